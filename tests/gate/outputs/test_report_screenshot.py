"""report.html as headless Chromium renders it, from recorded gate output
(``data/report-clean``, ``data/report-leak``): the failing report's screenshot
has the leaked pages' colour, the clean one has not a pixel of it; the failing
page's DOM, with nothing hovered, carries each failure's evidence, and the
clean one says every detector passed."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from paths import DATA
from PIL import Image

from kvwatch.gate.outputs.report import write_report
from kvwatch.gate.outputs.report_plots import LEAKED
from kvwatch.gate.outputs.summary import read_summary

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"no {CHROMIUM}: `make test` installs Debian's chromium where it runs as root",
    ),
]
WINDOW = "1400,3000"


def chromium(*args: str) -> str:
    """Headless Chromium's stdout; a generous timeout bounds a hang only."""
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Text(HTMLParser):
    """Text nodes of the body: what shows without hovering anything."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._body = self._skip = False

    def handle_starttag(self, tag, attrs):
        self._body = self._body or tag == "body"
        self._skip = tag in ("style", "script")

    def handle_endtag(self, tag):
        self._skip = False

    def handle_data(self, data):
        if self._body and not self._skip:
            self.parts.append(data)


def rendered(tmp_path: Path, fixture: str) -> tuple[dict, np.ndarray, str]:
    """(summary, screenshot RGB pixels, visible text of the DOM) of the fixture's report."""
    out = tmp_path / fixture
    shutil.copytree(DATA / fixture, out)
    summary = json.loads((out / "summary.json").read_text())
    url = write_report(read_summary(out), out).as_uri()
    shot = tmp_path / f"{fixture}.png"
    chromium(f"--screenshot={shot}", f"--window-size={WINDOW}", url)
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    parser = Text()
    parser.feed(chromium("--dump-dom", url))
    return summary, pixels, " ".join(" ".join(parser.parts).split())


def count(pixels: np.ndarray, color: str) -> int:
    rgb = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
    return int(np.all(pixels == rgb, axis=-1).sum())


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    where = tmp_path_factory.mktemp("shots")
    return {f: rendered(where, f) for f in ("report-clean", "report-leak")}


def test_only_the_failing_report_shows_leaked_pages_in_their_colour(shots):
    _, clean, _ = shots["report-clean"]
    _, leak, _ = shots["report-leak"]
    assert clean.shape[:2] == leak.shape[:2] == (3000, 1400)
    assert count(clean, LEAKED) == 0
    assert count(leak, LEAKED) >= 100  # bars a reader sees, not a stray pixel


def test_the_failing_page_shows_its_evidence_without_hovering(shots):
    summary, _, text = shots["report-leak"]
    assert text.startswith("kvwatch gate: FAIL")
    failed = [
        d for run in summary["runs"] for d in run["detectors"].values() if d["verdict"] == "fail"
    ]
    assert failed
    for d in failed:
        assert " ".join(d["evidence"].split()) in text
    assert "Every detector passed" not in text


def test_the_clean_page_says_every_detector_passed(shots):
    summary, _, text = shots["report-clean"]
    assert text.startswith("kvwatch gate: PASS")
    assert f"Every detector passed in all {len(summary['runs'])} runs." in text
    assert "What failed" not in text
