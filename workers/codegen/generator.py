"""CUDA C++ for the pipelined tensor-core GEMM family, one kernel per (variant, schedule).

The source depends only on the variant and the schedule: shapes are kernel arguments, so
one cubin serves every shape (and the compile cache keys on the source text).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetune.model.space import Schedule, knob_value_problems
from pipetune.model.workloads import DTYPES, GRID_Z_LIMIT, AnyWorkload
from pipetune.workers.codegen import cuda_text, pipeline
from pipetune.workers.codegen.layout import TileGeometry, swizzle_period
from pipetune.workers.codegen.memops.cuda_text import CONVERSIONS
from pipetune.workers.codegen.variants import (
    BIAS_GELU_VARIANTS,
    BMM_VARIANTS,
    GEMM_LOOP_VARIANTS,
    SCALAR_ARGS,
    SWIGLU_VARIANTS,
    b_is_kn,
    check_variant,
    pointer_args,
    scalar_args,
    variant_of,
)
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan


@dataclass(frozen=True)
class KernelSource:
    """One generated kernel. Launch it with ``threads`` threads (x) per block and
    ``smem_bytes`` of dynamic shared memory (above 48 KiB the runner must raise the
    function's MaxDynamicSharedMemorySize attribute first)."""

    variant: str  # one of variants.VARIANTS
    schedule: Schedule
    name: str  # the extern "C" kernel name
    code: str  # full CUDA C++ source, header-free
    threads: int  # block size (x)
    smem_bytes: int  # dynamic shared memory per block
    dtype: str = "float16"  # the operands' element type (model/workloads.py DTYPES)


# C parameter lists after the three pointers: a GEMM's M, N and K are M_arg, N_arg and K_arg
# (the body's constants take the plain names); a convolution's are its SCALAR_ARGS.
_C_SCALARS: dict[str, tuple[str, ...]] = {
    **SCALAR_ARGS,
    "gemm_kn": ("M_arg", "N_arg", "K_arg"),
    "gemm_nk": ("M_arg", "N_arg", "K_arg"),
    "gemm_swiglu_kn": ("M_arg", "N_arg", "K_arg"),
    "gemm_swiglu_nk": ("M_arg", "N_arg", "K_arg"),
    "gemm_bias_gelu_kn": ("M_arg", "N_arg", "K_arg", "gelu_tanh"),
    "gemm_bias_gelu_nk": ("M_arg", "N_arg", "K_arg", "gelu_tanh"),
    "bmm": ("M_arg", "N_arg", "K_arg"),
    "bmm_nk": ("M_arg", "N_arg", "K_arg"),
}
assert all(len(_C_SCALARS[v]) == len(SCALAR_ARGS[v]) for v in SCALAR_ARGS)


def kernel_name(variant: str, schedule: Schedule, dtype: str = "float16") -> str:
    # float16's names are those every cubin and export had before bfloat16 existed.
    return f"pipetune_{variant}_{schedule.id.replace('-', '_')}{cuda_text.name_suffix(dtype)}"


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"unknown element type {dtype!r}; known: {', '.join(DTYPES)}")
    return dtype


def _check_schedule(schedule: Schedule) -> None:
    problems = knob_value_problems(schedule.as_dict())
    if problems:
        raise ValueError(problems[0])


def _header(variant: str, schedule: Schedule, g: TileGeometry, dtype: str) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in schedule.as_dict().items())
    args = ", ".join(SCALAR_ARGS[variant])
    element = cuda_text.ELEMENTS[dtype].c_type
    of_type = "" if dtype == "float16" else f", {dtype}"
    bias = f"const {element}* bias, " if variant in BIAS_GELU_VARIANTS else ""
    return (
        f"// pipetune generated kernel: variant {variant}{of_type}, schedule {schedule.id}\n"
        f"// {knobs}\n"
        f"// block tile {g.bm}x{g.bn}x{g.bk}, {g.threads} threads, "
        f"{g.smem_bytes} B dynamic shared memory\n"
        f"// params: (const {element}* A, const {element}* B, {element}* C, {bias}int {args})\n"
        f"// grid: {_GRID_TEXT[variant]}\n"
    )


# The grid of each variant in its own parameters' names (`launch` computes it): the GEMM view's
# M x N tiles flattened into x, the batch in z.
_GRID_TEXT: dict[str, str] = {
    "gemm_kn": "(ceil(M/BM) * ceil(N/BN), 1, 1)",
    "gemm_nk": "(ceil(M/BM) * ceil(N/BN), 1, 1)",
    "gemm_swiglu_kn": "(ceil(M/BM) * ceil(N/BN), 1, 1)",
    "gemm_swiglu_nk": "(ceil(M/BM) * ceil(N/BN), 1, 1)",
    "gemm_bias_gelu_kn": "(ceil(M/BM) * ceil(N/BN), 1, 1)",
    "gemm_bias_gelu_nk": "(ceil(M/BM) * ceil(N/BN), 1, 1)",
    "bmm": "(ceil(M/BM) * ceil(N/BN), 1, batch)",
    "bmm_nk": "(ceil(M/BM) * ceil(N/BN), 1, batch)",
    "conv2d": "(ceil(batch*out_p*out_q/BM) * ceil(out_k/BN), 1, 1)",
    "conv3d": "(ceil(batch*out_o*out_p*out_q/BM) * ceil(out_k/BN), 1, 1)",
}


def _helpers(variant: str, g: TileGeometry) -> str:
    b_kn = b_is_kn(variant)
    values = {
        "BM": g.bm,
        "BN": g.bn,
        "BK": g.bk,
        "WM": g.wm,
        "WN": g.wn,
        "WARPS_M": g.warps_m,
        "WARPS_N": g.warps_n,
        "STAGES": g.stages,
        "REG_STAGES": g.reg_stages,
        "B_KN": "true" if b_kn else "false",
        "CONV_DIMS": {"conv2d": 2, "conv3d": 3}.get(variant, 0),
        "A_PERIOD": swizzle_period(g.bm, g.a_cpr, g.threads),
        "B_PERIOD": swizzle_period(g.b_rows(b_kn), g.b_cpr(b_kn), g.threads),
    }
    return cuda_text.fill_placeholders(cuda_text.HELPERS, values)


def _setup(variant: str) -> str:
    if variant in BIAS_GELU_VARIANTS:
        return cuda_text.SETUP_GEMM + cuda_text.SETUP_BIAS
    if variant in GEMM_LOOP_VARIANTS:
        return cuda_text.SETUP_GEMM
    if variant in BMM_VARIANTS:
        return cuda_text.SETUP_BMM
    fixed = (
        "  const int in_d = 1, f_t = 1, out_o = 1;  // 2-D: one depth slice\n"
        "  const int o_mul = 0, o_shift = 0;  // dividing by O = 1\n"
    )
    return (fixed if variant == "conv2d" else "") + cuda_text.SETUP_CONV


def _loaders(variant: str) -> str:
    a = cuda_text.LOAD_A_CONV if variant.startswith("conv") else cuda_text.LOAD_A_GEMM
    b = cuda_text.LOAD_B_KN if b_is_kn(variant) else cuda_text.LOAD_B_NK
    return a + b


def _epilogue(variant: str) -> str:
    if variant in SWIGLU_VARIANTS:
        return cuda_text.EPILOGUE_SWIGLU
    if variant in BIAS_GELU_VARIANTS:
        return cuda_text.EPILOGUE_BIAS_GELU
    return cuda_text.EPILOGUE


def source_parts(variant: str, schedule: Schedule, dtype: str = "float16") -> dict[str, str]:
    """The pieces of a kernel's source, in order: "header", "helpers" (constants and index
    math, plain C++ that a host compiler builds), "device" (PTX wrappers), "kernel", "end"
    (device and kernel sit inside one ``#if defined(__CUDACC__)``). ``dtype`` is the
    operands' element type: it changes only the storage type's name, the mma.sync operand
    type and the output conversion (cuda_text.ELEMENTS)."""
    check_variant(variant)
    check_dtype(dtype)
    _check_schedule(schedule)
    g = TileGeometry.of(schedule)
    element = cuda_text.ELEMENTS[dtype]
    scalars = ", ".join(f"int {p}" for p in _C_SCALARS[variant])
    bias_gelu = variant in BIAS_GELU_VARIANTS
    if bias_gelu:  # the bias pointer between C and the scalars
        scalars = f"const {element.c_type}* __restrict__ bias_ptr, {scalars}"
    head = element.fill(cuda_text.KERNEL_HEAD).replace("@THREADS@", str(g.threads))
    name = kernel_name(variant, schedule, dtype)
    head = head.replace("@NAME@", name).replace("@SCALARS@", scalars)
    helpers = cuda_text.PREAMBLE + _helpers(variant, g)
    device = element.fill(cuda_text.DEVICE)
    if bias_gelu:
        helpers += cuda_text.fill_placeholders(cuda_text.HELPERS_BIAS_GELU, cuda_text.GELU_FORMULAS)
        device += element.fill(cuda_text.DEVICE_BIAS.replace("@H2F@", CONVERSIONS[dtype].h2f))
    return {
        "header": _header(variant, schedule, g, dtype),
        "helpers": helpers,
        "device": device,
        "kernel": "".join(
            [
                head,
                _setup(variant),
                cuda_text.TILE_SETUP,
                _loaders(variant),
                cuda_text.MAINLOOP_SETUP,
                pipeline.mainloop(g),
                _epilogue(variant),
            ]
        ),
        "end": cuda_text.DEVICE_END,
    }


def generate(
    workload_or_variant: AnyWorkload | str, schedule: Schedule, dtype: str = "float16"
) -> KernelSource:
    """The kernel of a variant (or of the variant a workload maps to) for a schedule, on
    operands of ``dtype`` (a workload's own dtype when a workload is given).

    Any knob values within model.space.KNOBS generate; whether a schedule is *valid* for a
    workload on a GPU (shared memory, registers, loader divisibility) is the space's call.
    """
    if isinstance(workload_or_variant, str):
        variant = check_variant(workload_or_variant)
    else:
        variant = variant_of(workload_or_variant)
        dtype = workload_or_variant.dtype
    code = "".join(source_parts(variant, schedule, dtype).values())
    return KernelSource(
        variant=variant,
        schedule=schedule,
        name=kernel_name(variant, schedule, dtype),
        code=code,
        threads=schedule.threads,
        smem_bytes=TileGeometry.of(schedule).smem_bytes,
        dtype=dtype,
    )


def launch(
    kernel: KernelSource, workload: AnyWorkload
) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """(grid, scalar_args) to launch ``kernel`` on ``workload``.

    Kernel parameters are ``(A, B, C, *scalar_args)`` with the int32 scalars in the order of
    variants.SCALAR_ARGS[kernel.variant]; block = (kernel.threads, 1, 1), dynamic shared
    memory = kernel.smem_bytes. conv2d: A = input NHWC, B = filter KRSC, C = output NPQK.
    """
    variant = variant_of(workload)
    if variant != kernel.variant:
        raise ValueError(f"kernel {kernel.name} is {kernel.variant}; the workload needs {variant}")
    if workload.dtype != kernel.dtype:
        raise ValueError(
            f"kernel {kernel.name} takes {kernel.dtype}; the workload is {workload.dtype}"
        )
    view = workload.gemm_view()
    s = kernel.schedule
    tiles = -(-view.m // s.block_m) * -(-view.n // s.block_n)
    # Validation already refuses such a batch (model/workloads.py defines the limit); this
    # guards a workload built without it (model_construct), which would fail on the device.
    if view.batch > GRID_Z_LIMIT:
        raise ValueError(f"batch {view.batch} exceeds the grid z limit {GRID_Z_LIMIT}")
    return (tiles, 1, view.batch), scalar_args(workload)


def launch_config(kernel: KernelSource, workload: AnyWorkload) -> KernelLaunch:
    """The launch of ``kernel`` on ``workload``: the one description that the cupy runner
    times and that `pipetune.kernel` and `pipetune export` hand to users. Parameters in
    ``arguments`` order: the pointers A, B, C (and a bias variant's bias) of the workload's
    dtype (row-major, 16-byte aligned), then the int32 scalars of SCALAR_ARGS; block =
    (threads, 1, 1)."""
    grid, scalars = launch(kernel, workload)
    names = SCALAR_ARGS[kernel.variant]
    return KernelLaunch(
        kernel=kernel.name,
        grid=grid,
        block=(kernel.threads, 1, 1),
        smem_bytes=kernel.smem_bytes,
        arguments=(*pointer_args(kernel.variant), *names),
        scalars=dict(zip(names, scalars, strict=True)),
    )


def kernel_kind(workload: AnyWorkload) -> str:
    """The kind of kernel a workload needs: its variant."""
    return variant_of(workload)


def build_key(workload: AnyWorkload, schedule: Schedule) -> str:
    """What a kernel's source depends on besides its schedule: the variant and the element
    type (the shape is launch arguments), so one cubin per (variant, dtype, schedule) serves
    every shape. float16's key is the variant alone, as it was before bfloat16."""
    variant = variant_of(workload)
    return cuda_text.typed_key(variant, workload.dtype)


def launch_plan(
    kernel: KernelSource, workload: AnyWorkload, sm_count: int = 1, blocks_per_sm: int = 1
) -> LaunchPlan:
    """The run of ``kernel`` on ``workload`` as the runners take every family's: one launch
    (``launch_config``'s) over the inputs A and B (and a bias variant's bias of N elements)
    and the output C (of the workload's dtype), shaped as the
    kernels take them. The grid covers the output tiles whatever the occupancy
    (``sm_count`` and ``blocks_per_sm`` are the plan interface's; a GEMM ignores them)."""
    from pipetune.workers.runners.reference import operand_shapes

    a, b, c = operand_shapes(workload)
    bias = (Buffer("bias", (c[-1],), workload.dtype, "input"),)
    return LaunchPlan(
        buffers=(
            Buffer("A", a, workload.dtype, "input"),
            Buffer("B", b, workload.dtype, "input"),
            *(bias if kernel.variant in BIAS_GELU_VARIANTS else ()),
            Buffer("C", c, workload.dtype, "output"),
        ),
        launches=(launch_config(kernel, workload),),
        output="C",
    )


def grid_depends_on_occupancy(kernel: KernelSource) -> bool:
    """Whether a runner must size the grid from the driver's occupancy: never for GEMMs."""
    return False


def shape_notes(kernel: KernelSource, workload: AnyWorkload) -> list[str]:
    """What a caller launching the kernel on another shape must know beyond the launch
    document: nothing for these kernels, which take every shape of their variant as
    arguments (the grid follows the shape as `launch` computes it), but the fused
    GEMM + SwiGLU's N and B."""
    if kernel.variant in SWIGLU_VARIANTS:
        return [SWIGLU_SHAPE_NOTE]
    return []


# What a fused GEMM + SwiGLU's caller must know of its N and B (either family's kernel).
SWIGLU_SHAPE_NOTE = (
    "N is the GEMM's: 2n, both projections; B holds them interleaved in groups of 8 "
    "columns (rows with b_layout nk), gate then up (pipetune.interleave_gate_up "
    "builds it); C is M x n"
)
