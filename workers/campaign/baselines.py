"""The baselines phase: the vendor library's time on every benchmark operator.

cuBLAS (``cupy.matmul``) for GEMM and BMM, cuDNN (PyTorch, channels-last fp16) for Conv2D
and Conv3D, timed by the library child (workers.campaign.cuda_side, or its simulated twin)
exactly as the kernel runner times kernels, with the campaign's measurement settings. An
operator that fails is recorded with its error and not tried again by a later call; the
phase stops between operators at the deadline, and a later call adds the missing ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pipetune.model.workloads import AnyWorkload
from pipetune.workers.campaign.deadline import Deadline
from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS, GpuSideCosts
from pipetune.workers.runners.base import summarise
from pipetune.workers.runners.isolation import IsolatedWorker
from pipetune.workers.runners.timing import RepeatPolicy

VENDOR_TIMEOUT_S = 180.0  # inputs, cuDNN's algorithm search and the launches of one operator


def baseline_entry(workload: AnyWorkload, answer: dict[str, Any]) -> dict[str, Any]:
    samples_us = [s * 1e3 for s in answer["samples_ms"]]
    latency, spread = summarise(samples_us)
    return {
        "workload": workload.canonical(),
        "label": workload.label(),
        "library": answer["library"],
        "latency_us": latency,
        "spread": spread,
        "samples_us": samples_us,
        "tflops": workload.flops / (latency * 1e-6) / 1e12,
        **({"simulated": True} if answer.get("simulated") else {}),
    }


def run_baselines(
    child: IsolatedWorker,
    side: ModuleType,
    operators: dict[str, AnyWorkload],
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
    for name, workload in operators.items():
        if name in entries:
            continue
        if not deadline.allows(costs.baseline_per_operator * 4):
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
                "error": f"{outcome.kind}: {outcome.error}",
            }
        entries[name]["seconds"] = round(time.perf_counter() - started, 3)
        entry = entries[name]
        shown = f"{entry['latency_us']:.1f} µs" if "latency_us" in entry else entry["error"]
        log(f"baselines: {name}: {shown}")
        checkpoint(document)
    return all(name in entries for name in operators)
