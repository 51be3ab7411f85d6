"""A stand-in for Grafana's HTTP API, for testing what grafana-client sends.

Grafana itself cannot be installed here, so this server implements the few
endpoints kvwatch uses, as Grafana's HTTP API documentation describes them
(request bodies, status codes and response shapes), checks every body against
those documented shapes, and records each request:

    GET  /api/datasources/uid/:uid     200 the datasource | 404
    POST /api/datasources              200 {datasource, id, message, name} | 409 name taken
    PUT  /api/datasources/:id          200 {datasource, id, message, name} | 404
    GET  /api/folders/:uid             200 the folder | 404
    POST /api/folders                  200 {id, uid, title, url, version} | 409 uid taken
    POST /api/dashboards/db            200 {id, uid, url, status, version, slug} | 412 exists
    POST /api/annotations              200 {message, id}

With a token set, every request needs ``Authorization: Bearer <token>`` (401
otherwise), as with a Grafana service-account token.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from kvwatch.sockets import listen_socket, socket_url


class Documented(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasourceBody(Documented):
    name: str
    type: str
    access: Literal["proxy", "direct"]
    url: str
    uid: str | None = None
    isDefault: bool = False
    basicAuth: bool = False
    jsonData: dict[str, Any] = Field(default_factory=dict)
    secureJsonData: dict[str, str] = Field(default_factory=dict)


class FolderBody(Documented):
    title: str
    uid: str | None = None
    parentUid: str | None = None


class DashboardBody(Documented):
    dashboard: dict[str, Any]
    folderUid: str | None = None
    folderId: int | None = None
    message: str = ""
    overwrite: bool = False


class AnnotationBody(Documented):
    text: str
    time: int | None = None
    timeEnd: int | None = None
    tags: list[str] = Field(default_factory=list)
    dashboardUID: str | None = None
    dashboardId: int | None = None
    panelId: int | None = None


class FakeGrafana:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, JSON body)
        self.datasources: dict[int, dict] = {}
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}  # uid -> {"dashboard", "folderUid", "version"}
        self.annotations: list[dict] = []
        self.app = self._routes()

    def _routes(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next):
            body = await request.body()
            self.requests.append(
                (request.method, request.url.path, json.loads(body) if body else None)
            )
            if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"message": "Unauthorized"}, status_code=401)
            return await call_next(request)

        @app.get("/api/datasources/uid/{uid}")
        def datasource_by_uid(uid: str):
            for ds in self.datasources.values():
                if ds["uid"] == uid:
                    return ds
            return _error(404, "Data source not found")

        @app.post("/api/datasources")
        def create_datasource(body: DatasourceBody):
            if any(ds["name"] == body.name for ds in self.datasources.values()):
                return _error(409, "data source with the same name already exists")
            ds_id = len(self.datasources) + 1
            ds = {"id": ds_id, "orgId": 1, **body.model_dump()}
            ds["uid"] = ds["uid"] or f"ds{ds_id}"
            self.datasources[ds_id] = ds
            return {
                "datasource": ds,
                "id": ds_id,
                "message": "Datasource added",
                "name": ds["name"],
            }

        @app.put("/api/datasources/{ds_id}")
        def update_datasource(ds_id: int, body: DatasourceBody):
            if ds_id not in self.datasources:
                return _error(404, "Data source not found")
            ds = {**self.datasources[ds_id], **body.model_dump(), "id": ds_id}
            self.datasources[ds_id] = ds
            return {
                "datasource": ds,
                "id": ds_id,
                "message": "Datasource updated",
                "name": ds["name"],
            }

        @app.get("/api/folders/{uid}")
        def folder(uid: str):
            return self.folders.get(uid) or _error(404, "folder not found")

        @app.post("/api/folders")
        def create_folder(body: FolderBody):
            uid = body.uid or f"folder{len(self.folders) + 1}"
            if uid in self.folders:
                return _error(409, "a folder with the same uid already exists")
            f = {"id": len(self.folders) + 1, "uid": uid, "title": body.title, "version": 1}
            self.folders[uid] = {**f, "url": f"/dashboards/f/{uid}/"}
            return self.folders[uid]

        @app.post("/api/dashboards/db")
        def save_dashboard(body: DashboardBody):
            model = body.dashboard
            if not model.get("title") or not model.get("uid"):
                return _error(400, "Dashboard title and uid cannot be empty")
            if body.folderUid is not None and body.folderUid not in self.folders:
                return _error(400, "folder not found")
            old = self.dashboards.get(model["uid"])
            if old is not None and not body.overwrite:
                return _error(412, "A dashboard with the same uid already exists")
            version = (old["version"] + 1) if old else 1
            self.dashboards[model["uid"]] = {
                "dashboard": model,
                "folderUid": body.folderUid,
                "version": version,
            }
            slug = model["title"].lower().replace(" / ", "-").replace(" ", "-")
            return {
                "id": list(self.dashboards).index(model["uid"]) + 1,
                "uid": model["uid"],
                "url": f"/d/{model['uid']}/{slug}",
                "status": "success",
                "version": version,
                "slug": slug,
            }

        @app.post("/api/annotations")
        def add_annotation(body: AnnotationBody):
            entry = {"id": len(self.annotations) + 1, **body.model_dump()}
            self.annotations.append(entry)
            return {"message": "Annotation added", "id": entry["id"]}

        return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status)


@contextlib.contextmanager
def fake_grafana(token: str | None = None) -> Iterator[tuple[str, FakeGrafana]]:
    """Serve a ``FakeGrafana`` on a loopback port for the block; yields (URL, fake)."""
    fake = FakeGrafana(token)
    sock = listen_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning"))
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the fake Grafana did not start")
        time.sleep(0.02)
    try:
        yield socket_url(sock), fake
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
