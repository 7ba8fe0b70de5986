"""The dashboard page and its static files; Plotly is served from the installed package."""

from __future__ import annotations

from pathlib import Path

import plotly
from fastapi import APIRouter
from fastapi.responses import FileResponse

from pipetune.service.errors import NotFoundError

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}

router = APIRouter(include_in_schema=False)


@router.get("/dashboard")
def dashboard() -> FileResponse:
    return FileResponse(DASHBOARD_DIR / "index.html", media_type="text/html")


@router.get("/dashboard/static/plotly.min.js")
def plotly_js() -> FileResponse:
    # No CDN: the page must work on a machine with no network.
    return FileResponse(
        PLOTLY_JS,
        media_type="text/javascript",
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.get("/dashboard/static/{name}")
def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise NotFoundError(f"no dashboard file {name}")
    return FileResponse(DASHBOARD_DIR / name, media_type=ASSETS[name])
