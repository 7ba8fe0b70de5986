"""The PIPETUNE_* environment variables pipetune reads, and the warning for one it does not.

A misspelt variable was read by nothing, silently: a replica started with
PIPETUNE_DATABASE_URI ran on its own SQLite file beside the fleet's PostgreSQL (its tasks and
workers unseen by the other replicas), and PIPETUNE_DB_POOLSIZE left the pool at its
default. `serve` and `worker` name each such variable at start, with the name it most likely
meant. A warning, not a refusal: a variable left over from another version, or set for
another program's use, must not stop a service. tests/test_readme_env.py checks this list
against every variable pipetune's code reads."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

PREFIX = "PIPETUNE_"
DEBUG_ENV = "PIPETUNE_DEBUG"  # the CLI's tracebacks (clients/cli/errors.py)
# The test suite's own (`make test`'s PostgreSQL and the dashboard's screenshot): read by the
# tests, never by pipetune, and set where the tests start services.
TESTS_PREFIX = "PIPETUNE_TEST_"
TESTS_ONLY = frozenset({"PIPETUNE_DASHBOARD_SCREENSHOT"})


def known_variables() -> frozenset[str]:
    """Every PIPETUNE_* variable some part of pipetune reads: the service's settings and the
    clients', workers' and tuner's own."""
    from pipetune.clients.sdk.client import API_KEY_ENV, SERVER_ENV
    from pipetune.model.hardware import USER_PROFILE_DIR_ENV
    from pipetune.model.wire import TOKEN_ENV
    from pipetune.service.settings import settings_variables
    from pipetune.tuner.peers import PEER_TIME_LIMIT_ENV
    from pipetune.workers.compile.cache import ENV_DIR as COMPILE_CACHE_ENV
    from pipetune.workers.runners.faults import FAULTS_ENV
    from pipetune.workers.runners.reference_cache import ENV_DIR as REFERENCE_CACHE_ENV
    from pipetune.workers.runners.simulated import TIME_SCALE_ENV

    return settings_variables() | {
        API_KEY_ENV,
        SERVER_ENV,
        TOKEN_ENV,
        USER_PROFILE_DIR_ENV,
        PEER_TIME_LIMIT_ENV,
        COMPILE_CACHE_ENV,
        REFERENCE_CACHE_ENV,
        FAULTS_ENV,
        TIME_SCALE_ENV,
        DEBUG_ENV,
    }


def unknown_variable_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per PIPETUNE_* variable in the environment that nothing reads, naming the
    closest one that is read where there is one."""
    from pipetune.service.settings import settings_variables

    environ = os.environ if environ is None else environ
    known = known_variables()
    # (The settings' names are read in any case, as pydantic-settings reads them; the other
    # variables as they are spelt.)
    settings = settings_variables()
    lines = []
    for name in sorted(environ):
        if not name.upper().startswith(PREFIX) or name in known or name.upper() in settings:
            continue
        if name.startswith(TESTS_PREFIX) or name in TESTS_ONLY:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"warning: {name} is set, but pipetune reads no such variable{hint}")
    return lines
