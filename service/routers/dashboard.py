"""The dashboard page and its static files; Plotly is served from the installed package.

The page gets the vocabulary it needs (which job states are final, how each runner's
latencies are labelled) from model/ at serve time, so the script spells no state or runner
name of its own.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import plotly
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from pipetune.model.states import JobState, TaskState
from pipetune.model.trials import RunnerKind
from pipetune.service.errors import NotFoundError
from pipetune.service.routers.bounded_json import BoundedJsonRoute

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
VOCABULARY_MARK = "<!-- vocabulary -->"

router = APIRouter(route_class=BoundedJsonRoute, include_in_schema=False)


def vocabulary() -> dict:
    return {
        "final_job_states": [s.value for s in JobState if s.is_final()],
        "final_task_states": [s.value for s in TaskState if s.is_final()],
        "runner_labels": {k.value: k.adjective for k in RunnerKind},
        "simulated": RunnerKind.SIMULATED.adjective,
        "simulated_kind": RunnerKind.SIMULATED.value,
        "measured": RunnerKind.CUPY.adjective,
    }


@cache
def _page() -> str:
    html = (DASHBOARD_DIR / "index.html").read_text()
    # "</" escaped: the data cannot close the script element early.
    data = json.dumps(vocabulary(), sort_keys=True).replace("</", "<\\/")
    script = f'<script id="vocabulary" type="application/json">{data}</script>'
    return html.replace(VOCABULARY_MARK, script)


# The page shows only what the service's JSON routes return, always as text (no innerHTML):
# nothing a worker or user sends can become markup today. The policy keeps it so if that
# ever slips: scripts only from the service itself (Plotly is served locally, the vocabulary
# block is data, not code), inline styles (Plotly writes its own), no framing.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


# HEAD answered as GET (headers, no body): an uptime check that asks with HEAD got a 405.
GET_OR_HEAD = ["GET", "HEAD"]


@router.api_route("/dashboard", methods=GET_OR_HEAD)
def dashboard() -> HTMLResponse:
    return HTMLResponse(_page(), headers=PAGE_HEADERS)


@router.api_route("/dashboard/", methods=GET_OR_HEAD)
def dashboard_slash(request: Request) -> RedirectResponse:
    """To the page, by a relative address: Starlette's own redirect names the path the
    service saw, without the prefix of a proxy that strips it (PIPETUNE_ROOT_PATH)."""
    query = request.url.query
    return RedirectResponse(f"../dashboard{'?' + query if query else ''}", status_code=308)


@router.api_route("/dashboard/static/plotly.min.js", methods=GET_OR_HEAD)
def plotly_js() -> FileResponse:
    # No CDN: the page must work on a machine with no network.
    return FileResponse(
        PLOTLY_JS,
        media_type="text/javascript",
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.api_route("/dashboard/static/{name}", methods=GET_OR_HEAD)
def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise NotFoundError(f"no dashboard file {name}")
    return FileResponse(DASHBOARD_DIR / name, media_type=ASSETS[name])
