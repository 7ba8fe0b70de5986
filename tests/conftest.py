from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from pg_instance import (
    ADMIN_URL_ENV,
    DEFAULT_ADMIN_URL,
    UNAVAILABLE_ENV,
    PostgresInstance,
    PostgresUnavailableError,
    settle,
)

from pipetune.model.hardware import get_gpu

# The tests never touch the user's data directory (the embedded database, the worker token
# `serve` generates): each run gets its own, which the processes the tests start inherit.
_DATA_HOME = tempfile.mkdtemp(prefix="pipetune-tests-data-")
os.environ["XDG_DATA_HOME"] = _DATA_HOME
atexit.register(shutil.rmtree, _DATA_HOME, ignore_errors=True)

# Ctrl-C as Python has it, in the tests and the processes they start: a suite started in
# the background by a shell without job control (`make test &`, nohup) inherits SIGINT
# ignored, and so did every child, whose answer to SIGINT the interrupt tests check. (A
# handler, unlike SIG_IGN, is not inherited across exec: the children start with SIGINT's
# default, and Python installs its own.)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# CI replays the same generated cases on every run, so a landing never hangs on a draw;
# local runs keep exploring new cases (a failure prints its reproduction).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


_private_postgres: list[PostgresInstance] = []


def pytest_configure(config: pytest.Config) -> None:
    """The PostgreSQL the tests use, settled before any test module reads it (see
    pg_instance.settle): the local server when it answers, else a private throwaway one for
    this run. Without either, the tests that need PostgreSQL fail with the reason: they
    never skip, so a green run always covered PostgreSQL."""
    pg = settle(os.environ)
    if pg is not None:
        _private_postgres.append(pg)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _private_postgres:
        _private_postgres.pop().destroy()


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get(UNAVAILABLE_ENV):
        return f"PostgreSQL: none ({os.environ[UNAVAILABLE_ENV]})"
    where = " (a private server for this run)" if _private_postgres else ""
    return f"PostgreSQL: {os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL)}{where}"


@pytest.fixture(autouse=True)
def _pipetune_logger_restored() -> Iterator[None]:
    """The `pipetune` logger as each test found it. `pipetune serve` run in this process
    (tests/test_serve_interrupt.py) configures logging for the whole process: the logger
    stopped propagating to the root logger, where caplog listens, and a later test in the
    same pytest worker saw none of the service's records (test_service_driver's "does not
    replay" failed or passed by how the workers happened to share out the tests)."""
    logger = logging.getLogger("pipetune")
    propagate, handlers, level, disabled = (
        logger.propagate, list(logger.handlers), logger.level, logger.disabled,
    )  # fmt: skip
    yield
    logger.propagate, logger.handlers[:], logger.disabled = propagate, handlers, disabled
    logger.setLevel(level)


@pytest.fixture
def private_postgres() -> Iterator[PostgresInstance]:
    """A PostgreSQL server of the test's own, to stop, restart or freeze (the shared one is
    never touched); destroyed at the end, continued first if the test left it stopped."""
    try:
        pg = PostgresInstance().init()
    except PostgresUnavailableError as exc:
        pytest.fail(f"{exc} (make test installs PostgreSQL)", pytrace=False)
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()


@pytest.fixture(scope="session")
def campaign_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the campaign tests' compile and reference caches (cubins/, references/),
    shared by the run's tests: each kernel compiled once. For a module-scoped fixture's
    campaign; a test's own takes campaign_caches."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The run's folder, not this worker's: every worker compiled each kernel itself.
        # (Both caches write each entry under a temporary name and rename it.)
        root = root.parent
    return root


@pytest.fixture
def campaign_caches(campaign_cache_root: Path, monkeypatch: pytest.MonkeyPatch):
    """A campaign test's compile and reference caches, shared by the run's tests (kernels
    compiled once), and the simulated runner without its pretend measuring time."""
    monkeypatch.setenv("PIPETUNE_CACHE_DIR", str(campaign_cache_root / "cubins"))
    monkeypatch.setenv("PIPETUNE_REFERENCE_CACHE", str(campaign_cache_root / "references"))
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")


@pytest.fixture
def users_own_h200(tmp_path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A user's own H200 profile (the profile folder of PIPETUNE_PROFILE_DIR) far from the
    shipped one, as calibrate on another device could write it: 400 GB/s of DRAM bandwidth
    and 0.2 of mma.sync's peak. Returns the shipped profile's document. Data committed with
    pipetune was measured on the shipped profile's device and is evaluated with that one."""
    from pipetune.model import hardware

    shipped = json.loads((hardware.PROFILE_DIR / "h200.json").read_text())
    distorted = {"dram_bandwidth_gbs": 400.0, "mma_sync_efficiency": 0.2}
    own = tmp_path / "own-profiles"
    own.mkdir()
    other = {**shipped, "overrides": {**shipped["overrides"], **distorted}}
    (own / "h200.json").write_text(json.dumps(other))
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(own))
    return shipped


@pytest.fixture(scope="session")
def h100():
    return get_gpu("h100", calibrated=False)


@pytest.fixture(scope="session")
def a100():
    return get_gpu("a100", calibrated=False)


@pytest.fixture(scope="session")
def small_ours(h100):
    """A small pipetune schedule space recorded as if measured: the analytical model's
    latencies with 10% lognormal noise (seeded), for the offline tuner benchmark's tests."""
    import numpy as np

    from pipetune.model.analytical import evaluate
    from pipetune.model.space import Space
    from pipetune.model.workloads import gemm
    from pipetune.tuner.bench import Dataset
    from pipetune.tuner.offline import RecordedSpace
    from pipetune.tuner.recorded import RecordedConfigs

    space = Space.enumerate(gemm(512, 256, 1024), h100)
    noise = np.exp(np.random.default_rng(1).normal(0, 0.1, len(space)))
    rec = RecordedSpace(space, evaluate(space).T_kernel * noise)
    return Dataset("synthetic", RecordedConfigs.from_recorded_space("synthetic", rec), rec)
