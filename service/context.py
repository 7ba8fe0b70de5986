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

    def upkeep(self) -> None:
        """Requeue expired leases and advance tasks whose batch completed (any replica)."""
        self.queue.reclaim()
        self.driver.advance_ready(held_elsewhere=self.proposer.request, in_hand=self.proposer.has)


async def get_service(request: Request) -> Service:
    # async: FastAPI runs a plain function dependency in a worker thread, per request.
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]
