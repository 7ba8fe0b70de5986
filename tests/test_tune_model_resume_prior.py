"""`pipetune tune-model --resume` follows only the tasks made with the prior the command asks
for. It matched an earlier run's tasks by shape, GPU, strategy, budget and seed alone, so a
resume with another prior (or none) silently followed tasks warm-started from another GPU's
task, or learned, or cold where a prior was asked for and is there now."""

from __future__ import annotations

from test_cli_client_tune_model import _listed_task

from pipetune.clients.sdk import ApiError
from pipetune.clients.tune_model import resumable_tasks
from pipetune.model.family import family_of
from pipetune.model.networks import network
from pipetune.model.wire import TaskDoc

SHAPES = network("bert-base", 1, 128).distinct()
# Two GEMMs (one kernel family) and a memory-intensive operator (another).
GEMMS = [s for s in SHAPES if family_of(s.workload).name == "tensor_gemm"][:2]
OTHER = next(s for s in SHAPES if family_of(s.workload).name != "tensor_gemm")
W0, W1, W2 = (s.workload.canonical() for s in (*GEMMS, OTHER))
GEMM_SCHEDULE = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 2,
                 "warp_col_tiles": 2, "chunk": 2, "smem_stages": 3, "reg_stages": 2}  # fmt: skip
MEASURED = {"trial": 0, "schedule": GEMM_SCHEDULE, "latency_us": 1.0, "throughput": 1.0,
            "runner": "cupy"}  # fmt: skip


def _task(task_id: int, workload: dict, **changes: object) -> TaskDoc:
    """A listed task of this run's kind (test_cli_client_tune_model's), on the H200."""
    return _listed_task(task_id, workload, **({"gpu": "h200"} | changes))


def _finished(task_id: int, workload: dict, gpu: str, **changes: object) -> TaskDoc:
    """A finished task of 16 trials, on `gpu`: a prior for the same workload elsewhere."""
    fields = {"state": "done", "gpu": gpu, "trials_done": 16, "best": MEASURED}
    return _task(task_id, workload, **(fields | changes))


class Service:
    """GET /v1/tasks newest first, a page of two at a time, and GET /v1/tasks/ID."""

    def __init__(self, *tasks: TaskDoc) -> None:
        self.by_id = {t.id: t for t in tasks}

    def tasks(self, state=None, *, limit=None, offset=None, before=None):  # type: ignore[no-untyped-def]
        newest = sorted((t for t in self.by_id.values() if before is None or t.id < before),
                        key=lambda t: -t.id)  # fmt: skip
        return newest[:2]

    def task(self, task_id: int) -> TaskDoc:
        return self.by_id[task_id]

    def task_prior(self, *args: object, **kwargs: object) -> None:
        """A service from before POST /v1/tasks/prior: the prior is judged from the list."""
        raise ApiError(405, "Method Not Allowed")


def _resumed(service: Service, **prior: object) -> dict[int, int]:
    found = resumable_tasks(service, [*GEMMS, OTHER], "h200", 16, "auto", 0, **prior)  # type: ignore[arg-type]
    return {i: t.id for i, t in found.items()}


def test_a_resume_without_a_prior_leaves_a_task_warm_started_from_another_gpu():
    service = Service(
        _finished(1, W0, "h100"),
        _task(2, W0, prior_task=1),  # an earlier run of --prior-gpu h100
        _task(3, W1, learned_from=[1]),  # the family's choice: learned
        _task(4, W2),  # cold
    )
    assert _resumed(service) == {1: 3, 2: 4}
    # --no-learned-prior refuses a learned one as well.
    assert _resumed(service, learned_prior=False) == {2: 4}


def test_a_resume_with_a_prior_gpu_follows_the_tasks_warm_started_from_that_gpu():
    service = Service(
        _finished(1, W0, "a100"),
        _finished(2, W0, "h100"),
        _task(3, W0, prior_task=2),  # from h100: followed, though 4 is newer
        _task(4, W0, prior_task=1),  # from a100: another run's
        _task(5, W1),  # cold, and W1 has no task on h100: as this run would start it
        _task(6, W2),  # cold, but W2 has a finished task on h100 (7): not this run's
        _finished(7, W2, "h100"),
    )
    assert _resumed(service, prior_gpu="h100") == {0: 3, 1: 5}
    assert _resumed(service, prior_gpu="a100") == {0: 4, 1: 5, 2: 6}  # (none of W2 on a100)
    # With --no-learned-prior beside it, a shape that started cold did not learn either.
    learned = Service(_task(5, W1, learned_from=[9]))
    assert _resumed(learned, prior_gpu="h100", learned_prior=False) == {}
    assert _resumed(learned, prior_gpu="h100") == {1: 5}


def test_a_resume_with_a_learned_prior_follows_the_tasks_that_learned():
    service = Service(
        _task(1, W0, learned_from=[7]),
        _task(2, W1),  # cold, and a measured GEMM (9) is there to learn from: not this run's
        _task(3, W2),  # cold, and no task of its family measured: as this run would start it
        _finished(8, W2, "a100", best=MEASURED | {"runner": "simulated"}),  # (not measured)
        _finished(9, W0, "h100"),
    )
    assert _resumed(service, learned_prior=True) == {0: 1, 2: 3}
    # A task warm-started from another GPU's task is no learned one.
    assert _resumed(Service(_finished(1, W0, "h100"), _task(2, W0, prior_task=1)),
                    learned_prior=True) == {}  # fmt: skip
