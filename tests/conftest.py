from __future__ import annotations

import pytest

from model.hardware import get_gpu


@pytest.fixture(scope="session")
def h100():
    return get_gpu("h100", calibrated=False)


@pytest.fixture(scope="session")
def a100():
    return get_gpu("a100", calibrated=False)
