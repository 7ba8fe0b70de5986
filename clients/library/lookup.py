"""`pipetune.best_schedule`: the best known schedule of a workload on a GPU.

With a server, the service answers (POST /v1/schedules). Without one, the local database
answers exactly as the service would on it: the best measured trial of the workload on the
GPU over every task (the service's own query), else the model's pick: for a tensor-core GEMM
or a memory-intensive operator the learned prior's where measured tasks of 8 or more shapes
exist (`learned_from` names them), else the analytical model's. The answer says which
(`source` "measured" or "model") and, for a measured one, which runner measured it (`runner`
"simulated" is the model plus noise, not a measurement).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipetune.clients.library.inputs import WorkloadLike, as_gpu, as_workload
from pipetune.lazy import load_module
from pipetune.model.errors import InvalidArgumentError
from pipetune.model.wire import ScheduleResponse

if TYPE_CHECKING:
    from pipetune.clients.library.store import LocalStore


def best_schedule(
    workload: WorkloadLike,
    gpu: str,
    server: str | None = None,
    *,
    db: str | None = None,
    api_key: str | None = None,
) -> ScheduleResponse:
    """The best measured schedule of `workload` on `gpu`, else the model's pick.

    server: a pipetune service URL; None reads the local database (`db`, default: the one
    `pipetune serve` uses) without a service. api_key goes to the service (X-API-Key).
    """
    w, key = as_workload(workload), as_gpu(gpu)
    if server is not None and db is not None:
        raise InvalidArgumentError(
            "db", "give server or db, not both: a service answers from its own database"
        )
    if api_key is not None and server is None:
        # Refused, not silently unused: the caller may believe a service answered.
        raise InvalidArgumentError(
            "api_key", "goes to a service: give server=... too (the local database takes none)"
        )
    if server is not None:
        from pipetune.clients.sdk import Client
        from pipetune.clients.sdk.http import server_problem

        # As the CLI's --server: not a URL is the caller's mistake, not a service that is
        # down ("" too, which Client would have read as PIPETUNE_SERVER or the default).
        if problem := server_problem(server):
            raise InvalidArgumentError("server", problem)

        with Client(server, api_key=api_key) as client:
            return client.best_schedule(w, key)
    try:
        # (through load_module: a tuning starting in another thread imports SQLAlchemy too)
        local_store: type[LocalStore] = load_module("pipetune.clients.library.store").LocalStore
    except ImportError as exc:  # a GPU machine with pipetune's kernel parts only
        raise ImportError(
            f"reading the local database needs pipetune's service dependencies ({exc.name} "
            "is missing): pass server=..., or give the schedule yourself"
        ) from exc

    with local_store(db) as store:
        return store.best_schedule(w, key)
