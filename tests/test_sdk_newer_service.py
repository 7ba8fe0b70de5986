"""A client reads the answers of a newer service: fields it does not know are ignored, at any
depth, so that a service which adds a field to an answer (as `generator_revision` was added to
a trial) does not break the SDKs already deployed. What a client sends is still checked
strictly (an unknown field in a request is a 422, tests/test_service_validation.py)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from pipetune.clients.sdk import Client
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.wire import READING, TaskCreate, TrialDoc
from pipetune.model.workloads import gemm

SCHEDULE = Space.enumerate(gemm(256, 256, 256), get_gpu("h100"))[0].as_dict()
TRIAL = {"trial": 0, "state": "done", "status": "ok", "schedule": SCHEDULE, "latency_us": 12.5}


def test_the_sdk_reads_a_trial_list_with_fields_from_a_newer_service():
    def answer(request: httpx.Request) -> httpx.Response:
        trial = {**TRIAL, "a_field_of_a_later_version": {"nested": [1, 2]}}
        return httpx.Response(200, json={"trials": [trial], "page_cursor_of_the_future": 7})

    client = Client("http://service", transport=httpx.MockTransport(answer))
    (trial,) = client.trials(1)
    assert (trial.trial, trial.latency_us) == (0, 12.5)
    assert trial.schedule.smem_stages == SCHEDULE["smem_stages"]


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
