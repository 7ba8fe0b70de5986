"""`pipetune tune-model`: tune every distinct tensor-core layer of a network through the
service and report the modelled end-to-end speedup of pipelining (ALCOP Table 3's view).

Per distinct shape: the tuned latency is the task's best trial. The non-pipelined
baseline (smem_stages = 1 and reg_stages = 1) is the best non-pipelined trial of that task
when the tuner measured one, else the analytical model's best non-pipelined prediction;
each row says which. End to end: Σ count·baseline / Σ count·tuned over the layers that
have both.

Whether the latencies are measurements depends on the workers that produced them: the
service's worker list says which runner each worker uses (cupy measures, simulated is the
analytical model plus noise, replay answers from a recorded dataset).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipetune.clients.sdk import ApiError, Client, PipetuneError
from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.networks import DistinctShape, Network
from pipetune.model.pipelining import non_pipelined
from pipetune.model.space import Space
from pipetune.model.trials import RunnerKind
from pipetune.model.wire import StrategyName, TaskDoc, TrialDoc
from pipetune.model.workloads import AnyWorkload

RUNNER_MEANING = {
    RunnerKind.CUPY: "measured on GPUs (cupy workers)",
    RunnerKind.SIMULATED: "simulated (analytical model + noise, not measurements)",
    RunnerKind.REPLAY: "replayed from recorded datasets",
}


@dataclass
class LayerResult:
    shape: DistinctShape
    task: TaskDoc
    trials: list[TrialDoc]
    model_non_pipelined_us: float | None
    runners: set[str]

    @property
    def tuned_us(self) -> float | None:
        return self.task.best.latency_us if self.task.best else None

    def non_pipelined_trial_us(self) -> float | None:
        values = [
            t.latency_us
            for t in self.trials
            if t.status == "ok"
            and t.latency_us is not None
            and t.schedule.smem_stages == 1
            and t.schedule.reg_stages == 1
        ]
        return min(values) if values else None

    def baseline(self) -> tuple[float | None, str]:
        measured = self.non_pipelined_trial_us()
        if measured is not None:
            return measured, "trials"
        return self.model_non_pipelined_us, "model"

    def speedup(self) -> float | None:
        base, _ = self.baseline()
        tuned = self.tuned_us
        return base / tuned if base and tuned else None


def model_non_pipelined_us(workload: AnyWorkload, gpu: str) -> float | None:
    """The analytical model's best prediction among the non-pipelined schedules."""
    space = Space.enumerate(workload, get_gpu(gpu))
    if not len(space):
        return None
    mask = non_pipelined(space)
    if not mask.any():
        return None
    return float(np.min(evaluate(space).latency_us[mask]))


def launch(
    client: Client,
    shapes: list[DistinctShape],
    gpu: str,
    budget: int,
    strategy: StrategyName,
    seed: int,
) -> list[TaskDoc]:
    """One tuning task per distinct shape, all queued at once so the workers share them."""
    return [
        client.tune(s.workload.canonical(), gpu, budget=budget, strategy=strategy, seed=seed)
        for s in shapes
    ]


def wait_all(
    client: Client,
    tasks: list[TaskDoc],
    progress: Callable[[list[TaskDoc]], None] | None = None,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
) -> list[TaskDoc]:
    """Poll every task until each has finished (done, failed or cancelled)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    current = list(tasks)
    while True:
        current = [t if t.state.is_final() else client.task(t.id) for t in current]
        if progress is not None:
            progress(current)
        if all(t.state.is_final() for t in current):
            return current
        if deadline is not None and time.monotonic() > deadline:
            unfinished = [t.id for t in current if not t.state.is_final()]
            raise PipetuneError(f"tasks {unfinished} did not finish within {timeout_s:g} s")
        time.sleep(poll_s)


def worker_runners(client: Client) -> dict[str, str] | None:
    """Worker name -> runner kind (cupy, simulated, replay), or None if not listed."""
    try:
        return {w.name: w.runner.split(":")[0] for w in client.workers()}
    except ApiError:
        return None


def collect(
    client: Client, shapes: list[DistinctShape], tasks: list[TaskDoc], gpu: str
) -> list[LayerResult]:
    runners = worker_runners(client)
    results = []
    for shape, task in zip(shapes, tasks, strict=True):
        trials = client.all_trials(task.id)
        used = {t.worker for t in trials if t.worker and t.status is not None}
        kinds = {runners.get(name, "unknown") for name in used} if runners is not None else set()
        results.append(
            LayerResult(
                shape=shape,
                task=task,
                trials=trials,
                model_non_pipelined_us=model_non_pipelined_us(shape.workload, gpu),
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


def document(
    network: Network,
    gpu: str,
    budget: int,
    strategy: str,
    results: list[LayerResult],
) -> dict[str, Any]:
    layers = []
    total_tuned = total_base = 0.0
    complete = True
    for r in results:
        base, source = r.baseline()
        tuned = r.tuned_us
        if base is not None and tuned is not None:
            total_tuned += r.shape.count * tuned
            total_base += r.shape.count * base
        else:
            complete = False
        best = r.task.best
        layers.append(
            {
                "layers": list(r.shape.layers),
                "workload": r.shape.workload.canonical(),
                "label": r.shape.workload.label(),
                "count": r.shape.count,
                "task_id": r.task.id,
                "state": r.task.state,
                "trials": r.task.trials_done,
                "tuned_us": tuned,
                "tuned_schedule": best.schedule.model_dump() if best else None,
                "non_pipelined_us": base,
                "non_pipelined_source": source,
                "model_non_pipelined_us": r.model_non_pipelined_us,
                "speedup": r.speedup(),
                "runners": sorted(r.runners),
                "error": r.task.error,
            }
        )
    speedup = total_base / total_tuned if total_tuned > 0 else None
    return {
        "network": network.name,
        "batch": network.batch,
        "seq": network.seq,
        "gpu": gpu,
        "budget": budget,
        "strategy": strategy,
        "latencies": latency_kind(results),
        "notes": network.notes,
        "layers": layers,
        "end_to_end": {
            "tuned_us": total_tuned,
            "non_pipelined_us": total_base,
            "speedup": speedup,
            "complete": complete,
        },
    }
