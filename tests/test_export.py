"""`pipetune export` on a database with two tuned workloads: sources that compile, cubins
whose ELF header says sm_90, launch JSON that is the cupy runner's launch, a header whose
#defines a C compiler reads back, an index; a task's trials as a T4 file that `pipetune
dataset info` and Kernel Tuner's T4 schema accept; the same export through a service. The
same for a database holding a tuned GEMM and a tuned softmax (both families exported, the
softmax's launch JSON its whole run: launches, buffers, workspace)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cubin_support import cubin_sm
from launch_support import runner_spec
from service_support import TestClient, client_for
from typer.testing import CliRunner

import pipetune
from pipetune.clients.cli.main import app
from pipetune.clients.cli.output import console
from pipetune.clients.library.exports import defined_kernels, export_tuned, symbol_of
from pipetune.clients.library.store import LocalStore
from pipetune.clients.sdk import Client
from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.model.space import KNOB_NAMES, Schedule
from pipetune.model.workloads import parse_workload
from pipetune.workers.codegen import generate
from pipetune.workers.compile import compile_source
from pipetune.workers.datasets import load_dataset
from pipetune.workers.datasets.pipetune import t4_timestamp
from pipetune.workers.runners.base import MeasureSettings
from pipetune.workers.runners.builds import Compiled
from pipetune.workers.runners.kernel_runner import trial_spec
from pipetune.workers.runners.timing import RepeatPolicy

FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
CONV = {"op": "conv2d", "n": 8, "h": 28, "w": 28, "c": 64, "k": 64, "r": 3, "s": 3, "pad": 1}
SOFTMAX = {"op": "softmax", "rows": 4096, "cols": 1024}
cli = CliRunner()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database with two workloads tuned on h100 (simulated runner, instantly)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('export') / 'tuned.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        pipetune.tune(FC, "h100", budget=6, strategy="random", runner="simulated", db=url)
        pipetune.tune(CONV, "h100", budget=4, strategy="random", runner="simulated", db=url)
    return url


@pytest.fixture(scope="module")
def tuned_mixed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database with a tuned GEMM and a tuned softmax on h100 (both kernel families)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('export-mixed') / 'tuned.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        pipetune.tune(FC, "h100", budget=4, strategy="random", runner="simulated", db=url)
        pipetune.tune(SOFTMAX, "h100", budget=6, strategy="random", runner="simulated", db=url)
    return url


@pytest.fixture(autouse=True)
def no_ambient_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)


def _export(tuned: str, out: Path) -> dict[str, Any]:
    result = cli.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out), "--db", tuned])
    assert result.exit_code == 0, result.output
    assert "2 tuned kernels for h100 (sm_90)" in result.stdout
    assert "runner simulated: those latencies are simulated" in result.stdout
    return json.loads((out / "index.json").read_text())


def test_every_tuned_workload_is_written(tuned: str, tmp_path: Path):
    index = _export(tuned, tmp_path)
    assert (index["gpu"], index["arch"], index["simulated"]) == ("h100", "sm_90", True)
    assert sorted(row["label"] for row in index["workloads"]) == [
        "conv2d n8 28x28x64->64 3x3 s1 p1",
        "gemm 1024x64x2048",
    ]
    names = {"index.json", "pipetune_tuned.h"}
    for row in index["workloads"]:
        names |= set(row["files"].values())
        best = pipetune.best_schedule(row["workload"], "h100", db=tuned)
        assert row["schedule"] == best.schedule.model_dump() and row["runner"] == "simulated"
        assert row["latency_us"] == best.latency_us and "not measurements" in row["latency_label"]
    assert {p.name for p in tmp_path.iterdir()} == names  # and no temporary file left


def test_sources_compile_and_cubins_are_for_sm_90(tuned: str, tmp_path: Path):
    index = _export(tuned, tmp_path)
    # Which NVRTC built the cubins and which driver loads them (a user loading them with
    # the driver API could not tell).
    from pipetune.workers.compile import nvrtc

    major, minor = nvrtc.version()
    assert index["cubins"]["nvrtc"] == f"{major}.{minor}"
    assert index["cubins"]["nvrtc_build"] == nvrtc.build()
    assert index["cubins"]["driver"].startswith(f"a CUDA {major} driver")
    for row in index["workloads"]:
        source = (tmp_path / row["files"]["source"]).read_text()
        compiled = compile_source(source, "sm_90", entry=row["kernel"], use_cache=False)
        assert compiled.registers > 0
        assert cubin_sm((tmp_path / row["files"]["cubin"]).read_bytes()) == 90
        assert cubin_sm(compiled.cubin) == 90


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_nvcc_compiles_an_exported_source(tuned: str, tmp_path: Path):
    row = _export(tuned, tmp_path)["workloads"][0]
    out = tmp_path / "nvcc.cubin"
    source = tmp_path / row["files"]["source"]
    done = subprocess.run(
        ["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert cubin_sm(out.read_bytes()) == 90


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_the_index_says_the_nvcc_command_that_builds_the_export(tuned: str, tmp_path: Path):
    """The documented `nvcc -c *.cu` built for nvcc's default arch (sm_75), where no kernel
    of ours compiles; index.json now says the command, with the arch, and it builds them."""
    index = _export(tuned, tmp_path)
    assert index["nvcc"] == "nvcc -c -std=c++17 -arch=sm_90 *.cu"
    sources = sorted(p.name for p in tmp_path.glob("*.cu"))
    command = index["nvcc"].split()[:-1] + sources  # (the glob, as a shell expands it)
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert len(list(tmp_path.glob("*.o"))) == len(sources)


def test_launch_json_is_the_cupy_runners_launch(tuned: str, tmp_path: Path):
    index = _export(tuned, tmp_path)
    for row in index["workloads"]:
        launch = json.loads((tmp_path / row["files"]["launch"]).read_text())
        workload = parse_workload(row["workload"])
        schedule = Schedule.from_dict(row["schedule"])
        compiled = Compiled(kernel=generate(workload, schedule), cubin_path="/x.cubin")
        spec = trial_spec(compiled, workload, schedule, RepeatPolicy.of(MeasureSettings()))
        # (the runner's kernel, named with the GPU in the export)
        assert launch["kernel"] == symbol_of(spec.kernel_name, "h100") == row["kernel"]
        assert tuple(launch["grid"]) == spec.grid
        assert tuple(launch["block"]) == (spec.threads, 1, 1)
        assert launch["dynamic_smem_bytes"] == spec.smem_bytes
        assert tuple(launch["scalars"].values()) == spec.scalars
        assert launch["arguments"][:3] == ["A", "B", "C"]
        assert list(launch["scalars"]) == launch["arguments"][3:]
        assert [op["name"] for op in launch["operands"]] == ["A", "B", "C"]
        assert launch["arch"] == "sm_90" and launch["runner"] == "simulated"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def _assert_header_defines(folder: Path, stem: str, schedule: dict, knobs) -> None:
    """A C compiler confirms that pipetune_tuned.h, with TARGET_<stem> defined, defines each
    knob (bare and prefixed with the workload's stem) as the schedule's value."""
    checks = "".join(
        f'_Static_assert({knob} == {schedule[knob]}, "{knob}");\n'
        f'_Static_assert(PIPETUNE_{stem.upper()}_{knob.upper()} == {schedule[knob]}, "{knob}");\n'
        for knob in knobs
    )
    program = folder / f"check_{stem}.c"
    program.write_text(f'#include "pipetune_tuned.h"\n{checks}')
    done = subprocess.run(
        ["cc", "-fsyntax-only", "-std=c11", f"-I{folder}", f"-DTARGET_{stem}", str(program)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_header_defines_each_workloads_parameters(tuned: str, tmp_path: Path):
    index = _export(tuned, tmp_path)
    for row in index["workloads"]:
        _assert_header_defines(tmp_path, row["stem"], row["schedule"], KNOB_NAMES)


def test_the_same_export_through_a_service(tuned: str, tmp_path: Path):
    direct = _export(tuned, tmp_path / "direct")
    with client_for(tuned) as service:
        assert isinstance(service, TestClient)
        with Client("http://testserver", transport=service._transport) as sdk:
            served = export_tuned(sdk, "h100", tmp_path / "served")
    assert served["source"] == "http://testserver"
    assert {**served, "source": None} == {**direct, "source": None}
    for row in direct["workloads"]:
        for name in row["files"].values():
            assert (tmp_path / "served" / name).read_bytes() == (
                tmp_path / "direct" / name
            ).read_bytes()


def test_a_gpu_with_nothing_tuned_exports_an_empty_index(tuned: str, tmp_path: Path):
    result = cli.invoke(app, ["export", "--gpu", "a100", "--out-dir", str(tmp_path), "--db", tuned])
    assert result.exit_code == 0 and "no workload tuned on a100" in result.stdout
    assert json.loads((tmp_path / "index.json").read_text())["workloads"] == []


def test_an_export_over_another_gpus_replaces_its_kernels_only(tuned: str, tmp_path: Path):
    """The h100 kernels stayed beside an a100 export's index (a build globbing *.cubin linked
    them); the user's own files in the folder, and anything a hand-edited index names outside
    the folder, are left alone."""
    index = _export(tuned, tmp_path / "out")
    kernels = {name for row in index["workloads"] for name in row["files"].values()}
    (tmp_path / "out" / "mine.cu").write_text("// the user's own\n")
    (tmp_path / "keep.txt").write_text("outside\n")
    edited = json.loads((tmp_path / "out" / "index.json").read_text())
    edited["workloads"][0]["files"]["extra"] = "../keep.txt"
    (tmp_path / "out" / "index.json").write_text(json.dumps(edited))
    args = ["export", "--gpu", "a100", "--out-dir", str(tmp_path / "out"), "--db", tuned]
    assert cli.invoke(app, args).exit_code == 0
    left = {p.name for p in (tmp_path / "out").iterdir()}
    assert left == {"index.json", "pipetune_tuned.h", "mine.cu"} and not kernels & left
    assert (tmp_path / "keep.txt").exists()
    assert json.loads((tmp_path / "out" / "index.json").read_text())["gpu"] == "a100"


def test_an_export_whose_compile_fails_leaves_the_earlier_export_whole(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Each kernel's files were written as its cubin compiled: a compile that failed on the
    second left the first kernel's new files beside the earlier export's index. Now every
    file is made first, and all are written or none."""
    from pipetune.clients.library.exports import Exported

    out = tmp_path / "out"
    _export(tuned, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []

    def second_fails(self):
        calls.append(self.stem)
        if len(calls) == 2:
            raise RuntimeError("NVRTC: out of memory")
        return b"changed\n"  # (a file unlike the earlier export's, if it were written)

    monkeypatch.setattr(Exported, "cubin", second_fails)
    monkeypatch.setattr(Exported, "source", lambda self: "// changed\n")
    with pytest.raises(RuntimeError, match="NVRTC"):
        export_tuned(LocalStore(tuned), "h100", out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_tasks_trials_as_t4(tuned: str, tmp_path: Path):
    out = tmp_path / "task1.t4.json.gz"
    args = ["export", "--task", "1", "--format", "t4", "--out", str(out), "--db", tuned]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "wrote 6 trials of task 1" in result.stdout
    info = cli.invoke(app, ["dataset", "info", str(out), "--json"])
    assert info.exit_code == 0, info.output
    doc = json.loads(info.stdout)
    assert (doc["configurations"], doc["valid"], doc["runner"]) == (6, 6, "simulated")
    assert doc["workload_label"] == "gemm 1024x64x2048" and doc["gpu"] == "h100"
    best = pipetune.best_schedule(FC, "h100", db=tuned)
    assert doc["best"] == best.schedule.model_dump()
    assert doc["best_time_ms"] == pytest.approx(best.latency_us / 1e3)

    # ... and back in, into another database: the same trials, as an imported task.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    imported = cli.invoke(app, ["db", "import-dataset", str(out), "--db", other, "--json"])
    assert imported.exit_code == 0, imported.output
    task = json.loads(imported.stdout)
    assert task["imported_from"] == str(out) and task["trials_done"] == 6
    with LocalStore(tuned) as source, LocalStore(other) as copy:
        mine = source.all_trials(1, samples=True)
        theirs = copy.all_trials(task["id"], samples=True)
    assert [(t.schedule, t.runner) for t in theirs] == [(t.schedule, t.runner) for t in mine]
    # The file keeps milliseconds (T4's unit): µs -> ms -> µs may move a latency's last bit
    # (15.850401134328441 came back as 15.85040113432844), never more.
    for back, sent in zip(theirs, mine, strict=True):
        assert back.latency_us == pytest.approx(sent.latency_us, rel=1e-15)
        # ... and the rest of the measurement with it (an export kept the latency alone).
        assert sent.samples_us and back.samples_us == pytest.approx(sent.samples_us, rel=1e-15)
        assert sent.spread is not None and sent.smem_bytes is not None
        fields = ("spread", "registers", "spill_bytes", "smem_bytes", "compile_ms", "max_abs_error")
        assert [getattr(back, f) for f in fields] == [getattr(sent, f) for f in fields]
        # ... and when it was measured: each record's timestamp is its trial's finish (it was
        # the export's own time for every record, and the import dropped it).
        assert sent.finished_at is not None and back.finished_at == sent.finished_at
    stamps = [r.timestamp for r in load_dataset(out).records]
    assert stamps == [t4_timestamp(t.finished_at) for t in mine]


@pytest.mark.skipif(importlib.util.find_spec("kernel_tuner") is None, reason="no Kernel Tuner")
def test_kernel_tuners_t4_schema_accepts_the_file(tuned: str, tmp_path: Path):
    import jsonschema
    from kernel_tuner.file_utils import output_file_schema

    out = tmp_path / "task2.t4.json"
    args = ["export", "--task", "2", "--format", "t4", "--out", str(out), "--db", tuned]
    assert cli.invoke(app, args).exit_code == 0
    version, schema = output_file_schema("results")
    document = json.loads(out.read_text())
    jsonschema.validate(document, schema)
    assert document["schema_version"] == version and len(document["results"]) == 4


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "give --gpu and --out-dir (tuned kernels) or --task"),
        (["--gpu", "h100"], "give --gpu and --out-dir"),
        (["--task", "1"], "--out: give the T4 file"),
        (["--task", "1", "--out", "x.json", "--format", "csv"], "--format: a task's trials"),
        (["--task", "1", "--out", "/no/dir/x.json"], "--out: directory /no/dir does not exist"),
        (["--task", "1", "--gpu", "h100", "--out", "x.json"], "--task: exports one task's"),
        (["--gpu", "h100", "--out-dir", "d", "--format", "t4"], "--out and --format go with"),
        (["--gpu", "v100", "--out-dir", "d"], "unknown GPU 'v100'"),
        (["--gpu", "h100", "--out-dir", "d", "--db", "x", "--server", "http://h"], "not both"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(args: list[str], words: str, tmp_path: Path):
    result = cli.invoke(app, ["export", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and words in result.stderr


def test_no_task_is_exit_2_and_a_task_with_no_trials_exit_1(tuned: str, tmp_path: Path):
    missing = ["export", "--task", "99", "--out", str(tmp_path / "x.json"), "--db", tuned]
    result = cli.invoke(app, missing)
    assert result.exit_code == 2 and "task 99 does not exist" in result.stderr
    copy = tmp_path / "copy.db"
    shutil.copy(tuned.removeprefix("sqlite:///"), copy)
    with client_for(f"sqlite:///{copy}") as service:  # a task whose trials wait for workers
        body = {"workload": FC, "gpu": "a100", "budget": 4}
        task = service.post("/v1/tasks", json=body).json()["id"]
    waiting = ["export", "--task", str(task), "--out", str(tmp_path / "x.json")]
    result = cli.invoke(app, [*waiting, "--db", f"sqlite:///{copy}"])
    assert result.exit_code == 1 and "has no finished trial to export yet" in result.stderr
    assert not (tmp_path / "x.json").exists()
    # Cancelled, it never will: "yet" said otherwise.
    with client_for(f"sqlite:///{copy}") as service:
        assert service.delete(f"/v1/tasks/{task}").status_code == 200
    result = cli.invoke(app, [*waiting, "--db", f"sqlite:///{copy}"])
    assert result.exit_code == 1
    assert "has no finished trial to export (it ended cancelled)" in result.stderr


def test_help_names_both_forms_and_the_sources():
    result = cli.invoke(app, ["export", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for flag in ("--gpu", "--out-dir", "--task", "--format", "--out", "--server", "--db"):
        assert flag in text


# ---- both families: a tuned GEMM and a tuned softmax ----------------------------------------


def test_a_gemm_and_a_softmax_are_both_exported(tuned_mixed: str, tmp_path: Path):
    index = _export(tuned_mixed, tmp_path)
    assert index["not_exported"] == []
    rows = {row["workload"]["op"]: row for row in index["workloads"]}
    assert sorted(rows) == ["gemm", "softmax"]
    assert rows["softmax"]["label"] == "softmax 4096x1024"
    assert rows["softmax"]["throughput_unit"] == "GB/s"
    names = {"index.json", "pipetune_tuned.h"}
    for row in index["workloads"]:
        names |= set(row["files"].values())
        best = pipetune.best_schedule(row["workload"], "h100", db=tuned_mixed)
        assert row["schedule"] == best.schedule.model_dump() and row["runner"] == "simulated"
        source = (tmp_path / row["files"]["source"]).read_text()
        assert 'extern "C"' in source and row["kernel"] in source
        compiled = compile_source(source, "sm_90", use_cache=False)  # every entry
        assert compiled.registers > 0 and cubin_sm(compiled.cubin) == 90
        assert cubin_sm((tmp_path / row["files"]["cubin"]).read_bytes()) == 90
    assert {p.name for p in tmp_path.iterdir()} == names


def _assert_the_runners_plan(
    launch: dict[str, Any], workload: Any, schedule: Any, *, exported: bool = True
) -> None:
    """The launch document is the plan KernelRunner.run_trials sends the cupy child for
    this schedule: the device's SMs, the model's occupancy; an export's (`exported`) names
    the runner's kernels with the GPU (h100) after them."""
    spec, occupancy = runner_spec(workload, schedule)
    plan = spec.plan.as_dict()
    kernel_name = symbol_of(spec.kernel_name, "h100") if exported else spec.kernel_name
    if exported:
        for entry in plan["launches"]:
            entry["kernel"] = symbol_of(entry["kernel"], "h100")
    assert launch["launches"] == plan["launches"]
    assert [{k: v for k, v in b.items() if k != "nbytes"} for b in launch["buffers"]] == (
        plan["buffers"]
    )
    assert launch["output"] == plan["output"]
    assert launch["kernel"] == kernel_name
    assert tuple(launch["grid"]) == spec.grid
    assert tuple(launch["block"]) == (spec.threads, 1, 1)
    assert launch["dynamic_smem_bytes"] == spec.smem_bytes
    assert tuple(launch["scalars"].values()) == spec.scalars
    assert launch["occupancy"] == {
        "sm_count": get_gpu("h100").sm_count,
        "blocks_per_sm": occupancy,
        "blocks_per_sm_from": "model",  # the cubin's registers allow as many or more
        "grid_depends_on_occupancy": spec.codegen is not None,
    }
    roles = {b["name"]: b["role"] for b in launch["buffers"]}
    operands = [op["name"] for op in launch["operands"]]
    assert operands == [n for n, r in roles.items() if r == "input"] + [launch["output"]]
    assert launch["workspace"] == [n for n, r in roles.items() if r == "workspace"]


def test_every_familys_launch_json_is_the_cupy_runners_plan(tuned_mixed: str, tmp_path: Path):
    index = _export(tuned_mixed, tmp_path)
    for row in index["workloads"]:
        launch = json.loads((tmp_path / row["files"]["launch"]).read_text())
        workload = parse_any_workload(row["workload"])
        schedule = family_of(workload).parse_schedule(row["schedule"])
        _assert_the_runners_plan(launch, workload, schedule)
        assert launch["kernel"] == row["kernel"]
        assert launch["arch"] == "sm_90" and launch["runner"] == "simulated"
        operands = [op["name"] for op in launch["operands"]]
        if workload.op == "softmax":
            assert operands == ["x", "y"] and launch["workspace"] == ["ws"]
            assert launch["arguments"] == ["x", "x", "x", "y", "ws", "rows", "cols", "eps",
                                           "scale", "queries"]  # fmt: skip
            assert launch["scalars"] == {"rows": 4096, "cols": 1024, "eps": 0.0, "scale": 1.0,
                                         "queries": 0}  # fmt: skip
            assert any("ws: a workspace of" in note for note in launch["notes"])
        else:
            assert operands == ["A", "B", "C"] and launch["workspace"] == []
            assert len(launch["launches"]) == 1


@pytest.mark.parametrize(
    ("knobs", "launches"),
    [
        # A row over 4 blocks joined by a second kernel; joined in the kernel, one wave.
        ({"blocks_per_row": 4, "split_mode": 0, "max_waves": 0}, 2),
        ({"blocks_per_row": 4, "split_mode": 1, "max_waves": 1}, 1),
    ],
    ids=["two-pass", "fused"],
)
def test_a_split_softmaxs_launch_json_is_the_runners_plan(knobs: dict[str, int], launches: int):
    workload = parse_any_workload(SOFTMAX)
    schedule = family_of(workload).parse_schedule(
        {"threads_per_row": 32, "rows_per_block": 1, "vector_width": 8, "row_cache": 0, **knobs}
    )
    kernel = pipetune.kernel(workload, "h100", schedule=schedule)
    launch = json.loads(json.dumps(kernel.launch_document()))  # as export writes it
    _assert_the_runners_plan(launch, workload, schedule, exported=False)
    assert len(launch["launches"]) == launches
    (ws,) = [b for b in launch["buffers"] if b["role"] == "workspace"]
    # A partial (3 floats) per (row, block) and two counters per row.
    assert ws["nbytes"] == 4096 * (4 * 3 * 4 + 2 * 4)
    assert launch["occupancy"]["grid_depends_on_occupancy"] == (knobs["split_mode"] == 1)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_the_header_defines_each_familys_knobs(tuned_mixed: str, tmp_path: Path):
    index = _export(tuned_mixed, tmp_path)
    header = (tmp_path / "pipetune_tuned.h").read_text()
    for row in index["workloads"]:
        stem, schedule = row["stem"], row["schedule"]
        knobs = family_of(parse_any_workload(row["workload"])).knob_names
        assert set(knobs) == set(schedule)  # the family's knobs, none of the other's
        _assert_header_defines(tmp_path, stem, schedule, knobs)
    softmax_stem = next(r["stem"] for r in index["workloads"] if r["workload"]["op"] == "softmax")
    assert f"#define PIPETUNE_{softmax_stem.upper()}_THREADS_PER_ROW " in header


def test_a_hopper_kernel_exports_its_arch_specific_cubin_and_tensor_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A wgmma kernel is built for sm_90a, not sm_90: its files and index say so (its cubin's
    ELF header says SM 90, as sm_90's), and its launch document says how to make the tensor
    maps it reads A and B through."""
    url = f"sqlite:///{tmp_path / 'hopper.db'}"
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    fc2 = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
    pipetune.tune(fc2, "h100", budget=4, strategy="random", runner="simulated", db=url)
    result = cli.invoke(
        app, ["export", "--gpu", "h100", "--out-dir", str(tmp_path / "out"), "--db", url]
    )
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((tmp_path / "out" / "index.json").read_text())["workloads"]
    assert entry["arch"] == "sm_90a" and entry["files"]["cubin"].endswith(".sm_90a.cubin")
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["nvcc"] == "nvcc -c -std=c++17 -arch=sm_90a *.cu"  # (sm_90's code runs too)
    assert cubin_sm((tmp_path / "out" / entry["files"]["cubin"]).read_bytes()) == 90
    launch = json.loads((tmp_path / "out" / entry["files"]["launch"]).read_text())
    assert launch["arch"] == "sm_90a"
    assert [m["operand"] for m in launch["tensor_maps"]] == ["A", "B"]
    assert launch["trailing"][:2] == ["tmap_a", "tmap_b"]


def test_a_hopper_gemm_of_b_stored_n_by_k_exports_its_k_major_b_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A PyTorch Linear weight (B stored N x K) on the wgmma kernels: the exported kernel is
    the gemm_nk variant, built for sm_90a, and its launch document's B map is N rows of K
    (dims K, N), each box one K tile of the block's columns' rows."""
    url = f"sqlite:///{tmp_path / 'hopper.db'}"
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    fc1 = {"op": "hopper_gemm", "m": 1024, "n": 3072, "k": 768, "b_layout": "nk"}
    pipetune.tune(fc1, "h100", budget=2, strategy="random", runner="simulated", db=url)
    out = tmp_path / "out"
    result = cli.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out), "--db", url])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((out / "index.json").read_text())["workloads"]
    assert entry["arch"] == "sm_90a" and "gemm_nk" in entry["kernel"]
    launch = json.loads((out / entry["files"]["launch"]).read_text())
    _, b_map = launch["tensor_maps"]
    assert b_map["operand"] == "B" and b_map["dims"] == [768, 3072, 1]
    assert b_map["box"] == [64, entry["schedule"]["tile_n"], 1]
    b_buffer = next(b for b in launch["buffers"] if b["name"] == "B")
    assert b_buffer["shape"] == [3072, 768]


def test_a_hopper_gemm_with_bias_and_gelu_exports_its_bias_and_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """FC1 with its bias and GELU on the wgmma kernels: built for sm_90a, its launch document
    takes the bias after C and the GELU form after K, as the mma.sync family's does."""
    url = f"sqlite:///{tmp_path / 'hopper.db'}"
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    fc1 = {"op": "hopper_gemm_bias_gelu", "m": 1024, "n": 3072, "k": 768, "approximate": "tanh"}
    pipetune.tune(fc1, "h100", budget=2, strategy="random", runner="simulated", db=url)
    out = tmp_path / "out"
    result = cli.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out), "--db", url])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((out / "index.json").read_text())["workloads"]
    assert entry["arch"] == "sm_90a" and "gemm_bias_gelu_kn" in entry["kernel"]
    launch = json.loads((out / entry["files"]["launch"]).read_text())
    (run,) = launch["launches"]
    assert run["arguments"][:8] == ["A", "B", "C", "bias", "M", "N", "K", "gelu_tanh"]
    assert run["scalars"]["gelu_tanh"] == 1
    bias = next(b for b in launch["buffers"] if b["name"] == "bias")
    assert bias["shape"] == [3072] and bias["role"] == "input"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_a_hopper_kernels_tensor_map_header_compiles_into_a_host_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The exported host function that encodes a wgmma kernel's tensor maps is C++ that nvcc
    builds against the toolkit's cuda.h, with the launch JSON's shapes in it."""
    url = f"sqlite:///{tmp_path / 'hopper.db'}"
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    fc2 = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
    pipetune.tune(fc2, "h100", budget=4, strategy="random", runner="simulated", db=url)
    out = tmp_path / "out"
    result = cli.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out), "--db", url])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((out / "index.json").read_text())["workloads"]
    header = out / entry["files"]["tensor_maps"]
    text = header.read_text()
    launch = json.loads((out / entry["files"]["launch"]).read_text())
    for m in launch["tensor_maps"]:
        assert "{" + ", ".join(map(str, m["dims"])) + "}" in text
        assert "{" + ", ".join(map(str, m["box"])) + "}" in text
    program = tmp_path / "use.cpp"
    program.write_text(
        f'#include "{header.name}"\n'
        "int main() {\n"
        "  CUtensorMap maps[2];\n"
        f"  return (int)pipetune_{entry['stem']}_tensor_maps((const void*)0x1000,"
        " (const void*)0x2000, maps);\n"
        "}\n"
    )
    built = subprocess.run(
        ["nvcc", "-c", "-std=c++17", "-I", str(out), "-o", str(tmp_path / "use.o"), str(program)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr


def test_the_table_names_each_kernels_own_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The table's files column named every kernel's cubin after the GPU's architecture
    (`….sm_90.cubin`) where a Hopper kernel's is `….sm_90a.cubin`, and left out its tensor-map
    header: it is each row's own files, as index.json lists them."""
    url = f"sqlite:///{tmp_path / 'hopper.db'}"
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    fc2 = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
    pipetune.tune(fc2, "h100", budget=4, strategy="random", runner="simulated", db=url)
    pipetune.tune(FC, "h100", budget=4, strategy="random", runner="simulated", db=url)
    out = tmp_path / "out"
    args = ["export", "--gpu", "h100", "--out-dir", str(out), "--db", url]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout  # a narrow table folds a name, never cuts it short
    monkeypatch.setattr(console, "width", 250)  # each row's files on one line
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {
        r["workload"]["op"]: r for r in json.loads((out / "index.json").read_text())["workloads"]
    }
    hopper, gemm = rows["hopper_gemm"], rows["gemm"]
    assert f"{hopper['stem']}.{{cu,sm_90a.cubin,launch.json,tensor_maps.h}}" in result.stdout
    assert f"{hopper['stem']}.{{cu,sm_90.cubin" not in result.stdout
    assert f"{gemm['stem']}.{{cu,sm_90.cubin,launch.json}}" in result.stdout
    # Every file the column names is one the export wrote.
    for row in (hopper, gemm):
        assert all((out / name).is_file() for name in row["files"].values())


def test_workloads_tuned_to_one_kernel_share_its_files(tmp_path: Path):
    """Two softmax shapes of one row length, tuned to the same schedule, were exported as two
    .cu files defining the same extern "C" kernel: `nvcc *.cu` failed with a multiple
    definition. They share the first one's .cu and cubin now; each keeps its launch file."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    shapes = [{"op": "softmax", "rows": r, "cols": 768} for r in (4096, 8192)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        for shape in shapes:
            pipetune.tune(
                shape, "h200", budget=1, strategy="analytical", runner="simulated", db=url
            )
    out = tmp_path / "out"
    result = cli.invoke(app, ["export", "--gpu", "h200", "--out-dir", str(out), "--db", url])
    assert result.exit_code == 0, result.output
    first, second = json.loads((out / "index.json").read_text())["workloads"]
    assert first["kernel"] == second["kernel"]  # the premise: one schedule for both
    assert "shares_kernel_with" not in first and second["shares_kernel_with"] == first["stem"]
    assert second["files"]["source"] == first["files"]["source"] == f"{first['stem']}.cu"
    assert second["files"]["cubin"] == first["files"]["cubin"]
    assert second["files"]["launch"] == f"{second['stem']}.launch.json" != first["files"]["launch"]
    launch = json.loads((out / second["files"]["launch"]).read_text())
    assert launch["scalars"]["rows"] == 8192 and launch["kernel"] == second["kernel"]
    defined = [k for cu in sorted(out.glob("*.cu")) for k in defined_kernels(cu.read_text())]
    assert defined == [first["kernel"]]
    if shutil.which("nvcc"):  # the build a user runs: every .cu of the export, one program
        (tmp_path / "main.cu").write_text("int main() { return 0; }\n")
        sources = [str(p) for p in sorted(out.glob("*.cu"))]
        done = subprocess.run(
            ["nvcc", "-arch=sm_90", "-std=c++17", "-o", str(tmp_path / "app"),
             str(tmp_path / "main.cu"), *sources],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_nothing_a_header_names_can_end_its_comments(tmp_path: Path, monkeypatch):
    """The header's comments name the database it was exported from and each result's
    runner: a runner string with "*/" in it closed the comment, and what followed was C in
    every build that included the header (the service now refuses such a runner too)."""
    from pipetune.clients.library.exports import in_comment

    assert in_comment("sqlite:////tmp/x*/t.db") == "sqlite:////tmp/x* /t.db"
    assert in_comment("cupy:*/\n#if 0//") == "cupy:* / #if 0//"
    folder = tmp_path / "x*"
    folder.mkdir()
    url = f"sqlite:///{folder / 't.db'}"
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    pipetune.tune(FC, "h100", budget=2, strategy="random", runner="simulated", db=url)
    export_tuned(LocalStore(url), "h100", tmp_path / "out")
    header = (tmp_path / "out" / "pipetune_tuned.h").read_text()
    code = re.sub(r"/\*.*?\*/", "", header, flags=re.DOTALL)  # as the preprocessor does
    assert all(line.startswith("#") or not line.strip() for line in code.splitlines()), code


def test_an_export_does_not_write_through_a_link_at_a_temporary_name(tuned: str, tmp_path: Path):
    """A cubin went through `.<name>.<pid>.tmp`, a name known in advance: a link left there
    (a shared export folder) had its target overwritten with the cubin, and the cubin became
    the link. Temporary files are mkstemp's now."""
    import os

    out = tmp_path / "out"
    with LocalStore(tuned) as store:
        index = export_tuned(store, "h100", out)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    for row in index["workloads"]:
        for name in row["files"].values():
            (out / f".{name}.{os.getpid()}.tmp").symlink_to(victim)
    with LocalStore(tuned) as store:
        export_tuned(store, "h100", out)
    assert victim.read_text() == "keep me\n"
    for row in index["workloads"]:
        for name in row["files"].values():
            assert (out / name).is_file() and not (out / name).is_symlink()


def test_a_fused_splits_grid_is_sized_from_the_cubins_registers():
    """The model estimates this layernorm schedule at fewer registers than ptxas allocates
    (64 at 128 threads: 16 blocks per SM, the model says 18): the launch document's one-wave
    grid must not count on the 18, or a fused split's blocks wait on blocks that cannot be
    resident. The cubin's own registers size it, and the document says so."""
    workload = parse_any_workload({"op": "layernorm", "rows": 4096, "cols": 8192})
    schedule = family_of(workload).parse_schedule(
        {"threads_per_row": 64, "rows_per_block": 1, "blocks_per_row": 2, "vector_width": 1,
         "row_cache": 0, "split_mode": 1, "max_waves": 1}
    )  # fmt: skip
    kernel = pipetune.kernel(workload, "h100", schedule=schedule)
    model_blocks = kernel.blocks_per_sm
    kernel.size_grid_for_cubin()
    doc = kernel.launch_document()
    compiled = compile_source(kernel.source, "sm_90", entry=kernel.name)
    threads = doc["block"][0]
    # As the driver counts: each of the SM's four sub-partitions holds a quarter of its
    # registers, and a warp's come from one of them.
    warps_by_registers = 4 * (65536 // 4 // (-(-compiled.registers * 32 // 256) * 256))
    fits = warps_by_registers // (threads // 32)
    assert fits < model_blocks  # the case this test is about
    assert doc["occupancy"]["blocks_per_sm"] == fits
    assert doc["occupancy"]["blocks_per_sm_from"] == "cubin"
    assert doc["grid"][0] <= fits * get_gpu("h100").sm_count
    assert any("what the cubin's registers" in note for note in doc["notes"])


def test_export_sizes_a_fused_splits_grid_from_its_cubin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`pipetune export` writes the cubin-sized grid (the case above, as the best measured
    schedule of a tuned layernorm)."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    workload = {"op": "layernorm", "rows": 4096, "cols": 8192}
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    pipetune.tune(workload, "h100", budget=2, strategy="random", runner="simulated", db=url)
    store = LocalStore(url)
    schedule = {"threads_per_row": 64, "rows_per_block": 1, "blocks_per_row": 2,
                "vector_width": 1, "row_cache": 0, "split_mode": 1, "max_waves": 1}  # fmt: skip
    best = store.best_schedule(parse_any_workload(workload), "h100")
    forced = best.model_copy(
        update={"schedule": type(best.schedule).model_validate(schedule),
                "schedule_id": "m-64-1-2-1-0-1-1"}
    )  # fmt: skip
    monkeypatch.setattr(store, "best_schedule", lambda w, gpu: forced)
    index = export_tuned(store, "h100", tmp_path / "out")
    (row,) = index["workloads"]
    assert row["schedule_id"] == "m-64-1-2-1-0-1-1"
    launch = json.loads((tmp_path / "out" / row["files"]["launch"]).read_text())
    assert launch["occupancy"]["blocks_per_sm_from"] == "cubin"
    assert launch["occupancy"]["blocks_per_sm"] == 16
    assert launch["grid"][0] <= 16 * get_gpu("h100").sm_count


def test_a_workload_whose_answer_is_no_trial_is_listed_as_not_exported(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Where the best answer for a tuned workload is the model's pick (each of its successes
    failed on the GPU since, and the service never answers such a schedule), the export
    says so in `not_exported` instead of leaving the workload out without a word."""
    with LocalStore(tuned) as store:
        answer = store.best_schedule

        def no_trial(workload: Any, gpu: str):
            best = answer(workload, gpu)
            if workload.op == "conv2d":
                return best.model_copy(update={"source": "model"})
            return best

        monkeypatch.setattr(store, "best_schedule", no_trial)
        index = export_tuned(store, "h100", tmp_path / "out")
    assert [w["workload"]["op"] for w in index["workloads"]] == ["gemm"]
    (left,) = index["not_exported"]
    assert left["workload"]["op"] == "conv2d" and "the model's pick" in left["reason"]


def test_the_export_command_says_which_workloads_it_did_not_export(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """index.json's `not_exported` is said on screen too (stderr), each with its reason: the
    command's table alone showed the exported ones, and a tuned workload left out read as
    one never tuned."""
    from pipetune.clients.library import exports

    tuned_for = exports.export_tuned

    def one_left_out(reader: Any, gpu: str, out_dir: Path) -> dict[str, Any]:
        index = tuned_for(reader, gpu, out_dir)
        gone = index["workloads"].pop()
        index["not_exported"].append(
            {"workload": gone["workload"], "label": gone["label"],
             "schedule_id": gone["schedule_id"], "reason": "PlanError: [no longer fits]"}
        )  # fmt: skip
        return index

    monkeypatch.setattr(exports, "export_tuned", one_left_out)
    out = tmp_path / "out"
    result = cli.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out), "--db", tuned])
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("not exported:")]
    assert line.endswith(": PlanError: [no longer fits]")  # as written: no rich markup
    assert "1 tuned kernels for h100" in result.stdout


def test_a_fused_splits_grid_fits_the_blocks_the_driver_makes_resident():
    """The reviewer's case: softmax 4096x32768 at m-64-1-2-1-0-1-1 on an H100. The model
    counts 25 blocks per SM (its shared memory not rounded to the driver's 128-byte unit,
    its registers not split over the four sub-partitions): a one-wave grid of 3,300 blocks
    where the driver makes 132 x 24 = 3,168 resident, so a launch from the document could
    leave a row's blocks waiting on blocks that never start."""
    workload = parse_any_workload({"op": "softmax", "rows": 4096, "cols": 32768})
    schedule = family_of(workload).parse_schedule(
        {"threads_per_row": 64, "rows_per_block": 1, "blocks_per_row": 2, "vector_width": 1,
         "row_cache": 0, "split_mode": 1, "max_waves": 1}
    )  # fmt: skip
    kernel = pipetune.kernel(workload, "h100", schedule=schedule)
    kernel.size_grid_for_cubin()
    doc = kernel.launch_document()
    compiled = compile_source(kernel.source, "sm_90", entry=kernel.name)
    h100 = get_gpu("h100")
    from pipetune.model.occupancy import blocks_per_sm

    threads = doc["block"][0]
    smem = kernel.plan.launches[0].smem_bytes + compiled.smem_static_bytes
    resident = int(blocks_per_sm(h100, threads, smem, compiled.registers, cuda_rules=True))
    assert doc["grid"][0] <= resident * h100.sm_count
    assert doc["occupancy"]["blocks_per_sm"] == resident


# ---- the LLaMA operators: an RMS norm and a SwiGLU ------------------------------------------

RMSNORM = {"op": "rmsnorm", "rows": 1024, "cols": 4096, "eps": 1e-5}
SWIGLU = {"op": "silu_mul", "rows": 1024, "cols": 11008}


def test_an_rms_norm_and_a_swiglu_export_with_their_operands(tmp_path: Path):
    """Tuned (simulated) and exported: each source compiles, and each launch document is the
    cupy runner's plan, with the RMS norm's gamma and eps and the SwiGLU's x of gate and up
    side by side (rows x 2·cols)."""
    url = f"sqlite:///{tmp_path / 'llama.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        for workload in (RMSNORM, SWIGLU):
            pipetune.tune(workload, "h100", budget=4, strategy="random", runner="simulated", db=url)
    out = tmp_path / "out"
    index = _export(url, out)
    rows = {row["workload"]["op"]: row for row in index["workloads"]}
    assert sorted(rows) == ["rmsnorm", "silu_mul"] and index["not_exported"] == []
    for op, row in rows.items():
        source = (out / row["files"]["source"]).read_text()
        assert cubin_sm(compile_source(source, "sm_90", use_cache=False).cubin) == 90
        launch = json.loads((out / row["files"]["launch"]).read_text())
        workload = parse_any_workload(row["workload"])
        _assert_the_runners_plan(
            launch, workload, family_of(workload).parse_schedule(row["schedule"])
        )
        shapes = {b["name"]: tuple(b["shape"]) for b in launch["buffers"]}
        operands = [o["name"] for o in launch["operands"]]
        if op == "rmsnorm":
            assert operands == ["x", "gamma", "y"] and shapes["gamma"] == (4096,)
            assert launch["scalars"]["eps"] == pytest.approx(1e-5)
        else:
            assert operands == ["x", "y"]
            assert shapes["x"] == (1024, 2 * 11008) and shapes["y"] == (1024, 11008)


def test_a_gemm_with_bias_and_gelu_exports_with_its_bias(tmp_path: Path):
    """Tuned (simulated) and exported, both GELU forms: each source compiles, each launch
    document is the cupy runner's plan (A, B, the bias of N and C; the scalar gelu_tanh 1
    for the tanh form) and its arguments put the bias after C."""
    url = f"sqlite:///{tmp_path / 'bias_gelu.db'}"
    erf = {"op": "gemm_bias_gelu", "m": 256, "n": 128, "k": 512}
    tanh = {**erf, "b_layout": "nk", "approximate": "tanh"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        for workload in (erf, tanh):
            pipetune.tune(workload, "h100", budget=3, strategy="random", runner="simulated", db=url)
    out = tmp_path / "out"
    index = _export(url, out)
    assert index["not_exported"] == []
    rows = {row["workload"]["approximate"]: row for row in index["workloads"]}
    for form, flag in (("none", 0), ("tanh", 1)):
        row = rows[form]
        source = (out / row["files"]["source"]).read_text()
        assert cubin_sm(compile_source(source, "sm_90", use_cache=False).cubin) == 90
        launch = json.loads((out / row["files"]["launch"]).read_text())
        parsed = parse_any_workload(row["workload"])
        schedule = family_of(parsed).parse_schedule(row["schedule"])
        _assert_the_runners_plan(launch, parsed, schedule)
        shapes = {b["name"]: tuple(b["shape"]) for b in launch["buffers"]}
        assert shapes["bias"] == (128,) and shapes["C"] == (256, 128)
        assert launch["arguments"][:4] == ["A", "B", "C", "bias"]
        assert launch["scalars"]["gelu_tanh"] == flag


def test_a_fused_gemm_swiglu_exports_with_its_interleaved_weights(tmp_path: Path):
    """Tuned (simulated) and exported, both B layouts: each source compiles, each launch
    document is the cupy runner's plan (B of K x 2N or 2N x K, C of M x N, the scalar N the
    GEMM's 2N) and says how B is laid out."""
    url = f"sqlite:///{tmp_path / 'swiglu.db'}"
    kn = {"op": "gemm_swiglu", "m": 256, "n": 128, "k": 512}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        for workload in (kn, {**kn, "b_layout": "nk"}):
            pipetune.tune(workload, "h100", budget=3, strategy="random", runner="simulated", db=url)
    out = tmp_path / "out"
    index = _export(url, out)
    assert index["not_exported"] == []
    rows = {row["workload"]["b_layout"]: row for row in index["workloads"]}
    for layout, b_shape in (("kn", (512, 256)), ("nk", (256, 512))):
        row = rows[layout]
        source = (out / row["files"]["source"]).read_text()
        assert cubin_sm(compile_source(source, "sm_90", use_cache=False).cubin) == 90
        launch = json.loads((out / row["files"]["launch"]).read_text())
        parsed = parse_any_workload(row["workload"])
        schedule = family_of(parsed).parse_schedule(row["schedule"])
        _assert_the_runners_plan(launch, parsed, schedule)
        shapes = {b["name"]: tuple(b["shape"]) for b in launch["buffers"]}
        assert shapes == {"A": (256, 512), "B": b_shape, "C": (256, 128)}
        assert launch["scalars"]["N"] == 256
        assert any("interleaved in groups of 8" in note for note in launch["notes"])
