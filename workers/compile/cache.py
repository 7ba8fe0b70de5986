"""Cubin cache: an in-process dict in front of a directory of cubins and their reports.

Key: sha256 of (source sha256, arch, options, NVRTC version and exact build: a patch
release of the same major.minor is another ptxas), so a different compiler or option set
never answers from a stale entry. Directory: ``$PIPETUNE_CACHE_DIR`` if set, else
the platform's user cache dir (``platformdirs``), under ``cubins/``. Each entry is
``<key>.cubin`` plus ``<key>.json`` (resources, compile time, log); files are written to a
temporary name and renamed, so concurrent writers and readers never see half an entry.
A missing, unreadable or damaged entry (its cubin's length or sha256 not the json's) is a
miss, never an error.

The in-process layer keeps the most recently used entries up to MEMORY_LIMIT_BYTES: a worker
compiles a new kernel for nearly every trial (15-30 KB of cubin each), so a dict of every
entry grew without end over a long-running worker's life (a campaign's 15,000 kernels: about
350 MB), where the disk answers any entry it dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

ENV_DIR = "PIPETUNE_CACHE_DIR"

# Bytes of cubin the in-process layer holds at most (least recently used dropped first).
MEMORY_LIMIT_BYTES = 64 << 20

_memory: OrderedDict[str, tuple[bytes, dict[str, Any]]] = OrderedDict()
_memory_bytes = 0
_lock = threading.Lock()


def _remember(key: str, entry: tuple[bytes, dict[str, Any]]) -> None:
    """Keep `entry` in memory as the most recent, dropping the oldest beyond the limit
    (the caller holds _lock)."""
    global _memory_bytes
    old = _memory.pop(key, None)
    if old is not None:
        _memory_bytes -= len(old[0])
    _memory[key] = entry
    _memory_bytes += len(entry[0])
    while _memory_bytes > MEMORY_LIMIT_BYTES and len(_memory) > 1:
        _, (cubin, _meta) = _memory.popitem(last=False)
        _memory_bytes -= len(cubin)


def memory_bytes() -> int:
    """Bytes of cubin the in-process layer holds now."""
    with _lock:
        return _memory_bytes


def cache_dir() -> Path:
    """Where cubins are kept (read from the environment at each call)."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser() / "cubins"
    import platformdirs

    return Path(platformdirs.user_cache_dir("pipetune")) / "cubins"


def cache_key(
    code: str,
    arch: str,
    options: list[str],
    nvrtc_version: tuple[int, int],
    nvrtc_build: str = "",
) -> str:
    doc = {
        "source": hashlib.sha256(code.encode()).hexdigest(),
        "arch": arch,
        "options": options,
        "nvrtc": list(nvrtc_version),
    }
    if nvrtc_build:
        doc["nvrtc_build"] = nvrtc_build
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _paths(key: str) -> tuple[Path, Path]:
    folder = cache_dir() / key[:2]
    return folder / f"{key}.cubin", folder / f"{key}.json"


def load(key: str) -> tuple[bytes, dict[str, Any]] | None:
    with _lock:
        hit = _memory.get(key)
        if hit is not None:
            _memory.move_to_end(key)
    if hit is not None:
        return hit
    cubin_path, meta_path = _paths(key)
    try:
        meta = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or len(cubin) != meta.get("cubin_bytes"):
        return None
    if hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        return None  # damaged in place (same length), or written without its checksum
    with _lock:
        _remember(key, (cubin, meta))
    return cubin, meta


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(key: str, cubin: bytes, meta: dict[str, Any]) -> None:
    meta = {**meta, "cubin_bytes": len(cubin), "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
    with _lock:
        _remember(key, (cubin, meta))
    cubin_path, meta_path = _paths(key)
    try:
        cubin_path.parent.mkdir(parents=True, exist_ok=True)
        # cubin first: an entry counts only once its json (written last) exists.
        _atomic_write(cubin_path, cubin)
        _atomic_write(meta_path, json.dumps(meta, sort_keys=True).encode())
    except OSError:
        pass  # a read-only or full cache disk costs recompiles, not failures


def clear_memory() -> None:
    """Forget the in-process entries (the disk cache stays)."""
    global _memory_bytes
    with _lock:
        _memory.clear()
        _memory_bytes = 0
