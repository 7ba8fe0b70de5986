"""A local-disk cache of fp32 references and tolerances, kept across child restarts.

The cupy runner's child computes a workload's reference when it sets the workload up. A
kernel fault kills the child's CUDA context, and the next child would compute the same
reference again (for the largest convolutions, the im2col reference is the slowest part of
setting a workload up). Device memory cannot outlive the child, so the child stores the
reference on local disk the first time and loads it afterwards.

Entry: ``<key>.ref.npy`` and ``<key>.tol.npy`` in the cache folder, written to temporary
names and renamed, the tolerance last, so an entry counts only once both are whole. The key
names everything the arrays depend on (workload, input seed, how the reference was computed,
the tolerance formula). Written against an array module ``xp`` with host conversions, so the
tests run it with numpy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipetune.workers.runners.reference import TOLERANCE_TEXT

ENV_DIR = "PIPETUNE_REFERENCE_CACHE"


def default_folder() -> Path:
    """``$PIPETUNE_REFERENCE_CACHE``, else a folder of this user's under the system's
    temporary directory (local disk; a reference is worth keeping for one machine's session,
    not longer). The folder is per user: in a shared one another user's files could stand in
    for the references a kernel is verified against, and one user's folder is read-only to
    the next."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser()
    return Path(tempfile.gettempdir()) / f"pipetune-references-{_user_id()}"


def _user_id() -> str:
    getuid = getattr(os, "getuid", None)  # POSIX; elsewhere the login name
    if getuid is not None:
        return str(getuid())
    import getpass

    return getpass.getuser()


def cache_key(workload_hash: str, seed: int, method: str, formula: str = TOLERANCE_TEXT) -> str:
    """The entry's name: the workload, the input seed, how the reference was computed, and
    the tolerance formula (its family's check's text)."""
    digest = hashlib.sha256(formula.encode()).hexdigest()[:8]
    return f"{workload_hash}-seed{seed}-{method}-{digest}"


def _paths(folder: Path, key: str) -> tuple[Path, Path]:
    return folder / f"{key}.ref.npy", folder / f"{key}.tol.npy"


def _save(path: Path, array: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.save(handle, array, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _trusted(folder: Path) -> bool:
    """Whether the folder is this user's: references from a folder another user made (one
    squatting the default name in the shared temporary directory, say) are not read."""
    getuid = getattr(os, "getuid", None)
    try:
        return getuid is None or folder.stat().st_uid == getuid()
    except OSError:
        return False


def load(folder: Path, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached (ref, tol) host arrays, or None (missing, partial, unreadable, or in a
    folder that is not this user's)."""
    if not _trusted(folder):
        return None
    ref_path, tol_path = _paths(folder, key)
    try:
        ref = np.load(ref_path, allow_pickle=False)
        tol = np.load(tol_path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if ref.shape != tol.shape or ref.dtype != np.float32 or tol.dtype != np.float32:
        return None
    return ref, tol


def store(folder: Path, key: str, ref: np.ndarray, tol: np.ndarray) -> None:
    """Write an entry; a full or read-only disk costs a recomputation later, not a failure."""
    ref_path, tol_path = _paths(folder, key)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _trusted(folder):
            return
        _save(ref_path, ref)
        _save(tol_path, tol)  # last: the entry exists once this file does
    except OSError:
        pass


def cached_reference(
    xp: Any,
    workload_hash: str,
    seed: int,
    method: str,
    folder: Path | None,
    compute: Callable[[], tuple[Any, Any, str]],
    to_host: Callable[[Any], np.ndarray] = np.asarray,
    formula: str = TOLERANCE_TEXT,
) -> tuple[Any, Any, str, bool]:
    """(ref, tol, method used, came from disk): the cached entry for ``method`` as ``xp``
    arrays, else ``compute()``'s (ref, tol, method it used), stored under the method it used
    (a fallback's arrays never pass for the method asked for). ``folder`` None: no cache."""
    if folder is not None:
        hit = load(folder, cache_key(workload_hash, seed, method, formula))
        if hit is not None:
            return xp.asarray(hit[0]), xp.asarray(hit[1]), method, True
    ref, tol, used = compute()
    if folder is not None:
        store(folder, cache_key(workload_hash, seed, used, formula), to_host(ref), to_host(tol))
    return ref, tol, used, False
