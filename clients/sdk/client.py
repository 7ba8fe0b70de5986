"""The user-facing SDK: best schedules, tuning tasks, their trials and curves.

>>> with Client("http://127.0.0.1:8000") as c:
...     task = c.tune({"op": "gemm", "m": 1024, "n": 64, "k": 2048}, "h100", budget=16)
...     done = c.wait(task.id, progress=lambda t: print(t.trials_done, "/", t.budget))
...     print(done.best)
"""

from __future__ import annotations

import json
import math
import numbers
import os
import reprlib
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar, get_args

import httpx
from pydantic import BaseModel, ValidationError

from pipetune.clients.sdk.errors import (
    TRANSIENT,
    InvalidArgumentError,
    ProtocolError,
    WaitTimeoutError,
    asked_wait_s,
)
from pipetune.clients.sdk.http import (
    DEFAULT_TIMEOUT_S,
    Http,
    argument_error,
    clean_msg,
    header_value_problem,
    server_problem,
    shown_value,
)
from pipetune.model.errors import InvalidArgumentTypeError
from pipetune.model.plain_numbers import plain
from pipetune.model.wire import (
    DEFAULT_PRIORITY,
    DEFAULT_STRATEGY,
    ID_MAX,
    MAX_TASK_PAGE,
    MAX_WORKER_PAGE,
    AggregateCurves,
    Curve,
    OpName,
    ScheduleResponse,
    StrategyName,
    TaskDoc,
    TaskList,
    TaskPrior,
    TaskState,
    TrialDoc,
    TrialList,
    TuneOptions,
    WorkerDoc,
    WorkerList,
    WorkerState,
)

_T = TypeVar("_T")
DEFAULT_SERVER = "http://127.0.0.1:8000"
SERVER_ENV = "PIPETUNE_SERVER"
API_KEY_ENV = "PIPETUNE_API_KEY"
# Client.wait looks again after a failed look (TRANSIENT) until failures in a row have lasted
# this long: a database failover or a service restart, not a service that is gone.
WAIT_THROUGH_S = 60.0
# The shortest time a look of Client.wait is given near its deadline (a request cut at a few
# milliseconds fails where the service answers at once).
MIN_LOOK_S = 1.0

WorkloadLike = Mapping[str, Any] | BaseModel


def default_server() -> str:
    return os.environ.get(SERVER_ENV) or DEFAULT_SERVER


def workload_body(workload: WorkloadLike) -> dict[str, Any]:
    if isinstance(workload, BaseModel):
        return workload.model_dump(mode="json")
    # Only a mapping: dict() of anything else fails with a message about "update sequence
    # elements", or turns a list of pairs into a workload nobody meant.
    if not isinstance(workload, Mapping):
        raise InvalidArgumentError(
            "workload",
            'must be a dict like {"op": "gemm", "m": 1024, "n": 64, "k": 2048} or a workload '
            f"object such as pipetune.Gemm(...), not {type(workload).__name__}",
        )
    body: dict[str, Any] = plain(dict(workload))  # NumPy sizes as numbers (JSON has no int64)
    for key, value in body.items():
        # What JSON cannot carry is the caller's mistake, named here: the request's encoder
        # raised a bare ValueError or TypeError ("Out of range float values are not JSON
        # compliant") that named no field and was no PipetuneError.
        if not isinstance(key, str):
            raise InvalidArgumentError(
                "workload", f"its keys are field names (text), got {shown_value(key)}"
            )
        if problem := _json_problem(value):
            raise InvalidArgumentError(key, problem)
    return body


def _json_problem(value: Any) -> str | None:
    """Why a workload field's value cannot be sent as JSON (None: it can)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        kind = type(value).__name__
        return f"must be a number, text or true/false, got {shown_value(value)} (a {kind})"
    return None


def gpu_text(argument: str, value: object) -> str:
    """A GPU name as the text a request carries, which the service judges; anything else is
    refused naming `argument` (JSON's encoder failed on it with a bare TypeError)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(
            argument, f"must be a GPU name such as 'h100', not {type(value).__name__}"
        )
    return value


def task_id_path(task_id: int) -> int:
    """`task_id` as the int that goes in a /v1/tasks/{id} path.

    int() would turn 5.99 into task 5 and True into task 1, acting on a task nobody named;
    the service's wire contract (RowRef, strict) refuses floats, strings and booleans in a
    body for the same reason. numpy integers are fine (numbers.Integral), bool is not."""
    return integer_argument("task_id", task_id, least=1, most=ID_MAX)


def integer_argument(argument: str, value: object, *, least: int, most: int) -> int:
    """`value` as an int in least..most (the service's bounds for it), else
    InvalidArgumentError naming `argument`, before any request: numpy integers are fine
    (numbers.Integral), bool, floats and strings are not (int() would act on a value nobody
    named: 5.99 as 5, True as 1)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InvalidArgumentError(
            argument, f"must be an integer, not {type(value).__name__} {reprlib.repr(value)}"
        )
    number = int(value)
    if not least <= number <= most:
        shown = shown_value(number)
        raise InvalidArgumentError(argument, f"must be {least}..{most}, got {shown}")
    return number


def _optional_integer(argument: str, value: object, *, least: int, most: int) -> int | None:
    return None if value is None else integer_argument(argument, value, least=least, most=most)


def choice_argument(argument: str, value: object, choices: tuple[str, ...]) -> str:
    """`value` if it is one of `choices` (the wire's vocabulary for it), else
    InvalidArgumentError naming `argument`, before any request (sent, it came back as the
    service's 422, an ApiError and no ValueError, unlike a bad limit beside it)."""
    if isinstance(value, str) and value in choices:
        return str(value)  # (a StrEnum member as its value)
    raise InvalidArgumentError(
        argument, f"must be one of {', '.join(choices)}, got {shown_value(value)}"
    )


def gpu_argument(argument: str, value: object) -> str:
    """The registry key of the GPU `value` names (any of its names), else InvalidArgumentError
    naming `argument` with the known GPUs. Resolved as the wire contract resolves every GPU
    name (a task's prior_gpu here: the SDK imports nothing of pipetune's but model.wire)."""
    value = gpu_text(argument, value)
    try:
        return str(TuneOptions.model_validate({"prior_gpu": value}).prior_gpu)
    except ValidationError as exc:
        raise InvalidArgumentError(argument, clean_msg(exc.errors()[0]["msg"])) from None


def _optional(check: Callable[..., str], argument: str, value: object, *args: Any) -> str | None:
    return None if value is None else check(argument, value, *args)


def _values(choices: Any) -> tuple[str, ...]:
    return tuple(choice.value for choice in choices)


# The wire contract's vocabularies (those of TaskDoc.state and WorkerDoc.state, which read a
# newer service's further states as their text: model.wire.Open).
TASK_STATES: tuple[str, ...] = _values(TaskState)
WORKER_STATES: tuple[str, ...] = _values(WorkerState)
OP_NAMES: tuple[str, ...] = _values(OpName)
STRATEGY_NAMES: tuple[str, ...] = get_args(StrategyName)


def seconds_problem(value: object, *, zero_ok: bool = False) -> str | None:
    """Why `value` cannot be a duration in seconds, None if it can: a real number (bool is
    not one, nor is a string), finite, above 0 (or 0 itself where `zero_ok`).

    Checked where the argument is given, so that the error names it: past that point a bad
    timeout surfaces at the first request as socket's bare "Timeout value out of range", a
    TypeError, or (0) as every request timing out, which reads as an unreachable service."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return f"must be a number of seconds, not {type(value).__name__} {reprlib.repr(value)}"
    try:
        seconds = float(value)
    except OverflowError:  # an int past float's range (too long even to print whole)
        return "must be a finite number of seconds, not an integer this large"
    if not math.isfinite(seconds):
        return f"must be a finite number of seconds, not {seconds!r}"
    if seconds < 0 or (seconds == 0 and not zero_ok):
        least = "0 or more" if zero_ok else "more than 0"
        return f"must be {least} seconds, got {value!r}"
    return None


def seconds_argument(argument: str, value: object, *, zero_ok: bool = False) -> float:
    """`value` as float seconds, or InvalidArgumentError naming `argument` (seconds_problem)."""
    if problem := seconds_problem(value, zero_ok=zero_ok):
        raise InvalidArgumentError(argument, problem)
    return float(value)  # type: ignore[arg-type]  # a real number: seconds_problem


def _pause(poll_s: float, deadline: float | None, asked_s: float | None = None) -> float:
    """How long Client.wait sleeps before its next look: `poll_s`, or longer where the last
    answer asked for it (a 503's or 429's Retry-After: looking every second through a
    rate limit or an outage adds to it), but never past its deadline (a poll_s longer than
    timeout_s would otherwise give up poll_s late)."""
    pause = poll_s if asked_s is None else max(poll_s, asked_s)
    if deadline is None:
        return pause
    return max(0.0, min(pause, deadline - time.monotonic()))


class Outage:
    """Looks at the service for a wait that rides out failures for the moment (TRANSIENT: a
    database failover is a 503 "retry shortly", a restart refuses connections), not a
    service that is gone: `look(call)` calls again, after `poll_s` or the answer's
    Retry-After, until one succeeds; it raises the last error once failures in a row have
    lasted WAIT_THROUGH_S, or the deadline has passed."""

    def __init__(self, poll_s: float, deadline: float | None):
        self.poll_s = poll_s
        self.deadline = deadline

    def look(self, call: Callable[[], _T]) -> _T:
        since: float | None = None
        while True:
            try:
                return call()
            except TRANSIENT as exc:
                now = time.monotonic()
                since = now if since is None else since
                past_deadline = self.deadline is not None and now >= self.deadline
                if past_deadline or now - since >= WAIT_THROUGH_S:
                    raise
                time.sleep(_pause(self.poll_s, self.deadline, asked_wait_s(exc)))


def _options_body(options: TuneOptions | Mapping[str, Any]) -> dict[str, Any]:
    """A task's options as sent: those left out (None) are not sent, nor the default
    priority: a service that predates the field refuses any unknown one (422), even at the
    value it would have used. A dict is validated first (ArgumentError names the field)."""
    if not isinstance(options, TuneOptions):
        if not isinstance(options, Mapping):
            raise InvalidArgumentTypeError(
                "tune",
                f"must be a dict of task options or a TuneOptions, not {type(options).__name__}",
            )
        try:
            options = TuneOptions.model_validate(plain(dict(options)))
        except ValidationError as exc:
            raise argument_error(exc) from None
    body = options.model_dump(mode="json", exclude_none=True)
    if body.get("priority") == DEFAULT_PRIORITY:
        del body["priority"]
    return body


def _task_body(
    workload: WorkloadLike,
    gpu: str,
    *,
    budget: int,
    strategy: StrategyName,
    seed: int,
    prior_task: int | None,
    prior_gpu: str | None,
    learned_prior: bool | None,
    batch_size: int | None,
    runner: str | None,
    priority: int,
) -> dict[str, Any]:
    """A task's body (TaskCreate) as `Client.tune` sends it."""
    # Checked here, before any request (TuneOptions is the options' wire model, as in
    # schedule_and_tune): a budget of 0 is the caller's mistake whether or not the
    # service can be reached. The workload and the GPU are the service's to judge.
    try:
        options = TuneOptions.model_validate(
            plain(  # NumPy integers are the numbers they hold, as the workload's sizes
                {
                    "budget": budget,
                    "strategy": strategy,
                    "seed": seed,
                    "prior_task": prior_task,
                    "prior_gpu": prior_gpu,
                    "learned_prior": learned_prior,
                    "batch_size": batch_size,
                    "runner": runner,
                    "priority": priority,
                }
            )
        )
    except ValidationError as exc:
        raise argument_error(exc) from None
    return {
        "workload": workload_body(workload),
        "gpu": gpu_text("gpu", gpu),
        **_options_body(options),
    }


class Client:
    """A pipetune service. `token` is sent as `Authorization: Bearer` (as `X-API-Key` where
    the URL holds a user and password, a proxy's basic auth, which httpx sends as the
    Authorization header), `api_key` as `X-API-Key` (either satisfies a service started with
    PIPETUNE_API_KEYS).

    One Client may be shared between threads: it is an httpx.Client (whose connection pool
    is thread-safe) and settings that never change. Close it once, after the last call."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        # A credential that cannot be a header value (a trailing newline from a file, say)
        # would fail on the first call inside httpx, with the secret in the message; refuse
        # it here, naming the argument and never the value. Empty means "none", as before.
        for argument, value in (("token", token), ("api_key", api_key)):
            if value and (problem := header_value_problem(value)):
                raise InvalidArgumentError(argument, problem)
        timeout_s = seconds_argument("timeout_s", timeout_s)
        # A URL that is none (no scheme, no host) is the caller's mistake, not a service that
        # is down: refused here, naming where it came from, rather than "cannot reach" at the
        # first call. (Empty or None: PIPETUNE_SERVER, else the default, as before.)
        server = base_url or default_server()
        if problem := server_problem(server):
            raise InvalidArgumentError("base_url" if base_url else SERVER_ENV, problem)
        headers: dict[str, str] = {}
        if token and httpx.URL(server).userinfo and not api_key:
            # (httpx sends a URL's user and password, a proxy's basic auth, as Authorization:
            # the bearer token was replaced, and the service answered 401.)
            headers["X-API-Key"] = token
        elif token:
            headers["Authorization"] = f"Bearer {token}"
        if api_key:
            headers["X-API-Key"] = api_key
        self._http = Http(server, headers, timeout_s, transport)
        self._timeout_s = timeout_s

    @property
    def base_url(self) -> str:
        return self._http.base_url

    # ---- schedules and tasks -----------------------------------------------------------

    def best_schedule(self, workload: WorkloadLike, gpu: str) -> ScheduleResponse:
        """The best measured schedule of this workload on this GPU, else the model's pick."""
        body = {"workload": workload_body(workload), "gpu": gpu_text("gpu", gpu)}
        return self._http.call(ScheduleResponse, "POST", "/v1/schedules", json=body)

    def schedule_and_tune(
        self, workload: WorkloadLike, gpu: str, tune: TuneOptions | Mapping[str, Any]
    ) -> ScheduleResponse:
        """The best known schedule now, and a tuning task started (task_id, url)."""
        body = {
            "workload": workload_body(workload),
            "gpu": gpu_text("gpu", gpu),
            "tune": _options_body(tune),
        }
        # (It starts a task: sent again, another one, as tune.)
        return self._http.call(ScheduleResponse, "POST", "/v1/schedules", json=body, acts_anew=True)

    def tune(
        self,
        workload: WorkloadLike,
        gpu: str,
        budget: int = 50,
        strategy: StrategyName = DEFAULT_STRATEGY,
        seed: int = 0,
        prior_task: int | None = None,
        prior_gpu: str | None = None,
        learned_prior: bool | None = None,
        batch_size: int | None = None,
        runner: str | None = None,
        priority: int = DEFAULT_PRIORITY,
    ) -> TaskDoc:
        """Start a tuning task (POST /v1/tasks); returns at once with the queued task.
        prior_task: a finished task of the same workload on another GPU (or of its twin in the
        other element type, float16 or bfloat16, on any GPU) whose trials warm-start the search;
        prior_gpu: instead, such a task of this workload on that GPU (one of the newest generator
        revision, the most successful trials of those); learned_prior: instead, a cost model of
        every finished task of the kernel family measured on a GPU (the task's learned_from says
        which); None: the
        kernel family's choice (tensor-core GEMMs and memory-intensive operators learn where such
        tasks of 8 or more shapes exist), False: never.
        batch_size: trials per proposal round (None: the service's; 1 where one GPU serves the
        task). runner: only workers of that runner measure it ("cupy": GPU measurements only;
        None: any worker of the GPU). priority: its share of the GPU's workers while other
        tasks wait for them too (1..10: p trials to a priority-1 task's one)."""
        body = _task_body(
            workload,
            gpu,
            budget=budget,
            strategy=strategy,
            seed=seed,
            prior_task=prior_task,
            prior_gpu=prior_gpu,
            learned_prior=learned_prior,
            batch_size=batch_size,
            runner=runner,
            priority=priority,
        )
        # (Sent again, it makes another task: an answer lost on its way back says so.)
        return self._http.call(TaskDoc, "POST", "/v1/tasks", json=body, acts_anew=True)

    def task_prior(
        self,
        workload: WorkloadLike,
        gpu: str,
        budget: int = 50,
        strategy: StrategyName = DEFAULT_STRATEGY,
        seed: int = 0,
        prior_task: int | None = None,
        prior_gpu: str | None = None,
        learned_prior: bool | None = None,
        batch_size: int | None = None,
        runner: str | None = None,
        priority: int = DEFAULT_PRIORITY,
    ) -> TaskPrior:
        """The prior `tune` with these arguments would start its task from now, creating
        nothing (POST /v1/tasks/prior): its `prior_task` (prior_gpu resolved to the task it
        names) or the tasks it would learn from (`learned_from`); both None: cold. A prior
        that cannot be one is the InvalidRequestError (422) `tune` would raise, naming the
        prior's field. A service that predates the route answers 404 or 405 (ApiError)."""
        body = _task_body(
            workload,
            gpu,
            budget=budget,
            strategy=strategy,
            seed=seed,
            prior_task=prior_task,
            prior_gpu=prior_gpu,
            learned_prior=learned_prior,
            batch_size=batch_size,
            runner=runner,
            priority=priority,
        )
        return self._http.call(TaskPrior, "POST", "/v1/tasks/prior", json=body)

    def task(self, task_id: int) -> TaskDoc:
        return self._task(task_id)

    def _task(self, task_id: int, timeout_s: float | None = None) -> TaskDoc:
        path = f"/v1/tasks/{task_id_path(task_id)}"
        return self._http.call(TaskDoc, "GET", path, timeout_s=timeout_s)

    def tasks(
        self,
        state: str | None = None,
        *,
        limit: int | None = None,
        offset: int | None = None,
        before: int | None = None,
    ) -> list[TaskDoc]:
        """Tasks, newest first (`state`: only those in that state); one page of `limit`
        (the service's default 100) after skipping `offset`; `before`: only tasks with ids
        below it (the last id of the page before: the next page, however many tasks were
        created meanwhile)."""
        params = {
            "state": _optional(choice_argument, "state", state, TASK_STATES),
            "limit": _optional_integer("limit", limit, least=1, most=MAX_TASK_PAGE),
            "offset": _optional_integer("offset", offset, least=0, most=ID_MAX),
            "before": _optional_integer("before", before, least=1, most=ID_MAX),
        }
        return self._http.call(TaskList, "GET", "/v1/tasks", params=params).tasks

    def cancel(self, task_id: int) -> TaskDoc:
        """Cancel a task (409 ConflictError if it already finished); the cancelled task."""
        return self._http.call(TaskDoc, "DELETE", f"/v1/tasks/{task_id_path(task_id)}")

    def trials(
        self, task_id: int, after: int | None = None, samples: bool = False
    ) -> list[TrialDoc]:
        """One page of the task's trials in proposal order; `after=N`: those after trial N
        (for following a running task); `samples`: with each trial's timed repeats."""
        params: dict[str, Any] = {"after": _optional_integer("after", after, least=-1, most=ID_MAX)}
        if samples:  # (sent only when asked: a service before it had no such parameter)
            params["samples"] = "true"
        return self._http.call(
            TrialList, "GET", f"/v1/tasks/{task_id_path(task_id)}/trials", params=params
        ).trials

    def all_trials(self, task_id: int, samples: bool = False) -> list[TrialDoc]:
        """Every trial of a task, page after page; `samples`: with their timed repeats."""
        trials: list[TrialDoc] = []
        while True:
            page = self.trials(task_id, after=trials[-1].trial if trials else None, samples=samples)
            if not page:
                return trials
            trials.extend(page)

    def curve(self, task_id: int) -> Curve:
        """Best-so-far latency and throughput (TFLOP/s; GB/s for memory-intensive operators)
        after each trial of one task."""
        return self._http.call(Curve, "GET", f"/v1/tasks/{task_id_path(task_id)}/curve")

    def curves(
        self, gpu: str | None = None, op: str | None = None, strategy: str | None = None
    ) -> AggregateCurves:
        """Best-in-k-trials per strategy over the finished tasks (ALCOP Fig. 13 view)."""
        # Checked here as limit is: a name the service does not know came back as its 422.
        params = {
            "gpu": _optional(gpu_argument, "gpu", gpu),
            "op": _optional(choice_argument, "op", op, OP_NAMES),
            "strategy": _optional(choice_argument, "strategy", strategy, STRATEGY_NAMES),
        }
        return self._http.call(AggregateCurves, "GET", "/v1/curves", params=params)

    def wait(
        self,
        task_id: int,
        progress: Callable[[TaskDoc], None] | None = None,
        *,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> TaskDoc:
        """Poll a task until it is done, failed or cancelled (a state a newer service added,
        read as its text, is waited through as a running task's); call `progress` with every
        document that differs from the last one (and with the final one). `timeout_s`: give
        up (WaitTimeoutError) after that long, 0 after one look; None: never. A look that
        fails for the moment (TRANSIENT) is retried, after the answer's Retry-After where it
        asks for longer than `poll_s` (up to MAX_RETRY_AFTER_S); one that still fails at the
        deadline raises its own error (the service out of reach says why, not "still
        running"). A look is given no more than the time left (at least MIN_LOOK_S) to
        connect and for each read: a service that does not answer gives up at the deadline,
        though one that trickles its answer a byte at a time can hold a look longer."""
        # Checked before the first request: later, a bad poll_s fails in time.sleep with
        # its own words (or 0 polls the service flat out), and a NaN timeout never expires.
        poll_s = seconds_argument("poll_s", poll_s)
        if progress is not None and not callable(progress):  # (else a TypeError mid-wait)
            raise InvalidArgumentTypeError(
                "progress", f"must be a callable progress(task), not {type(progress).__name__}"
            )
        if timeout_s is not None:
            timeout_s = seconds_argument("timeout_s", timeout_s, zero_ok=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last: TaskDoc | None = None
        outage = Outage(poll_s, deadline)

        def look() -> TaskDoc:
            # No look waits past the deadline for a read (a service that does not answer held
            # a 5 s wait for the client's whole timeout, and more), but the first is whole.
            left = None if deadline is None else deadline - time.monotonic()
            if left is None or (left <= 0 and last is None):
                return self._task(task_id)
            return self._task(task_id, timeout_s=min(self._timeout_s, max(left, MIN_LOOK_S)))

        while True:
            doc = outage.look(look)  # (past the deadline, the last look's error says why)
            if progress is not None and (last is None or doc != last):
                progress(doc)
            last = doc
            # (A state a newer service added, which this client does not know, is not one
            # it knows to be final: the wait goes on, its progress showing the state.)
            if doc.is_finished():
                return doc
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(task_id, timeout_s or 0.0, doc.state)
            time.sleep(_pause(poll_s, deadline))

    def workers(self, state: str | None = None, *, limit: int | None = None) -> list[WorkerDoc]:
        """The registered workers (name, GPU, arch, runner, last heartbeat, state), most
        recent heartbeat first: those in `state` only (live, silent or exited), up to
        `limit` (the service's default 200)."""
        return self.worker_list(state, limit=limit).workers

    def worker_list(self, state: str | None = None, *, limit: int | None = None) -> WorkerList:
        """`workers`, with how many registered workers are in each state (`counts`)."""
        params = {
            "state": _optional(choice_argument, "state", state, WORKER_STATES),
            "limit": _optional_integer("limit", limit, least=1, most=MAX_WORKER_PAGE),
        }
        return self._http.call(WorkerList, "GET", "/v1/workers", params=params)

    def healthz(self) -> dict[str, Any]:
        response = self._http.request("GET", "/healthz")
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):  # (as every other call: not the service's answer)
            shown = reprlib.repr(response.text)
            raise ProtocolError(f"GET /healthz: the answer is not a JSON object: {shown}")
        return doc

    # ---- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
