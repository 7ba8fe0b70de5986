"""`pipetune tune-model`: tune every distinct operator of a network through the service
and report the modelled end-to-end gain of tuning (ALCOP Table 3's view, for each kernel
family) and how the network's time splits between the families.

Each operator belongs to a kernel family (model/family.py): tensor-core GEMMs (GEMM, BMM,
Conv2D) or memory-intensive operators (softmax, layer norm, bias + GELU). Per distinct
shape: the tuned latency is the task's best trial, its throughput in the family's unit
(TFLOP/s, GB/s). The baseline is the family's fixed schedule set (``family.baseline``: the
non-pipelined schedules, smem_stages = 1 and reg_stages = 1, for GEMMs; one row per block
for memory-intensive operators): the best such trial of that task when the tuner measured
one, else the analytical model's best prediction among them; each row says which. End to
end, per family and over all operators: Σ count·baseline / Σ count·tuned over the layers
that have both. Each family's share of the network's time is its Σ count·tuned over all
the layers' Σ count·tuned (the same latencies as the rows).

Whether the latencies are measurements depends on the runners that produced them: each
trial records its runner (cupy measures, simulated is the analytical model plus noise,
replay answers from a recorded dataset, and a replay of a simulated sweep is simulated);
a trial that records none is told by its worker's entry in the service's worker list.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from pipetune.clients.cli.output import format_rate
from pipetune.clients.sdk import ApiError, Client, PipetuneError
from pipetune.clients.sdk.client import Outage
from pipetune.model.family import KernelFamily, family_for_op, family_names, family_of
from pipetune.model.hardware import HardwareError, get_gpu, resolve_gpu_key
from pipetune.model.networks import DistinctShape, Network
from pipetune.model.states import TaskState
from pipetune.model.trials import RunnerKind, is_measured, runner_kind_shown
from pipetune.model.wire import DEFAULT_PRIORITY, ScheduleDoc, StrategyName, TaskDoc, TrialDoc
from pipetune.model.workloads import DTYPE_SHORT, WorkloadError

RUNNER_MEANING = {
    RunnerKind.CUPY: "measured on GPUs (cupy workers)",
    RunnerKind.SIMULATED: "simulated (analytical model + noise, not measurements)",
    RunnerKind.REPLAY: "replayed from recorded datasets",
}


def baseline_of(workload: Any, gpu: str, schedules: list[ScheduleDoc]) -> tuple[str, np.ndarray]:
    """The family's baseline label and, per schedule, whether it is a baseline schedule.
    Asked of the family (not by knob names here) so that a family's baseline rule lives in
    one place; the space holds exactly these schedules, valid or not."""
    fam = family_of(workload)
    space = fam.space_of(workload, get_gpu(gpu), fam.knob_arrays(schedules))
    label, mask = fam.baseline(space)
    return label, np.asarray(mask, dtype=bool)


@dataclass
class LayerResult:
    shape: DistinctShape
    task: TaskDoc
    trials: list[TrialDoc]
    model_baseline_us: float | None
    runners: set[str]

    @property
    def family(self) -> KernelFamily:
        return family_of(self.shape.workload)

    @property
    def baseline_label(self) -> str:
        """What the baseline is: "non-pipelined", "one row per block", ..."""
        return baseline_of(self.shape.workload, self.task.gpu, [])[0]

    @property
    def tuned_us(self) -> float | None:
        return self.task.best.latency_us if self.task.best else None

    def tuned_throughput(self) -> float | None:
        """The tuned latency as throughput in the family's unit (TFLOP/s, GB/s)."""
        tuned = self.tuned_us
        return self.family.throughput_of(self.shape.workload, tuned) if tuned else None

    def baseline_trial_us(self) -> float | None:
        """The best successful trial among the family's baseline schedules."""
        ok = [t for t in self.trials if t.status == "ok" and t.latency_us is not None]
        if not ok:
            return None
        _, mask = baseline_of(self.shape.workload, self.task.gpu, [t.schedule for t in ok])
        values = [t.latency_us for t, is_base in zip(ok, mask, strict=True) if is_base]
        return min(v for v in values if v is not None) if values else None

    def baseline(self) -> tuple[float | None, str]:
        measured = self.baseline_trial_us()
        if measured is not None:
            return measured, "trials"
        return self.model_baseline_us, "model"

    def speedup(self) -> float | None:
        base, _ = self.baseline()
        tuned = self.tuned_us
        return base / tuned if base and tuned else None


def model_baseline_us(workload: Any, gpu: str) -> float | None:
    """The analytical model's best prediction among the family's baseline schedules (the
    non-pipelined ones for GEMMs, one row per block for memory-intensive operators)."""
    fam = family_of(workload)
    space = fam.enumerate(workload, get_gpu(gpu))
    if not len(space):
        return None
    _, mask = fam.baseline(space)
    if not mask.any():
        return None
    return float(np.min(fam.evaluate(space).latency_us[mask]))


def prior_gpu_problem(prior_gpu: str, gpu: str, strategy: str) -> str | None:
    """Why no shape's task could warm-start from `prior_gpu` (one line), or None. The
    service refuses each of these for every shape alike, so they are caught before any task
    is created: only a shape that has no finished task on that GPU starts cold (`launch`)."""
    try:
        key = resolve_gpu_key(prior_gpu)
    except HardwareError as exc:
        return str(exc)
    if key == resolve_gpu_key(gpu):
        return (
            f"{key} is the GPU being tuned (--gpu): a prior is the same workload measured "
            "on another GPU"
        )
    # The tuner's registry (loaded only when a prior is asked for) says which strategies
    # take one, as the service's check does.
    from pipetune.tuner.strategies import STRATEGY_MAP

    spec = STRATEGY_MAP.get(strategy)
    if spec is not None and not spec.uses_prior:
        takes = ", ".join(name for name, s in STRATEGY_MAP.items() if s.uses_prior)
        return f"strategy '{strategy}' takes no prior (these do: {takes})"
    return None


# What --resume follows again: a task that is still tuning or has finished its budget. A
# failed or cancelled one is tuned anew, as a first run would.
RESUMABLE_STATES = frozenset({TaskState.QUEUED, TaskState.RUNNING, TaskState.DONE})


def _workload_key(workload: dict[str, Any]) -> str:
    return json.dumps(workload, sort_keys=True)


@dataclass(frozen=True)
class PriorAsked:
    """The prior a run of tune-model asks for (`prior_gpu`, a GPU key, and `learned_prior`, as
    `launch` takes them), and whether a task was made with it: --resume follows a task tuned
    from another prior (another GPU's task, a learned model, none where one is asked for) no
    more than one of another budget: it is another run's, and this run queues its own."""

    prior_gpu: str | None = None
    learned_prior: bool | None = None

    @property
    def explicit(self) -> bool:
        return self.prior_gpu is not None or self.learned_prior is True

    def fits(self, task: TaskDoc, prior_task_gpu: str | None) -> bool | None:
        """Whether `task` was made with this prior (`prior_task_gpu`: the GPU of its prior
        task, where it has one). None for a task that started cold though this run asks for
        a prior: this run's where the shape has no prior to start from now, as the run would
        then start it cold too (the service says: `resumable_tasks`)."""
        learned = task.learned_from is not None
        if task.prior_task is not None:
            return self.prior_gpu is not None and prior_task_gpu == self.prior_gpu
        if self.prior_gpu is not None:
            # Cold there, learning or not as the learned prior was asked (launch's `without`).
            return None if not (learned and self.learned_prior is False) else False
        if self.learned_prior is True:
            return True if learned else None
        if self.learned_prior is False:
            return not learned
        return True  # (each family's choice: learned or not)

    def warm_starts(self, listed: TaskDoc, shapes: list[DistinctShape], gpu: str) -> set[int]:
        """The shapes (their indices) a listed task gives the prior asked for, as the service
        picks it, roughly: with prior_gpu, a finished task of the shape on that GPU with a
        successful trial; with learned_prior, such a task of the shape's family measured on a
        GPU (its best trial; the service reads every one), other than the shape itself on
        `gpu`. Only for a service that predates POST /v1/tasks/prior (`service_prior`), which
        answers exactly: where this guess and the service's choice differ, a resume queued a
        task the service then started cold again, beside the cold one it left."""
        if not self.explicit or not listed.is_finished():
            return set()
        if listed.trials_done - listed.trials_failed <= 0:
            return set()
        key = _workload_key(listed.workload)
        if self.prior_gpu is not None:
            if listed.gpu != self.prior_gpu:
                return set()
            return {i for i, s in enumerate(shapes) if _workload_key(s.workload.canonical()) == key}
        if listed.best is None or not is_measured(listed.best.runner):
            return set()
        try:
            family = family_for_op(listed.workload.get("op"))
        except WorkloadError:  # (an operator this client does not know)
            return set()
        return {
            i
            for i, s in enumerate(shapes)
            if family_of(s.workload) is family
            and not (listed.gpu == gpu and _workload_key(s.workload.canonical()) == key)
        }


def resumable_tasks(
    client: Client,
    shapes: list[DistinctShape],
    gpu: str,
    budget: int,
    strategy: str,
    seed: int,
    batch_size: int | None = None,
    prior_gpu: str | None = None,
    learned_prior: bool | None = None,
) -> dict[int, TaskDoc]:
    """`--resume`: per shape (by its index in `shapes`), the newest task an earlier run left
    at the service for the same workload, GPU, strategy, budget and seed (and batch size, where
    one is given), queued, running or done, made with the prior this run asks for (`prior_gpu`,
    `learned_prior` as `launch` takes them: `PriorAsked`). Imported tasks were never tuned and
    are not followed. The service's task list is read newest first, page by page, until every
    shape has its task or the list ends: to its end where a task that started cold though a
    prior is asked for waits on whether its shape has a prior now, which the service says
    (`service_prior`; from the list itself, `PriorAsked.warm_starts`, where it predates
    that)."""
    tuned_gpu = resolve_gpu_key(gpu)
    asked = PriorAsked(None if prior_gpu is None else resolve_gpu_key(prior_gpu), learned_prior)
    want = {_workload_key(s.workload.canonical()): i for i, s in enumerate(shapes)}
    run = (tuned_gpu, strategy, budget, seed)
    found: dict[int, TaskDoc] = {}
    cold: dict[int, TaskDoc] = {}  # per shape, its newest task that started cold
    # The shapes the listed tasks would give the prior asked for, as guessed from the list
    # (warm_starts: only where the service cannot say), kept as indices, not the tasks.
    guessed: set[int] = set()
    prior_gpus: dict[int, str | None] = {}  # a prior task's GPU, read once
    before: int | None = None
    while len(found) < len(shapes):
        page = client.tasks(before=before)
        if not page:
            break
        for task in page:
            guessed |= asked.warm_starts(task, shapes, tuned_gpu)
            index = want.get(_workload_key(task.workload))
            if (
                index is None
                or index in found
                or task.state not in RESUMABLE_STATES
                or task.imported_from is not None
                or (task.gpu, task.strategy, task.budget, task.seed) != run
                or (batch_size is not None and task.batch_size != batch_size)
            ):
                continue
            prior_task_gpu = None
            if task.prior_task is not None:
                if task.prior_task not in prior_gpus:
                    prior_gpus[task.prior_task] = _gpu_of_task(client, task.prior_task)
                prior_task_gpu = prior_gpus[task.prior_task]
            fits = asked.fits(task, prior_task_gpu)
            if fits is None:
                cold.setdefault(index, task)
            elif fits:
                found[index] = task
        before = min(t.id for t in page)
    # Is a shape whose only task started cold given a prior now? The service says; one that
    # predates saying it is guessed at from the tasks listed (warm_starts).
    args = {"budget": budget, "strategy": strategy, "seed": seed, "batch_size": batch_size}
    prior = _prior_args(prior_gpu, learned_prior)
    service_says = True  # until it answers that it cannot (404, 405)
    for index, task in cold.items():
        if index in found:
            continue
        warm = service_prior(client, shapes[index], gpu, args, prior) if service_says else None
        if warm is None:
            service_says = False
            warm = index in guessed
        if not warm:
            found[index] = task
    return found


def service_prior(
    client: Client,
    shape: DistinctShape,
    gpu: str,
    args: dict[str, Any],
    prior: dict[str, Any],
) -> bool | None:
    """Whether the service would start the shape's task (`Client.tune`'s `args` and the
    `prior` asked for, as `launch` sends them) from a prior now, as it says (POST
    /v1/tasks/prior): False where the prior asked for cannot be one (the 422 naming its
    field, on which `launch` starts the shape cold). None for a service that predates the
    route (404, 405)."""
    try:
        answer = client.task_prior(shape.workload.canonical(), gpu, **args, **prior)
    except ApiError as exc:
        if exc.status_code in (404, 405):
            return None
        if exc.status_code == 422 and exc.field in prior:
            return False
        raise
    return answer.prior_task is not None or answer.learned_from is not None


def _prior_args(prior_gpu: str | None, learned_prior: bool | None) -> dict[str, Any]:
    """The prior a run's tasks are asked for (`launch`'s `prior_gpu`, `learned_prior`), as
    Client.tune takes it: prior_gpu, else learned_prior where given (None: each family's
    choice)."""
    if prior_gpu is not None:
        return {"prior_gpu": prior_gpu}
    if learned_prior is not None:
        return {"learned_prior": learned_prior}
    return {}


def _gpu_of_task(client: Client, task_id: int) -> str | None:
    """A task's GPU; None where the service no longer has it."""
    try:
        return client.task(task_id).gpu
    except ApiError as exc:
        if exc.status_code == 404:
            return None
        raise


def launch(
    client: Client,
    shapes: list[DistinctShape],
    gpu: str,
    budget: int,
    strategy: StrategyName,
    seed: int,
    prior_gpu: str | None = None,
    learned_prior: bool | None = None,
    batch_size: int | None = None,
    resumed: dict[int, TaskDoc] | None = None,
    priority: int = DEFAULT_PRIORITY,
    started: list[TaskDoc] | None = None,
    cold: list[str] | None = None,
) -> list[TaskDoc]:
    """One tuning task per distinct shape, all queued at once so the workers share them;
    a shape in `resumed` (its index: `resumable_tasks`) keeps that task instead.
    With prior_gpu, each shape warm-starts from its finished task on that GPU (one of the newest
    generator revision, the most successful trials of those) where it has one; with learned_prior,
    from a cost model of the measured tasks of its kernel family where there are any. A shape
    without starts cold (the service says which by a 422 on the prior's field). A prior_gpu no shape
    could use (unknown, the tuned GPU, a strategy without a prior) raises ValueError before any task
    is created. batch_size: each task's trials per proposal round (None: the service's);
    priority: each task's share of the GPU's workers (TaskCreate.priority). `started`: the list
    each task is appended to as it is created (the caller's: a signal part-way through leaves
    it holding the tasks that exist); `cold`: where given, the service's reason for each shape
    that started cold though a prior was asked for."""
    if learned_prior and prior_gpu is not None:
        raise ValueError("give prior_gpu or learned_prior, not both")
    if prior_gpu is not None:
        problem = prior_gpu_problem(prior_gpu, gpu, strategy)
        if problem:
            raise ValueError(problem)
    prior = _prior_args(prior_gpu, learned_prior)
    args = {
        "budget": budget,
        "strategy": strategy,
        "seed": seed,
        "batch_size": batch_size,
        "priority": priority,
    }
    # A shape without a task on prior_gpu starts cold, but as asked of the learned prior
    # (--no-learned-prior beside --prior-gpu was dropped there, and the shape learned one).
    without = {"learned_prior": False} if prior_gpu is not None and learned_prior is False else {}
    started = [] if started is None else started
    for i, s in enumerate(shapes):
        if resumed and i in resumed:
            started.append(resumed[i])
            continue
        workload = s.workload.canonical()
        try:
            task = client.tune(workload, gpu, **args, **prior)
        except ApiError as exc:
            if not prior or exc.status_code != 422 or exc.field not in prior:
                raise
            task = client.tune(workload, gpu, **args, **without)
            if cold is not None:
                cold.append(f"{s.workload.label()}: {exc}")
        started.append(task)
    return started


def wait_all(
    client: Client,
    tasks: list[TaskDoc],
    progress: Callable[[list[TaskDoc]], None] | None = None,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
) -> list[TaskDoc]:
    """Poll every task until each has finished (done, failed or cancelled). A look that fails
    for the moment (a service restart, a 503 while the database fails over) is retried as
    `Client.wait` retries it: one such failure ended the command while its tasks went on."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    outage = Outage(poll_s, deadline)
    current = list(tasks)
    while True:
        current = outage.look(functools.partial(_looked_again, client, current))
        if progress is not None:
            progress(current)
        if all(t.is_finished() for t in current):
            return current
        if deadline is not None and time.monotonic() > deadline:
            unfinished = [t.id for t in current if not t.is_finished()]
            raise PipetuneError(f"tasks {unfinished} did not finish within {timeout_s:g} s")
        time.sleep(poll_s)


def _looked_again(client: Client, tasks: list[TaskDoc]) -> list[TaskDoc]:
    """Each unfinished task's document read again (the finished ones do not change)."""
    return [t if t.is_finished() else client.task(t.id) for t in tasks]


def worker_runners(client: Client, outage: Outage | None = None) -> dict[str, str] | None:
    """Worker name -> runner kind (cupy, simulated, replay), or None if not listed (the
    list refused, unreadable, or out of reach past what `outage` rides out)."""
    look = outage.look if outage is not None else (lambda call: call())
    try:
        return {w.name: w.runner.split(":")[0] for w in look(client.workers)}
    except PipetuneError:  # (ApiError only: a lost answer ended the whole report)
        return None


def trial_runner_kinds(trials: list[TrialDoc], runners: dict[str, str] | None) -> set[str]:
    """The runner kinds that answered a task's finished trials, from each trial's own runner
    (recorded with its result: a replay of a simulated sweep is simulated), else from its
    worker's registration (the service's worker list, which may have changed since)."""
    kinds = set()
    for t in trials:
        if t.status is None:
            continue
        if t.runner:
            kinds.add(runner_kind_shown(t.runner) or "unknown")
        elif t.worker and runners is not None:
            kinds.add(runners.get(t.worker, "unknown"))
    return kinds


def collect(
    client: Client,
    shapes: list[DistinctShape],
    tasks: list[TaskDoc],
    gpu: str,
    poll_s: float = 1.0,
) -> list[LayerResult]:
    """Each shape's trials and what measured them, read as the wait reads (a moment's
    failure, a restart or a proxy's 502, ridden out: one ended the report of a network whose
    every task had finished)."""
    outage = Outage(poll_s, None)
    runners = worker_runners(client, outage)
    results = []
    for shape, task in zip(shapes, tasks, strict=True):
        trials = outage.look(functools.partial(client.all_trials, task.id))
        kinds = trial_runner_kinds(trials, runners)
        results.append(
            LayerResult(
                shape=shape,
                task=task,
                trials=trials,
                model_baseline_us=model_baseline_us(shape.workload, gpu),
                runners=kinds or {"unknown"},
            )
        )
    return results


def latency_kind(results: list[LayerResult]) -> str:
    kinds = set().union(*(r.runners for r in results)) if results else {"unknown"}
    if len(kinds) == 1:
        (kind,) = kinds
        return RUNNER_MEANING.get(kind, "from workers whose runner the service did not list")
    return "mixed: " + ", ".join(RUNNER_MEANING.get(k, k) for k in sorted(kinds))


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Σ count·tuned over the rows with a tuned latency (the time split's source), and the
    end-to-end gain over the rows with both a tuned and a baseline latency."""
    timed = [r for r in rows if r["tuned_us"] is not None]
    tuned_all = sum(r["count"] * r["tuned_us"] for r in timed)
    both = [r for r in rows if r["tuned_us"] is not None and r["baseline_us"] is not None]
    tuned = sum(r["count"] * r["tuned_us"] for r in both)
    base = sum(r["count"] * r["baseline_us"] for r in both)
    return {
        "time_us": tuned_all,
        "timed_complete": len(timed) == len(rows),  # every row counts in time_us
        "tuned_us": tuned,
        "baseline_us": base,
        "speedup": base / tuned if tuned > 0 else None,
        "complete": len(both) == len(rows),
        # What the end-to-end gain leaves out, and why: a layer with no tuned latency, or a
        # tuned one whose space has none of its family's baseline schedules (a softmax over 8
        # keys has no one-row-per-block schedule), which the line called "without a result".
        "untuned_layers": len(rows) - len(timed),
        "layers_without_baseline": len(timed) - len(both),
    }


def left_out_note(scope: dict[str, Any]) -> str:
    """The end-to-end line's note on the layers its gain leaves out ("" for none)."""
    parts = []
    if untuned := scope["untuned_layers"]:
        parts.append(f"{untuned} without a tuned latency")
    if unbased := scope["layers_without_baseline"]:
        parts.append(f"{unbased} whose space has no baseline schedule")
    return f" (layers left out: {'; '.join(parts)})" if parts else ""


def family_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family present, in registry order: its operators, its share of the network's
    time (Σ count·tuned, so the shares sum to 1 over the families) and its own end-to-end
    gain over its baseline."""
    total = sum(r["count"] * r["tuned_us"] for r in rows if r["tuned_us"] is not None)
    out = []
    for name in family_names():
        mine = [r for r in rows if r["family"] == name]
        if not mine:
            continue
        first = mine[0]
        totals = _totals(mine)
        out.append(
            {
                "family": name,
                "label": first["family_label"],
                "throughput_unit": first["throughput_unit"],
                "baseline": first["baseline"],
                "operators": sum(r["count"] for r in mine),
                "shapes": len(mine),
                "share": totals["time_us"] / total if total > 0 else None,
                **totals,
            }
        )
    return out


def document(
    network: Network,
    gpu: str,
    budget: int,
    strategy: str,
    results: list[LayerResult],
) -> dict[str, Any]:
    layers = []
    for r in results:
        base, source = r.baseline()
        tuned = r.tuned_us
        best = r.task.best
        fam = r.family
        schedule = best.schedule.knobs() if best else None
        layers.append(
            {
                "layers": list(r.shape.layers),
                "workload": r.shape.workload.canonical(),
                "label": r.shape.workload.label(),
                "family": fam.name,
                "family_label": fam.label,
                "count": r.shape.count,
                "task_id": r.task.id,
                "state": r.task.state,
                "trials": r.task.trials_done,
                "trials_failed": r.task.trials_failed,
                # Where its search started: another GPU's task, a cost model of measured
                # tasks, or neither (the strategy's own prior, the analytical model for ours).
                "prior_task": r.task.prior_task,
                "learned_from": r.task.learned_from,
                "tuned_us": tuned,
                "tuned_schedule": schedule,
                "tuned_schedule_label": (
                    fam.schedule_label(schedule, r.shape.workload) if schedule else None
                ),
                "throughput": r.tuned_throughput(),
                "throughput_unit": fam.throughput_unit,
                "baseline": r.baseline_label,
                "baseline_us": base,
                "baseline_source": source,
                "model_baseline_us": r.model_baseline_us,
                "speedup": r.speedup(),
                "runners": sorted(r.runners),
                "error": r.task.error,
            }
        )
    overall = _totals(layers)
    return {
        "network": network.name,
        "batch": network.batch,
        "seq": network.seq,
        "phase": "decode" if network.decode else "prefill",
        "dtype": network.dtype,
        "gpu": gpu,
        "budget": budget,
        "strategy": strategy,
        "latencies": latency_kind(results),
        "notes": network.notes,
        "layers": layers,
        "families": family_summary(layers),
        "end_to_end": overall,  # over every listed operator
    }


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def time_split(doc: dict[str, Any]) -> str:
    """Each family's share of Σ count·tuned, e.g. "tensor-core GEMM 81%, memory-intensive
    19%"."""
    return ", ".join(
        f"{f['label']} {f['share']:.0%}" if f["share"] is not None else f"{f['label']} -"
        for f in doc["families"]
    )


def prior_label(row: dict[str, Any]) -> str:
    """A layer's prior, in a few words: another GPU's task, a learned cost model, or '-'."""
    if row.get("prior_task") is not None:
        return f"task {row['prior_task']}"
    if row.get("learned_from"):
        return f"learned ({len(row['learned_from'])} tasks)"
    return "-"


def unfinished_problem(doc: dict[str, Any]) -> str | None:
    """What a script must know of a report (one line), or None: shapes whose task ended
    otherwise than done (their best so far still counts, where they have one), and shapes
    with no successful trial, which every figure leaves out."""
    rows = doc["layers"]
    problems = []
    if ended := [r for r in rows if r["state"] != "done"]:
        listed = ", ".join(f"{r['task_id']} ({r['state']})" for r in ended)
        counted = [r["task_id"] for r in ended if r["tuned_us"] is not None]
        counts = f": the figures count {counted} at their best so far" if counted else ""
        problems.append(f"tasks {listed} did not finish{counts}")
    if untimed := [r["task_id"] for r in rows if r["tuned_us"] is None]:
        problems.append(
            f"tasks {untimed} have no successful trial: every figure leaves them out (their "
            "trials say why: pipetune curve ID)"
        )
    return "; ".join(problems) or None


def print_report(doc: dict[str, Any], out: Console) -> None:
    """The human-readable report of `document(...)`: one row per distinct shape, then the
    latency source, each family's baseline, its share of the time and its end-to-end gain."""
    seq = f", seq {doc['seq']}" if doc["seq"] else ""
    if doc["phase"] == "decode":
        seq = f", one decode step at context {doc['seq']}"
    dtype = doc.get("dtype", "float16")
    if dtype != "float16":
        seq += f", {DTYPE_SHORT[dtype]}"
    table = Table(
        title=f"{doc['network']} (batch {doc['batch']}{seq}) on {doc['gpu']}: "
        f"{doc['budget']} trials per shape, {doc['strategy']}"
    )
    right = {"count", "task", "failed", "tuned µs", "throughput", "baseline µs", "speedup"}
    columns = ("layers", "shape", "family", "count", "task", "prior", "failed", "tuned µs",
               "throughput", "schedule", "baseline µs", "from", "speedup")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right" if col in right else None)
    for row in doc["layers"]:
        table.add_row(
            ", ".join(row["layers"]),
            row["label"],
            row["family_label"],
            str(row["count"]),
            str(row["task_id"]),
            prior_label(row),
            f"{row['trials_failed']}/{row['trials']}",
            _us(row["tuned_us"]),
            format_rate(row["throughput"], row["throughput_unit"]),
            row["tuned_schedule_label"] or "-",
            _us(row["baseline_us"]),
            row["baseline_source"],
            "-" if row["speedup"] is None else f"{row['speedup']:.2f}x",
        )
    out.print(table)
    out.print(f"latencies: {doc['latencies']}")
    baselines = "; ".join(f"{f['label']}: {f['baseline']}" for f in doc["families"])
    out.print(
        f"baseline per family ({baselines}): 'trials' = the best such trial of the task, "
        "'model' = the analytical model's best prediction among them (no such trial was "
        "measured)"
    )
    for note in doc["notes"]:
        out.print(f"note: {note}")
    families = doc["families"]
    if any(f["share"] is not None for f in families):
        timed = all(f["timed_complete"] for f in families)
        partial = "" if timed else "; layers without a tuned latency left out"
        out.print(
            f"time by family (Σ count·tuned µs, {doc['latencies']}{partial}): {time_split(doc)}"
        )
    scopes = list(families)
    if len(families) > 1:  # with one family the overall figure is that family's
        scopes.append({**doc["end_to_end"], "label": "all listed", "baseline": "baseline"})
    for scope in scopes:
        if scope["speedup"] is None:
            out.print(f"end-to-end ({scope['label']} layers): no layer has both latencies")
            continue
        partial = left_out_note(scope)
        out.print(
            f"end-to-end ({scope['label']} layers): Σ count·{scope['baseline']} "
            f"{scope['baseline_us']:.1f} µs / Σ count·tuned {scope['tuned_us']:.1f} µs = "
            f"{scope['speedup']:.2f}x{partial}"
        )
