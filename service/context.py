"""What every route needs, built once per app by create_app and found on app.state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from pipetune.service.db import Database
from pipetune.service.driver import Driver
from pipetune.service.metrics import Metrics
from pipetune.service.proposer import Proposer
from pipetune.service.queue import Queue
from pipetune.service.settings import Settings
from pipetune.service.wakeup import Wakeup


@dataclass
class Service:
    settings: Settings
    db: Database
    queue: Queue
    driver: Driver
    metrics: Metrics
    schema_revision: str
    wakeup: Wakeup
    proposer: Proposer

    def upkeep(self, patient: bool = False) -> None:
        """Requeue expired leases and advance tasks whose batch completed (any replica).
        `patient` (the periodic sweep's): only tasks found ready, at the same batch, by the
        sweep before too; a task that just became ready is its proposer's, on whichever
        replica took the result that completed its batch.
        A stalled database (service/db.py) is probed first: the sweep is how a replica
        with no requests finds it answering again (`pipetune_database_up` back to 1); its
        statements wait for the probe's answer rather than each for a deadline."""
        if self.db.stalled:
            self.db.probe()
        self.queue.reclaim()
        self.driver.advance_ready(
            held_elsewhere=self.proposer.request, in_hand=self.proposer.has, patient=patient
        )


async def get_service(request: Request) -> Service:
    # async: FastAPI runs a plain function dependency in a worker thread, per request.
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]
