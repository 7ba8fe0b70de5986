"""What a measurement of one schedule returns: the contract between runners, workers, the
service and the tuner (all of them import it from here)."""

from __future__ import annotations

import contextlib
import numbers
import os
import re
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

TrialStatus = Literal[
    "ok",
    "compile_error",
    "launch_error",
    "runtime_error",
    "wrong_result",
    "timeout",
]
FAILED_STATUSES: frozenset[str] = frozenset(get_args(TrialStatus)) - {"ok"}
# The failures a simulated runner records only when it rehearses a GPU's faults (its measuring
# child crashed or hung: workers/runners/faults.py): the rehearsal's, no evidence against the
# schedule (its launch errors, the model's rules, and a wrong result or compile error a worker
# reports are).
REHEARSED_STATUSES: frozenset[str] = frozenset({"runtime_error", "timeout"})


class RunnerKind(StrEnum):
    """What answers a trial: the runners' names (workers/runners implement one each).

    Declared here, with the result they return, because the wire schema (model/) must
    derive its enums from it and model/ imports nothing from workers/. A result's `runner`
    string may carry a suffix after a colon (a replayed result says `replay:<recorded
    runner>`); :meth:`of` reads the kind.
    """

    CUPY = "cupy"  # a real GPU, timed with CUDA events
    REPLAY = "replay"  # answers from a recorded dataset
    SIMULATED = "simulated"  # the analytical model plus stated noise: demos and CI only

    @classmethod
    def of(cls, runner: str | None) -> RunnerKind | None:
        """The kind of a result's or a worker's runner string (None if unknown)."""
        if not runner:
            return None
        try:
            return cls(runner.split(":", 1)[0])
        except ValueError:
            return None

    @property
    def adjective(self) -> str:
        """How its latencies are labelled wherever they are shown: measured, simulated or
        replayed."""
        return _ADJECTIVES[self]


def is_simulated(runner: str | None) -> bool:
    """Whether a result's runner string says its latency is the analytical model's: the
    simulated runner, a replay of a simulated sweep ("replay:simulated"), or a dataset of
    several runners one of which was simulated ("cupy,simulated": an export of a task that
    both kinds of worker measured)."""
    return RunnerKind.SIMULATED.value in re.split("[:,]", runner or "")


def runner_kind_shown(runner: str | None) -> str | None:
    """The kind a result's runner string is shown as: simulated wherever a simulated runner
    had a part in it (`is_simulated`: a replay of a simulated sweep is not "replayed", a
    dataset of cupy and simulated results not "measured"), else its own kind (None if
    unknown)."""
    if is_simulated(runner):
        return RunnerKind.SIMULATED.value
    kind = RunnerKind.of(runner)
    return None if kind is None else kind.value


# The runner strings of a latency measured on a GPU: the cupy runner's, or a replay of its
# recording. Anything else (simulated, several runners, none or an unknown one) cannot say
# that every latency it labels was measured, and teaches no learned prior.
MEASURED_RUNNERS = (RunnerKind.CUPY.value, f"{RunnerKind.REPLAY.value}:{RunnerKind.CUPY.value}")
# The runner strings of the simulated runner's own results: its own, or a replay of them.
SIMULATED_RUNNERS = (
    RunnerKind.SIMULATED.value,
    f"{RunnerKind.REPLAY.value}:{RunnerKind.SIMULATED.value}",
)


def is_measured(runner: str | None) -> bool:
    return runner in MEASURED_RUNNERS


def runner_label_problem(runner: str) -> str | None:
    """Why a dataset's runner label is not one pipetune writes (None if it is): runner
    strings (`kind` or `kind:recorded`) joined by commas, each kind a RunnerKind, or
    "unknown". A label such as "Simulated" would be read as measured."""
    for part in runner.split(","):
        if part != "unknown" and RunnerKind.of(part) is None:
            kinds = ", ".join(k.value for k in RunnerKind)
            return f"runner {runner!r}: {part!r} is none of {kinds} (or unknown)"
        if not RUNNER_PATTERN.fullmatch(part):
            return f"runner {runner!r}: {part!r} is not a runner's name"
    return None


_ADJECTIVES = {
    RunnerKind.CUPY: "measured",
    RunnerKind.REPLAY: "replayed",
    RunnerKind.SIMULATED: "simulated",
}


# What a kernel's time can be, in µs: from a nanosecond (no launch is shorter) to about
# three hours (a trial times out after seconds). Outside it a time is a worker's bug, and
# it would not stay harmless: its throughput overflows to infinity (or rounds to nothing),
# and a cost model fitted to it fails for every later lookup. Strict, as every number of the
# wire: JSON's true and "12" are a worker's mistake, not a time (true was stored as a 1 µs
# best); a JSON integer is a number and is taken (12 -> 12.0).
LATENCY_US_RANGE = (1e-3, 1e10)
KernelTimeUs = Annotated[
    float,
    Field(ge=LATENCY_US_RANGE[0], le=LATENCY_US_RANGE[1], allow_inf_nan=False, strict=True),
]
# The other measured numbers of a result (spread, compile time, error): strict the same way.
Measured = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
MAX_SAMPLES = 10_000  # timed repeats one result may carry
RUNNER_MAX_CHARS = 16  # "replay:simulated"; the trial row's column (service/orm.py)
# What a runner string may be: names, joined by a colon (a replay, and what it replays) or a
# comma (a dataset's label of several runners, which an imported record keeps). It is shown
# in tables and written into the comments of exported C headers: a worker's "cupy:*/\n#if 0"
# closed the header's comment and put a preprocessor line into every build that included it.
# Checked where a runner string comes in (a worker's result, a dataset's label), not on every
# MeasureResult: a trial stored before the rule is still read back.
RUNNER_PATTERN = re.compile(r"[A-Za-z0-9_.+-]+([:,][A-Za-z0-9_.+-]+)*")
# A generator revision is a small count of code changes; the bound refuses a value no column
# or dataset should carry (a timestamp or a hash sent by mistake).
MAX_GENERATOR_REVISION = 10_000
ERROR_MAX_CHARS = 8_000  # a log's head says what failed; the rest is cut (see _error_text)


def _utf8(value: str) -> bool:
    """Whether a string can be stored as text: JSON's \\ud800 escapes decode to lone
    surrogates, which no UTF-8 column (nor a JSON response) can hold."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_text(value: str) -> str:
    """`value` as any text column can hold it: NUL bytes (which PostgreSQL's text refuses)
    and lone surrogates (which no UTF-8 column holds) replaced by U+FFFD."""
    value = value.replace("\x00", "\ufffd")
    if not _utf8(value):
        # (UTF-16 carries a lone surrogate through; decoding it back replaces it.)
        value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def readable_os_text(value: str) -> str:
    """Text from the operating system (a file name, a command-line argument) as any text
    column and terminal can hold it: bytes that are not UTF-8, which Python decodes to lone
    surrogates, kept as backslash escapes (lat\\xe9.t4.json); the rest as storable_text."""
    # (A lone surrogate that no bytes decode to is not an escaped byte: storable_text
    # replaces it.)
    with contextlib.suppress(UnicodeEncodeError):
        value = os.fsencode(value).decode("utf-8", "backslashreplace")
    return storable_text(value)


def _whole_number(value: Any) -> Any:
    """A count as a whole number: JSON's 12.0, "12" and true are a worker's mistake, not a
    count (the rest of the wire is strict the same way); numpy's integers, which a compiler
    report parsed through arrays gives, are whole numbers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError("must be a whole number")
    return int(value)


# Registers and bytes of a kernel.
ByteCount = Annotated[int, Field(ge=0), BeforeValidator(_whole_number)]


class MeasureResult(BaseModel):
    """One schedule's measurement. latency_us is the median of the timed repeats."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: TrialStatus
    latency_us: KernelTimeUs | None = None
    samples_us: list[KernelTimeUs] = Field(default_factory=list, max_length=MAX_SAMPLES)
    # Spread of the repeats: (p90 - p10) / median; None when it was not recorded.
    spread: Measured | None = None
    registers: ByteCount | None = None
    spill_bytes: ByteCount | None = None
    smem_bytes: ByteCount | None = None
    compile_ms: Measured | None = None
    max_abs_error: Measured | None = None
    error: str | None = None
    runner: str | None = Field(default=None, max_length=RUNNER_MAX_CHARS)
    # The revision of the code generator that made the measured kernel (the workload's
    # line, model.family.GeneratorRevision): a runner that generates kernels says which;
    # None where none did (a simulated answer) or it was not recorded (revision 1 then).
    generator_revision: int | None = Field(
        default=None, ge=1, le=MAX_GENERATOR_REVISION, strict=True
    )

    @field_validator("error")
    @classmethod
    def _error_text(cls, value: str | None) -> str | None:
        # Free text from compilers and drivers: keep the result rather than refuse a
        # measurement over its log text. NUL bytes and lone surrogates (no database text
        # column can hold them) are replaced; a log longer than ERROR_MAX_CHARS keeps its
        # head, where compilers say what failed first.
        if value is None:
            return None
        value = storable_text(value)
        if len(value) > ERROR_MAX_CHARS:
            cut = len(value) - ERROR_MAX_CHARS
            value = f"{value[:ERROR_MAX_CHARS]}... [{cut} more characters cut]"
        return value

    @field_validator("runner")
    @classmethod
    def _runner_name(cls, value: str | None) -> str | None:
        # A name, not a log: refused rather than repaired (its length bound already refuses
        # lone surrogates, as "not a valid string").
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ok_latency_us(self) -> float | None:
        """The latency where the trial succeeded, else None: what a job row keeps, and what
        a best-so-far curve counts."""
        return self.latency_us if self.ok else None
