"""pipetune's modules loaded on first use, one thread at a time.

`import pipetune` loads nothing but the version (PEP 562 names), and the library loads the
service's parts only when a call needs them. Two threads' first calls at once (one
`pipetune.tune`, one `pipetune.best_schedule`) then imported SQLAlchemy together, and Python's
import deadlock avoidance gave one of them the half-made ``sqlalchemy.engine``: "cannot import
name 'AdaptedConnection' from partially initialized module" (1 run in 12 of two such threads).
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

# Reentrant: a module loaded here may load another through here while it is imported.
_LOADING = threading.RLock()


def load_module(name: str) -> ModuleType:
    """importlib.import_module(name), with no other thread loading through here meanwhile."""
    with _LOADING:
        return importlib.import_module(name)
