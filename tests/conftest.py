from __future__ import annotations

import os

import pytest
from hypothesis import settings

from model.hardware import get_gpu

# CI replays the same generated cases on every run, so a landing never hangs on a draw;
# local runs keep exploring new cases (a failure prints its reproduction).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def h100():
    return get_gpu("h100", calibrated=False)


@pytest.fixture(scope="session")
def a100():
    return get_gpu("a100", calibrated=False)
