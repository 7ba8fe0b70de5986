"""Two GPUs' exports of the same workloads in one program: a user tuning an operator for an
H100 and an A100 includes both exports' headers in one translation unit and links both
exports' .cu files (each built for its GPU's arch) into one program that picks a kernel by
device at run time. The stems, the PIPETUNE_<STEM>_* macros, the tensor-map functions and
the kernels' extern "C" names lacked the GPU: the macros were redefined with the other GPU's
values (only a warning: the first header's values silently kept), and two kernels of one
schedule were a duplicate symbol at link time. nvcc builds them here (compile only: nothing
runs); a one-GPU export's names still build, and are left undefined where they would be
ambiguous."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import pipetune
from pipetune.clients.library.exports import export_tuned, workload_stem
from pipetune.clients.library.store import LocalStore
from pipetune.model.family import family_of, parse_any_workload

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not installed: these tests build with it"
)

# The model's pick on both GPUs: one schedule, so one generated kernel name for both.
SOFTMAX = {"op": "softmax", "rows": 4096, "cols": 1024}
# One random trial per GPU, of another seed each: two schedules, two sets of header values.
FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
SEEDS = {"h100": 1, "a100": 2}
HOPPER = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
HOPPER_SEEDS = {"h100": 1, "h200": 3}  # (two schedules: the tensor maps' boxes differ)


def _nvcc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nvcc", "-std=c++17", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _built_clean(done: subprocess.CompletedProcess[str]) -> None:
    """Built, and nothing redefined (a macro redefined with another value is only a
    warning)."""
    assert done.returncode == 0, done.stderr
    assert "redefin" not in done.stderr, done.stderr


def _rows(folder: Path) -> dict[str, dict[str, Any]]:
    """index.json's entries by operator."""
    index = json.loads((folder / "index.json").read_text())
    return {row["workload"]["op"]: row for row in index["workloads"]}


def _static_asserts(row: dict[str, Any], prefix: str | None) -> str:
    """C++ that compiles where each knob's macro, PREFIX_<KNOB> (None: the knob's own name,
    as TARGET_<stem> defines it), is the row's tuned value."""
    knobs = family_of(parse_any_workload(row["workload"])).knob_names
    return "".join(
        f"static_assert({knob if prefix is None else f'{prefix}_{knob.upper()}'} == "
        f'{row["schedule"][knob]}, "{knob}");\n'
        for knob in knobs
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """h100/ and a100/: each GPU's export of a softmax and a GEMM (simulated runner)."""
    root = tmp_path_factory.mktemp("two-gpus")
    url = f"sqlite:///{root / 'tuned.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        for gpu, seed in SEEDS.items():
            tune = {"budget": 1, "runner": "simulated", "db": url}
            pipetune.tune(SOFTMAX, gpu, strategy="analytical", **tune)
            pipetune.tune(FC, gpu, strategy="random", seed=seed, **tune)
    with LocalStore(url) as store:
        for gpu in SEEDS:
            export_tuned(store, gpu, root / gpu)
    return root


def _both(exported: Path) -> list[dict[str, Any]]:
    """Both GPUs' rows, after the premises: one kernel for the softmax on both GPUs (its
    generator's name the same), two GEMM schedules (other values in each header)."""
    h100, a100 = _rows(exported / "h100"), _rows(exported / "a100")
    assert h100["softmax"]["schedule"] == a100["softmax"]["schedule"]
    assert h100["gemm"]["schedule"] != a100["gemm"]["schedule"]
    return [*h100.values(), *a100.values()]


def test_two_gpus_kernels_link_into_one_program(exported: Path):
    """Each GPU's .cu built for its arch, all linked into one program that names every
    kernel (its host function, what cudaLaunchKernel takes) and picks one at run time."""
    kernels = [row["kernel"] for row in _both(exported)]
    (exported / "pick.cpp").write_text(
        "".join(f'extern "C" void {name}();\n' for name in kernels)
        + "int main(int argc, char**) {\n"
        + f"  void* kernels[] = {{{', '.join(f'(void*)&{name}' for name in kernels)}}};\n"
        + f"  return kernels[argc % {len(kernels)}] == nullptr;\n}}\n"
    )
    _built_clean(_nvcc("-c", "-o", "pick.o", "pick.cpp", cwd=exported))
    objects = ["pick.o"]
    for gpu in SEEDS:
        arch = json.loads((exported / gpu / "index.json").read_text())["arch"]
        for source in sorted((exported / gpu).glob("*.cu")):
            objects.append(f"{gpu}.{source.stem}.o")
            done = _nvcc(f"-arch={arch}", "-c", "-o", objects[-1], str(source), cwd=exported)
            _built_clean(done)
    _built_clean(_nvcc("-o", "app", *objects, cwd=exported))


def test_two_gpus_headers_in_one_translation_unit(exported: Path):
    """Both pipetune_tuned.h included: every GPU's PIPETUNE_<STEM>_<KNOB> its own value,
    none redefined."""
    rows = _both(exported)
    (exported / "headers.cpp").write_text(
        '#include "h100/pipetune_tuned.h"\n#include "a100/pipetune_tuned.h"\n'
        + "".join(_static_asserts(row, f"PIPETUNE_{row['stem'].upper()}") for row in rows)
    )
    _built_clean(_nvcc("-c", "-o", "headers.o", "headers.cpp", cwd=exported))


def test_a_one_gpu_exports_names_build_alone_and_are_undefined_beside_another_gpus(
    exported: Path,
):
    """PIPETUNE_<STEM>_<KNOB> and TARGET_<stem> of the stem without the GPU (what a one-GPU
    export named them) are the GPU's with its header alone; with another GPU's header too
    they are undefined, and TARGET_ of that stem an error, not the first header's values."""
    row = _rows(exported / "h100")["gemm"]
    old = workload_stem(parse_any_workload(row["workload"]))
    alone = exported / "one_gpu.cpp"
    alone.write_text(
        '#include "h100/pipetune_tuned.h"\n'
        + _static_asserts(row, f"PIPETUNE_{old.upper()}")
        + _static_asserts(row, None)
    )
    _built_clean(_nvcc(f"-DTARGET_{old}", "-c", "-o", "one_gpu.o", alone.name, cwd=exported))
    both = exported / "both_gpus.cpp"
    both.write_text(
        '#include "h100/pipetune_tuned.h"\n#include "a100/pipetune_tuned.h"\n'
        f"#if defined(PIPETUNE_{old.upper()}_CHUNK)\n#error ambiguous yet defined\n#endif\n"
    )
    _built_clean(_nvcc("-c", "-o", "both_gpus.o", both.name, cwd=exported))
    done = _nvcc(f"-DTARGET_{old}", "-c", "-o", "both_gpus.o", both.name, cwd=exported)
    assert done.returncode != 0 and f"TARGET_{old} is ambiguous" in done.stderr, done.stderr
    assert row["stem"] == f"{old}_h100"


def test_two_hopper_gpus_tensor_map_functions_in_one_translation_unit(tmp_path: Path):
    """A wgmma GEMM tuned on an H100 and an H200: both tensor-map headers in one program,
    each GPU's function called by its name; the name without the GPU is the H100's with its
    header alone."""
    url = f"sqlite:///{tmp_path / 'hopper.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        for gpu, seed in HOPPER_SEEDS.items():
            tune = {"budget": 1, "strategy": "random", "runner": "simulated", "db": url}
            pipetune.tune(HOPPER, gpu, seed=seed, **tune)
    headers, boxes = {}, []
    with LocalStore(url) as store:
        for gpu in HOPPER_SEEDS:
            (row,) = export_tuned(store, gpu, tmp_path / gpu)["workloads"]
            headers[gpu] = (f"{gpu}/{row['files']['tensor_maps']}", row["stem"])
            launch = json.loads((tmp_path / gpu / row["files"]["launch"]).read_text())
            boxes.append([m["box"] for m in launch["tensor_maps"]])
    assert boxes[0] != boxes[1]  # the premise: each GPU's function encodes other maps
    call = "(const void*)0x1000, (const void*)0x2000, maps"
    stems = [stem for _, stem in headers.values()]
    both = tmp_path / "both.cpp"
    both.write_text(
        "".join(f'#include "{header}"\n' for header, _ in headers.values())
        + "int main() {\n  CUtensorMap maps[2];\n"
        + "".join(f"  if (pipetune_{stem}_tensor_maps({call})) return 1;\n" for stem in stems)
        + "  return 0;\n}\n"
    )
    _built_clean(_nvcc("-c", "-o", "both.o", both.name, cwd=tmp_path))
    header, stem = headers["h100"]
    alone = tmp_path / "alone.cpp"
    alone.write_text(
        f'#include "{header}"\n'
        f"int main() {{ CUtensorMap maps[2]; return (int)pipetune_{stem.removesuffix('_h100')}"
        f"_tensor_maps({call}); }}\n"
    )
    _built_clean(_nvcc("-c", "-o", "alone.o", alone.name, cwd=tmp_path))
