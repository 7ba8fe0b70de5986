"""NVRTC compilation of generated kernels to cubins, with ptxas resource usage and a cache."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipetune.model.errors import InvalidArgumentError, InvalidArgumentTypeError, PipetuneError
from pipetune.workers.compile import cache, nvrtc
from pipetune.workers.compile.ptxas_report import ReportMissingError, kernel_usage

_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")
BASE_OPTIONS: tuple[str, ...] = ("-std=c++17", "--ptxas-options=-v")


class CompileError(PipetuneError, RuntimeError):
    """The source does not compile; the message carries NVRTC's log."""

    def __init__(self, message: str, log: str = "", arch: str = ""):
        super().__init__(message)
        self.log = log
        self.arch = arch


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes = field(repr=False)
    arch: str
    registers: int
    spill_bytes: int  # spill stores + spill loads, bytes per thread
    smem_static_bytes: int
    compile_ms: float  # of the compile that produced the cubin (a cache hit keeps it)
    log: str = field(repr=False)
    spill_stores_bytes: int = 0
    spill_loads_bytes: int = 0
    stack_bytes: int = 0
    nvrtc_version: tuple[int, int] = (0, 0)
    cached: bool = False  # answered from the cache, no NVRTC call

    def resources(self) -> dict[str, Any]:
        """The resource report, without the cubin and the log."""
        return {
            "arch": self.arch,
            "registers": self.registers,
            "spill_bytes": self.spill_bytes,
            "spill_stores_bytes": self.spill_stores_bytes,
            "spill_loads_bytes": self.spill_loads_bytes,
            "stack_bytes": self.stack_bytes,
            "smem_static_bytes": self.smem_static_bytes,
            "compile_ms": self.compile_ms,
        }


_stats_lock = threading.Lock()
_nvrtc_calls = 0


def nvrtc_calls() -> int:
    """How many times this process has invoked NVRTC (cache hits do not count)."""
    return _nvrtc_calls


# The oldest target pipetune's kernels compile for: below sm_80 ptxas refuses what they use
# (checked with NVRTC 13.5 for sm_75: every tensor-core GEMM kernel, and every
# memory-intensive one that stores float16 vectors). Every GPU pipetune models is sm_80 or
# newer, so no kernel is lost by refusing older targets up front, where each kernel's
# compile failed on its own before.
MIN_SM = 80
SM80_INSTRUCTIONS = "cp.async, mma.sync m16n8k16, cvt.rn.f16x2.f32"


def check_arch(arch: str) -> str:
    """`arch` if it names a target this NVRTC compiles for; else an InvalidArgumentError (a
    ValueError) naming `arch` and saying why (an SM number NVRTC does not know was an
    NvrtcError, "invalid option", from deep inside)."""
    if not isinstance(arch, str):
        raise InvalidArgumentTypeError(
            "arch", f"expected a target name such as 'sm_90', got {type(arch).__name__}"
        )
    if not _ARCH.match(arch):
        raise InvalidArgumentError("arch", f"must look like sm_80 or sm_90a, got {arch!r}")
    known = nvrtc.supported_archs()
    number = int(arch.removeprefix("sm_").rstrip("af"))
    if number not in known:
        major, minor = nvrtc.version()
        listed = ", ".join(f"sm_{a}" for a in known)
        raise InvalidArgumentError(
            "arch", f"NVRTC {major}.{minor} does not compile for {arch}; it knows {listed}"
        )
    if number < MIN_SM:
        raise InvalidArgumentError(
            "arch",
            f"pipetune's kernels need sm_{MIN_SM} or newer ({SM80_INSTRUCTIONS}), not {arch}",
        )
    if arch != f"sm_{number}" and not nvrtc.accepts_arch(arch):
        # (Each kernel's compile failed on its own before: "invalid or no value specified
        # with --nv_arch flag".)
        major, minor = nvrtc.version()
        kind = "arch-specific" if arch.endswith("a") else "family-specific"
        raise InvalidArgumentError(
            "arch",
            f"NVRTC {major}.{minor} has no {kind} target {arch}; use sm_{number}",
        )
    return arch


def options_for(arch: str, extra: Sequence[str] = ()) -> list[str]:
    return [f"-arch={check_arch(arch)}", *BASE_OPTIONS, *extra]


def _result(cubin: bytes, meta: dict[str, Any], cached: bool) -> CompileResult:
    return CompileResult(
        cubin=cubin,
        arch=meta["arch"],
        registers=meta["registers"],
        spill_bytes=meta["spill_stores_bytes"] + meta["spill_loads_bytes"],
        smem_static_bytes=meta["smem_static_bytes"],
        compile_ms=meta["compile_ms"],
        log=meta["log"],
        spill_stores_bytes=meta["spill_stores_bytes"],
        spill_loads_bytes=meta["spill_loads_bytes"],
        stack_bytes=meta["stack_bytes"],
        nvrtc_version=tuple(meta["nvrtc_version"]),  # type: ignore[arg-type]
        cached=cached,
    )


def compile_source(
    code: str,
    arch: str,
    *,
    entry: str | None = None,
    options: Sequence[str] = (),
    filename: str = "pipetune_kernel.cu",
    use_cache: bool = True,
) -> CompileResult:
    """Compile CUDA C++ to a cubin for ``arch`` (e.g. "sm_90"); no GPU or driver needed.

    ``entry`` names the kernel whose ptxas report is returned (default: the worst case over
    all entries). Raises CompileError (with the log) when the source does not compile.
    """
    opts = options_for(arch, options)
    version = nvrtc.version()
    key = cache.cache_key(code + f"\n//entry:{entry}", arch, opts, version, nvrtc.build())
    if use_cache and (hit := cache.load(key)) is not None:
        try:
            return _result(*hit, cached=True)
        except (KeyError, TypeError, ValueError):
            pass  # an entry without the report's fields (another writer's): compile again

    global _nvrtc_calls
    with _stats_lock:
        _nvrtc_calls += 1
    start = time.perf_counter()
    cubin, log = nvrtc.compile_to_cubin(code, filename, opts)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    if cubin is None:
        raise CompileError(f"NVRTC could not compile {filename} for {arch}:\n{log}", log, arch)
    try:
        usage = kernel_usage(log, entry)
    except ReportMissingError as exc:
        raise CompileError(f"{exc} ({filename}, {arch}):\n{log}", log, arch) from None
    meta = {
        "arch": arch,
        "registers": usage.registers,
        "spill_stores_bytes": usage.spill_stores_bytes,
        "spill_loads_bytes": usage.spill_loads_bytes,
        "stack_bytes": usage.stack_bytes,
        "smem_static_bytes": usage.smem_static_bytes,
        "compile_ms": round(elapsed_ms, 3),
        "log": log,
        "nvrtc_version": list(version),
    }
    if use_cache:
        cache.store(key, cubin, meta)
    return _result(cubin, meta, cached=False)


def kernel_arch(kernel: Any, arch: str) -> str:
    """The target a generated kernel is built for on a device of `arch`: the arch itself, or
    its arch-specific target for a kernel of arch-specific instructions (Hopper's wgmma:
    ``arch_suffix`` "a", sm_90 -> sm_90a), which runs on that arch only, as the device is."""
    suffix = getattr(kernel, "arch_suffix", "")
    device = getattr(kernel, "device_arch", None)
    if suffix and device is not None and arch.removesuffix(suffix) != device:
        # (NVRTC's own answer, for sm_80a, was "invalid --nv_arch".)
        raise InvalidArgumentError(
            "arch",
            f"{kernel.name} uses {device}{suffix}-only instructions: it compiles for "
            f"{device}{suffix}, not {arch}",
        )
    return arch + suffix if suffix and not arch.endswith(suffix) else arch


def compile_kernel(kernel: Any, arch: str, *, use_cache: bool = True) -> CompileResult:
    """Compile a generated kernel of any family (``code``, ``name`` and, for a kernel of
    several launches, ``entries``); the report is that of its entry function, or the worst
    case over its entries when it has several (what a launch of any of them can need)."""
    entries = getattr(kernel, "entries", None) or (kernel.name,)
    entry = kernel.name if len(entries) == 1 else None
    return compile_source(
        kernel.code,
        kernel_arch(kernel, arch),
        entry=entry,
        filename=f"{kernel.name}.cu",
        use_cache=use_cache,
    )


def compile_many(
    sources: Sequence[Any],
    arch: str,
    workers: int | None = None,
    *,
    return_exceptions: bool = False,
    use_cache: bool = True,
) -> list[Any]:
    """Compile many sources (generated kernels of any family, or CUDA text) in parallel,
    results in input order.

    Threads, not processes: NVRTC releases the GIL while it compiles (measured: two
    threads compile two kernels in about half the time of one), and threads share the
    in-process cache. With ``return_exceptions`` a CompileError takes the failed entry's
    place instead of being raised.
    """
    check_arch(arch)
    workers = max(1, workers or os.cpu_count() or 1)

    def one(src: Any) -> CompileResult | CompileError:
        try:
            if isinstance(src, str):
                return compile_source(src, arch, use_cache=use_cache)
            return compile_kernel(src, arch, use_cache=use_cache)
        except CompileError as exc:
            if return_exceptions:
                return exc
            raise

    if workers == 1 or len(sources) <= 1:
        return [one(s) for s in sources]
    with ThreadPoolExecutor(max_workers=min(workers, len(sources))) as pool:
        return list(pool.map(one, sources))
