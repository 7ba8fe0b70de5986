"""CUDA C++ for the memory-intensive family (AStitch's adaptive thread mapping).

One kernel per (op, element type, schedule), plus, for a register-cached row, the number of
vectors a thread keeps (a compile-time array size: the only shape dependence of the source);
a causally masked softmax has kernels of its own. Rows, cols, eps and softmax's scale and
mask length (queries) are kernel arguments. The element type (the workload's dtype, float16
or bfloat16) changes only the storage type's name and the conversions
(cuda_text.CONVERSIONS); a bfloat16 kernel's names end in ``_bf16``. Two-pass splitting adds
a second entry, ``<name>_out``.

Whether a schedule is *valid* for a workload on a GPU is the space's call
(model/memops/space.py); this module generates any schedule of the knob domains.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetune.model.memops.space import (
    CACHE_REGISTERS,
    CACHE_SMEM,
    KNOBS,
    LOAD_BATCH,
    MODE_FUSED,
    MemSchedule,
    geometry,
    grid_blocks,
    workspace_bytes,
)
from pipetune.model.memops.workloads import (
    OP_CODES,
    BiasGelu,
    MemWorkload,
    NormWorkload,
    Reduce,
    Softmax,
    op_key,
)
from pipetune.model.space import ScheduleError
from pipetune.workers.codegen.cuda_text import (
    GELU_FORMULAS,
    fill_placeholders,
    name_suffix,
    typed_key,
)
from pipetune.workers.codegen.memops import cuda_text as t
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan

# The kernels' parameters, in order; eps is the norms', scale and queries softmax's (the
# others take them and read nothing).
ARGUMENTS: tuple[str, ...] = (
    "x", "p0", "p1", "y", "ws", "rows", "cols", "eps", "scale", "queries"
)  # fmt: skip


@dataclass(frozen=True)
class MemKernelSource:
    """One generated kernel (one or two entries). Launch with ``threads`` threads per block
    and the dynamic shared memory its launch plan gives (the row cache depends on cols)."""

    variant: str  # op key (+ "-tanh"), + "-r<n>" for a register cache of n vectors
    schedule: MemSchedule
    name: str  # the first entry
    entries: tuple[str, ...]  # every entry, in launch order
    code: str
    threads: int
    scratch_bytes: int  # shared memory for reductions (the row cache comes on top)
    reg_vecs: int
    # A row's blocks spin until all of them have added their partials (the space's
    # fused_wait: fused splitting of an op with an output pass). Not a fused reduce's: its
    # last block to arrive finishes the row, and no block waits.
    blocks_wait: bool = False
    dtype: str = "float16"  # of x, the parameter vectors and y (model/workloads.py DTYPES)

    @property
    def smem_bytes(self) -> int:
        """Shared memory that does not depend on the shape (see launch_plan for the rest)."""
        return self.scratch_bytes


def _check(schedule: MemSchedule) -> None:
    for knob in KNOBS:
        value = getattr(schedule, knob.name)
        if value not in knob.values:
            raise ScheduleError(f"{knob.name} must be one of {list(knob.values)}, got {value!r}")


def _one(value) -> int:
    return int(value.reshape(-1)[0]) if hasattr(value, "reshape") else int(value)


def variant_of(workload: MemWorkload, schedule: MemSchedule) -> tuple[str, int]:
    """(variant, register-cache vectors per thread) of a workload's kernel."""
    key = kernel_kind(workload)
    reg_vecs = 1
    if schedule.row_cache == CACHE_REGISTERS:
        reg_vecs = _one(geometry(schedule.knob_arrays(), workload).vecs_per_thread)
        key += f"-r{reg_vecs}"
    return key, reg_vecs


def kernel_kind(workload: MemWorkload) -> str:
    """The kind of kernel a workload needs: the op (reduce-sum, reduce-max, ...), with
    "-tanh" for the tanh GELU and "-causal" for a masked softmax (a register-cached row adds
    its length per schedule). A softmax's scale is an argument: every scale shares a kernel."""
    key = op_key(workload)
    if isinstance(workload, BiasGelu) and workload.approximate == "tanh":
        key += "-tanh"
    if _causal(workload):
        key += "-causal"
    return key


def _causal(workload: MemWorkload) -> bool:
    return isinstance(workload, Softmax) and workload.causal


def build_key(workload: MemWorkload, schedule: MemSchedule) -> str:
    """What a kernel's source depends on besides its schedule: the op (and GELU form), for a
    register-cached row the vectors a thread keeps, and the element type; rows and cols are
    arguments. float16's key is the variant alone, as it was before bfloat16."""
    variant = variant_of(workload, schedule)[0]
    return typed_key(variant, workload.dtype)


def blocks_wait_for_each_other(kernel: MemKernelSource) -> bool:
    """Whether every block of the grid must be resident at once (its launch is cooperative):
    fused splitting where a row's blocks wait for each other (softmax and the norms), whose grid
    is one wave. A fused reduce's grid may be many waves, which a cooperative launch
    refuses (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE)."""
    return kernel.blocks_wait


def grid_note(
    kernel: MemKernelSource,
    workload: MemWorkload,
    gpu: str,
    sm_count: int,
    blocks_per_sm: int,
    occupancy_from: str,
) -> str:
    """How a grid sized from one wave (grid_depends_on_occupancy) is sized again where the
    device differs."""
    return (
        f"the grid is sized from one wave of {sm_count} SMs x {blocks_per_sm} resident blocks "
        f"per SM ({occupancy_from} on {gpu}); pipetune.kernel and the cupy runner size it "
        "again from the driver's (cuOccupancyMaxActiveBlocksPerMultiprocessor of the loaded "
        "first entry) and the device's SM count: do the same where either differs (split "
        "rows whose blocks wait for each other deadlock unless all are resident)"
    )


def grid_depends_on_occupancy(kernel: MemKernelSource) -> bool:
    """Whether the grid is sized from the resident blocks of one wave (a wave bound, or
    fused splitting whose blocks wait for each other): a runner then passes the driver's
    occupancy of the loaded kernel to launch_plan, not the model's."""
    return kernel.schedule.max_waves > 0 or blocks_wait_for_each_other(kernel)


def kernel_name(variant: str, schedule: MemSchedule, dtype: str = "float16") -> str:
    # float16's names are those every cubin and export had before bfloat16 existed.
    clean = variant.replace("-", "_")
    suffix = name_suffix(dtype)
    return f"pipetune_mem_{clean}_{schedule.id.replace('-', '_')}{suffix}"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _helpers(workload: MemWorkload, s: MemSchedule, reg_vecs: int) -> str:
    split = s.blocks_per_row > 1 and workload.has_reduction
    values = {
        "OP": OP_CODES[op_key(workload)],
        "REDUCES": _bool(workload.has_reduction),
        "OUTPUT_PASS": _bool(workload.has_output_pass),
        "X_ROW": workload.row_inputs,
        "GELU_TANH": _bool(isinstance(workload, BiasGelu) and workload.approximate == "tanh"),
        "CAUSAL": _bool(_causal(workload)),
        "TPR": s.threads_per_row,
        "RPB": s.rows_per_block,
        "SPLIT": s.blocks_per_row,
        "VEC": s.vector_width,
        "CACHE": s.row_cache,
        "FUSED": _bool(split and s.split_mode == MODE_FUSED),
        "REG_VECS": reg_vecs,
        "BATCH": LOAD_BATCH,
    }  # fmt: skip
    return fill_placeholders(t.HELPERS, {**values, **GELU_FORMULAS})


def _transform(workload: MemWorkload) -> str:
    if workload.op == "softmax":
        return t.TRANSFORM_SOFTMAX
    if workload.op == "rmsnorm":
        return t.TRANSFORM_RMSNORM
    return t.TRANSFORM_LAYERNORM.replace("@GB_LOAD@", t.GB_FROM_BATCH)


# The output pass's parameter vectors, loaded a batch at a time beside x: (declaration, load).
_PARAMS: dict[str, tuple[str, str]] = {
    "layernorm": (t.PARAM_DECL, t.PARAM_LOAD),  # gamma and beta
    "rmsnorm": (t.GAMMA_DECL, t.GAMMA_LOAD),
}


def _output_pass(workload: MemWorkload, cache: int) -> str:
    """The output pass; a norm's gamma (and layer norm's beta) is loaded a batch at a time
    beside x."""
    decl, load = _PARAMS.get(workload.op, ("", ""))
    values = {"PARAM_DECL": decl, "PARAM_LOAD": load, "TRANSFORM": _transform(workload)}
    cut = t.CUT_OUTPUT if _causal(workload) else ""
    if cache == CACHE_REGISTERS:
        return fill_placeholders(t.OUT_REGISTERS, values) + cut
    values["RELOAD"] = t.RELOAD_SMEM if cache == CACHE_SMEM else t.RELOAD_GLOBAL
    return fill_placeholders(t.OUT_STREAMING, values) + cut


def _head(name: str, threads: int) -> str:
    return fill_placeholders(t.KERNEL_HEAD, {"NAME": name, "THREADS": threads})


def _kernels(workload: MemWorkload, s: MemSchedule, name: str) -> tuple[str, tuple[str, ...]]:
    """The entries' text and names."""
    threads = s.threads
    head = _head(name, threads)
    split = s.blocks_per_row > 1 and workload.has_reduction
    two_pass = split and s.split_mode != MODE_FUSED
    if workload.op == "bias_gelu":
        return head + t.BODY_ELEMENTWISE, (name,)
    if workload.op == "silu_mul":
        return head + t.BODY_GATED, (name,)
    if s.row_cache == CACHE_REGISTERS:
        stats = t.PASS_STATS_REGISTERS
    else:
        store = t.SMEM_STORE if s.row_cache == CACHE_SMEM else ""
        stats = t.PASS_STATS_STREAMING.replace("@SMEM_STORE@", store)
    if isinstance(workload, Reduce):
        text = head + stats + t.REDUCE_TAIL
        if two_pass:
            second = f"{name}_out"
            text += fill_placeholders(t.SECOND_REDUCE, {"NAME": second, "THREADS": threads})
            return text, (name, second)
        return text, (name,)
    if _causal(workload):
        stats += t.CUT_STATS
    text = head + stats + t.NORM_JOIN + _output_pass(workload, s.row_cache) + t.NORM_DEPART
    if two_pass:
        second = f"{name}_out"
        text += (
            _head(second, threads)
            + t.SECOND_NORM_HEAD
            + _output_pass(workload, 0)
            + t.SECOND_NORM_TAIL
        )
        return text, (name, second)
    return text, (name,)


def source_parts(workload: MemWorkload, schedule: MemSchedule) -> dict[str, str]:
    """The pieces of a kernel's source, in order: "header", "preamble", "device" (CUDA
    only: conversions, memory, shuffles, atomics), "helpers" (constants and the op's
    maths, plain C++), "common" (the reductions) and "kernel" (the entries). The
    workload's dtype changes only the storage type's name (the entries' pointer types) and
    the conversions in "device" (cuda_text.CONVERSIONS)."""
    _check(schedule)
    variant, reg_vecs = variant_of(workload, schedule)
    dtype = workload.dtype
    conversions = t.CONVERSIONS[dtype]
    name = kernel_name(variant, schedule, dtype)
    kernels, entries = _kernels(workload, schedule, name)
    knobs = ", ".join(f"{k}={v}" for k, v in schedule.as_dict().items())
    element = conversions.words.c_type
    of_type = "" if dtype == "float16" else f", {dtype}"
    header = (
        f"// pipetune generated kernel: memory-intensive {variant}{of_type}, "
        f"schedule {schedule.id}\n"
        f"// {knobs}\n"
        f"// entries: {', '.join(entries)}; {schedule.threads} threads per block\n"
        f"// params: (const {element}* x, const {element}* p0, const {element}* p1, "
        f"{element}* y, float* ws, int rows, int cols, float eps, float scale, int queries)\n"
    )
    return {
        "header": header,
        "preamble": t.PREAMBLE,
        "device": conversions.fill(t.DEVICE) + t.DEVICE_SMEM,
        "helpers": _helpers(workload, schedule, reg_vecs),
        # (a plain kernel's text is the one it had before the mask existed)
        "common": t.KERNEL_COMMON + (t.CUT_COMMON if _causal(workload) else ""),
        "kernel": conversions.fill(kernels),
    }


def generate(workload: MemWorkload, schedule: MemSchedule) -> MemKernelSource:
    """The kernel of a workload's op for a schedule."""
    parts = source_parts(workload, schedule)
    variant, reg_vecs = variant_of(workload, schedule)
    name = kernel_name(variant, schedule, workload.dtype)
    g = geometry(schedule.knob_arrays(), workload)
    entries = (name, f"{name}_out") if _one(g.launches) == 2 else (name,)
    return MemKernelSource(
        variant=variant,
        schedule=schedule,
        name=name,
        entries=entries,
        code="".join(parts.values()),
        threads=schedule.threads,
        scratch_bytes=_one(g.scratch_bytes),
        reg_vecs=reg_vecs,
        blocks_wait=bool(_one(g.fused_wait)),
        dtype=workload.dtype,
    )


def _param_names(workload: MemWorkload) -> tuple[str, str, tuple[Buffer, ...]]:
    cols, dtype = (workload.cols,), workload.dtype
    if workload.op == "layernorm":
        return (
            "gamma",
            "beta",
            (Buffer("gamma", cols, dtype, "input"), Buffer("beta", cols, dtype, "input")),
        )
    if workload.op == "rmsnorm":
        return "gamma", "x", (Buffer("gamma", cols, dtype, "input"),)
    if workload.op == "bias_gelu":
        return "bias", "x", (Buffer("bias", cols, dtype, "input"),)
    return "x", "x", ()


def shape_notes(kernel: MemKernelSource, workload: MemWorkload) -> list[str]:
    """What a caller launching the kernel on another shape must know: rows and cols are
    arguments, but a row cache and a workspace are sized for a shape (the kernel traps on a
    row it cannot hold: cuda_text.row_fits), and fused split rows wait for each other."""
    s = kernel.schedule
    notes = []
    per_segment = s.vector_width * s.blocks_per_row
    if s.row_cache == CACHE_REGISTERS:
        longest = kernel.reg_vecs * s.threads_per_row * per_segment
        notes.append(
            f"cols: a thread keeps {kernel.reg_vecs} vector(s) of {s.vector_width} halves of "
            f"its row in registers (compiled in), so the kernel takes rows of at most "
            f"{longest} columns, a multiple of {s.vector_width}; on a longer row it traps (the "
            "launch fails) rather than write part of each row"
        )
    elif s.row_cache == CACHE_SMEM:
        notes.append(
            f"cols: the row waits in dynamic shared memory, which dynamic_smem_bytes sizes for "
            f"{workload.cols} columns; a longer row needs {kernel.scratch_bytes} + "
            f"{s.rows_per_block} x ceil(cols / {per_segment}) x {s.vector_width} x 2 bytes, "
            "and the kernel traps (the launch fails) when it is given less"
        )
    if _causal(workload):
        notes.append(
            "queries: the causal mask's query length (rows of one attention matrix, 1 to cols; "
            "query r mod queries sees the keys up to r mod queries + cols - queries) is an "
            "argument, as the scale is; the kernel traps on 0 or more than cols"
        )
    ws = _one(workspace_bytes(s.knob_arrays(), workload))
    if ws:
        notes.append(
            f"ws holds the partials and counters of {workload.rows} rows: more rows need "
            f"rows x {ws // workload.rows} bytes"
        )
    if blocks_wait_for_each_other(kernel):
        notes.append(
            f"a row's {s.blocks_per_row} blocks wait for each other: grid = min(rows, "
            f"resident blocks // {s.blocks_per_row}) x {s.blocks_per_row}, every block resident "
            'at once; launch it with cuLaunchCooperativeKernel ("cooperative": true, as '
            "pipetune.kernel does), which makes the driver refuse a grid that cannot be, "
            "where a plain launch beside other work on the GPU could wait forever"
        )
    return notes


def launch_plan(
    kernel: MemKernelSource, workload: MemWorkload, sm_count: int, blocks_per_sm: int
) -> LaunchPlan:
    """The buffers and launches of ``kernel`` on ``workload``.

    ``sm_count`` × ``blocks_per_sm`` is one wave of resident blocks: a runner reads both
    from the device (the driver's occupancy for the loaded kernel), which makes the
    one-wave grid of fused splitting safe; the model uses its own prediction.
    """
    s = kernel.schedule
    expected, _ = variant_of(workload, s)
    if expected != kernel.variant:
        raise ValueError(f"kernel {kernel.name} is {kernel.variant}; the workload needs {expected}")
    if workload.dtype != kernel.dtype:
        raise ValueError(
            f"kernel {kernel.name} takes {kernel.dtype}; the workload is {workload.dtype}"
        )
    if sm_count < 1 or blocks_per_sm < 1:
        raise ValueError("sm_count and blocks_per_sm must be at least 1")
    knobs = s.knob_arrays()
    g = geometry(knobs, workload)
    grid = _one(grid_blocks(knobs, g, workload.rows, sm_count * blocks_per_sm))
    if grid < 1:
        raise ValueError(
            f"schedule {s.id} does not fit one wave of {sm_count} x {blocks_per_sm} blocks"
        )
    smem = _one(g.smem_bytes)
    p0, p1, params = _param_names(workload)
    out_shape = (workload.rows,) if isinstance(workload, Reduce) else (workload.rows, workload.cols)
    ws_floats = max(4, _one(workspace_bytes(knobs, workload)) // 4)
    x_shape = (workload.rows, workload.row_inputs * workload.cols)
    buffers = (  # x, the parameter vectors and y of the workload's dtype; partials in float32
        Buffer("x", x_shape, workload.dtype, "input"),
        *params,
        Buffer("y", out_shape, workload.dtype, "output"),
        Buffer("ws", (ws_floats,), "float32", "workspace"),
    )
    eps = float(workload.eps) if isinstance(workload, NormWorkload) else 0.0
    softmax = workload if isinstance(workload, Softmax) else None
    scalars: dict[str, int | float] = {
        "rows": workload.rows,
        "cols": workload.cols,
        "eps": eps,
        "scale": float(softmax.scale) if softmax else 1.0,
        "queries": softmax.mask_queries if softmax else 0,
    }
    arguments = ("x", p0, p1, "y", "ws", *ARGUMENTS[5:])
    block = (kernel.threads, 1, 1)
    cooperative = blocks_wait_for_each_other(kernel)
    launches = [
        KernelLaunch(
            kernel.entries[0],
            (grid, 1, 1),
            block,
            smem,
            arguments,
            scalars,
            cooperative=cooperative,
        )
    ]
    if len(kernel.entries) == 2:
        if isinstance(workload, Reduce):
            grid2 = -(-workload.rows // kernel.threads)
            launches.append(KernelLaunch(kernel.entries[1], (grid2, 1, 1), block, 0, arguments,
                                         scalars))  # fmt: skip
        else:
            launches.append(KernelLaunch(kernel.entries[1], (grid, 1, 1), block, smem,
                                         arguments, scalars))  # fmt: skip
    return LaunchPlan(buffers=buffers, launches=tuple(launches), output="y")
