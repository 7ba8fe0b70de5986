"""The campaign's GPU side outside the kernel runner: what the probe asks of the device and
its libraries, and the vendor-library baselines. Runs in an isolated child process (the
campaign's "library child"); imports CuPy, and PyTorch for cuDNN, inside the functions.
workers/campaign/sim_side.py is its simulated twin (same functions, same arguments).

Baselines are timed exactly as the kernel runner times kernels: the timing loop of
workers.runners.timing, a flush of the same size before each timed launch, an event pair
around the launch. cuBLAS through ``cupy.matmul`` (fp16 in and out) for GEMM and BMM;
cuDNN through PyTorch for Conv2D and Conv3D, fp16 channels-last tensors, with
``cudnn.benchmark`` on so that the first (untimed) call picks cuDNN's fastest algorithm.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from typing import Any

import numpy as np

from pipetune.workers.campaign.checks import conv_check, matmul_checks
from pipetune.workers.runners.cupy_child import MIN_FLUSH_BYTES, CupyClock
from pipetune.workers.runners.reference import make_inputs, operand_shapes
from pipetune.workers.runners.timing import RepeatPolicy, time_launches

_STATE: dict[str, Any] = {}
SMI_FIELDS = (
    "name",
    "driver_version",
    "clocks.max.sm",
    "clocks.max.memory",
    "clocks.sm",
    "memory.total",
    "power.limit",
    "pci.bus_id",
)


class TorchClock:
    """CUDA events through PyTorch, on its current stream (workers.runners.timing.Clock)."""

    def __init__(self, torch: Any):
        self.torch = torch

    def pair(self) -> tuple[Any, Any]:
        event = self.torch.cuda.Event
        return event(enable_timing=True), event(enable_timing=True)

    def record(self, event: Any) -> None:
        event.record()

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))


def init(device: int, stand_in: str | None = None) -> dict[str, Any]:
    """Select the device; the flush buffer as the kernel runner sizes it."""
    import cupy

    cupy.cuda.Device(device).use()
    l2 = int(cupy.cuda.runtime.getDeviceProperties(device)["l2CacheSize"])
    _STATE.clear()
    _STATE.update(device=device, flush_bytes=max(2 * l2, MIN_FLUSH_BYTES))
    _STATE["flush"] = cupy.empty(_STATE["flush_bytes"], dtype=cupy.uint8)
    return {"device": device, "flush_bytes": _STATE["flush_bytes"]}


def _nvidia_smi() -> dict[str, str] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = ",".join(SMI_FIELDS)
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={query}", "--format=csv,noheader", "-i", str(_STATE["device"])],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in out.stdout.strip().split(",")]
    return dict(zip(SMI_FIELDS, values, strict=False))


def _torch_versions() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"torch": None, "torch_error": f"{type(exc).__name__}: {exc}"}
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_sees_gpu": bool(torch.cuda.is_available()),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }


def describe() -> dict[str, Any]:
    """The device and the software around it (the probe's description)."""
    import cupy

    from pipetune.workers.runners.device_info import describe_device

    info = describe_device(cupy, _STATE["device"])
    try:
        nvrtc = ".".join(str(v) for v in cupy.cuda.nvrtc.getVersion())
    except Exception:
        nvrtc = None
    return {
        **info,
        "cupy": cupy.__version__,
        "cupy_nvrtc": nvrtc,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "nvidia_smi": _nvidia_smi(),
        **_torch_versions(),
    }


def _cudnn_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    import torch
    import torch.nn.functional as functional

    xt = torch.from_numpy(x).cuda().permute(0, 3, 1, 2)  # NHWC storage, channels-last view
    wt = torch.from_numpy(w).cuda().permute(0, 3, 1, 2)
    with torch.no_grad():
        out = functional.conv2d(xt, wt, stride=stride, padding=pad)
    return out.permute(0, 2, 3, 1).contiguous().cpu().numpy()


def library_checks() -> dict[str, dict[str, Any]]:
    """cuBLAS, an fp16 cast and cuDNN, each against numpy (workers.campaign.checks)."""
    import cupy

    checks = matmul_checks(cupy, cupy.asnumpy)
    checks["conv_fp16_cudnn"] = conv_check(_cudnn_conv)
    return checks


def _flush() -> None:
    _STATE["flush"].fill(0)


def vendor_time(canonical: dict[str, Any], seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    """Time the vendor library on one workload: {"library", "samples_ms"}."""
    from pipetune.model.workloads import parse_workload

    workload = parse_workload(canonical)
    a_host, b_host = make_inputs(workload, seed)
    if workload.op in ("gemm", "bmm"):
        import cupy

        a, b = cupy.asarray(a_host), cupy.asarray(b_host)
        if workload.op == "gemm" and workload.b_layout == "nk":
            b = b.T  # a transposed view: cuBLAS takes it as an operation, not a copy
        out = cupy.empty(operand_shapes(workload)[2], dtype=cupy.float16)

        def launch() -> None:
            cupy.matmul(a, b, out=out)

        launch()
        cupy.cuda.Device().synchronize()
        samples = time_launches(launch, _flush, CupyClock(cupy), policy)
        library = f"cuBLAS through cupy.matmul (CuPy {cupy.__version__}), fp16 in and out"
    else:
        import torch
        import torch.nn.functional as functional

        torch.backends.cudnn.benchmark = True
        spatial = a_host.ndim - 2
        channels_first = (0, spatial + 1, *range(1, spatial + 1))
        x = torch.from_numpy(a_host).cuda().permute(*channels_first)
        w = torch.from_numpy(b_host).cuda().permute(*channels_first)
        conv = functional.conv2d if spatial == 2 else functional.conv3d
        flush = torch.empty(_STATE["flush_bytes"], dtype=torch.uint8, device="cuda")

        def launch() -> None:
            with torch.no_grad():
                conv(x, w, stride=workload.stride, padding=workload.pad)

        launch()  # cuDNN picks its algorithm here (benchmark mode), untimed
        torch.cuda.synchronize()
        samples = time_launches(launch, flush.zero_, TorchClock(torch), policy)
        library = (
            f"cuDNN {torch.backends.cudnn.version()} through PyTorch {torch.__version__}, "
            "fp16 channels-last, cudnn.benchmark on"
        )
        del x, w, flush
        torch.cuda.empty_cache()
    return {"library": library, "samples_ms": samples}
