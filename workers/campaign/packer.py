"""Keep the campaign's archive current without stopping the GPU: a background thread rewrites
the archive whenever the campaign asks (after every phase and every sweep part), and the
measuring thread goes on meanwhile. A request that arrives while a pack is being written
makes the thread pack once more after it, so the last archive always holds the last
checkpoint; :meth:`Packer.flush` waits for that.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pipetune.workers.campaign import layout

# Packs in a row begun again because a part vanished under them (a sweep's parts merged).
MAX_REPACKS = 20


def _inside(filename: object, folder: Path) -> bool:
    """Whether an error's file name lies in the campaign's folder (a part of it)."""
    if not isinstance(filename, str | bytes | Path):
        return False
    try:
        return Path(os.fsdecode(filename)).resolve().is_relative_to(folder.resolve())
    except (OSError, ValueError):
        return False


class Packer:
    def __init__(self, folder: Path, archive: Path | None):
        self.folder, self.archive = folder, archive
        self.size: int | None = None
        self.error: str | None = None
        self._dirty = False
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="pipetune-pack", daemon=True)
        if archive is not None:
            self._thread.start()

    def request(self) -> None:
        if self.archive is None:
            return
        with self._cond:
            self._dirty = True
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until the archive holds everything written before this call."""
        if self.archive is None:
            return
        self.request()
        with self._cond:
            self._cond.wait_for(lambda: not self._dirty and not self._busy)

    def close(self, final: bool = True) -> None:
        """Stop the thread; ``final``: after packing everything written (without it, an
        archive that already exists, perhaps the --have itself, is left as it is)."""
        if final:
            self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        assert self.archive is not None
        repacks = 0  # in a row, for parts that vanished
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._dirty or self._closed)
                if self._closed and not self._dirty:
                    return
                self._dirty, self._busy = False, True
            try:
                self.size = layout.pack(self.folder, self.archive)
                self.error = None
                repacks = 0
            except FileNotFoundError as exc:
                # A part merged away while packing: pack again, a few times at most. Not the
                # archive's own folder gone (or one no file can be made in, as /proc): that
                # was packed again for ever, at 100% CPU, and the campaign never ended.
                if _inside(exc.filename, self.folder) and repacks < MAX_REPACKS:
                    repacks += 1
                    with self._cond:
                        self._dirty = True
                else:
                    self.error = f"could not write {self.archive}: {exc}"
            except OSError as exc:
                self.error = f"could not write {self.archive}: {exc}"
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
