"""GPU hardware specifications and calibrated profiles.

Every spec value carries its source. Values marked "approximate" come from public
microbenchmark reports rather than vendor sheets; `pipetune calibrate` measures them on
the real device and writes a profile (JSON) that overrides them. :func:`get_gpu` applies a
GPU's profile automatically: the user's own (``<user profile dir>/<key>.json``, where
`pipetune calibrate` and `pipetune campaign unpack` write by default), else the one shipped
with pipetune (``model/profiles/<key>.json``, committed from the project's GPU campaigns).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipetune.model.errors import PipetuneError

# The profiles shipped with pipetune (committed from the project's GPU campaigns). Installed,
# this folder is inside site-packages: an upgrade replaces it and an uninstall removes it, so
# a user's own calibration goes to user_profile_dir() instead.
PROFILE_DIR = Path(__file__).with_name("profiles")
USER_PROFILE_DIR_ENV = "PIPETUNE_PROFILE_DIR"


UNKNOWN_GPU = "unknown GPU"  # how a name that is no GPU's is refused (the CLI names --gpu)


class HardwareError(PipetuneError, ValueError):
    """An unknown GPU name or a malformed hardware profile."""


@dataclass(frozen=True)
class GPUSpec:
    key: str
    name: str
    arch: str
    sm_count: int
    boost_clock_mhz: float
    # Dense FP16 tensor-core FLOPs per clock per SM with FP32 accumulation.
    tensor_fp16_flops_per_clk_per_sm: float
    # Fraction of that peak the mma.sync path (our kernel family) can reach. Hopper's full
    # rate needs wgmma; the legacy warp-level mma.sync issues at a lower rate there.
    mma_sync_efficiency: float
    dram_bandwidth_gbs: float
    dram_write_bandwidth_gbs: float
    dram_latency_ns: float
    l2_bandwidth_gbs: float
    l2_latency_ns: float
    l2_bytes: int
    smem_bandwidth_bytes_per_clk_per_sm: float
    smem_latency_ns: float
    smem_per_sm_bytes: int
    smem_per_block_bytes: int
    smem_reserved_per_block_bytes: int
    registers_per_sm: int
    max_registers_per_thread: int
    register_alloc_unit_per_warp: int
    max_threads_per_sm: int
    max_threads_per_block: int
    max_blocks_per_sm: int
    # Warps on an SM needed to keep every tensor core busy: one per sub-partition.
    warps_to_saturate_tensor: int
    # GPU time one kernel launch adds in a stream (launch latency and the drain before the
    # next kernel starts): what a second kernel costs a two-pass schedule.
    kernel_launch_ns: float
    # Cycles one main-loop iteration (one K step of a threadblock) costs beyond its loads and
    # its mma work: the cp.async wait and the barrier that close the step, and the loop's
    # own instructions. Every warp of the block waits on them, so pipelining does not hide
    # them; they are what makes a short K chunk (BK = 16) slower than its work.
    k_step_cycles: float
    profile: str = "spec"

    # Derived quantities, in the units the analytical model uses (seconds, bytes/s).
    @property
    def clock_hz(self) -> float:
        return self.boost_clock_mhz * 1e6

    @property
    def sm_tensor_flops(self) -> float:
        """Throughput_SM: achievable tensor FLOP/s of one SM on the mma.sync path."""
        return self.tensor_fp16_flops_per_clk_per_sm * self.clock_hz * self.mma_sync_efficiency

    @property
    def issue_rate_per_sm(self) -> float:
        """Warp instructions an SM issues per second: one per clock per sub-partition's warp
        scheduler (as many as tensor cores, `warps_to_saturate_tensor`)."""
        return self.warps_to_saturate_tensor * self.clock_hz

    @property
    def peak_tensor_tflops(self) -> float:
        return self.tensor_fp16_flops_per_clk_per_sm * self.clock_hz * self.sm_count / 1e12

    @property
    def k_step_s(self) -> float:
        """Seconds of one main-loop iteration's fixed cost (k_step_cycles at the clock)."""
        return self.k_step_cycles / self.clock_hz

    @property
    def smem_bandwidth_per_sm(self) -> float:
        return self.smem_bandwidth_bytes_per_clk_per_sm * self.clock_hz

    @property
    def compute_capability(self) -> tuple[int, int]:
        digits = self.arch.removeprefix("sm_").rstrip("a")
        return int(digits[:-1]), int(digits[-1])

    def with_overrides(self, overrides: dict[str, Any], profile: str) -> GPUSpec:
        """A copy with measured values in place of spec-sheet ones (validated)."""
        known = {f.name: f for f in fields(self)}
        clean: dict[str, Any] = {}
        for name, value in overrides.items():
            if name in ("key", "name", "arch", "profile"):
                raise HardwareError(f"profile may not override '{name}'")
            if name not in known:
                raise HardwareError(f"profile has unknown field '{name}'")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise HardwareError(f"profile field '{name}' must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise HardwareError(f"profile field '{name}' must be positive, got {value!r}")
            # Integer fields (counts, bytes) stay integers; a fraction of one is a mistake,
            # not a count to round (0.5 SMs became 0: a division by zero in the model).
            if known[name].type in ("int", int):
                if value != int(value):
                    raise HardwareError(
                        f"profile field '{name}' must be a whole number, got {value!r}"
                    )
                clean[name] = int(value)
            else:
                clean[name] = float(value)
            sheet = getattr(self, name)
            if (
                isinstance(sheet, int | float)
                and sheet > 0
                and not (sheet / PROFILE_MAX_RATIO <= clean[name] <= sheet * PROFILE_MAX_RATIO)
            ):
                # A calibration corrects a spec sheet by a measured factor; "sm_count": 1e20
                # overflowed the model (a bare OverflowError in every command on the GPU), and
                # a clock of 1e-300 MHz predicted 7e297 us.
                raise HardwareError(
                    f"profile field '{name}' is {value!r}, more than {PROFILE_MAX_RATIO:g} "
                    f"times off the spec sheet's {sheet!r}: not a calibration of this GPU"
                )
        return replace(self, **clean, profile=profile)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Sources:
#  [A100-WP]  NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020).
#  [H100-WP]  NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022).
#  [H100-DS]  NVIDIA H100 datasheet; [H200-DS] NVIDIA H200 datasheet (2024).
#  [CUDA-PG]  CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"
#             (8.0 and 9.0) and the shared-memory sections of the tuning guides.
#  [MB]       Public microbenchmark reports (Jia et al., "Dissecting the Ampere GPU
#             Architecture through Microbenchmarking", GTC 2021; Luo et al., "Benchmarking
#             and Dissecting the Nvidia Hopper GPU Architecture", 2024; Chips and Cheese
#             H100 and A100 articles). Approximate: replaced by `pipetune calibrate`.
#  [H200-CAMPAIGN] pipetune's GPU campaign on an NVIDIA H200, 2026-11-26 (benchmarks/data/h200,
#             RESULTS.md "GPU campaign on H200"). k_step_cycles: the per-K-step cost that
#             ranks the 23 ALCOP operators' exhaustive sweeps best; 20-60 cycles rank alike,
#             and the GEMM/BMM and the convolution operators, fitted apart, agree.
#             kernel_launch_ns: the timing floor its probe and the H100 campaign's measured
#             (an empty kernel timed as every trial is: 3.02 and 3.44 us), what a launch adds
#             to a measured latency; the [MB] reports' 2 us of an empty kernel between events
#             left the A100 predicted at half the Hopper GPUs' time for the smallest kernels.
_SPECS: dict[str, GPUSpec] = {
    "a100": GPUSpec(
        key="a100",
        name="NVIDIA A100-SXM4-40GB",
        arch="sm_80",
        sm_count=108,  # [A100-WP] Table 3
        boost_clock_mhz=1410.0,  # [A100-WP] Table 3
        tensor_fp16_flops_per_clk_per_sm=2048.0,  # [A100-WP] 1024 dense FP16 FMA/clk/SM
        mma_sync_efficiency=1.0,  # mma.sync is Ampere's native tensor-core path
        dram_bandwidth_gbs=1555.0,  # [A100-WP] HBM2, 40 GB
        dram_write_bandwidth_gbs=1555.0,  # assumed symmetric with reads
        dram_latency_ns=480.0,  # [MB] approximate pointer-chase latency
        l2_bandwidth_gbs=5000.0,  # [A100-WP] 2.3x V100's L2; [MB] ~5 TB/s approximate
        l2_latency_ns=150.0,  # [MB] approximate, ~200 cycles
        l2_bytes=40 * 1024 * 1024,  # [A100-WP]
        smem_bandwidth_bytes_per_clk_per_sm=128.0,  # [CUDA-PG] 32 banks x 4 B per clock
        smem_latency_ns=25.0,  # [MB] approximate, ~30 cycles for ldmatrix
        smem_per_sm_bytes=167936,  # [CUDA-PG] CC 8.0: 164 KB per SM
        smem_per_block_bytes=166912,  # [CUDA-PG] CC 8.0: 163 KB per block (opt-in)
        smem_reserved_per_block_bytes=1024,  # [CUDA-PG] 1 KB reserved per block (CC >= 8.0)
        registers_per_sm=65536,  # [CUDA-PG]
        max_registers_per_thread=255,  # [CUDA-PG]
        register_alloc_unit_per_warp=256,  # [CUDA-PG] occupancy calculator granularity
        max_threads_per_sm=2048,  # [CUDA-PG]
        max_threads_per_block=1024,  # [CUDA-PG]
        max_blocks_per_sm=32,  # [CUDA-PG]
        warps_to_saturate_tensor=4,  # [A100-WP] four tensor cores per SM, one per SMSP
        kernel_launch_ns=3200.0,  # [H200-CAMPAIGN] the timing floor, as measured on Hopper
        k_step_cycles=40.0,  # [H200-CAMPAIGN] as Hopper: a lead for Ampere, not measured
    ),
    "h100": GPUSpec(
        key="h100",
        name="NVIDIA H100-SXM5-80GB",
        arch="sm_90",
        sm_count=132,  # [H100-WP] H100 SXM5
        boost_clock_mhz=1830.0,  # [H100-WP] clock of the quoted 989.4 dense FP16 TFLOPS
        tensor_fp16_flops_per_clk_per_sm=4096.0,  # [H100-WP] 2x A100 per SM per clock
        mma_sync_efficiency=0.62,  # [MB] Luo et al.: mma.sync ~60-65% of wgmma peak
        dram_bandwidth_gbs=3350.0,  # [H100-DS] HBM3
        dram_write_bandwidth_gbs=3350.0,  # assumed symmetric with reads
        dram_latency_ns=500.0,  # [MB] approximate
        l2_bandwidth_gbs=6600.0,  # [MB] ~5.5 TB/s on H100 PCIe x (132 SMs x 1.83) / (114 x 1.755)
        l2_latency_ns=160.0,  # [MB] approximate, ~260 cycles (near partition)
        l2_bytes=50 * 1024 * 1024,  # [H100-WP]
        smem_bandwidth_bytes_per_clk_per_sm=128.0,  # [CUDA-PG]
        smem_latency_ns=20.0,  # [MB] approximate
        smem_per_sm_bytes=233472,  # [CUDA-PG] CC 9.0: 228 KB per SM
        smem_per_block_bytes=232448,  # [CUDA-PG] CC 9.0: 227 KB per block (opt-in)
        smem_reserved_per_block_bytes=1024,  # [CUDA-PG]
        registers_per_sm=65536,  # [CUDA-PG]
        max_registers_per_thread=255,  # [CUDA-PG]
        register_alloc_unit_per_warp=256,  # [CUDA-PG]
        max_threads_per_sm=2048,  # [CUDA-PG]
        max_threads_per_block=1024,  # [CUDA-PG]
        max_blocks_per_sm=32,  # [CUDA-PG]
        warps_to_saturate_tensor=4,  # [H100-WP] four tensor cores per SM
        kernel_launch_ns=3200.0,  # [H200-CAMPAIGN] the timing floor, as measured on Hopper
        k_step_cycles=40.0,  # [H200-CAMPAIGN] the same SM as the H200's
    ),
    "h200": GPUSpec(
        key="h200",
        name="NVIDIA H200-SXM-141GB",
        arch="sm_90",
        sm_count=132,  # [H200-DS] same GH100 configuration as H100 SXM5
        boost_clock_mhz=1830.0,  # [H200-DS] 989 dense FP16 TFLOPS, as H100 SXM5
        tensor_fp16_flops_per_clk_per_sm=4096.0,  # [H100-WP]
        mma_sync_efficiency=0.62,  # [MB] as H100
        dram_bandwidth_gbs=4800.0,  # [H200-DS] HBM3e, 141 GB
        dram_write_bandwidth_gbs=4800.0,  # assumed symmetric with reads
        dram_latency_ns=500.0,  # [MB] approximate, as H100
        l2_bandwidth_gbs=6600.0,  # [MB] approximate, as H100
        l2_latency_ns=160.0,  # [MB] approximate, as H100
        l2_bytes=50 * 1024 * 1024,  # [H200-DS]
        smem_bandwidth_bytes_per_clk_per_sm=128.0,  # [CUDA-PG]
        smem_latency_ns=20.0,  # [MB] approximate
        smem_per_sm_bytes=233472,  # [CUDA-PG] CC 9.0
        smem_per_block_bytes=232448,  # [CUDA-PG] CC 9.0
        smem_reserved_per_block_bytes=1024,  # [CUDA-PG]
        registers_per_sm=65536,  # [CUDA-PG]
        max_registers_per_thread=255,  # [CUDA-PG]
        register_alloc_unit_per_warp=256,  # [CUDA-PG]
        max_threads_per_sm=2048,  # [CUDA-PG]
        max_threads_per_block=1024,  # [CUDA-PG]
        max_blocks_per_sm=32,  # [CUDA-PG]
        warps_to_saturate_tensor=4,  # [H100-WP]
        kernel_launch_ns=3200.0,  # [H200-CAMPAIGN] the timing floor, as measured on Hopper
        k_step_cycles=40.0,  # [H200-CAMPAIGN]
    ),
}

_ALIASES = {
    "a100": "a100",
    "a100-sxm4-40gb": "a100",
    "nvidia a100-sxm4-40gb": "a100",
    "h100": "h100",
    "h100-sxm5-80gb": "h100",
    "h100-sxm": "h100",
    "nvidia h100-sxm5-80gb": "h100",
    "nvidia h100 80gb hbm3": "h100",
    # Device names as CUDA reports them for the other boards of a chip: the model's spec is
    # the SXM part's, and a calibrated profile overrides what differs (SMs, L2, bandwidth).
    "nvidia a100-sxm4-80gb": "a100",
    "nvidia a100-pcie-40gb": "a100",
    "nvidia a100 80gb pcie": "a100",
    "nvidia h100 pcie": "h100",
    "nvidia h100 nvl": "h100",
    "nvidia h100": "h100",
    "h200": "h200",
    "h200-sxm-141gb": "h200",
    "nvidia h200": "h200",
    "nvidia h200 nvl": "h200",
}


# The GPU a command or call means when it names none (`pipetune tune`, `pipetune.kernel`, ...).
DEFAULT_GPU = "h100"
# How far a profile may move a spec-sheet value (either way): measured values differ from
# the sheet by tens of percent, a mistake (units, a typo) by orders of magnitude.
PROFILE_MAX_RATIO = 100.0


def gpu_keys() -> list[str]:
    """Registry keys of every GPU the model knows."""
    return sorted(_SPECS)


def resolve_gpu_key(name: str) -> str:
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        raise HardwareError(f"{UNKNOWN_GPU} '{name}'; known: {', '.join(gpu_keys())}")
    return key


def parse_profile(document: Any, source: str) -> tuple[str | None, dict[str, Any]]:
    """Split a profile document into (gpu key or None, overrides).

    A profile is ``{"gpu": "h100", "overrides": {field: value, ...}, ...}``; other
    top-level keys (device name, date, method) are provenance and are kept by the file only.
    """
    if not isinstance(document, dict):
        raise HardwareError(f"{source}: a profile must be a JSON object")
    overrides = document.get("overrides")
    if not isinstance(overrides, dict):
        raise HardwareError(f"{source}: a profile needs an 'overrides' object")
    gpu = document.get("gpu")
    if gpu is not None and not isinstance(gpu, str):
        raise HardwareError(f"{source}: 'gpu' must be a string")
    if not gpu:
        return None, overrides
    try:
        return resolve_gpu_key(gpu), overrides
    except HardwareError as exc:  # (named "--gpu: ..." by the CLI, which the user typed right)
        raise HardwareError(f"{source}: 'gpu': {exc}") from None


def load_profile(path: str | Path) -> tuple[str | None, dict[str, Any]]:
    """A profile file's (gpu key or None, overrides), parsed once per version of the file.

    get_gpu reads a profile on every call, and a worker registration calls it: read from disk
    each time, a registration made with every file descriptor taken (EMFILE at the hard
    limit) answered 500. Profiles are rewritten rarely (`pipetune calibrate`, `pipetune
    campaign unpack`, a user's edit), so the parse is cached under the file's stat signature
    instead: a stat needs no descriptor, and a rewritten file (new mtime, size or inode) is
    read afresh on the next call, as before.
    """
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        raise HardwareError(f"profile {path} does not exist") from exc
    except OSError as exc:  # a folder on the way not searchable, a name too long
        raise HardwareError(f"profile {path} cannot be read: {exc}") from exc
    target, overrides = _read_profile(path, st.st_mtime_ns, st.st_size, st.st_ino)
    return target, dict(overrides)  # a copy: the cached one is shared by every caller


# A profile is a few kilobytes of JSON: a file past this is something else (read whole, an
# endless device such as /dev/zero took all the memory).
MAX_PROFILE_BYTES = 16 * 2**20

# Enough for every GPU's profile plus a few explicit ones; each entry is a few hundred bytes.
# A rewritten file leaves its old entry behind until it is pushed out.
_PROFILE_CACHE_SIZE = 64


@functools.lru_cache(maxsize=_PROFILE_CACHE_SIZE)
def _read_profile(
    path: Path, _mtime_ns: int, _size: int, _inode: int
) -> tuple[str | None, dict[str, Any]]:
    """load_profile's read and parse; the stat fields are only the cache key (a failure
    raises, and lru_cache keeps no exception, so a file fixed since is read again)."""
    try:
        with path.open("rb") as file:  # (a device such as /dev/zero has no end: capped)
            raw = file.read(MAX_PROFILE_BYTES + 1)
        if len(raw) > MAX_PROFILE_BYTES:
            raise HardwareError(
                f"profile {path} holds more than {MAX_PROFILE_BYTES // 2**20} MiB: not a "
                "hardware profile (a few kilobytes of JSON)"
            )
        document = json.loads(raw.decode())
    except FileNotFoundError as exc:  # removed between the stat and the read
        raise HardwareError(f"profile {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise HardwareError(f"profile {path} is a directory, not a JSON file") from exc
    except (OSError, UnicodeDecodeError) as exc:  # unreadable, or not text
        raise HardwareError(f"profile {path} cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise HardwareError(f"profile {path} is not valid JSON: {exc.msg}") from exc
    except RecursionError:  # (json's decoder recurses per level: a crash, not a message)
        raise HardwareError(f"profile {path} is not valid JSON: nested too deeply") from None
    return parse_profile(document, str(path))


def user_profile_dir() -> Path:
    """Where this user's own profiles live: ``$PIPETUNE_PROFILE_DIR``, else ``profiles/``
    under the user data dir (beside the embedded database). `pipetune calibrate` and
    `pipetune campaign unpack` write there by default, and :func:`get_gpu` looks there first."""
    explicit = os.environ.get(USER_PROFILE_DIR_ENV)
    if explicit:
        folder = Path(explicit).expanduser()
        if folder.exists() and not folder.is_dir():
            # (Ignored, the shipped profiles applied: replicas and workers told to share one
            # folder modelled their GPUs apart, without a word.)
            raise HardwareError(f"{USER_PROFILE_DIR_ENV}: {folder} is not a directory")
        return folder
    import platformdirs  # imported here: the model's other users never need it

    return Path(platformdirs.user_data_dir("pipetune")) / "profiles"


def profile_dirs(*, user_profile: bool = True) -> tuple[tuple[Path, str], ...]:
    """The folders the model applies a GPU's profile from, the first that holds one winning,
    each with its label's prefix: the user's own (``calibrated(user)``; left out without
    ``user_profile``), then the shipped one (``calibrated``)."""
    shipped = (PROFILE_DIR, "calibrated")
    return ((user_profile_dir(), "calibrated(user)"), shipped) if user_profile else (shipped,)


def applied_profile(key: str, *, user_profile: bool = True) -> tuple[Path, str] | None:
    """The profile :func:`get_gpu` applies to GPU ``key`` and its label: the user's own
    (``calibrated(user):<file>``; not with ``user_profile`` False), else the shipped one
    (``calibrated:<file>``), else None. A user's profile replaces the shipped one rather
    than stacking on it: it measured the same fields on the user's own device."""
    for folder, kind in profile_dirs(user_profile=user_profile):
        path = folder / f"{key}.json"
        if path.is_file():
            return path, f"{kind}:{path.name}"
    return None


def get_gpu(
    name: str,
    *,
    profile: str | Path | None = None,
    calibrated: bool = True,
    user_profile: bool = True,
) -> GPUSpec:
    """The spec of a GPU by name or alias.

    With ``calibrated`` (the default) the GPU's profile is applied (:func:`applied_profile`:
    the user's own, else the shipped ``model/profiles/<key>.json``); an explicit
    ``profile`` path is applied on top of that. ``user_profile=False`` skips the user's own
    profile: data measured elsewhere (the campaigns committed with pipetune, whose
    calibration is the shipped profile) is evaluated with the profile of the device that
    measured it, not with one of the user's device.
    """
    key = resolve_gpu_key(name)
    spec = _SPECS[key]
    found = applied_profile(key, user_profile=user_profile) if calibrated else None
    if found is not None:
        spec = _with_profile(spec, *found)
    if profile is not None:
        spec = _with_profile(spec, profile, f"profile:{Path(profile).name}")
    return spec


def _with_profile(spec: GPUSpec, path: str | Path, label: str) -> GPUSpec:
    """spec with the profile file at ``path`` applied, labelled ``label``. A profile that
    says it measured another GPU is refused: <key>.json is applied by its name alone, and a
    copied or renamed file (or an explicit one of the wrong GPU) would pass that GPU's
    numbers off as this one's."""
    target, overrides = load_profile(path)
    if target is not None and target != spec.key:
        raise HardwareError(f"profile {path} is for '{target}', not '{spec.key}'")
    return _applied(spec, overrides, label, path)


def _applied(spec: GPUSpec, overrides: dict[str, Any], label: str, path: str | Path) -> GPUSpec:
    """spec.with_overrides, its refusal naming the file: a profile applied by itself (the
    user's folder, the shipped one) is otherwise a field name with no file to look in."""
    try:
        return spec.with_overrides(overrides, profile=label)
    except HardwareError as exc:
        raise HardwareError(f"profile {path}: {exc}") from None
