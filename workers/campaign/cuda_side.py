"""The campaign's GPU side outside the kernel runner: what the probe asks of the device and
its libraries, and the vendor-library baselines. Runs in an isolated child process (the
campaign's "library child"); imports CuPy, and PyTorch for cuDNN, inside the functions.
workers/campaign/sim_side.py is its simulated twin (same functions, same arguments).

Baselines are timed exactly as the kernel runner times kernels: the timing loop of
workers.runners.timing, a flush of the same size before each timed launch, an event pair
around the launch. cuBLAS through ``cupy.matmul`` (fp16 in and out) for GEMM, and its
strided-batched GEMM through ``torch.bmm`` for BMM;
cuDNN through PyTorch for Conv2D and Conv3D, fp16 channels-last tensors, with
``cudnn.benchmark`` on so that the first (untimed) call picks cuDNN's fastest algorithm.
The memory-intensive operators through PyTorch's CUDA kernels, fp16 in and out, as a model
written in PyTorch runs them: ``torch.softmax`` over the last dimension, ``layer_norm``
with the operator's gamma, beta and eps, the bias add then ``gelu`` with the operator's
approximation (two kernels: PyTorch does not stitch them), ``torch.sum`` or ``torch.amax``
over each row. Their inputs are drawn on the device with the distributions of
workers.runners.memops_reference (the largest operator's 1.6 GB would take seconds to draw
on the host, and a row operator's time does not depend on the values drawn).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import numpy as np

from pipetune.model.workloads import DTYPE_SHORT
from pipetune.workers.campaign.checks import conv_check, matmul_checks
from pipetune.workers.runners.cupy_child import MIN_FLUSH_BYTES, CupyClock
from pipetune.workers.runners.reference import make_bias, make_inputs, operand_shapes
from pipetune.workers.runners.timing import RepeatPolicy, time_launches

_STATE: dict[str, Any] = {}
# The uniform ranges workers.runners.memops_reference.make_inputs draws each input from, per
# op (tests/test_campaign_gpu_side.py checks that they agree).
MEMOPS_INPUT_RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "reduce": {"x": (-4.0, 4.0)},
    "softmax": {"x": (-4.0, 4.0)},
    "layernorm": {"x": (-1.5, 2.5), "gamma": (0.5, 1.5), "beta": (-0.5, 0.5)},
    "rmsnorm": {"x": (-1.5, 2.5), "gamma": (0.5, 1.5)},
    "bias_gelu": {"x": (-4.0, 4.0), "bias": (-0.5, 0.5)},
    "silu_mul": {"x": (-4.0, 4.0)},
}
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


# A library call's host dispatch (Python, the library's own checks) can outlast the flush
# kernel, and the start event then waits on the host, not the GPU: on an H200 the baselines
# under ~100 µs spread by 13-550% from sample to sample while pipetune's own kernels (a raw
# launch) spread by 1-6%. A spin kernel of HOLD_CYCLES between the flush and the start event
# keeps the GPU busy while the host dispatches the call (workers.runners.timing, ``hold``).
HOLD_CYCLES = 400_000  # about 200 µs at 2 GHz: longer than any dispatch seen
HOLD_SOURCE = r"""
extern "C" __global__ void pipetune_hold(long long cycles, long long* out) {
    long long start = clock64();
    long long now = start;
    while (now - start < cycles) now = clock64();
    if (cycles < 0) out[0] = now;  // never: keeps the loop's result alive
}
"""


def _hold_on(stream_of: Callable[[], int]) -> Callable[[], None] | None:
    """A hold that queues the spin kernel on the library's stream (``stream_of()`` gives
    its handle), tried once; None where it cannot run, and the baseline is then timed
    without it (and says so)."""
    try:
        import cupy

        kernel = _STATE.get("hold_kernel")
        if kernel is None:
            kernel = _STATE["hold_kernel"] = cupy.RawKernel(HOLD_SOURCE, "pipetune_hold")
        sink = _STATE.setdefault("hold_sink", cupy.zeros(1, dtype=cupy.int64))

        def hold() -> None:
            with cupy.cuda.ExternalStream(stream_of()):
                kernel((1,), (32,), (np.int64(HOLD_CYCLES), sink))

        hold()
        cupy.cuda.Device().synchronize()
        return hold
    except Exception:  # the baseline still runs, unheld, and its entry says so
        return None


def _torch_stream(torch: Any) -> int:
    return int(torch.cuda.current_stream().cuda_stream)


def _torch_timed(torch: Any, launch: Callable[[], None], policy: RepeatPolicy) -> dict[str, Any]:
    """A PyTorch library call timed: its first call untimed (cuDNN's algorithm search,
    cuBLAS's handle, PyTorch's kernel selection and allocator), then the held timing loop
    with a flush buffer of PyTorch's own. The answer less its "library" line."""
    flush = torch.empty(_STATE["flush_bytes"], dtype=torch.uint8, device="cuda")
    launch()
    torch.cuda.synchronize()
    samples, held = _timed(
        launch, flush.zero_, TorchClock(torch), policy, lambda: _torch_stream(torch)
    )
    return {"samples_ms": samples, "held": held}


def _timed(
    launch: Callable[[], None],
    flush: Callable[[], None],
    clock: Any,
    policy: RepeatPolicy,
    stream_of: Callable[[], int],
) -> tuple[list[float], bool]:
    """The timing loop with the hold where it runs: (samples, held)."""
    hold = _hold_on(stream_of)
    return time_launches(launch, flush, clock, policy, hold=hold), hold is not None


def vendor_time(canonical: dict[str, Any], seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    """Time the vendor library on one workload: {"library", "samples_ms"}."""
    from pipetune.model.family import family_of, parse_any_workload
    from pipetune.model.hopper.workloads import TENSOR_OP

    workload = parse_any_workload(canonical)
    # The Hopper family's shapes are the tensor-core GEMM and BMM: the same library call.
    op = TENSOR_OP.get(workload.op, workload.op)
    if op == "gemm" and workload.dtype == "float16":
        return _cublas(workload, seed, policy)
    if op == "gemm":  # CuPy has no bfloat16: cuBLAS through PyTorch
        timed = _torch_gemm
    elif op == "bmm":
        timed = _torch_bmm
    elif op == "gemm_swiglu":
        timed = _torch_gemm_swiglu
    elif op == "gemm_bias_gelu":
        timed = _torch_gemm_bias_gelu
    else:
        timed = _torch_memops if family_of(workload).name == "memops" else _cudnn
    answer = timed(workload, seed, policy)
    import torch

    torch.cuda.empty_cache()  # the operator's tensors went with timed's frame
    return answer


def _cublas(workload: Any, seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    import cupy

    a_host, b_host = make_inputs(workload, seed)
    a, b = cupy.asarray(a_host), cupy.asarray(b_host)
    # (A Hopper GEMM's op is another; its B is stored as a tensor-core GEMM's.)
    if getattr(workload, "b_layout", "kn") == "nk":
        b = b.T  # a transposed view: cuBLAS takes it as an operation, not a copy
    out = cupy.empty(operand_shapes(workload)[2], dtype=cupy.float16)

    def launch() -> None:
        cupy.matmul(a, b, out=out)

    launch()
    cupy.cuda.Device().synchronize()
    samples, held = _timed(
        launch, _flush, CupyClock(cupy), policy, lambda: cupy.cuda.get_current_stream().ptr
    )
    library = f"cuBLAS through cupy.matmul (CuPy {cupy.__version__}), fp16 in and out"
    return {"library": library, "samples_ms": samples, "held": held}


def _torch_operands(torch: Any, workload: Any, seed: int) -> tuple[Any, Any]:
    """A and B, make_inputs's draws, as CUDA tensors of the workload's dtype (bfloat16's
    bits, uint16 on the host, viewed as torch.bfloat16 on the device)."""
    a_host, b_host = make_inputs(workload, seed)
    if workload.dtype == "float16":
        return torch.from_numpy(a_host).cuda(), torch.from_numpy(b_host).cuda()
    bf16 = torch.bfloat16
    a = torch.from_numpy(a_host.view(np.int16)).cuda().view(bf16)
    return a, torch.from_numpy(b_host.view(np.int16)).cuda().view(bf16)


def _torch_vector(torch: Any, host: np.ndarray, dtype: str) -> Any:
    """A host array of the workload's dtype as a CUDA tensor (bfloat16's bits viewed)."""
    if dtype == "float16":
        return torch.from_numpy(host).cuda()
    return torch.from_numpy(host.view(np.int16)).cuda().view(torch.bfloat16)


def _in_and_out(workload: Any) -> str:
    """The element type a baseline runs in, as its library text says it."""
    return f"{DTYPE_SHORT[workload.dtype]} in and out"


def _torch_gemm(workload: Any, seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    """cuBLAS's GEMM through ``torch.matmul``, for the element types CuPy has not
    (bfloat16); float16 GEMMs are timed through ``cupy.matmul`` (_cublas)."""
    import torch

    a, b = _torch_operands(torch, workload, seed)
    if workload.b_layout == "nk":
        b = b.t()  # a transposed view: cuBLAS takes it as an operation, not a copy
    dtype = getattr(torch, workload.dtype)
    out = torch.empty(operand_shapes(workload)[2], dtype=dtype, device="cuda")

    def launch() -> None:
        torch.matmul(a, b, out=out)

    library = f"cuBLAS through torch.matmul (PyTorch {torch.__version__}), {_in_and_out(workload)}"
    return {"library": library, **_torch_timed(torch, launch, policy)}


def _torch_gemm_swiglu(workload: Any, seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    """What a model runs without the fused kernel: cuBLAS's GEMM of both projections (their
    weights side by side, not interleaved) and PyTorch's silu(gate) * up over its halves:
    two launches and the intermediate's round trip through memory."""
    import torch

    functional = torch.nn.functional
    a, b = _torch_operands(torch, workload, seed)
    if workload.b_layout == "nk":
        b = b.t()  # a transposed view: cuBLAS takes it as an operation, not a copy
    n = workload.n
    dtype = getattr(torch, workload.dtype)
    both = torch.empty((workload.m, 2 * n), dtype=dtype, device="cuda")
    out = torch.empty((workload.m, n), dtype=dtype, device="cuda")

    def launch() -> None:
        with torch.no_grad():
            torch.matmul(a, b, out=both)
            torch.mul(functional.silu(both[:, :n]), both[:, n:], out=out)

    library = (
        f"cuBLAS through torch.matmul, then torch.nn.functional.silu(gate) * up (PyTorch "
        f"{torch.__version__}), {_in_and_out(workload)}: two kernels, unfused"
    )
    return {"library": library, **_torch_timed(torch, launch, policy)}


def _torch_gemm_bias_gelu(workload: Any, seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    """What a model runs without the fused kernel (torch.nn.Linear, then GELU): cuBLAS's GEMM
    with the bias through ``torch.addmm`` and PyTorch's GELU of the same form: two launches
    and the intermediate's round trip through memory. (cuBLASLt's own GELU_BIAS epilogue,
    tanh form only, is not what nn.Linear + nn.GELU calls, and is not timed.)"""
    import torch

    a, b = _torch_operands(torch, workload, seed)
    bias = _torch_vector(torch, make_bias(workload, seed), workload.dtype)
    if workload.b_layout == "nk":
        b = b.t()  # a transposed view: cuBLAS takes it as an operation, not a copy
    dtype = getattr(torch, workload.dtype)
    z = torch.empty((workload.m, workload.n), dtype=dtype, device="cuda")
    out = torch.empty((workload.m, workload.n), dtype=dtype, device="cuda")

    def launch() -> None:
        with torch.no_grad():
            torch.addmm(bias, a, b, out=z)
            torch.ops.aten.gelu.out(z, approximate=workload.approximate, out=out)

    library = (
        f"cuBLAS through torch.addmm(bias, A, B), then torch.nn.functional.gelu(approximate="
        f"'{workload.approximate}') (PyTorch {torch.__version__}), {_in_and_out(workload)}: "
        "two kernels, unfused"
    )
    return {"library": library, **_torch_timed(torch, launch, policy)}


def _torch_bmm(workload: Any, seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    """cuBLAS's strided-batched GEMM through ``torch.bmm``. Not ``cupy.matmul``: on 3-D fp16
    arrays it ran at 8.7-12.9 TFLOP/s on an H200 (2026-11-26 campaign), a fraction of what
    cuBLAS's batched GEMM does, which made every BMM look several times faster than cuBLAS."""
    import torch

    a, b = _torch_operands(torch, workload, seed)
    if workload.b_layout == "nk":
        b = b.transpose(1, 2)  # a transposed view: cuBLAS takes it as an operation, not a copy
    dtype = getattr(torch, workload.dtype)
    out = torch.empty(operand_shapes(workload)[2], dtype=dtype, device="cuda")

    def launch() -> None:
        torch.bmm(a, b, out=out)

    library = (
        f"cuBLAS (strided batched) through torch.bmm (PyTorch {torch.__version__}), "
        f"{_in_and_out(workload)}"
    )
    return {"library": library, **_torch_timed(torch, launch, policy)}


def _cudnn(workload: Any, seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    import torch
    import torch.nn.functional as functional

    a, b = _torch_operands(torch, workload, seed)
    torch.backends.cudnn.benchmark = True
    spatial = a.ndim - 2
    channels_first = (0, spatial + 1, *range(1, spatial + 1))
    x = a.permute(*channels_first)
    w = b.permute(*channels_first)
    conv = functional.conv2d if spatial == 2 else functional.conv3d

    def launch() -> None:
        with torch.no_grad():
            conv(x, w, stride=workload.stride, padding=workload.pad)

    library = (
        f"cuDNN {torch.backends.cudnn.version()} through PyTorch {torch.__version__}, "
        f"{DTYPE_SHORT[workload.dtype]} channels-last, cudnn.benchmark on"
    )
    return {"library": library, **_torch_timed(torch, launch, policy)}


def memops_inputs(torch: Any, workload: Any, seed: int) -> dict[str, Any]:
    """The operator's inputs by name, of the workload's dtype, drawn on the device
    (MEMOPS_INPUT_RANGES)."""
    from pipetune.workers.runners.memops_reference import input_shapes

    generator = torch.Generator(device="cuda")
    generator.manual_seed(seed)
    inputs = {}
    for name, shape in input_shapes(workload).items():
        low, high = MEMOPS_INPUT_RANGES[workload.op][name]
        uniform = torch.rand(shape, generator=generator, device="cuda", dtype=torch.float32)
        inputs[name] = (low + (high - low) * uniform).to(getattr(torch, workload.dtype))
    return inputs


def _softmax_launch(torch: Any, workload: Any, x: Any) -> tuple[Callable[[], Any], str]:
    """A softmax as eager PyTorch attention computes it: the scores scaled, the causal mask
    applied with torch.where (its boolean mask built once, outside the timing, broadcast
    over the attention matrices), then torch.softmax, each a kernel of its own."""
    scale, queries = workload.scale, workload.mask_queries
    if not queries:
        if scale == 1.0:
            return (lambda: torch.softmax(x, dim=-1)), "torch.softmax(x, dim=-1)"
        return (lambda: torch.softmax(x * scale, dim=-1)), f"torch.softmax(x * {scale!r}, dim=-1)"
    cols = workload.cols
    # Query i of an attention matrix sees the keys up to i + cols - queries.
    visible = torch.ones(queries, cols, dtype=torch.bool, device=x.device).tril(cols - queries)
    scores = x.reshape(-1, queries, cols)  # a view: x is contiguous
    hidden = torch.tensor(float("-inf"), dtype=x.dtype, device=x.device)

    def launch() -> Any:
        z = scores * scale if scale != 1.0 else scores
        return torch.softmax(torch.where(visible, z, hidden), dim=-1).reshape(x.shape)

    scaled = f"x * {scale!r}" if scale != 1.0 else "x"
    return launch, (
        f"torch.softmax(torch.where(mask, {scaled}, -inf), dim=-1), mask = "
        f"ones({queries}, {cols}).tril({cols - queries}) over each attention matrix"
    )


def memops_launch(
    torch: Any, workload: Any, inputs: dict[str, Any]
) -> tuple[Callable[[], Any], str]:
    """(launch, what it calls): the operator as PyTorch computes it, in and out in the
    workload's dtype."""
    functional = torch.nn.functional
    x = inputs["x"]
    if workload.op == "softmax":
        return _softmax_launch(torch, workload, x)
    if workload.op == "layernorm":
        gamma, beta, eps = inputs["gamma"], inputs["beta"], workload.eps
        return (
            lambda: functional.layer_norm(x, (workload.cols,), gamma, beta, eps)
        ), f"torch.nn.functional.layer_norm(x, ({workload.cols},), gamma, beta, eps={eps:g})"
    if workload.op == "rmsnorm":
        gamma, eps = inputs["gamma"], workload.eps
        if hasattr(functional, "rms_norm"):  # PyTorch 2.4 and later
            return (
                lambda: functional.rms_norm(x, (workload.cols,), gamma, eps)
            ), f"torch.nn.functional.rms_norm(x, ({workload.cols},), gamma, eps={eps:g})"

        # Before 2.4, the norm as LLaMA's reference code writes it, in float32 (as rms_norm
        # does), each step its own PyTorch kernel.
        def composed() -> Any:
            f = x.float()
            norm = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps) * gamma
            return norm.to(x.dtype)

        return composed, f"x * rsqrt(mean(x^2) + {eps:g}) * gamma in float32 (PyTorch ops)"
    if workload.op == "silu_mul":
        gate, up = x[:, : workload.cols], x[:, workload.cols :]
        return (
            lambda: functional.silu(gate) * up
        ), "torch.nn.functional.silu(gate) * up (gate, up: the halves of x's rows)"
    if workload.op == "bias_gelu":
        bias, form = inputs["bias"], workload.approximate
        return (
            lambda: functional.gelu(x + bias, approximate=form)
        ), f"x + bias, then torch.nn.functional.gelu(approximate={form!r})"
    if workload.reduction == "sum":
        return (lambda: torch.sum(x, dim=-1)), "torch.sum(x, dim=-1)"
    return (lambda: torch.amax(x, dim=-1)), "torch.amax(x, dim=-1)"


def _torch_memops(workload: Any, seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    import torch

    inputs = memops_inputs(torch, workload, seed)
    op, what = memops_launch(torch, workload, inputs)

    def launch() -> None:
        with torch.no_grad():
            op()

    library = (
        f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) kernels: {what}, "
        f"{_in_and_out(workload)}"
    )
    return {"library": library, **_torch_timed(torch, launch, policy)}
