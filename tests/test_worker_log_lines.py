"""The worker's human log is one line per event (README: "one line per trial"): a compile
error's log (NVRTC's, many lines) was written raw in `error="..."`, each of its lines a line
of the log, and a quote in it ended the value early."""

from __future__ import annotations

import io
import json

from pipetune.workers.daemon.logs import EventLog


def test_a_multi_line_value_stays_on_its_trials_line():
    stream = io.StringIO()
    log = EventLog(stream=stream)
    error = 'NVRTC could not compile k.cu for sm_90:\nk.cu(3): error: "x" undefined\n'
    log.event("trial", job=29, status="compile_error", error=error, msg="first\nsecond")
    (line,) = stream.getvalue().splitlines()
    value = line.split("error=", 1)[1].split(" - ", 1)[0]
    assert json.loads(value) == error  # quoted as a JSON string, whole
    assert line.endswith("- first\\nsecond")


def test_plain_values_are_written_as_they_were():
    stream = io.StringIO()
    EventLog(stream=stream).event("trial", job=1, schedule="s-1-2", runner="simulated", label="a b")
    line = stream.getvalue()
    assert 'job=1 schedule=s-1-2 runner=simulated label="a b"' in line


def test_unicode_line_separators_are_escaped_too():
    """U+2028, U+2029 and NEL end a line for str.splitlines (and journald's readers): a
    compiler message holding one split its event in two."""
    stream = io.StringIO()
    EventLog(stream=stream).event("trial", error="a\u2028b\x85c", msg="d\u2029e")
    (line,) = stream.getvalue().splitlines()
    assert "\\u2028" in line and "\\u0085" in line and "\\u2029" in line
    assert json.loads(line.split("error=", 1)[1].split(" - ", 1)[0]) == "a\u2028b\x85c"
