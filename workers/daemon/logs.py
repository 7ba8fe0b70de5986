"""The worker's log: one line per event (one per trial), for people or, with --json-logs,
one JSON object per line for machines. Lines are written whole under a lock, since the
measuring, reporting and heartbeat threads all log."""

from __future__ import annotations

import json
import sys
import threading
from datetime import UTC, datetime
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")


def _human(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    text = str(value)
    if not text or any(c in text for c in ' "\\') or _has_control(text):
        # Quoted as a JSON string: a compiler's log (NVRTC's, many lines) kept the trial's
        # line one line, and a quote in it cannot end the value early.
        return _quoted(text)
    return text


def _quoted(text: str) -> str:
    """`text` as a JSON string, the line breaks JSON leaves as they are escaped too."""
    quoted = json.dumps(text, ensure_ascii=False)
    return quoted.translate({ord(c): f"\\u{ord(c):04x}" for c in _LINE_BREAKS})


# What ends a line to a reader besides the C0 controls: NEL and Unicode's line and paragraph
# separators (str.splitlines splits at them).
_LINE_BREAKS = frozenset("\x85\u2028\u2029")


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 or c in _LINE_BREAKS for c in text)


def _message(text: str) -> str:
    """A free-text message on the line's end, its newlines and other control characters
    escaped (the line stays one line)."""
    return _quoted(text)[1:-1] if _has_control(text) else text


class EventLog:
    def __init__(self, json_lines: bool = False, stream: TextIO | None = None, debug: bool = False):
        self.json_lines = json_lines
        self._stream = stream
        self._min = 0 if debug else 1
        # Reentrant: a line logged while another is being written on the same thread (a
        # signal arriving mid-write) must not deadlock.
        self._lock = threading.RLock()
        self.lost = 0  # lines that could not be written

    def event(self, event: str, level: str = "info", **fields: Any) -> None:
        if LEVELS.index(level) < self._min:
            return
        now = datetime.now(UTC)
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.json_lines:
            line = json.dumps(
                {"ts": now.isoformat(timespec="milliseconds"), "level": level, "event": event}
                | fields,
                default=str,
            )
        else:
            message = fields.pop("msg", None)
            parts = [now.strftime("%H:%M:%S"), f"{level.upper():7}", event]
            parts += [f"{k}={_human(v)}" for k, v in fields.items()]
            if message:
                parts.append(f"- {_message(str(message))}")
            line = " ".join(parts)
        stream = self._stream or sys.stdout
        with self._lock:
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):
                # A log that can no longer be written (a closed pipe: `| head`, a restarted
                # journal) must not stop the work it describes: raised here it left a
                # measured result unreported and its slot taken, and the heartbeats kept
                # the other leases alive for ever. As logging.Handler.handleError does.
                self.lost += 1

    def info(self, event: str, **fields: Any) -> None:
        self.event(event, "info", **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.event(event, "warning", **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.event(event, "error", **fields)


class Throttle:
    """Says yes at most once per `every_s` seconds per key: a service that is down for a
    minute should give a few log lines, not one per retry."""

    def __init__(self, every_s: float = 30.0):
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str, now: float) -> bool:
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every_s:
                return False
            self._last[key] = now
            return True
