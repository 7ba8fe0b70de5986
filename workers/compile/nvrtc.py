"""NVRTC through ``cuda.bindings.nvrtc`` (cuda-bindings, NVIDIA's maintained bindings).

NVRTC needs neither a GPU nor a driver: it loads libnvrtc from the ``nvidia-cuda-nvrtc``
wheel (cuda-pathfinder finds it in site-packages) and compiles for any named arch. With
``-arch=sm_XX`` it runs ptxas and hands back a cubin (SASS), which a driver of the same major
CUDA version runs without JIT: the 13.x wheels are pinned for the GPU machines' driver 580
(CUDA 13.0). The calls release the GIL, so threads compile in parallel.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pipetune.model.errors import PipetuneError


class NvrtcError(PipetuneError, RuntimeError):
    """NVRTC itself failed (not a compile error of the source)."""


def _nvrtc() -> Any:
    from cuda.bindings import nvrtc  # imported lazily: the CLI's other commands skip it

    return nvrtc


def _check(result: Any, what: str) -> Any:
    """Unwrap a cuda.bindings ``(err, *values)`` tuple, raising on an error code."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise NvrtcError(f"{what}: {msg.decode(errors='replace')}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def _read_out(prog: Any, size: int, get: Any, what: str) -> bytes:
    """`size` bytes of one of a program's outputs (its log, PTX or cubin), read into a fresh
    bytearray: the bindings write through the buffer they are given, and a `b" " * size` of
    size 1 (the empty log of every clean compile) is CPython's shared one-byte b" ", so
    NVRTC's terminator turned every b" " of the process into b"\x00" (an HTTP body padded
    with b" " went out as NULs)."""
    buf = bytearray(size)
    _check(get(prog, buf), what)
    return bytes(buf)


@cache
def version() -> tuple[int, int]:
    """(major, minor) of the loaded libnvrtc."""
    major, minor = _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


@cache
def build() -> str:
    """The loaded libnvrtc's exact build, as its PTX header names it ("Cuda compilation
    tools, release 13.5, V13.5.37" and the compiler's build ID): nvrtcVersion says only
    (major, minor), the same for every patch release of a minor version, whose ptxas
    differ. One empty program compiled to PTX, once per process; "" if that fails."""
    try:
        ptx, _ = _compile(
            'extern "C" __global__ void k() {}', "build.cu", ["-arch=compute_80"], "ptx"
        )
    except NvrtcError:
        return ""
    lines = (ptx or b"").rstrip(b"\x00").decode(errors="replace").splitlines()
    return "; ".join(
        ln.removeprefix("//").strip()
        for ln in lines
        if ln.startswith(("// Compiler Build ID", "// Cuda compilation tools"))
    )


# The oldest Linux driver of each CUDA major version: a cubin NVRTC of that major version
# built runs on it and on every newer one (CUDA's minor version compatibility), without JIT.
DRIVER_OF_MAJOR = {12: "525.60.13", 13: "580.65.06"}


def cubin_compiler() -> dict[str, str]:
    """What built the cubins and what runs them, for a user who loads them with the driver
    API on their own machine (an export said neither)."""
    major, minor = version()
    driver = DRIVER_OF_MAJOR.get(major)
    runs_on = f"a CUDA {major} driver" + (f" ({driver} or newer on Linux)" if driver else "")
    return {"nvrtc": f"{major}.{minor}", "nvrtc_build": build(), "driver": runs_on}


@cache
def supported_archs() -> tuple[int, ...]:
    """The SM numbers the loaded libnvrtc compiles for (75, 80, ..., 121 for NVRTC 13)."""
    archs = _check(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


@cache
def accepts_arch(arch: str) -> bool:
    """Whether the loaded libnvrtc builds a cubin for ``arch`` (an empty program, once per
    arch): an arch-specific or family target ("a", "f") exists for some SM numbers only
    (sm_90a, sm_100f; no sm_80a, no sm_90f), which nvrtcGetSupportedArchs does not say."""
    try:
        cubin, _ = compile_to_cubin(
            'extern "C" __global__ void pipetune_arch_probe() {}',
            "pipetune_arch_probe.cu",
            [f"-arch={arch}"],
        )
    except NvrtcError:
        return False
    return cubin is not None


def compile_to_cubin(code: str, filename: str, options: list[str]) -> tuple[bytes | None, str]:
    """(cubin or None when the source does not compile, program log)."""
    return _compile(code, filename, options, "cubin")


def _compile(
    code: str, filename: str, options: list[str], output: Literal["cubin", "ptx"]
) -> tuple[bytes | None, str]:
    """(the program's cubin or PTX, or None when the source does not compile; its log)."""
    nvrtc = _nvrtc()
    prog = _check(
        nvrtc.nvrtcCreateProgram(code.encode(), filename.encode(), 0, [], []),
        "nvrtcCreateProgram",
    )
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = _read_out(prog, size, nvrtc.nvrtcGetProgramLog, "nvrtcGetProgramLog")
        log = buf.rstrip(b"\x00").decode(errors="replace")
        if err == nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
            return None, log
        _check((err,), "nvrtcCompileProgram")
        if output == "cubin":
            size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            if size == 0:
                raise NvrtcError("NVRTC produced no cubin (is the arch a real sm_XX?)")
            return _read_out(prog, size, nvrtc.nvrtcGetCUBIN, "nvrtcGetCUBIN"), log
        size = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        return _read_out(prog, size, nvrtc.nvrtcGetPTX, "nvrtcGetPTX"), log
    finally:
        _check(nvrtc.nvrtcDestroyProgram(prog), "nvrtcDestroyProgram")
