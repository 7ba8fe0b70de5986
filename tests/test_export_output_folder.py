"""`pipetune export --gpu G --out-dir DIR` and `export_tuned`: what the output folder may be.

An empty --out-dir exported into the current folder; an index.json no export wrote drove the
removal of the files it listed; a folder (or a broken link) where a file or the output folder
goes was found only after every kernel had compiled, through the unexpected-error path; an
export that failed or was interrupted left its new folder behind, empty. A workload whose
every trial failed was left out of the export without a word, and the printed build command
was not quoted for the shell. Also the launch notes of the Hopper stream-K workspace, which
said the kernels return its "row counters" to zero."""

from __future__ import annotations

import errno
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import pipetune
from pipetune.clients.cli.main import app
from pipetune.clients.cli.output import console
from pipetune.clients.library import exports
from pipetune.clients.library import kernel as kernel_module
from pipetune.clients.library.exports import export_tuned, stem_of
from pipetune.clients.library.kernel import TunedKernel
from pipetune.clients.library.store import LocalStore
from pipetune.model.errors import InvalidArgumentError, PipetuneError
from pipetune.model.family import parse_any_workload
from pipetune.model.hopper.space import STREAM_K
from pipetune.model.trials import MeasureResult
from pipetune.workers.runners.base import Runner

FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
FAILING = {"op": "gemm", "m": 512, "n": 512, "k": 512}
cli = CliRunner()


class FailingRunner(Runner):
    """Every trial a compile error: the task ends done, with no successful trial."""

    name = "simulated"
    gpu = "h100"

    def _measure(self, workload: Any, schedules: list[Any]) -> list[MeasureResult]:
        return [
            MeasureResult(status="compile_error", error="ptxas: boom", runner="simulated")
            for _ in schedules
        ]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One GEMM tuned on h100 (simulated, instantly; one kernel to compile) and another whose
    two trials both failed."""
    url = f"sqlite:///{tmp_path_factory.mktemp('export-folder') / 'tuned.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        pipetune.tune(FC, "h100", budget=2, strategy="random", runner="simulated", db=url)
        pipetune.tune(FAILING, "h100", budget=2, strategy="random", runner=FailingRunner(), db=url)
    return url


@pytest.fixture(autouse=True)
def no_ambient_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)


@pytest.fixture
def no_compiling(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Any compile fails the test: a refusal must come before the first one."""
    calls: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise AssertionError("a kernel was compiled before the folder was refused")

    monkeypatch.setattr(kernel_module, "compile_kernel", refuse)
    monkeypatch.setattr(exports, "compile_source", refuse)  # (the exported source's cubin)
    return calls


def _export(tuned: str, out_dir: str) -> Any:
    return cli.invoke(app, ["export", "--gpu", "h100", "--out-dir", out_dir, "--db", tuned])


def _one_line_usage_error(result: Any) -> str:
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --out-dir: ") and "PIPETUNE_DEBUG" not in line
    return line


# ---- B1: an empty --out-dir -----------------------------------------------------------------


def test_an_empty_out_dir_is_refused_not_the_current_folder(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_compiling: list[Any]
):
    """`--out-dir "$UNSET"` wrote every file into the current folder (exit 0) and removed
    the files an index.json there listed."""
    monkeypatch.chdir(tmp_path)
    line = _one_line_usage_error(_export(tuned, ""))
    assert line.startswith("error: --out-dir: empty")
    assert list(tmp_path.iterdir()) == []


def test_the_library_refuses_an_empty_out_dir(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_compiling: list[Any]
):
    monkeypatch.chdir(tmp_path)
    with LocalStore(tuned) as store, pytest.raises(InvalidArgumentError) as caught:
        export_tuned(store, "h100", "")
    assert caught.value.argument == "out_dir" and caught.value.reason.startswith("empty")
    assert list(tmp_path.iterdir()) == []


# ---- B2: an index.json no export wrote ----------------------------------------------------------


def test_a_foreign_index_json_is_refused_and_nothing_deleted(
    tuned: str, tmp_path: Path, no_compiling: list[Any]
):
    """The user's own index.json listed main.c: the export deleted it and replaced the
    index without a word."""
    (tmp_path / "main.c").write_text("int main(){}\n")
    foreign = '{"name":"my-app","workloads":[{"files":{"entry":"main.c"}}]}\n'
    (tmp_path / "index.json").write_text(foreign)
    line = _one_line_usage_error(_export(tuned, str(tmp_path)))
    assert f"{tmp_path / 'index.json'} is not a pipetune export's index" in line
    assert (tmp_path / "main.c").read_text() == "int main(){}\n"
    assert (tmp_path / "index.json").read_text() == foreign
    assert {p.name for p in tmp_path.iterdir()} == {"main.c", "index.json"}


@pytest.mark.parametrize("text", ["not json at all\n", "[1, 2]\n", '{"pipetune": "0.1"}\n'])
def test_the_library_refuses_an_index_json_that_is_not_an_exports(
    tuned: str, tmp_path: Path, text: str, no_compiling: list[Any]
):
    (tmp_path / "index.json").write_text(text)
    with LocalStore(tuned) as store, pytest.raises(InvalidArgumentError, match="not a pipetune"):
        export_tuned(store, "h100", tmp_path)
    assert (tmp_path / "index.json").read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]


# ---- B3: a folder where a file goes -----------------------------------------------------------


@pytest.mark.parametrize("name", ["index.json", "pipetune_tuned.h"])
def test_a_folder_where_the_index_or_header_goes_is_refused_before_compiling(
    tuned: str, tmp_path: Path, name: str, no_compiling: list[Any]
):
    """It was found at the write, after every kernel had compiled: exit 1 through the
    unexpected-error path (IsADirectoryError, the debug hint)."""
    (tmp_path / name).mkdir()
    line = _one_line_usage_error(_export(tuned, str(tmp_path)))
    assert f"{tmp_path / name} is a directory" in line
    assert no_compiling == []
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("suffix", [".cu", ".sm_90.cubin", ".launch.json"])
def test_a_folder_where_a_kernels_file_goes_is_refused_before_compiling(
    tuned: str, tmp_path: Path, suffix: str, no_compiling: list[Any]
):
    name = stem_of(parse_any_workload(FC), "h100") + suffix
    (tmp_path / name).mkdir()
    line = _one_line_usage_error(_export(tuned, str(tmp_path)))
    assert f"{tmp_path / name} is a directory" in line
    assert no_compiling == []
    assert [p.name for p in tmp_path.iterdir()] == [name]
    with LocalStore(tuned) as store, pytest.raises(InvalidArgumentError, match="is a directory"):
        export_tuned(store, "h100", tmp_path)


# ---- B4: a broken link as --out-dir --------------------------------------------------------------


def test_a_broken_link_as_out_dir_is_refused_before_compiling(
    tuned: str, tmp_path: Path, no_compiling: list[Any]
):
    """exists() is False for a link to nothing: the check passed, and mkdir failed with
    FileExistsError after the compiling (exit 1, the debug hint)."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    line = _one_line_usage_error(_export(tuned, str(link)))
    assert f"{link} is a broken symbolic link" in line
    line = _one_line_usage_error(_export(tuned, str(link / "sub")))  # under one, too
    assert f"{link} is a broken symbolic link" in line
    with LocalStore(tuned) as store, pytest.raises(PipetuneError, match="broken symbolic link"):
        export_tuned(store, "h100", link)
    assert no_compiling == [] and link.is_symlink() and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("name", ["index.json", "pipetune_tuned.h"])
def test_a_broken_link_where_the_export_writes_a_file_is_refused(
    tuned: str, tmp_path: Path, no_compiling: list[Any], name: str
):
    """Written through: a link left in the folder made the export create its target,
    outside the folder (/nonexistent) as anywhere else."""
    out, outside = tmp_path / "out", tmp_path / "outside.json"
    out.mkdir()
    (out / name).symlink_to(outside)
    line = _one_line_usage_error(_export(tuned, str(out)))
    assert f"{out / name} is a broken symbolic link (to {outside}" in line
    assert no_compiling == [] and not outside.exists()


# ---- B5: all or nothing, the new folder included -----------------------------------------------


def test_an_interrupted_export_leaves_no_new_folder(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The folder was made before the kernels compiled: Ctrl-C (or SIGTERM) while they did
    left it behind, empty."""

    def interrupted(self: exports.Exported) -> bytes:
        raise KeyboardInterrupt

    monkeypatch.setattr(exports.Exported, "cubin", interrupted)
    out = tmp_path / "new" / "export"
    with LocalStore(tuned) as store, pytest.raises(KeyboardInterrupt):
        export_tuned(store, "h100", out)
    assert list(tmp_path.iterdir()) == []


def test_an_export_whose_write_fails_removes_the_folders_it_made(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A write that fails (a full disk) leaves no file; the folders made for them went too.
    A folder that was there before stays."""

    def disk_full(files: list[tuple[Path, bytes]]) -> list[Path]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(exports, "write_all_atomic", disk_full)
    with LocalStore(tuned) as store:
        with pytest.raises(OSError, match="No space"):
            export_tuned(store, "h100", tmp_path / "new" / "export")
        assert list(tmp_path.iterdir()) == []
        (tmp_path / "mine").mkdir()
        with pytest.raises(OSError, match="No space"):
            export_tuned(store, "h100", tmp_path / "mine")
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


# ---- B6: a workload whose every trial failed ---------------------------------------------------


def test_a_workload_with_no_successful_trial_is_listed_as_not_exported(tuned: str, tmp_path: Path):
    """`tuned_workloads` keeps workloads with a success: the failed one was in neither the
    table, the notes on stderr nor index.json's not_exported."""
    out = tmp_path / "out"
    result = _export(tuned, str(out))
    assert result.exit_code == 0, result.output
    (left,) = json.loads((out / "index.json").read_text())["not_exported"]
    assert left["label"] == "gemm 512x512x512" and left["schedule_id"] is None
    assert left["reason"] == "no successful trial (2 failed)"
    assert left["workload"] == parse_any_workload(FAILING).canonical()
    assert "not exported: gemm 512x512x512: no successful trial (2 failed)" in (
        result.stderr.splitlines()
    )
    assert "1 tuned kernels for h100" in result.stdout


# ---- B7: the build command, quoted ------------------------------------------------------------


def test_the_printed_build_command_quotes_the_folder(
    tuned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`cd /tmp/my dir && nvcc ...`, pasted, was `cd: too many arguments`."""
    monkeypatch.setattr(console, "width", 400)  # the command on one line
    out = tmp_path / "my dir"
    result = _export(tuned, str(out))
    assert result.exit_code == 0, result.output
    assert f"build them: cd {shlex.quote(str(out))} && nvcc -c" in result.stdout


# ---- the stream-K workspace's notes ------------------------------------------------------------


def _split_rows_softmax() -> TunedKernel:
    """A softmax whose rows are split over 4 blocks, fused: its grid is one wave."""
    return pipetune.kernel(
        {"op": "softmax", "rows": 4096, "cols": 1024},
        "h100",
        schedule={"threads_per_row": 32, "rows_per_block": 1, "vector_width": 8, "row_cache": 0,
                  "blocks_per_row": 4, "split_mode": 1, "max_waves": 1},
    )  # fmt: skip


def test_the_stream_k_workspace_notes_say_what_it_holds():
    """The note written for the split rows' workspace ("the kernels return its row counters
    to zero") was given to the Hopper stream-K GEMM's W (float partial sums, no counter) and
    arrivals (a counter per output tile) too."""
    workload = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
    schedule = {"tile_m": 64, "tile_n": 64, "stages": 3, "tile_loop": STREAM_K}
    notes = pipetune.kernel(workload, "h100", schedule=schedule).launch_document()["notes"]
    (w,) = [n for n in notes if n.startswith("W: a workspace of")]
    (arrivals,) = [n for n in notes if n.startswith("arrivals: a workspace of")]
    assert "row" not in w and "counter" not in w
    assert "partial sums" in w and "before the tile's last block reads them" in w
    assert "row" not in arrivals
    assert "an arrival counter per output tile" in arrivals
    assert "returns its counter to zero" in arrivals
    # The split rows' workspace keeps its own account.
    softmax = _split_rows_softmax()
    (ws,) = [n for n in softmax.launch_document()["notes"] if n.startswith("ws: a workspace")]
    assert "two counters per row" in ws and "counters are back at zero" in ws


def test_a_persistent_grid_is_said_to_be_one_block_per_sm_with_its_workspace():
    """The note said a stream-K GEMM's grid was sized from the occupancy and to size it
    again from cuOccupancyMaxActiveBlocksPerMultiprocessor: at 3 blocks per SM a user
    launched 396 blocks on an H100, writing past the end of W, which holds 132 blocks'
    partials. Its grid is one block per SM, and the note gives W's size for a grid."""
    workload = {"op": "hopper_gemm", "m": 512, "n": 512, "k": 8192, "b_layout": "nk"}
    schedule = {"tile_m": 64, "tile_n": 64, "stages": 3, "tile_loop": STREAM_K}
    kernel = pipetune.kernel(workload, "h100", schedule=schedule)
    document = kernel.launch_document()
    (grid,) = [n for n in document["notes"] if n.startswith("the grid is")]
    assert "one block per SM" in grid and "132 SMs on h100" in grid
    assert "cuOccupancyMaxActiveBlocksPerMultiprocessor" not in grid
    # W's size as the note gives it is the plan's, on this grid and on another SM count.
    threads = kernel.plan.launches[0].block[0]
    assert f"W of grid x 2 x {threads} x 32 floats" in grid
    codegen = kernel_module.codegen_for("hopper_gemm")
    for sms, blocks_per_sm in ((132, 1), (132, 3), (114, 2)):
        plan = codegen.launch_plan(kernel._kernel, kernel.workload, sms, blocks_per_sm)
        (w,) = [b for b in plan.buffers if b.name == "W"]
        assert plan.launches[0].grid[0] == sms
        assert w.shape == (sms * 2 * threads * 32,)
    (shape,) = [n for n in document["notes"] if n.startswith("shape:")]
    assert "ceil(M / tile_m) x ceil(N / tile_n) x batch" in shape
    # A memory-bound operator's grid is one wave of the occupancy's blocks, still.
    softmax = _split_rows_softmax()
    (wave,) = [n for n in softmax.launch_document()["notes"] if n.startswith("the grid is")]
    assert "cuOccupancyMaxActiveBlocksPerMultiprocessor" in wave
