"""A client reads the answers of a newer service: fields it does not know are ignored, at any
depth, so that a service which adds a field to an answer (as `generator_revision` was added to
a trial) does not break the SDKs already deployed. What a client sends is still checked
strictly (an unknown field in a request is a 422, tests/test_service_validation.py)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from pipetune.clients.sdk import Client
from pipetune.model.wire import READING, TaskCreate, TrialDoc

SCHEDULE = {
    "block_row_warps": 2,
    "block_col_warps": 2,
    "warp_row_tiles": 2,
    "warp_col_tiles": 2,
    "chunk": 2,
    "smem_stages": 3,
    "reg_stages": 2,
}
TRIAL = {"trial": 0, "state": "done", "status": "ok", "schedule": SCHEDULE, "latency_us": 12.5}


def test_the_sdk_reads_a_trial_list_with_fields_from_a_newer_service():
    def answer(request: httpx.Request) -> httpx.Response:
        trial = {**TRIAL, "a_field_of_a_later_version": {"nested": [1, 2]}}
        return httpx.Response(200, json={"trials": [trial], "page_cursor_of_the_future": 7})

    client = Client("http://service", transport=httpx.MockTransport(answer))
    (trial,) = client.trials(1)
    assert (trial.trial, trial.latency_us, trial.schedule.smem_stages) == (0, 12.5, 3)


def test_unknown_fields_are_refused_except_when_reading_answers():
    with pytest.raises(ValidationError, match="later"):
        TrialDoc.model_validate({**TRIAL, "later": 1})
    assert TrialDoc.model_validate({**TRIAL, "later": 1}, context=READING).trial == 0
    body = {"workload": {"op": "gemm", "m": 64, "n": 64, "k": 64}, "gpu": "h100", "budgett": 9}
    with pytest.raises(ValidationError, match="budgett"):
        TaskCreate.model_validate(body)
    # A known field's value is checked as strictly when reading.
    with pytest.raises(ValidationError, match="trial"):
        TrialDoc.model_validate({**TRIAL, "trial": "zero"}, context=READING)
