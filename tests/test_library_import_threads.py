"""pipetune's lazily loaded parts are imported by one thread at a time.

Two threads' first calls at once (`pipetune.tune` in one, `pipetune.best_schedule` in the
other) imported SQLAlchemy together, and Python's import deadlock avoidance gave one of them
the half-made ``sqlalchemy.engine``: an ImportError "cannot import name 'AdaptedConnection'
from partially initialized module", which best_schedule reported as missing dependencies (1
run in 12). Loads now go through one lock (pipetune.lazy): here, in a fresh interpreter, a
thread that needs a module while another holds the lock waits for it instead of importing.
"""

from __future__ import annotations

import subprocess
import sys

_WAITS_FOR_THE_LOCK = """
import sys, threading
import pipetune
from pipetune import lazy

what, db = sys.argv[1], sys.argv[2]
modules = {"tune": "tuning", "lookup": "store"}
module = "pipetune.clients.library." + modules[what]
if what == "lookup":
    best_schedule = pipetune.best_schedule  # (its own module is light: only the store waits)

def call():
    if what == "tune":
        pipetune.tune
    else:
        best_schedule({"op": "gemm", "m": 64, "n": 64, "k": 64}, "h100", db=db)

with lazy._LOADING:  # another thread loading
    thread = threading.Thread(target=call)
    thread.start()
    thread.join(1.0)
    print("while held:", "waiting" if thread.is_alive() else "done", module in sys.modules)
thread.join(120)
print("after:", "waiting" if thread.is_alive() else "done", module in sys.modules)
"""


def _run(what: str, db: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", _WAITS_FOR_THE_LOCK, what, db],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.splitlines()


def test_a_public_name_is_loaded_under_the_lock(tmp_path):
    lines = _run("tune", f"sqlite:///{tmp_path / 'p.db'}")
    assert lines == ["while held: waiting False", "after: done True"]


def test_best_schedule_loads_the_local_store_under_the_lock(tmp_path):
    lines = _run("lookup", f"sqlite:///{tmp_path / 'p.db'}")
    assert lines == ["while held: waiting False", "after: done True"]
