"""`pipetune workers`: the registered workers as the service sees them.

pipetune workers --server http://service:8000                # most recently heard from first
pipetune workers --state silent                               # died, or cut off: leases expire
pipetune workers --json
"""

from __future__ import annotations

import typer
from rich.table import Table

from pipetune.clients.cli.errors import CliError, reported
from pipetune.clients.cli.output import console, print_json
from pipetune.clients.cli.remote import (
    answered_by,
    api_key_option,
    db_option,
    read_server_option,
    reader,
    service_errors,
)
from pipetune.clients.sdk.client import WORKER_STATES
from pipetune.model.wire import MAX_WORKER_PAGE, WORKER_PAGE, WorkerDoc

STAMP = "%Y-%m-%d %H:%M:%S"


@reported
def workers(
    state: str | None = typer.Option(None, "--state", help="|".join(WORKER_STATES)),
    limit: int = typer.Option(
        WORKER_PAGE,
        "--limit",
        help=f"workers to list, the most recently heard from first (1..{MAX_WORKER_PAGE})",
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    server: str | None = read_server_option(),
    api_key: str | None = api_key_option(),
    db: str | None = db_option(),
) -> None:
    """Registered workers, the most recently heard from first: each one's GPU, runner, state
    (live; silent past the lease TTL: died or cut off, its leases expire; exited: stopped
    cleanly), jobs in hand and last heartbeat, and how many workers are in each state."""
    if state is not None and state not in WORKER_STATES:
        raise CliError(f"--state: must be one of {', '.join(WORKER_STATES)}, got {state!r}", 2)
    if not 1 <= limit <= MAX_WORKER_PAGE:
        raise CliError(f"--limit: must be within 1..{MAX_WORKER_PAGE}, got {limit}", 2)
    with service_errors(), reader(server, api_key, db) as c:
        page = c.worker_list(state, limit=limit)
        where = answered_by(server, c)
    # A full page may not be all (said, as `pipetune tasks` says it).
    more = len(page.workers) == limit
    if as_json:
        print_json(page.model_dump(mode="json") | {"limit": limit, "more": more})
        return
    table = Table(title=f"workers at {where}")
    for col in ("id", "name", "gpu", "runner", "state", "busy", "last heard (UTC)", "exited"):
        table.add_column(col, justify="right" if col in ("id", "busy") else None)
    for w in page.workers:
        table.add_row(
            str(w.id),
            w.name,
            w.gpu,
            w.runner,
            w.state or "-",
            str(w.busy_jobs),
            w.last_heartbeat.strftime(STAMP),
            w.exited_at.strftime(STAMP) if w.exited_at else "-",
        )
    if page.workers:
        console.print(table)
    console.print(_counts_line(page.counts, state, page.workers))
    if more:
        console.print(
            f"{limit} workers, the most recently heard from first; there may be more: "
            f"--limit {min(MAX_WORKER_PAGE, 5 * limit)}" + ("" if state else " or --state")
        )


def _counts_line(counts: dict, state: str | None, listed: list[WorkerDoc]) -> str:
    """How many registered workers are in each state, e.g. `3 live, 1 silent, 12 exited`
    (all of them, whatever was listed)."""
    if not counts:  # (a service from before the counts)
        return f"{len(listed)} workers listed" + (f" ({state})" if state else "")
    if not any(counts.values()):
        return "no worker has registered"
    # A state this client does not know (a newer service's) is counted too, after the others.
    newer = [s for s in counts if s not in WORKER_STATES]
    return ", ".join(f"{counts.get(s, 0)} {s}" for s in [*WORKER_STATES, *newer])


def register(app: typer.Typer) -> None:
    """Add `workers` to the `pipetune` app."""
    app.command("workers")(workers)
