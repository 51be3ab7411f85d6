"""Push the dashboards into Grafana with grafana-client.

    push(api)                         upsert folder "kvwatch", then each dashboard in it
    push(api, prometheus_url=URL)     first upsert the "kvwatch-prometheus" datasource,
                                      and make it the dashboards' default $datasource

Every call is an upsert keyed by uid, so pushing twice leaves one folder, one
datasource and one copy of each dashboard (the second push overwrites).
Endpoints used (Grafana HTTP API): ``GET/POST /api/datasources``,
``PUT /api/datasources/:id``, ``GET/POST /api/folders``, ``POST /api/dashboards/db``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import NamedTuple

from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError

FOLDER_UID = "kvwatch"
FOLDER_TITLE = "kvwatch"
DATASOURCE_UID = "kvwatch-prometheus"
DATASOURCE_NAME = "kvwatch-prometheus"
SCRAPE_INTERVAL = "5s"  # $__rate_interval is at least 4 of these


class PushResult(NamedTuple):
    folder_uid: str
    datasource_uid: str | None
    dashboards: dict[str, str]  # uid -> the URL Grafana gave it


def connect(url: str, token: str | None = None, timeout: float = 10.0) -> GrafanaApi:
    return GrafanaApi.from_url(url, credential=token, timeout=timeout)


def _missing(exc: GrafanaClientError) -> bool:
    return exc.status_code == 404


def upsert_datasource(api: GrafanaApi, prometheus_url: str) -> str:
    body = {
        "name": DATASOURCE_NAME,
        "uid": DATASOURCE_UID,
        "type": "prometheus",
        "access": "proxy",
        "url": prometheus_url,
        "isDefault": False,
        "jsonData": {"httpMethod": "POST", "timeInterval": SCRAPE_INTERVAL},
    }
    try:
        found = api.datasource.get_datasource_by_uid(DATASOURCE_UID)
    except GrafanaClientError as exc:
        if not _missing(exc):
            raise
        api.datasource.create_datasource(body)
    else:
        api.datasource.update_datasource(found["id"], body)
    return DATASOURCE_UID


def upsert_folder(api: GrafanaApi, uid: str = FOLDER_UID, title: str = FOLDER_TITLE) -> str:
    try:
        api.folder.get_folder(uid)
    except GrafanaClientError as exc:
        if not _missing(exc):
            raise
        api.folder.create_folder(title, uid=uid)
    return uid


def with_default_datasource(model: Mapping, uid: str) -> dict:
    """The dashboard with ``$datasource`` preset to ``uid``."""
    out = copy.deepcopy(dict(model))
    for var in out.get("templating", {}).get("list", ()):
        if var.get("name") == "datasource":
            var["current"] = {"selected": True, "text": DATASOURCE_NAME, "value": uid}
    return out


def push(
    api: GrafanaApi,
    dashboards: Mapping[str, Mapping],
    prometheus_url: str | None = None,
    folder_uid: str = FOLDER_UID,
) -> PushResult:
    datasource = upsert_datasource(api, prometheus_url) if prometheus_url else None
    folder = upsert_folder(api, folder_uid)
    urls = {}
    for uid, model in dashboards.items():
        body = with_default_datasource(model, datasource) if datasource else dict(model)
        body["id"] = None  # match on uid, not on a numeric id from another Grafana
        answer = api.dashboard.update_dashboard(
            {
                "dashboard": body,
                "folderUid": folder,
                "overwrite": True,
                "message": "kvwatch dashboards push",
            }
        )
        urls[uid] = answer.get("url", "")
    return PushResult(folder, datasource, urls)
