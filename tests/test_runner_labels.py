"""What a runner string says about a latency: simulated (labelled so wherever shown) and
measured (the only kind a learned prior reads), for every label pipetune writes."""

from __future__ import annotations

import pytest

from pipetune.model.trials import is_measured, is_simulated, runner_label_problem


@pytest.mark.parametrize(
    ("runner", "simulated", "measured"),
    [
        ("cupy", False, True),
        ("replay:cupy", False, True),
        ("simulated", True, False),
        ("replay:simulated", True, False),
        # An export of a task that simulated and GPU workers both measured: it was read as
        # measured, and a re-import taught learned priors.
        ("cupy,simulated", True, False),
        ("simulated,cupy", True, False),
        # An export of a task with no runner, re-imported: it counted as measured.
        ("unknown", False, False),
        ("replay:unknown", False, False),
        (None, False, False),
    ],
)
def test_what_a_runner_string_says(runner, simulated, measured):
    assert is_simulated(runner) is simulated
    assert is_measured(runner) is measured


def test_the_labels_pipetune_writes_are_known_and_others_are_not():
    for label in ("cupy", "replay:cupy", "cupy,simulated", "unknown", "replay:unknown"):
        assert runner_label_problem(label) is None, label
    assert "'Simulated' is none of" in (runner_label_problem("Simulated") or "")
    # A dataset's label is written into exported headers' comments and shown in tables: one
    # that could end a comment or a line is not a runner's name (its kind alone passed).
    assert "'cupy:*/' is not a runner's name" in (runner_label_problem("cupy:*/,cupy") or "")
    assert "is not a runner's name" in (runner_label_problem("cupy:a b") or "")


def test_a_runner_stored_before_the_names_rule_still_reads_back():
    """The rule is checked where a runner string comes in (a worker's result, a dataset's
    label): checked on every MeasureResult, a trial stored before it made `export --task`
    and the task's own advance fail on reading the row back."""
    from pipetune.model.trials import MeasureResult
    from pipetune.service.errors import InputError
    from pipetune.service.queue import check_storable

    stored = MeasureResult(status="ok", latency_us=10.0, runner="cupy:a b")
    assert stored.runner == "cupy:a b"
    with pytest.raises(InputError, match="must be runner names"):
        check_storable(stored, ["result"])
