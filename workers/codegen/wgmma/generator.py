"""The wgmma probe kernel's source for one configuration, variant and element type, and its
launch."""

from __future__ import annotations

from pipetune.model.workloads import AnyWorkload
from pipetune.workers.codegen import cuda_text as family_text
from pipetune.workers.codegen import generator as family
from pipetune.workers.codegen.generator import KernelSource
from pipetune.workers.codegen.memops.cuda_text import CONVERSIONS
from pipetune.workers.codegen.variants import (
    BIAS_GELU_VARIANTS,
    BMM_VARIANTS,
    SWIGLU_VARIANTS,
    b_layout_of,
    variant_of,
)
from pipetune.workers.codegen.wgmma.config import BK, REDUCE_THREADS, VARIANTS, WgmmaConfig
from pipetune.workers.codegen.wgmma.cuda_text import (
    BATCH_OFFSETS,
    DEVICE_HEAD,
    DEVICE_TAIL,
    DEVICE_TMA,
    DEVICE_WGMMA,
    EPILOGUE,
    HELPERS,
    KERNEL,
    MMA_STEP,
    PARTIAL_EPILOGUE,
    PERSISTENT_KERNEL,
    REDUCE_KERNEL,
    STAGED_EPILOGUE,
    STREAM_K_KERNEL,
    TMA_KERNEL,
    fill_b_layout,
    fill_epilogue,
    wgmma_wrapper,
)

# How to build the file, in its header: wgmma needs the arch-specific target sm_90a, which
# nothing else in the source says (see cuda_text.DEVICE_WGMMA for what the other passes get).
BUILD_NOTE = (
    "// Build for sm_90a: nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -c <file>.cu\n"
    "// (NVRTC: -arch=sm_90a). nvcc -arch=sm_90a works too; what is built for any other\n"
    "// target (the compute_90 PTX that adds, or -arch=sm_90) traps at the first wgmma.\n"
)


def kernel_name(variant: str, config: WgmmaConfig, dtype: str = "float16") -> str:
    # float16's names are those every cubin and export had before bfloat16 existed.
    return f"pipetune_{variant}_{config.id}{family_text.name_suffix(dtype)}"


def source_parts(variant: str, config: WgmmaConfig, dtype: str = "float16") -> dict[str, str]:
    """The kernel's source in pieces: "header", "helpers" (plain C++), "device" (PTX wrappers:
    the mma.sync family's cp.async and conversion ones, wgmma's, and the TMA loader's mbarrier
    and tensor-copy ones), "kernel", "end". ``dtype`` is the operands' element type: it changes
    only the pointers' storage type, wgmma's operand type and the output conversion
    (``family_text.ELEMENTS``)."""
    if variant not in VARIANTS:
        raise ValueError(f"the wgmma probe computes {VARIANTS}, not {variant!r}")
    b_layout = b_layout_of(variant)
    if b_layout == "nk" and config.b_descriptor != "canonical":
        # The swapped reading is of an N-major B's two offsets; a K-major B has one.
        raise ValueError("the swapped B descriptor is for B stored K x N (gemm_kn, bmm)")
    bias_gelu = variant in BIAS_GELU_VARIANTS
    fused = "bias_gelu" if bias_gelu else "swiglu" if variant in SWIGLU_VARIANTS else "plain"
    if fused != "plain" and (config.epilogue != "staged" or config.splits > 1):
        # (The direct and split-K epilogues store C, or its partial sums, from the registers.)
        what = "bias + GELU" if bias_gelu else "SwiGLU"
        raise ValueError(f"the {what} epilogue is built on the staged epilogue, without split-K")
    element = family_text.ELEMENTS[family.check_dtype(dtype)]
    name = kernel_name(variant, config, dtype)
    helpers = HELPERS
    for key, value in {
        "BM": config.block_m,
        "BN": config.block_n,
        "STAGES": config.stages,
        "B_SWAPPED": "true" if config.b_descriptor == "swapped" else "false",
        "TMA": "true" if config.loader == "tma" else "false",
        "SPLITS": config.splits,
        "PERSISTENT": "true" if config.persistent else "false",
        "STREAM_K": "true" if config.stream_k else "false",
    }.items():
        helpers = helpers.replace(f"@{key}@", str(value))
    helpers = fill_b_layout(helpers, b_layout)
    device = (
        family_text.DEVICE
        + DEVICE_HEAD
        + DEVICE_WGMMA
        + wgmma_wrapper(config.block_n, b_layout)
        + (DEVICE_TMA if config.loader == "tma" else "")
        + DEVICE_TAIL
    )
    if bias_gelu:  # GELU (plain C++) and the bias's widening (device), as the mma.sync family's
        helpers += family_text.fill_placeholders(
            family_text.HELPERS_BIAS_GELU, family_text.GELU_FORMULAS
        )
        device += family_text.DEVICE_BIAS.replace("@H2F@", CONVERSIONS[dtype].h2f)
    tma = config.loader == "tma"
    split = config.splits > 1
    if split:
        epilogue = PARTIAL_EPILOGUE
    else:
        epilogue = STAGED_EPILOGUE if config.epilogue == "staged" else EPILOGUE
    if config.stream_k:
        main_loop = STREAM_K_KERNEL
    else:
        main_loop = PERSISTENT_KERNEL if config.persistent else TMA_KERNEL if tma else KERNEL
    kernel = (
        main_loop.replace("@MMA_STEP@", MMA_STEP.lstrip("\n"))
        .replace("@EPILOGUE@", epilogue)
        .replace("@WORKSPACE_PARAM@", ",\n       float* __restrict__ W" if split else "")
        .replace("@THREADS@", str(config.threads))
        .replace("@NAME@", name)
        .replace("@BATCH@", BATCH_OFFSETS if variant in BMM_VARIANTS else "")
    )
    kernel = fill_epilogue(fill_b_layout(kernel, b_layout), fused)
    if split:
        kernel += REDUCE_KERNEL.replace("@NAME@", name).replace(
            "@REDUCE_THREADS@", str(REDUCE_THREADS)
        )
    of_type = "" if dtype == "float16" else f", {dtype}"
    b_reading = f"B descriptor {config.b_descriptor}" if b_layout == "kn" else "B K-major"
    header = (
        f"// pipetune wgmma probe kernel: variant {variant}{of_type}, block {config.block_m}x"
        f"{config.block_n}x{BK}, {config.stages} stages, {b_reading}, "
        f"{config.loader} loader\n"
        f"// {config.threads} threads, {config.smem_bytes} B dynamic shared memory\n"
        f"{BUILD_NOTE}"
    )
    return {
        "header": header,
        "helpers": family_text.PREAMBLE + helpers,
        # family_text.DEVICE opens `#if defined(__CUDACC__)` with the family's cp.async,
        # smem_u32 and pack_half2 wrappers (the storage type and the conversion of `dtype`);
        # "end" closes it after the kernel.
        "device": element.fill(device),
        "kernel": element.fill(kernel),
        "end": family_text.DEVICE_END,
    }


def reduce_kernel_name(variant: str, config: WgmmaConfig, dtype: str = "float16") -> str:
    """Split-K's second kernel, in the same module."""
    return kernel_name(variant, config, dtype) + "_reduce"


def launch(
    kernel: KernelSource, workload, sms: int | None = None
) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """(grid, scalar_args) as the mma.sync family launches (grid x: output tiles, z: batch),
    with grid y the split-K slices. The TMA loader's kernel also takes the two tensor maps
    after the scalars, and with split-K the f32 workspace of splits * batch * M * N after
    them; the reduction kernel then runs on (W, C, batch * M * N), REDUCE_THREADS per block.
    A persistent kernel runs min(tiles, ``sms``) blocks (``sms``: the device's SM count) and
    takes the number of output tiles, the batch's included, after M, N and K. A stream-K
    kernel runs min(K steps of all tiles, ``sms``) blocks and takes the same scalars, then
    after the tensor maps the workspace and the arrival counters (``stream_k_buffers``)."""
    (tiles, _, batch), scalars = family.launch(kernel, workload)
    config: WgmmaConfig = kernel.schedule  # type: ignore[assignment]
    if config.persistent:
        if sms is None or sms < 1:
            raise ValueError("a persistent kernel's grid is one block per SM: give sms")
        work = tiles * batch
        if config.stream_k:  # every block at least one K step
            work *= -(-workload.gemm_view().k // BK)
        return (min(work, sms), 1, 1), (*scalars, tiles * batch)
    return (tiles, config.splits, batch), scalars


def generate(
    workload_or_variant: AnyWorkload | str, config: WgmmaConfig, dtype: str = "float16"
) -> KernelSource:
    """The kernel, described as the mma.sync family describes its own (the config stands in
    for the schedule: the launch reads its block shape), so `launch` wraps that family's. Its
    operands are of ``dtype`` (a workload's own dtype when a workload is given)."""
    w = workload_or_variant
    if isinstance(w, str):
        variant = w
    else:
        variant, dtype = variant_of(w), w.dtype
    code = "".join(source_parts(variant, config, dtype).values())  # (checks the dtype)
    return KernelSource(
        variant=variant,
        schedule=config,  # type: ignore[arg-type]
        name=kernel_name(variant, config, dtype),
        code=code,
        threads=config.threads,
        smem_bytes=config.smem_bytes,
        dtype=dtype,
    )
