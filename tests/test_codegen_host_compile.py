"""Generated sources build with a whole-program `nvcc -c` (host pass and device pass), as
`TunedKernel.source` and the exporter promise ("NVRTC or nvcc compile it as is"): the model's
pick of each family (a GEMM, each memory-intensive op, a Hopper GEMM). `-cubin` and NVRTC
skip the host pass, where a __host__ __device__ helper calling a __device__-only one is an
error (the memory-intensive family's unpack / pack did). The Hopper kernel's file states the
nvcc flags it needs (wgmma is sm_90a's only) and builds with them, and with a plain
`-arch=sm_90a` too (whose extra compute_90 pass gets trapping wrappers instead of wgmma);
that guard leaves the sm_90a code as it was. Every build is warning-free (`-Werror
all-warnings`, as a user's strict build has it), over schedules that reach each family's
optional parts: one register stage, a convolution's loaders, a batch, a shared-memory row
cache, split rows joined in one kernel or two, the tanh GELU, persistent and stream-K
tile loops.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pipetune
from pipetune.model.family import family_of
from pipetune.workers.compile import compile_source

GPU = "h100"
# One workload per case: a GEMM, every memory-intensive op, a Hopper GEMM (model's picks).
WORKLOADS = {
    "gemm": {"op": "gemm", "m": 1024, "n": 64, "k": 2048},
    "softmax": {"op": "softmax", "rows": 4096, "cols": 1024},
    "layernorm": {"op": "layernorm", "rows": 4096, "cols": 768},
    "reduce": {"op": "reduce", "rows": 4096, "cols": 1024},
    "bias_gelu": {"op": "bias_gelu", "rows": 4096, "cols": 3072},
    "hopper_gemm": {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072},
}
_CONV3D = {
    "op": "conv3d",
    "n": 2,
    "d": 8,
    "h": 14,
    "w": 14,
    "c": 64,
    "k": 64,
    "t": 3,
    "r": 3,
    "s": 3,
}
_GEMM_KNOBS = ("block_row_warps", "block_col_warps", "warp_row_tiles", "warp_col_tiles", "chunk")
# Schedules that reach the parts the model's picks may leave out: {case: (workload, schedule)}.
SCHEDULED = {
    "gemm/one register stage": (
        {"op": "gemm", "m": 1024, "n": 1024, "k": 1024, "b_layout": "nk"},
        dict(zip(_GEMM_KNOBS, (2, 2, 2, 2, 2), strict=True), smem_stages=2, reg_stages=1),
    ),
    "conv3d": (_CONV3D, None),
    "bmm": ({"op": "bmm", "b": 4, "m": 256, "n": 256, "k": 256}, None),
    "layernorm/smem cache": (
        {"op": "layernorm", "rows": 64, "cols": 4096},
        {"threads_per_row": 128, "rows_per_block": 1, "blocks_per_row": 1, "vector_width": 8,
         "row_cache": 1, "split_mode": 0, "max_waves": 0},
    ),
    "softmax/fused split": (
        {"op": "softmax", "rows": 4, "cols": 32768},
        {"threads_per_row": 32, "rows_per_block": 1, "blocks_per_row": 16, "vector_width": 8,
         "row_cache": 2, "split_mode": 1, "max_waves": 1},
    ),
    "reduce/two-pass split": (
        {"op": "reduce", "rows": 4, "cols": 65536, "reduction": "max"},
        {"threads_per_row": 64, "rows_per_block": 1, "blocks_per_row": 16, "vector_width": 8,
         "row_cache": 0, "split_mode": 0, "max_waves": 0},
    ),
    "bias_gelu/tanh": (
        {"op": "bias_gelu", "rows": 4096, "cols": 1024, "approximate": "tanh"}, None
    ),
    "hopper_gemm/persistent": (
        {"op": "hopper_gemm", "m": 4096, "n": 4096, "k": 4096},
        {"tile_m": 128, "tile_n": 128, "stages": 3, "tile_loop": 1},
    ),
    "hopper_gemm/stream-K": (
        {"op": "hopper_gemm", "m": 512, "n": 512, "k": 16384},
        {"tile_m": 64, "tile_n": 128, "stages": 3, "tile_loop": 2},
    ),
}  # fmt: skip
# The sm_90 families' sources state no flags: the tuned GPU's arch, C++17 (as the export test),
# and no warning (a user's -Werror build).
STRICT = ["-Werror", "all-warnings"]
SM90_FLAGS = ["-arch=sm_90", "-std=c++17", *STRICT]
BUILD_LINE = re.compile(r"^// Build for sm_90a: nvcc (?P<flags>.+) -c <file>\.cu$", re.M)
SM90A_GUARD = "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)"
KEEP = "hopper_gemm.keep"  # nvcc's intermediates of the Hopper build with the stated flags


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pipetune.TunedKernel]:
    """The model's pick of each workload (an empty database: no measured schedule)."""
    from pipetune.service.migrate import upgrade

    db = f"sqlite:///{tmp_path_factory.mktemp('host-compile') / 'empty.db'}"
    upgrade(db)  # (a named file that is not there is refused: a mistyped path)
    picks = {case: pipetune.kernel(w, GPU, db=db) for case, w in WORKLOADS.items()}
    chosen = {
        case: pipetune.kernel(w, GPU, s) if s else pipetune.kernel(w, GPU, db=db)
        for case, (w, s) in SCHEDULED.items()
    }
    return picks | chosen


def _stated_flags(source: str) -> list[str] | None:
    """The nvcc flags a Hopper source's header names in its first lines (None: none)."""
    found = BUILD_LINE.search("\n".join(source.splitlines()[:8]))
    return found["flags"].split() if found else None


def test_the_hopper_source_says_how_to_build_it(kernels):
    source = kernels["hopper_gemm"].source
    flags = _stated_flags(source)
    assert flags is not None, "no build line in the header:\n" + source[:400]
    assert "arch=compute_90a,code=sm_90a" in flags and kernels["hopper_gemm"].arch == "sm_90a"


@pytest.fixture(scope="module")
def built(kernels, tmp_path_factory: pytest.TempPathFactory):
    """{case: (nvcc command, its CompletedProcess or None: no flags stated)} and
    {KEEP: folder}: `nvcc -c` of every source, in parallel (seconds each): the sm_90 families
    with SM90_FLAGS, the Hopper kernel with the flags its header states (intermediates kept
    in KEEP, for its PTX) and with a plain -arch=sm_90a."""
    root = tmp_path_factory.mktemp("nvcc")
    commands: dict[str, list[str]] = {}
    for case, k in kernels.items():
        stem = case.replace("/", "_").replace(" ", "_")
        src = root / f"{stem}.cu"
        src.write_text(k.source)
        out = ["-c", str(src), "-o", str(root / f"{stem}.o")]
        if case.startswith("hopper_gemm"):
            keep = []
            if case == "hopper_gemm":
                (root / KEEP).mkdir()
                keep = ["-keep", "-keep-dir", str(root / KEEP)]
                plain = ["-c", str(src), "-o", str(root / f"{stem}.plain.o")]
                commands[f"{case}/-arch=sm_90a"] = ["nvcc", "-arch=sm_90a", *STRICT, *plain]
            flags = _stated_flags(k.source)
            commands[case] = ["nvcc", *flags, *STRICT, *keep, *out] if flags else []  # [] not run
        else:
            commands[case] = ["nvcc", *SM90_FLAGS, *out]

    def run(command: list[str]) -> subprocess.CompletedProcess[str] | None:
        if not command:
            return None
        return subprocess.run(command, capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(run, commands.values()))
    return {case: (commands[case], d) for case, d in zip(commands, done, strict=True)} | {
        KEEP: root / KEEP
    }


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
@pytest.mark.parametrize("case", [*WORKLOADS, *SCHEDULED, "hopper_gemm/-arch=sm_90a"])
def test_nvcc_builds_the_source_host_and_device(built, case: str):
    command, done = built[case]
    assert done is not None, f"{case}: the source states no nvcc flags"
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_the_stated_build_compiles_wgmma_not_the_trap(built):
    """With the header's flags the only device pass is compute_90a: its PTX holds the MMAs,
    and none of the wrappers' traps."""
    _, done = built["hopper_gemm"]
    assert done is not None and done.returncode == 0, done and done.stderr
    keep: Path = built[KEEP]
    ptx = [p.read_text() for p in keep.glob("*.ptx")]
    assert len(ptx) == 1, sorted(p.name for p in keep.iterdir())
    assert ".target sm_90a" in ptx[0]
    assert "wgmma.mma_async" in ptx[0] and "wgmma.fence" in ptx[0]
    assert "trap;" not in ptx[0]


def test_the_sm90a_guard_leaves_nvrtcs_cubin_as_it_was(kernels):
    """NVRTC builds sm_90a with the feature macro defined: the guarded source's cubin is the
    one of the same source with the guards taken as true (the wgmma code, byte for byte)."""
    k = kernels["hopper_gemm"]
    assert k.source.count(SM90A_GUARD) >= 4
    unguarded = k.source.replace(SM90A_GUARD, "#if 1")
    guarded_cubin = compile_source(k.source, "sm_90a", entry=k.name, use_cache=False).cubin
    unguarded_cubin = compile_source(unguarded, "sm_90a", entry=k.name, use_cache=False).cubin
    assert guarded_cubin == unguarded_cubin


def _identifiers(source: str) -> set[str]:
    """The C++ identifiers of a source, comments and string literals left out."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
    return set(re.findall(r"\b[A-Za-z_]\w*\b", code))


def test_no_identifier_of_a_source_is_a_knob_name(kernels):
    """`pipetune_tuned.h` under -DTARGET_<stem> defines each knob as a plain macro (Kernel
    Tuner's convention): a kernel that names a variable after a knob (the Hopper kernel's
    local `tile_m`) stopped compiling beside it ("expected an identifier")."""
    for case, k in kernels.items():
        knobs = set(family_of(k.workload).knob_names)
        assert not knobs & _identifiers(k.source), (case, sorted(knobs & _identifiers(k.source)))
