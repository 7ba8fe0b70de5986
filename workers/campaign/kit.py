"""`make gpu-kit`: the wheels a GPU machine needs to run `pipetune campaign`, and the
command to run there.

The GPU machine (the device tool's KINDS.md) has Python 3.12, CuPy for CUDA 13, PyTorch,
numpy, scipy, rich, httpx and many more (``GPU_MACHINE_PACKAGES``), no network, and none of
``KIT_PACKAGES`` (or not in a version pipetune was tested with). The kit, in a git-ignored
``.gpu-kit/``, holds pipetune's own wheel and the manylinux x86_64 wheels of those packages
for the machine's Python, downloaded the way the device README says (``pip download
--no-deps --only-binary=:all: --python-version 3.12 ...``) in the versions installed here.
It travels with a device call (``carry: [".gpu-kit"]``), and the device command installs it
into a folder on PYTHONPATH before it runs the campaign (:func:`device_command`).

    python -m pipetune.workers.campaign.kit [--out .gpu-kit] [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipetune.model.errors import PipetuneError
from pipetune.model.family import FIRST_REVISION, family_of, generator_revision_of
from pipetune.model.hardware import PROFILE_DIR
from pipetune.model.workloads import Conv2d, Conv3d
from pipetune.workers.campaign import layout
from pipetune.workers.campaign.operators import DEFAULT_OPERATORS, suite_in_order

KIT_DIR = ".gpu-kit"
SITE_DIR = ".gpu-site"  # where the device command installs the kit (under the working tree)
GPU_PYTHON = "3.12"
KIT_LIMIT_BYTES = 40 * 2**20
# What travels with a device call, the working tree and the carried paths together: the
# whole kit folder travels (its wheels, and an archive put there for `--have`), and a call
# over this is refused, costing a GPU session's start.
CARRY_LIMIT_BYTES = 64 * 2**20
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)

# What the campaign needs that the GPU machine lacks, and why each is carried.
KIT_PACKAGES: dict[str, str] = {
    "pydantic": "the core types (workloads, trial results); not on the machine",
    "pydantic-core": "pydantic's compiled core, the machine's cp312 build; not on the machine",
    "annotated-types": "a pydantic dependency; not on the machine",
    "typing-inspection": "a pydantic dependency; not on the machine",
    "typing-extensions": "pydantic needs a recent one; the machine's version is not recorded",
    "platformdirs": "where compiled kernels are cached; not on the machine",
    "tenacity": "imported by the CLI's worker commands; not on the machine",
    "typer": "the CLI, in the version it is tested with (recent typer vendors click and needs "
    "pydantic; the machine's version is not recorded)",
}

# The device tool's KINDS.md, "Python packages already there" (nvidia-h100-x1, nvidia-h200;
# read on 2026-11-17). The CI rehearsal links the ones installed here into a fresh virtual
# environment, beside the kit's wheels: the closest this machine gets to the GPU machine.
GPU_MACHINE_PACKAGES: frozenset[str] = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna
    imageio interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
    kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
    markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
    numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
    nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
    opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
    pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
    pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
    pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
    requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
    seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
    threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq
    torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
    typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
    xxhash yarl zipp
    """.split()  # noqa: SIM905 (a copy of the page's list)
)


class KitError(PipetuneError, RuntimeError):
    """The kit could not be built (no checkout, pip failed, too large)."""


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def repo_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise KitError("the kit is built from a pipetune checkout (no pyproject.toml found)")
    return root


def pins() -> list[str]:
    """``name==version`` of every kit package, as installed in this environment."""
    found = []
    for name in KIT_PACKAGES:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise KitError(f"{name} is not installed here; install the project first") from None
    return found


# --- the commands ---------------------------------------------------------------------


def install_line(python: str = "python3") -> str:
    """Install the kit into SITE_DIR and put it first on PYTHONPATH (or stop the command)."""
    return (
        f"{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
        f"--upgrade --target {SITE_DIR} {KIT_DIR}/*.whl && export PYTHONPATH=$PWD/{SITE_DIR} "
        "|| exit"
    )


def archive_name(call: int) -> str:
    return f"campaign-{call}.tar.gz"


def campaign_line(call: int, runner: str = "cupy", have: str | None = None) -> str:
    """Call ``call`` of a campaign: the default operators named (so the command says what
    it sweeps, whatever the CLI's default), its own out-dir, the previous call's archive as
    --have (copied into the kit folder, so one carried folder holds both; ``have``: another
    folder or archive, e.g. the committed data of a campaign left unfinished), its archive
    into $OUT."""
    if have is None and call > 1:
        have = f"{KIT_DIR}/{archive_name(call - 1)}"
    return (
        f"python3 -m pipetune.clients.cli campaign --operators {DEFAULT_OPERATORS} "
        f"--runner {runner} --out-dir .campaign-{call}{_have_option(have)} "
        f"--pack $OUT/{archive_name(call)}"
    )


def _have_option(have: str | None) -> str:
    """` --have WHAT` for a campaign line (what an earlier call measured), or nothing. Quoted
    for the shell: a --data folder with a space in its name split into two arguments."""
    return f" --have {shlex.quote(have)}" if have is not None else ""


def device_command(call: int = 1, runner: str = "cupy", have: str | None = None) -> str:
    """The whole ``command`` of the device tool's run for one call (one line). It starts by
    removing the call's own out-dir, so a call repeated on a machine still warm from the
    first try starts clean (what that try finished is in its archive, not there)."""
    return (
        f"set -o pipefail; rm -rf .campaign-{call}; {install_line()}; "
        f"PYTHONUNBUFFERED=1 {campaign_line(call, runner, have)} 2>&1 "
        f"| tee $OUT/campaign-{call}.log"
    )


# --- building -------------------------------------------------------------------------


@dataclass(frozen=True)
class Kit:
    folder: Path
    python_version: str
    wheels: tuple[Path, ...]

    @property
    def bytes(self) -> int:
        return sum(w.stat().st_size for w in self.wheels)


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise KitError(f"{what} failed: {' / '.join(tail)}")


def travelling_tree_bytes(root: Path, carried: Path) -> int:
    """What else travels with a call from the checkout at `root`: its tracked and
    untracked-not-ignored files (git's view), less those under the carried folder (counted
    with it). 0 where git cannot say (no git, not a checkout)."""
    try:
        listed = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    total = 0
    carried = carried.resolve()
    for name in filter(None, listed.decode(errors="surrogateescape").split("\0")):
        path = root / name
        if path.is_file() and not path.resolve().is_relative_to(carried):
            total += path.stat().st_size
    return total


def check_carry(folder: Path, tree_bytes: int = 0) -> None:
    """KitError unless the whole folder, with the `tree_bytes` of the working tree that
    travel beside it, fits the device tool's 64 MiB, naming what besides the wheels takes
    the room (archives left there by earlier sessions pile up). The folder alone was
    checked: after two campaign calls' archives it passed while the call, with the tree's
    28 MiB, was over the limit and would be refused."""
    files = [f for f in folder.rglob("*") if f.is_file()]
    total = sum(f.stat().st_size for f in files) + tree_bytes
    if total <= CARRY_LIMIT_BYTES:
        return
    others = sorted((f for f in files if f.suffix != ".whl"), key=lambda f: -f.stat().st_size)
    named = ", ".join(
        f"{f.relative_to(folder)} ({f.stat().st_size / 2**20:.1f} MiB)" for f in others
    )
    tree = f" with the working tree's {tree_bytes / 2**20:.1f} MiB" if tree_bytes else ""
    raise KitError(
        f"{folder} holds {(total - tree_bytes) / 2**20:.1f} MiB{tree}, over the device's "
        f"{CARRY_LIMIT_BYTES >> 20} MiB a call: remove what no call needs from it "
        f"({named or 'only wheels'})"
    )


WHEEL_LOCK = Path("build") / ".wheel.lock"  # under the tree's root


@contextmanager
def one_wheel_build_at_a_time(root: Path) -> Iterator[None]:
    """Hold the tree's wheel-build lock. setuptools builds in the tree's build/ folder, and
    two builds at once (two test workers each building a kit, two `make gpu-kit`) removed
    and rewrote each other's build/lib: "Failed building wheel for pipetune"."""
    lock = root / WHEEL_LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def build_kit(out: Path, python_version: str = GPU_PYTHON, *, python: str = sys.executable) -> Kit:
    """Fill ``out`` with pipetune's wheel and the kit packages' wheels for
    ``python_version`` (manylinux x86_64); other files there (an archive) are kept."""
    root = repo_root()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    # setuptools copies the packages into build/lib and reuses what is there: a module since
    # removed from the tree would ship in the wheel (and shadow nothing, or a package).
    with one_wheel_build_at_a_time(root):
        shutil.rmtree(root / "build" / "lib", ignore_errors=True)
        _run(
            [
                python,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
                str(out),
                str(root),
            ],
            "building pipetune's wheel",
        )
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    _run(
        [
            python,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            *platforms,
            "--dest",
            str(out),
            *pins(),
        ],
        f"downloading the wheels for Python {python_version}",
    )
    wheels = tuple(sorted(out.glob("*.whl")))
    kit = Kit(out, python_version, wheels)
    names = {normalise(w.name.split("-")[0]) for w in wheels}
    missing = {normalise(n) for n in KIT_PACKAGES} - names
    if "pipetune" not in names or missing:
        raise KitError(f"the kit lacks {sorted(missing | ({'pipetune'} - names))}")
    if kit.bytes > KIT_LIMIT_BYTES:
        raise KitError(f"the kit is {kit.bytes / 2**20:.1f} MiB, over {KIT_LIMIT_BYTES >> 20} MiB")
    check_carry(out, travelling_tree_bytes(root, out))
    manifest = {
        "python_version": python_version,
        "wheels": [
            {
                "file": w.name,
                "bytes": w.stat().st_size,
                "sha256": hashlib.sha256(w.read_bytes()).hexdigest(),
            }
            for w in wheels
        ],
        "why": KIT_PACKAGES,
    }
    (out / "KIT.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return kit


@dataclass(frozen=True)
class KeptParts:
    """The committed parts of operators an earlier call left unfinished on one GPU (`campaign
    unpack` keeps them in <gpu>/campaign/parts/, the Hopper family's in
    hopper/<gpu>/campaign/parts/), for the call that measures those operators next: copied
    into its out-dir, which it is given as --have, so that it goes on from the next part
    (sweeps: layout.parts_present) as a campaign continued with --have benchmarks/data/<gpu>
    does, instead of measuring them again. Not that folder as the --have: its campaign's
    documents would skip a suite's correctness of the families they checked (the suites'
    fused kernels are new variants of those) and its datasets would fill the call's archive.
    The call names its GPU (--gpu): with no probe beside them, nothing else would stop the
    parts of one GPU model going on on another."""

    gpu: str
    operators: tuple[str, ...]
    files: tuple[str, ...]  # a shell glob per operator: its parts' files

    def copy_line(self, out_dir: str) -> str:
        """The shell that puts the parts where the call's sweeps look (or stops the call)."""
        sweeps = f"{out_dir}/{layout.SWEEPS_DIR}"
        return f"mkdir -p {sweeps} && cp {' '.join(self.files)} {sweeps}/ || exit"


def kept_parts(data: Path, gpu: str, operators: dict[str, Any]) -> KeptParts | None:
    """The parts kept in the committed data of ``operators`` on this GPU (None: none). An
    operator with a part of an older generator revision than this code makes has none kept:
    merged with the new ones, that part would leave its sweep stale (sweep_is_open), to be
    offered again; it is measured whole."""
    found: dict[str, str] = {}
    for op, workload in operators.items():
        folder = sweep_folder(data, gpu, workload) / layout.UNPACKED_PARTS
        parts = [
            p
            for p in folder.glob(f"{op}.part*.t4.json.gz")
            if layout.is_part(p.name) and layout.sweep_operator(p.name) == op
        ]
        if parts and not any(sweep_is_open(p, workload) for p in parts):
            # (the folder quoted, the glob left to the shell; operator names are [A-Za-z0-9_])
            found[op] = f"{shlex.quote(str(folder))}/{op}.part*.t4.json.gz"
    if not found:
        return None
    return KeptParts(gpu, tuple(found), tuple(found.values()))


def one_call_command(
    operators: str,
    out_dir: str,
    minutes: int,
    name: str,
    runner: str,
    have: str | None = None,
    kept: KeptParts | None = None,
) -> str:
    """A campaign of ``operators`` made in one device call (the calls after the campaigns:
    README, GPU work): its out-dir removed first, as device_command does, its archive
    ``$OUT/<name>.tar.gz`` and its log ``$OUT/<name>.log``; ``have``: the unpacked data of an
    earlier call that left it unfinished, to go on from; ``kept``: instead, the committed
    parts of its unfinished operators, to go on from (KeptParts)."""
    start, options = f"rm -rf {out_dir}", _have_option(have)
    if kept is not None:
        if have is not None:
            raise KitError("a call goes on from a --have or from kept parts, not both")
        start += f"; {kept.copy_line(out_dir)}"
        options = f" --gpu {kept.gpu}{_have_option(out_dir)}"
    return (
        f"set -o pipefail; {start}; {install_line()}; PYTHONUNBUFFERED=1 "
        f"python3 -m pipetune.clients.cli campaign --operators {operators} --runner {runner} "
        f"--minutes {minutes} --out-dir {out_dir}{options} --pack $OUT/{name}.tar.gz "
        f"2>&1 | tee $OUT/{name}.log"
    )


HOPPER_MINUTES = 6  # its sweeps take about two minutes of GPU time after the phases


def hopper_device_command(runner: str = "cupy", have: str | None = None) -> str:
    """The Hopper wgmma family's campaign (the ``hopper`` suite) in one call: what a lent GPU
    runs first once the mma.sync campaigns are complete (README, GPU work)."""
    return one_call_command(
        "hopper", ".campaign-h", HOPPER_MINUTES, "campaign-hopper", runner, have
    )


CONV_MINUTES = 8  # `pipetune campaign plan` for these operators: one call, 439 of 480 s


def resweep_convolutions() -> tuple[str, ...]:
    """The ALCOP suite's convolutions, in sweep order: measured again since their loader
    changed (README, GPU work)."""
    return tuple(
        op
        for op, workload in suite_in_order("alcop").items()
        if isinstance(workload, Conv2d | Conv3d)
    )


def conv_device_command(
    runner: str = "cupy", operators: Sequence[str] | None = None, kept: KeptParts | None = None
) -> str:
    """The ALCOP convolutions swept again in one call (their loader changed after the
    committed sweeps; README, GPU work); ``operators``: only those of them (the ones the
    committed data lacks: open_operators), None: all eight; ``kept``: the committed parts of
    those an earlier call left unfinished, to go on from."""
    names = ",".join(_in_order(resweep_convolutions(), operators))
    return one_call_command(names, ".campaign-c", CONV_MINUTES, "campaign-conv", runner, kept=kept)


def _in_order(whole: Sequence[str], operators: Sequence[str] | None) -> list[str]:
    """``operators`` (None: all of ``whole``) in ``whole``'s sweep order; KitError for a name
    that is not one of them."""
    if operators is None:
        return list(whole)
    if unknown := sorted(set(operators) - set(whole)):
        raise KitError(f"{', '.join(unknown)}: not among {', '.join(whole)}")
    return [op for op in whole if op in set(operators)]


def suite_option(suite: str, operators: Sequence[str] | None = None) -> str:
    """The ``--operators`` value of a call that measures ``operators`` of ``suite`` (None:
    all of them): the suite's name where they are the whole suite, else their names in the
    suite's order. A call names only what the committed data lacks: the device's minutes
    are few, and a suite measured whole again for one missing operator spent them on sweeps
    already committed. No suite needs its operators from one call: each sweep is an
    operator's own dataset beside its own call's library baseline (the report sets
    operators of different calls side by side and says which day each was measured)."""
    whole = tuple(suite_in_order(suite))
    chosen = _in_order(whole, operators)
    return suite if len(chosen) == len(whole) else ",".join(chosen)


LLAMA_MINUTES = 4  # `pipetune campaign plan --operators llama`: one call, 135 of 480 s


def llama_device_command(
    runner: str = "cupy", operators: Sequence[str] | None = None, kept: KeptParts | None = None
) -> str:
    """The ``llama`` suite (LLaMA-2's RMS norms and SwiGLUs) in one call: correctness,
    PyTorch's baselines and every schedule of kernels no GPU has run yet (README, GPU work)."""
    return one_call_command(
        suite_option("llama", operators),
        ".campaign-l",
        LLAMA_MINUTES,
        "campaign-llama",
        runner,
        kept=kept,
    )


SWIGLU_MINUTES = 5  # `pipetune campaign plan --operators swiglu`: one call, 210 of 480 s


def swiglu_device_command(
    runner: str = "cupy", operators: Sequence[str] | None = None, kept: KeptParts | None = None
) -> str:
    """The ``swiglu`` suite (LLaMA-2 7B's gate+up GEMM, fused with the SwiGLU and not) in one
    call: correctness (the fused kernels among the GEMM variants), the unfused PyTorch
    baseline and both exhaustive sweeps (README, GPU work)."""
    return one_call_command(
        suite_option("swiglu", operators),
        ".campaign-s",
        SWIGLU_MINUTES,
        "campaign-swiglu",
        runner,
        kept=kept,
    )


BF16_MINUTES = 5  # `pipetune campaign plan --operators bf16`: one call, 210 of 480 s


def bf16_device_command(
    runner: str = "cupy", operators: Sequence[str] | None = None, kept: KeptParts | None = None
) -> str:
    """The ``bf16`` suite (the swiglu suite's GEMMs with bfloat16 operands) in one call:
    correctness (the bf16 cases among the GEMM family's), cuBLAS's bf16 baselines through
    PyTorch and both exhaustive sweeps (README, GPU work)."""
    return one_call_command(
        suite_option("bf16", operators),
        ".campaign-b",
        BF16_MINUTES,
        "campaign-bf16",
        runner,
        kept=kept,
    )


BIAS_GELU_MINUTES = 4  # `pipetune campaign plan --operators bias_gelu`: one call, 147 of 240 s


def bias_gelu_device_command(
    runner: str = "cupy", operators: Sequence[str] | None = None, kept: KeptParts | None = None
) -> str:
    """The ``bias_gelu`` suite (GPT-2's FC1 with its bias and GELU in the GEMM's epilogue) in
    one call: correctness (the fused kernels among the GEMM family's), the unfused PyTorch
    baseline and the exhaustive sweep (README, GPU work)."""
    return one_call_command(
        suite_option("bias_gelu", operators),
        ".campaign-g",
        BIAS_GELU_MINUTES,
        "campaign-bias-gelu",
        runner,
        kept=kept,
    )


HOPPER_FUSED_MINUTES = 4  # `pipetune campaign plan --operators hopper_fused`: one call, 98 s


def hopper_fused_device_command(
    runner: str = "cupy", operators: Sequence[str] | None = None, kept: KeptParts | None = None
) -> str:
    """The ``hopper_fused`` suite (the swiglu and bias_gelu suites' fused GEMMs on the Hopper
    wgmma family) in one call: correctness (the fused kernels among the family's cases), the
    unfused PyTorch baselines and both exhaustive sweeps (README, GPU work)."""
    return one_call_command(
        suite_option("hopper_fused", operators),
        ".campaign-hf",
        HOPPER_FUSED_MINUTES,
        "campaign-hopper-fused",
        runner,
        kept=kept,
    )


# --- what is open on each GPU ------------------------------------------------------------

DATA_DIR = Path("benchmarks/data")


@dataclass(frozen=True)
class DeviceCall:
    """One call of the device tool's `run` (its timeout_s, carry and command)."""

    heading: str
    timeout_s: int
    command: str

    def run(self) -> dict[str, object]:
        return {"timeout_s": self.timeout_s, "carry": [KIT_DIR], "command": self.command}


# The wgmma probe's shapes that no committed probe file of that GPU holds yet (README, GPU
# work, item 3): the file name a finished call is kept under, its timeout and its command.
PROBE_CALLS: dict[str, tuple[str, int, str]] = {
    # Each call's limit holds the probe (PROBE_SECONDS), every operator's ncu cap
    # (NCU_SECONDS, two here) and the kit's install: with ncu's default cap of 150 s the
    # H100 call's two profiles could run 150 s past its 300 and the second be lost.
    "h100": (
        "wgmma-probe-stream-k",
        300,
        'PROBE_SECONDS=150 NCU_SECONDS=60 SHAPES=--stream-k PROFILE_OPERATORS="MM_BERT_FC2 '
        'MM_RN50_FC" bash benchmarks/wgmma_probe.sh',
    ),
    "h200": (
        "wgmma-probe-persistent",
        330,
        "PROBE_SECONDS=270 SHAPES=--persistent PROFILE=0 bash benchmarks/wgmma_probe.sh",
    ),
}


def calibrate_device_command(gpu: str) -> str:
    """`pipetune calibrate` on a lent GPU, its profile into $OUT/<gpu>.json: for what the
    committed profile lacks (profile_lacks_k_step)."""
    return (
        f"set -o pipefail; {install_line()}; PYTHONUNBUFFERED=1 python3 -m "
        f"pipetune.clients.cli calibrate --gpu {gpu} --out $OUT/{gpu}.json 2>&1 "
        "| tee $OUT/calibrate.log"
    )


# README, GPU work, item 6: the 4 x 1 warp arrangement of BMM_GPT2_QK's 64 x 64 block (32.0 µs
# on the H100, its 1 x 4 twin 23.1), profiled beside the fastest schedule and the library.
WARPS_ALONG_N_WHERE = (
    "block_row_warps=4,block_col_warps=1,warp_row_tiles=1,warp_col_tiles=4,chunk=4,"
    "smem_stages=1,reg_stages=2"
)
WARPS_ALONG_N_REPORT = "ncu-BMM_GPT2_QK-where.txt"


def warps_along_n_command(gpu: str) -> str:
    """README, GPU work, item 6 (why warps side by side along N write C faster): Nsight
    Compute reports into $OUT, kept under benchmarks/data/<gpu>/profile/. The kit never
    offered it, and a session following the kit's list never reached it."""
    return (
        f"GPU={gpu} OPERATORS=BMM_GPT2_QK WHERE={WARPS_ALONG_N_WHERE} "
        "bash benchmarks/profile_best.sh"
    )


def warps_along_n_unprofiled(folder: Path) -> bool:
    return not (folder / "profile" / WARPS_ALONG_N_REPORT).exists()


def profile_lacks_k_step(gpu: str, profiles: Path) -> bool:
    """Whether the committed profile of this GPU has no measured K-step cost (its
    raw.k_step_cycles: the wait and barrier that end each main-loop step, which calibrate
    records since 2026-11-30): the model's review of the H200's held-out shapes needs it
    (RESULTS.md, "GPU calls on H200, 2026-12-04 (second session)"). A GPU without a profile
    gets one from its campaign."""
    path = profiles / f"{gpu}.json"
    if not path.is_file():
        return False
    raw = json.loads(path.read_text()).get("raw") or {}
    return raw.get("k_step_cycles") is None


def sweep_folder(data: Path, gpu: str, workload: Any) -> Path:
    """Where the committed sweep of an operator lies: the Hopper wgmma family's in its own
    folder (data/hopper/<gpu>), the others' in the GPU's (data/<gpu>)."""
    hopper = family_of(workload).name == "hopper_gemm"
    return data / "hopper" / gpu if hopper else data / gpu


def sweep_is_open(path: Path, workload: Any) -> bool:
    """Whether the committed sweep at ``path`` is missing, or holds kernels of an older
    revision of their generator line than this code makes (the convolutions before their
    loader multiplied: README, GPU work, item 1). Read only where the line has a revision
    after its first: no record can be older than that one."""
    if not path.exists():
        return True
    current = generator_revision_of(workload).revision
    if current == FIRST_REVISION:
        return False
    from pipetune.workers.datasets import load_dataset
    from pipetune.workers.datasets.pipetune import record_revision

    return any(record_revision(r) < current for r in load_dataset(path).records)


def open_operators(data: Path, gpu: str, operators: dict[str, Any]) -> list[str]:
    """The operators, in their order, whose committed sweep on this GPU is missing or stale
    (sweep_is_open): what a call still has to measure of them."""
    return [
        op
        for op, workload in operators.items()
        if sweep_is_open(sweep_folder(data, gpu, workload) / f"{op}.t4.json.gz", workload)
    ]


def _only(open_ops: list[str], of: int) -> str:
    """A heading's note where a call measures some of a set's operators."""
    if len(open_ops) == of:
        return ""
    others = of - len(open_ops)
    return f" ({', '.join(open_ops)} only: the other {others} are committed and current)"


def _going_on(kept: KeptParts | None) -> str:
    """A heading's note where a call goes on from committed parts."""
    if kept is None:
        return ""
    return f", going on from the parts of {', '.join(kept.operators)} kept in the data"


# campaign.json's states after which a campaign has nothing left to measure ("stopped": its
# correctness phase stopped it, and a stopped campaign stays stopped); any other (paused at
# the deadline, a call killed while "running", "failed") leaves operators to sweep.
FINISHED = ("complete", "stopped")


def campaign_state(folder: Path) -> str | None:
    """The state of the campaign unpacked into ``folder`` (its campaign/campaign.json),
    None where there is none: `campaign unpack` writes a paused campaign's finished
    operators too, so that a dataset there does not mean the campaign is done."""
    try:
        summary = layout.read_json(folder / layout.UNPACKED_DOCS / layout.SUMMARY_FILE)
    except layout.LayoutError as exc:
        raise KitError(str(exc)) from None
    return None if summary is None else str(summary.get("state"))


# `pipetune campaign plan --operators attention --gpu h100`: one call, ends 150 s of 240
ATTENTION_MINUTES = 4


def attention_device_command(
    runner: str = "cupy", operators: Sequence[str] | None = None, kept: KeptParts | None = None
) -> str:
    """The ``attention`` suite (GPT-2's Q·Kᵀ over keys stored N x K, on both GEMM families,
    and its scaled causal softmax) in one call: correctness (the bmm_nk kernels among each
    GEMM family's cases, the causal softmax among the memops family's), cuBLAS's
    strided-batched baseline on the keys as stored, eager PyTorch's for the softmax, and the
    sweeps (README, GPU work)."""
    return one_call_command(
        suite_option("attention", operators),
        ".campaign-at",
        ATTENTION_MINUTES,
        "campaign-attention",
        runner,
        kept=kept,
    )


@dataclass(frozen=True)
class SuiteCall:
    """A suite measured in one call of its own (README, GPU work, items 7 to 12)."""

    suite: str
    heading: str
    timeout_s: int
    command: Callable[..., str]  # (runner, operators, kept) -> the device command


# In README's order (GPU work, items 7 to 12).
SUITE_CALLS: tuple[SuiteCall, ...] = (
    SuiteCall(
        "llama",
        "the llama suite: RMS norms and SwiGLUs (their sweeps beside the memops ones)",
        300,
        llama_device_command,
    ),
    SuiteCall(
        "swiglu",
        "the swiglu suite: the gate+up GEMM fused with the SwiGLU, and not",
        360,
        swiglu_device_command,
    ),
    SuiteCall(
        "bf16",
        "the bf16 suite: the swiglu suite's GEMMs with bfloat16 operands",
        360,
        bf16_device_command,
    ),
    SuiteCall(
        "bias_gelu",
        "the bias_gelu suite: GPT-2's FC1 with its bias and GELU in the epilogue",
        300,
        bias_gelu_device_command,
    ),
    SuiteCall(
        "hopper_fused",
        "the hopper_fused suite: the fused GEMMs (SwiGLU, bias + GELU) on the wgmma family",
        300,
        hopper_fused_device_command,
    ),
    SuiteCall(
        "attention",
        "the attention suite: Q·Kᵀ over keys stored N x K, on both GEMM families, "
        "and the causal softmax",
        300,
        attention_device_command,
    ),
)


def open_calls(gpu: str, data: Path = DATA_DIR, profiles: Path = PROFILE_DIR) -> list[DeviceCall]:
    """The calls a lent GPU of this kind should make, most needed first, from what the
    repository's data already holds: a campaign, else what README's "GPU work" lists open,
    in its order (the convolutions with the current loader, the Hopper family's campaign,
    the wgmma probe's shapes, the K step's calibration, then the suites: llama, swiglu,
    bf16, bias_gelu, hopper_fused, attention). A session has time for a call or two: the
    suites came before the probe and the calibration, which were never reached. Read from
    the data, so that a call already made is not offered again (the kit offered a whole
    campaign first on GPUs whose campaigns were committed)."""
    folder = data / gpu
    state = campaign_state(folder)
    if state is None:
        return [
            DeviceCall(
                "the campaign, first call (README, GPU work, for the next calls)",
                600,
                device_command(1),
            )
        ]
    if state not in FINISHED:
        return [
            DeviceCall(
                f"the campaign, continued from {folder} (it is {state}; README, GPU work)",
                600,
                device_command(1, have=str(folder)),
            )
        ]
    calls = []
    convolutions = {op: suite_in_order("alcop")[op] for op in resweep_convolutions()}
    if stale := open_operators(data, gpu, convolutions):
        kept = kept_parts(data, gpu, {op: convolutions[op] for op in stale})
        calls.append(
            DeviceCall(
                "the convolutions again (their sweeps here measure an older loader or are "
                f"missing){_only(stale, len(convolutions))}{_going_on(kept)}",
                600,
                conv_device_command(operators=stale, kept=kept),
            )
        )
    hopper = data / "hopper" / gpu
    hopper_state = campaign_state(hopper)
    if hopper_state is None:
        calls.append(DeviceCall("the Hopper wgmma family's campaign", 420, hopper_device_command()))
    elif hopper_state not in FINISHED:
        calls.append(
            DeviceCall(
                f"the Hopper wgmma family's campaign, continued from {hopper} (it is "
                f"{hopper_state})",
                420,
                hopper_device_command(have=str(hopper)),
            )
        )
    # README, GPU work, "in this order": its items 3 and 5 before the suites (7 to 12).
    name, timeout_s, command = PROBE_CALLS[gpu]
    if not any(folder.glob(f"{name}*.json")):
        calls.append(
            DeviceCall(
                f"the wgmma probe's shapes (keep $OUT/wgmma-probe.json as {name}.json)",
                timeout_s,
                command,
            )
        )
    if profile_lacks_k_step(gpu, profiles):
        calls.append(
            DeviceCall(
                f"calibrate again (keep $OUT/{gpu}.json's raw.k_step_cycles in "
                f"model/profiles/{gpu}.json's raw; its other figures stay as calibrated)",
                300,
                calibrate_device_command(gpu),
            )
        )
    if warps_along_n_unprofiled(folder):
        calls.append(
            DeviceCall(
                "why warps side by side along N write C faster: BMM_GPT2_QK's 4 x 1 schedule "
                f"profiled (keep $OUT's ncu-*.txt in {folder}/profile/)",
                420,
                warps_along_n_command(gpu),
            )
        )
    for suite in SUITE_CALLS:
        operators = suite_in_order(suite.suite)
        if missing := open_operators(data, gpu, operators):
            kept = kept_parts(data, gpu, {op: operators[op] for op in missing})
            calls.append(
                DeviceCall(
                    suite.heading + _only(missing, len(operators)) + _going_on(kept),
                    suite.timeout_s,
                    suite.command(operators=missing, kept=kept),
                )
            )
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the GPU kit (make gpu-kit).")
    parser.add_argument("--out", type=Path, default=Path(KIT_DIR))
    parser.add_argument("--python-version", default=GPU_PYTHON)
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="the committed GPU data")
    parser.add_argument(
        "--profiles", type=Path, default=PROFILE_DIR, help="the committed hardware profiles"
    )
    args = parser.parse_args(argv)
    try:
        kit = build_kit(args.out, args.python_version)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for wheel in kit.wheels:
        print(f"  {wheel.name} ({wheel.stat().st_size / 1024:.0f} KiB)")
    print(f"{kit.folder}/: {len(kit.wheels)} wheels, {kit.bytes / 2**20:.1f} MiB "
          f"(limit {KIT_LIMIT_BYTES >> 20} MiB), Python {kit.python_version}")  # fmt: skip
    print(
        "\nOpen on each GPU, from the committed data: the device tool's run for each call, "
        "on the GPU kind `status` names (most needed first; README, GPU work, says what to "
        "do with what comes back)."
    )
    for gpu in ("h200", "h100"):
        try:
            calls = open_calls(gpu, args.data, args.profiles)
        except KitError as exc:  # a campaign.json there that is not one
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"\nOn an {gpu.upper()}:" + ("" if calls else " nothing listed is open"))
        for call in calls:
            print(f"- {call.heading}:")
            print(json.dumps(call.run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
