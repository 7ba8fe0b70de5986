"""pipetune.workers.compile: NVRTC to cubin without a GPU, the ptxas report, errors, the cache."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipetune.model.space import Schedule
from pipetune.workers.codegen import generate
from pipetune.workers.compile import (
    CompileError,
    cache_dir,
    check_arch,
    clear_memory,
    compile_kernel,
    compile_many,
    compile_source,
    nvrtc_calls,
    nvrtc_version,
)
from pipetune.workers.compile.ptxas_report import (
    ReportMissingError,
    kernel_usage,
    parse_ptxas_report,
)

SMALL = Schedule(1, 1, 1, 1, 1, 2, 1)

LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
ptxas         .     24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem, 364 bytes cmem[0]
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers
"""


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPETUNE_CACHE_DIR", str(tmp_path))
    clear_memory()
    yield tmp_path
    clear_memory()


def test_ptxas_report_is_parsed_per_entry():
    usage = parse_ptxas_report(LOG)
    assert list(usage) == ["k1", "k2"]
    k1 = usage["k1"]
    assert (k1.registers, k1.spill_stores_bytes, k1.spill_loads_bytes) == (255, 16, 12)
    assert (k1.stack_bytes, k1.smem_static_bytes, k1.spill_bytes) == (24, 2048, 28)
    assert usage["k2"].spill_bytes == 0 and usage["k2"].smem_static_bytes == 0
    worst = kernel_usage(LOG)
    assert worst.registers == 255 and worst.spill_bytes == 28
    with pytest.raises(ReportMissingError):
        kernel_usage("ptxas info    : 0 bytes gmem\n")
    with pytest.raises(ReportMissingError):
        kernel_usage(LOG, "k3")


def test_nvrtc_is_the_13_series():
    assert nvrtc_version()[0] == 13  # the GPU machines run driver 580 (CUDA 13.0)


def test_compiles_to_a_cubin_without_a_gpu(fresh_cache):
    kernel = generate("gemm_kn", SMALL)
    result = compile_kernel(kernel, "sm_90")
    assert result.cubin[:4] == b"\x7fELF"  # a cubin is an ELF image (PTX would be text)
    assert result.arch == "sm_90" and not result.cached
    assert 0 < result.registers <= 255
    assert result.spill_bytes == 0 and result.smem_static_bytes == 0
    assert result.compile_ms > 0
    assert f"Compiling entry function '{kernel.name}' for 'sm_90'" in result.log


def test_cache_hit_returns_the_same_report_without_nvrtc(fresh_cache):
    kernel = generate("conv2d", SMALL)
    first = compile_kernel(kernel, "sm_80")
    calls = nvrtc_calls()
    again = compile_kernel(kernel, "sm_80")  # in-process hit
    clear_memory()
    from_disk = compile_kernel(kernel, "sm_80")  # disk hit
    assert nvrtc_calls() == calls
    for hit in (again, from_disk):
        assert hit.cached
        assert hit.resources() == first.resources()
        assert hit.cubin == first.cubin and hit.log == first.log
    assert cache_dir() == fresh_cache / "cubins"
    assert len(list(cache_dir().rglob("*.cubin"))) == 1
    # Another arch is another entry.
    assert not compile_kernel(kernel, "sm_90").cached
    assert nvrtc_calls() == calls + 1


def test_another_patch_release_of_nvrtc_does_not_answer_from_the_cache(fresh_cache, monkeypatch):
    """The key had only nvrtcVersion's (major, minor): a cache kept across an upgrade from
    one 13.x.y wheel to the next (the compose volume) gave the older ptxas's cubins."""
    from pipetune.workers.compile import nvrtc

    major, minor = nvrtc_version()
    assert f"release {major}.{minor}, V{major}.{minor}." in nvrtc.build()
    kernel = generate("gemm_kn", SMALL)
    assert not compile_kernel(kernel, "sm_80").cached
    assert compile_kernel(kernel, "sm_80").cached
    monkeypatch.setattr(nvrtc, "build", lambda: f"release {major}.{minor}, V{major}.{minor}.999")
    assert not compile_kernel(kernel, "sm_80").cached


def test_a_corrupt_cache_entry_is_a_miss(fresh_cache):
    kernel = generate("bmm", SMALL)
    compile_kernel(kernel, "sm_80")
    for path in cache_dir().rglob("*.json"):
        path.write_text("{not json")
    clear_memory()
    assert not compile_kernel(kernel, "sm_80").cached


def test_a_cache_entry_damaged_in_place_or_without_its_fields_is_rebuilt(fresh_cache):
    """A cubin of the right length but other bytes (zeros where a crash left them) was
    loaded as the kernel, for good; a json without a report field raised KeyError."""
    import json

    kernel = generate("gemm_nk", SMALL)
    first = compile_kernel(kernel, "sm_80")
    (cubin_path,) = cache_dir().rglob("*.cubin")
    (meta_path,) = cache_dir().rglob("*.json")
    cubin_path.write_bytes(b"\0" * len(first.cubin))
    clear_memory()
    again = compile_kernel(kernel, "sm_80")
    assert not again.cached and again.cubin[:4] == b"\x7fELF"
    assert cubin_path.read_bytes() == again.cubin  # the entry is written anew
    clear_memory()
    assert compile_kernel(kernel, "sm_80").cached
    meta = json.loads(meta_path.read_text())
    del meta["stack_bytes"]
    meta_path.write_text(json.dumps(meta))
    clear_memory()
    rebuilt = compile_kernel(kernel, "sm_80")
    assert not rebuilt.cached and rebuilt.stack_bytes == first.stack_bytes


def test_broken_source_raises_compile_error_with_the_log(fresh_cache):
    with pytest.raises(CompileError) as info:
        compile_source('extern "C" __global__ void k(int* p) { p[0] = undefined_name; }', "sm_80")
    assert "undefined_name" in str(info.value)
    assert "identifier" in info.value.log and info.value.arch == "sm_80"


def test_bad_arch_is_rejected_before_compiling():
    for bad in ("sm90", "compute_90", "90", "sm_9"):
        with pytest.raises(ValueError, match="arch"):
            check_arch(bad)
    assert check_arch("sm_90a") == "sm_90a"
    with pytest.raises(ValueError, match=r"does not compile for sm_99; it knows sm_75, .*sm_90"):
        check_arch("sm_99")  # the right shape, but no SM NVRTC knows


def test_compile_many_keeps_order_and_can_return_errors(fresh_cache):
    kernels = [generate(v, SMALL) for v in ("gemm_kn", "gemm_nk", "conv3d")]
    broken = "__global__ void broken( {"
    results = compile_many([*kernels, broken], "sm_90", workers=2, return_exceptions=True)
    for kernel, result in zip(kernels, results[:3], strict=True):
        assert f"Compiling entry function '{kernel.name}'" in result.log
    assert isinstance(results[3], CompileError)
    with pytest.raises(CompileError):
        compile_many([broken], "sm_90")


def test_the_in_process_layer_keeps_the_recent_entries_within_its_limit(fresh_cache, monkeypatch):
    """A long-running worker compiles a new kernel for nearly every trial: the in-process
    layer keeps the most recently used cubins up to its byte limit (it grew without end),
    and an entry it dropped is still answered from the disk."""
    from pipetune.workers.compile import cache

    monkeypatch.setattr(cache, "MEMORY_LIMIT_BYTES", 10_000)
    cubin = b"\0" * 3_000
    for i in range(20):
        cache.store(f"{i:064x}", cubin, {"arch": "sm_90"})
        assert cache.memory_bytes() <= 10_000
    assert len(cache._memory) == 3  # the three newest: 9,000 bytes
    assert cache.load(f"{19:064x}") is not None and cache.load(f"{17:064x}") is not None
    # A hit is the most recent use: 17 stays when the next store drops the oldest.
    cache.store(f"{20:064x}", cubin, {"arch": "sm_90"})
    assert list(cache._memory) == [f"{19:064x}", f"{17:064x}", f"{20:064x}"]
    # Dropped from memory, answered from the disk (and remembered again).
    hit = cache.load(f"{0:064x}")
    assert hit is not None and hit[0] == cubin and hit[1]["cubin_bytes"] == 3_000
    assert f"{0:064x}" in cache._memory and cache.memory_bytes() <= 10_000


def test_compiling_leaves_the_interpreters_one_byte_bytes_alone():
    """A clean compile's log is empty: NVRTC wrote its NUL terminator into `b" " * 1`, which
    is CPython's shared one-byte b" ", so every b" " of the process became b"\\x00" after
    that (a 70 KB request body padded with spaces went to the service as NULs: 422). Run in
    a child, as the old code broke the interpreter that ran it."""
    probe = (
        "from pipetune.workers.compile.nvrtc import build, compile_to_cubin\n"
        "cubin, log = compile_to_cubin('extern \"C\" __global__ void k() {}', 'k.cu', "
        "['-arch=sm_90'])\n"
        "assert log == '' and cubin.startswith(bytes([0x7F]) + b'ELF'), (log, cubin[:4])\n"
        "build()\n"
        "print(repr(bytes([32]) * 3))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "b'   '"
