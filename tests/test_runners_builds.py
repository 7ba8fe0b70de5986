"""The cupy runner's build stage and the calibration kernels, compiled with NVRTC on the CPU
(skipped where the kernel generator or NVRTC is not installed)."""

from __future__ import annotations

import pytest

from pipetune.model.space import Schedule
from pipetune.workers.runners.base import RunnerUnavailableError

pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-bindings) is not installed")
try:
    from pipetune.workers.runners.builds import KernelBuilds
except RunnerUnavailableError:  # pragma: no cover - no kernel generator in this checkout
    pytest.skip("pipetune.workers.codegen is not available", allow_module_level=True)

SCHEDULES = [Schedule(2, 2, 2, 2, 2, 3, 2), Schedule(1, 1, 1, 1, 1, 1, 1)]


@pytest.fixture
def builds(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPETUNE_CACHE_DIR", str(tmp_path / "cache"))
    try:
        b = KernelBuilds("sm_90", workers=2)
    except RunnerUnavailableError as exc:  # pragma: no cover
        pytest.skip(str(exc))
    yield b
    b.close()


def test_builds_write_one_cubin_per_variant_and_schedule(builds):
    seen = []
    builds.build("gemm_kn", SCHEDULES, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (2, 2)
    for schedule in SCHEDULES:
        built = builds.get("gemm_kn", schedule)
        assert built.error is None
        with open(built.cubin_path, "rb") as handle:
            assert handle.read(4) == b"\x7fELF"  # a cubin is an ELF image
        assert 0 < built.registers <= 255 and built.compile_ms >= 0
        assert built.kernel.schedule == schedule
        assert built.smem_bytes >= built.kernel.smem_bytes
    # Another shape of the same variant needs no new kernel: nothing is compiled again.
    builds.build("gemm_kn", list(reversed(SCHEDULES)))
    assert builds.compiled_count == 2


def test_a_generator_refusal_is_that_schedule_s_compile_error(builds):
    bad = Schedule(3, 1, 1, 1, 1, 1, 1)  # 3 warps along M is not a knob value
    builds.build("bmm", [bad, SCHEDULES[1]])
    assert "code generation failed" in builds.get("bmm", bad).error
    assert builds.get("bmm", bad).cubin_path is None
    assert builds.get("bmm", SCHEDULES[1]).error is None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_calibration_kernels_compile(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPETUNE_CACHE_DIR", str(tmp_path / "cache"))
    compiler = pytest.importorskip("pipetune.workers.compile")
    from pipetune.workers.calibrate.microbench import SOURCE

    (result,) = compiler.compile_many([SOURCE], arch)
    assert result.cubin[:4] == b"\x7fELF"
    # The worst kernel is mma_kernel: its 8 chains x 4 fp32 accumulators stay in registers.
    assert result.spill_bytes == 0 and 32 < result.registers <= 64


def test_a_cubin_that_cannot_be_written_stops_the_runner_not_the_schedule(builds, monkeypatch):
    """A full disk: writing the compiled kernel failed with an OSError, which the worker took
    for the trial's own failure (`runtime_error`), every schedule it measured recorded as
    failing until the disk had room. It is the runner's failure now, naming the folder."""
    import errno
    from pathlib import Path

    def full(self, data):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    builds.submit("gemm_kn", SCHEDULES[:1])
    with pytest.raises(RunnerUnavailableError, match="No space left on device") as raised:
        builds.get("gemm_kn", SCHEDULES[0])
    assert "pipetune-cubins-" in str(raised.value)
    with pytest.raises(RunnerUnavailableError, match="cannot write compiled kernels"):
        builds.write_cubin("floor", b"\x7fELF")
