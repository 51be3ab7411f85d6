"""``kvwatch dashboards push`` and the gate's annotations, against a stand-in that
checks requests against Grafana's documented HTTP API (see fakegrafana.py)."""

from __future__ import annotations

import json

from fakegrafana import fake_grafana
from test_dashboards import SUMMARY

from kvwatch.cli import main
from kvwatch.dashboards import DASHBOARDS, build, push
from kvwatch.gate.options import GateOptions
from kvwatch.gate.pipeline import publish

TOKEN = "glsa_test"
PROMETHEUS = "http://127.0.0.1:9090"


def calls(fake) -> list[tuple[str, str]]:
    return [(method, path) for method, path, _ in fake.requests]


def test_a_first_push_creates_the_datasource_the_folder_and_every_dashboard():
    with fake_grafana(TOKEN) as (url, fake):
        result = push.push(push.connect(url, TOKEN), build.models(), PROMETHEUS)
    assert calls(fake) == [
        ("GET", "/api/datasources/uid/kvwatch-prometheus"),
        ("POST", "/api/datasources"),
        ("GET", "/api/folders/kvwatch"),
        ("POST", "/api/folders"),
        *[("POST", "/api/dashboards/db")] * len(DASHBOARDS),
    ]
    (ds,) = fake.datasources.values()
    assert (ds["type"], ds["url"], ds["access"], ds["uid"]) == (
        "prometheus",
        PROMETHEUS,
        "proxy",
        "kvwatch-prometheus",
    )
    assert fake.folders["kvwatch"]["title"] == "kvwatch"
    assert set(fake.dashboards) == set(DASHBOARDS)
    for uid, saved in fake.dashboards.items():
        assert saved["folderUid"] == "kvwatch" and saved["version"] == 1
        assert saved["dashboard"]["panels"] == build.models()[uid]["panels"]
        (var,) = [v for v in saved["dashboard"]["templating"]["list"] if v["name"] == "datasource"]
        assert var["current"]["value"] == "kvwatch-prometheus"
    assert result.dashboards["kvwatch-pools"].startswith("/d/kvwatch-pools/")


def test_pushing_again_updates_in_place():
    with fake_grafana(TOKEN) as (url, fake):
        api = push.connect(url, TOKEN)
        push.push(api, build.models(), PROMETHEUS)
        fake.requests.clear()
        push.push(api, build.models(), "http://prometheus.internal:9090")
    assert ("PUT", "/api/datasources/1") in calls(fake)
    assert ("POST", "/api/datasources") not in calls(fake)
    assert ("POST", "/api/folders") not in calls(fake)
    assert len(fake.datasources) == 1 and len(fake.folders) == 1
    assert fake.datasources[1]["url"] == "http://prometheus.internal:9090"
    assert {d["version"] for d in fake.dashboards.values()} == {2}


def test_without_a_prometheus_url_only_the_folder_and_dashboards_are_pushed():
    with fake_grafana() as (url, fake):
        push.push(push.connect(url), build.models())
    assert not fake.datasources and not any("datasources" in p for _, p in calls(fake))
    assert len(fake.dashboards) == len(DASHBOARDS)


def test_the_cli_pushes_with_a_token_and_fails_cleanly_without_one(capsys, monkeypatch):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    with fake_grafana(TOKEN) as (url, fake):
        assert main(["dashboards", "push", "--grafana-url", url]) == 1
        assert "Unauthorized" in capsys.readouterr().err and not fake.dashboards
        monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
        assert (
            main(["dashboards", "push", "--grafana-url", url, "--prometheus-url", PROMETHEUS]) == 0
        )
    printed = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert set(printed) == set(DASHBOARDS)


def test_the_gate_posts_its_findings_and_survives_an_unreachable_pushgateway(tmp_path):
    seen = []
    with fake_grafana(TOKEN) as (url, fake):
        opts = GateOptions(
            out=tmp_path,
            grafana_url=url,
            grafana_token=TOKEN,
            pushgateway="http://127.0.0.1:9",  # the discard port: nothing listens
            progress=seen.append,
        )
        done = publish(SUMMARY, opts)
    assert done["grafana"] == "2 annotations"
    assert done["pushgateway"].startswith("error:") and any("could not push" in s for s in seen)
    assert done["textfile"] == str(tmp_path / "gate.prom")
    assert "kvwatch_gate_verdict" in (tmp_path / "gate.prom").read_text()
    texts = [a["text"] for a in fake.annotations]
    assert texts[0] == "rl-rollout c=2: fail (heap)"
    finding = fake.annotations[1]
    assert finding["time"] == 1_700_000_006_000 and "kvwatch-gate" in finding["tags"]
    assert json.loads(json.dumps(finding))["dashboardUID"] is None  # organisation-wide
