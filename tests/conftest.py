from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

from pipetune.model.hardware import get_gpu

# The tests never touch the user's data directory (the embedded database, the worker token
# `serve` generates): each run gets its own, which the processes the tests start inherit.
_DATA_HOME = tempfile.mkdtemp(prefix="pipetune-tests-data-")
os.environ["XDG_DATA_HOME"] = _DATA_HOME
atexit.register(shutil.rmtree, _DATA_HOME, ignore_errors=True)

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
