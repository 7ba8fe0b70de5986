"""The baselines phase: the vendor library's time on every benchmark operator.

cuBLAS for GEMM (``cupy.matmul``) and BMM (``torch.bmm``), cuDNN (PyTorch, channels-last
fp16) for Conv2D and Conv3D, PyTorch's own CUDA kernels for the memory-intensive operators
(``torch.softmax``, ``layer_norm``, the bias add then ``gelu`` with the operator's
approximation, ``sum`` or ``amax`` over the rows; fp16 in and out), timed by the library child
(workers.campaign.cuda_side, or its simulated twin) exactly as the kernel runner times
kernels, with the campaign's measurement settings. Each entry gives its throughput in its
family's unit (``throughput``, ``unit``: TFLOP/s for the GEMMs, which keep their ``tflops``
too, GB/s of compulsory traffic for the memory-intensive operators). An operator that fails
is recorded with its error and not tried again by a later call; the phase stops between
operators at the deadline, and a later call adds the missing ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pipetune.model.family import THROUGHPUT_UNITS, family_of
from pipetune.workers.campaign.deadline import Deadline
from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS, GpuSideCosts
from pipetune.workers.runners.base import summarise
from pipetune.workers.runners.isolation import IsolatedWorker
from pipetune.workers.runners.timing import RepeatPolicy

VENDOR_TIMEOUT_S = 180.0  # inputs, cuDNN's algorithm search and the launches of one operator
# How a baseline is timed now: with a spin kernel holding the GPU while the host dispatches
# the library call (workers.campaign.cuda_side.HOLD_SOURCE). An entry timed otherwise (an
# earlier campaign's, before the hold; or one whose hold could not run) is timed again when
# a later call has the GPU, and keeps the earlier figures under "superseded".
HELD = "held"


def current(entry: dict[str, Any]) -> bool:
    """Whether an entry is timed as baselines are timed now (or could not be: an error)."""
    return entry.get("timing") == HELD or entry.get("simulated", False) or "error" in entry


def missing(document: dict[str, Any], operators: dict[str, Any]) -> list[str]:
    """The operators whose baseline is absent or timed the old way."""
    entries = document.get("operators", {})
    return [n for n in operators if n not in entries or not current(entries[n])]


def baseline_entry(workload: Any, answer: dict[str, Any]) -> dict[str, Any]:
    samples_us = [s * 1e3 for s in answer["samples_ms"]]
    latency, spread = summarise(samples_us)
    fam = family_of(workload)
    throughput = fam.throughput_of(workload, latency)
    entry = {
        "workload": workload.canonical(),
        "label": workload.label(),
        "family": fam.name,
        "library": answer["library"],
        "latency_us": latency,
        "spread": spread,
        "samples_us": samples_us,
        "throughput": throughput,
        "unit": fam.throughput_unit,
    }
    if fam.throughput_unit == THROUGHPUT_UNITS["flop"][0]:
        entry["tflops"] = throughput  # the GEMM entries' field before there were units
    if answer.get("simulated"):
        entry["simulated"] = True
    elif answer.get("held"):
        entry["timing"] = HELD
    return entry


def shown(entry: dict[str, Any]) -> str:
    """An entry in a few words: its latency and throughput, or its error."""
    if "latency_us" not in entry:
        return str(entry["error"])
    unit = entry.get("unit", THROUGHPUT_UNITS["flop"][0])
    rate = entry.get("throughput", entry.get("tflops"))
    return f"{entry['latency_us']:.1f} µs, {rate:,.1f} {unit}"


def run_baselines(
    child: IsolatedWorker,
    side: ModuleType,
    operators: dict[str, Any],
    document: dict[str, Any],
    deadline: Deadline,
    checkpoint: Callable[[dict[str, Any]], None],
    costs: GpuSideCosts | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> bool:
    """Fill ``document["operators"]`` with what is missing; whether all are there now."""
    costs = costs or GpuSideCosts()
    policy = RepeatPolicy.of(CAMPAIGN_SETTINGS)
    entries = document.setdefault("operators", {})
    for name in missing(document, operators):
        workload = operators[name]
        earlier = entries.get(name)
        if not deadline.allows(costs.baseline_s(workload) * 4):
            return False
        started = time.perf_counter()
        outcome = child.call(
            side.vendor_time,
            workload.canonical(),
            CAMPAIGN_SETTINGS.seed,
            policy,
            timeout_s=VENDOR_TIMEOUT_S,
        )
        if outcome.ok:
            entries[name] = baseline_entry(workload, outcome.value)
        else:
            entries[name] = {
                "workload": workload.canonical(),
                "label": workload.label(),
                "family": family_of(workload).name,
                "error": f"{outcome.kind}: {outcome.error}",
            }
        entries[name]["seconds"] = round(time.perf_counter() - started, 3)
        if earlier is not None:  # timed the old way: its figures stay, marked as such
            entries[name]["superseded"] = {
                k: earlier[k] for k in ("library", "latency_us", "spread") if k in earlier
            }
        log(f"baselines: {name}: {shown(entries[name])}")
        checkpoint(document)
    return all(name in entries for name in operators)
