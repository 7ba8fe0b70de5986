"""Build the worker's runner and describe its GPU, from its configuration."""

from __future__ import annotations

from pipetune.model.hardware import get_gpu
from pipetune.workers.daemon.config import WorkerConfig
from pipetune.workers.daemon.gpu import DeviceInfo, describe_model_gpu, detect_cupy
from pipetune.workers.runners import Runner, make_runner
from pipetune.workers.runners.faults import FaultPlan


def open_runner(config: WorkerConfig) -> tuple[Runner, DeviceInfo]:
    """(runner, device) for a worker. Raises DetectionError, RunnerError, HardwareError or
    DatasetError with a one-line reason when the worker cannot measure here."""
    if config.runner == "cupy":
        device = detect_cupy(config.device, config.gpu)
        runner = make_runner(
            "cupy",
            gpu=device.gpu,
            device=config.device,
            trial_timeout_s=config.trial_timeout_s,
        )
        return runner, device
    assert config.gpu is not None  # WorkerConfig requires it for these runners
    spec = get_gpu(config.gpu)
    if config.runner == "replay":
        runner = make_runner("replay", dataset=config.dataset, gpu=spec)
        recorded = runner.device_name
        name = f"replay of {recorded}" if recorded else None
        return runner, describe_model_gpu(spec.key, "replay", name)
    # simulated: PIPETUNE_SIMULATED_TIME_SCALE sets how long a trial takes (0 = instant).
    faults = FaultPlan.parse(config.simulate_faults) if config.simulate_faults else None
    runner = make_runner(
        "simulated", gpu=spec, faults=faults, trial_timeout_s=config.trial_timeout_s
    )
    return runner, describe_model_gpu(spec.key, "simulated")
