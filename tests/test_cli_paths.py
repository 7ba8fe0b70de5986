"""Output paths are refused before any work, with one line naming the option and exit 2:
a directory where a file goes, a file where a directory goes, a folder that cannot be made.
(They used to fail with exit 1, IsADirectoryError and the like, after the work was done.)"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pipetune
from pipetune.clients.cli.campaign_cmds import campaign_app
from pipetune.clients.cli.curve_files import check_curve_outputs
from pipetune.clients.cli.dataset_cmds import dataset_app
from pipetune.clients.cli.errors import CliError
from pipetune.clients.cli.main import app
from pipetune.clients.cli.paths import check_output_dir, check_output_file
from pipetune.clients.cli.sweep_cmds import sweep_app

cli = CliRunner()
GEMM = ["gemm", "--m", "64", "--n", "64", "--k", "64", "--runner", "simulated"]


@pytest.fixture(autouse=True)
def instant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    (tmp_path / "somedir").mkdir()
    (tmp_path / "afile").write_text("x")
    return tmp_path


def _refused(result, message: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {message}"], result.stderr


def _dataset(tmp_path: Path) -> Path:
    out = tmp_path / "good.t4.json.gz"
    result = cli.invoke(sweep_app, [*GEMM, "--limit", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


# --- the helper ----------------------------------------------------------------------------


def test_check_output_file(folder: Path) -> None:
    check_output_file(folder / "new.json", "--out")
    check_output_file(folder / "new" / "x.json", "--out", create_parent=True)
    cases = [
        (folder / "somedir", {}, f"--out: {folder / 'somedir'} is a directory"),
        (folder / "new" / "x.json", {}, f"--out: directory {folder / 'new'} does not exist"),
        (folder / "afile" / "x.json", {}, f"--out: {folder / 'afile'} is not a directory"),
        (
            folder / "afile" / "a" / "x.json",
            {"create_parent": True},
            f"--out: {folder / 'afile'} is not a directory",
        ),
    ]
    for path, kwargs, message in cases:
        with pytest.raises(CliError) as caught:
            check_output_file(path, "--out", **kwargs)
        assert (str(caught.value), caught.value.code) == (message, 2)


def test_check_output_dir(folder: Path) -> None:
    check_output_dir(folder / "somedir", "--out-dir")
    check_output_dir(folder / "new" / "deeper", "--out-dir")  # made by the command
    for path in (folder / "afile", folder / "afile" / "sub"):
        with pytest.raises(CliError) as caught:
            check_output_dir(path, "--out-dir")
        assert str(caught.value) == f"--out-dir: {folder / 'afile'} is not a directory"


# --- the commands --------------------------------------------------------------------------


def test_sweep_out_a_directory(folder: Path) -> None:
    result = cli.invoke(sweep_app, [*GEMM, "--out", str(folder / "somedir")])
    _refused(result, f"--out: {folder / 'somedir'} is a directory")
    assert "measure" not in result.stderr  # refused before measuring
    assert sorted(p.name for p in folder.iterdir()) == ["afile", "somedir"]  # no temp file


def test_sweep_out_under_a_file(folder: Path) -> None:
    result = cli.invoke(sweep_app, [*GEMM, "--out", str(folder / "afile" / "g.t4.json.gz")])
    _refused(result, f"--out: {folder / 'afile'} is not a directory")


def test_sweep_out_still_makes_a_missing_folder(tmp_path: Path) -> None:
    out = tmp_path / "new" / "g.t4.json.gz"
    result = cli.invoke(sweep_app, [*GEMM, "--limit", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_sweep_out_dir_a_file(folder: Path) -> None:
    args = ["--operators", "memops", "--runner", "simulated", "--limit", "1"]
    result = cli.invoke(sweep_app, [*args, "--out-dir", str(folder / "afile")])
    _refused(result, f"--out-dir: {folder / 'afile'} is not a directory")
    assert "measure" not in result.stderr


def test_dataset_convert_to_a_directory(folder: Path) -> None:
    source = _dataset(folder)
    result = cli.invoke(dataset_app, ["convert", str(source), str(folder / "somedir")])
    _refused(result, f"TARGET: {folder / 'somedir'} is a directory")
    assert not any((folder / "somedir").iterdir())


def test_export_task_to_a_directory(folder: Path) -> None:
    db = f"sqlite:///{folder / 'none.db'}"
    args = ["export", "--task", "1", "--format", "t4", "--out", str(folder / "somedir")]
    result = cli.invoke(app, [*args, "--db", db])
    _refused(result, f"--out: {folder / 'somedir'} is a directory")
    assert not (folder / "none.db").exists()  # refused before the database was opened


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["sweep", *GEMM, "--limit", "1", "--out", "{new}/"], "'--out'"),
        (["dataset", "convert", "{source}", "{new}/"], "'target'"),
        (["export", "--task", "1", "--format", "t4", "--out", "{new}/"], "'--out'"),
        (["curve", "1", "--html", "{new}/"], "'--html'"),
        (["curve", "1", "--png", "{new}/"], "'--png'"),
        (
            ["campaign", "--runner", "simulated", "--out-dir", "{new}x", "--pack", "{new}/"],
            "--pack",
        ),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_an_output_file_that_ends_in_a_slash_is_refused(folder: Path, command, named) -> None:
    """Made a Path, `--out newd/` lost its slash: exit 0, and a file named newd."""
    source = _dataset(folder)
    args = [a.format(new=folder / "newd", source=source) for a in command]
    db = ["--db", f"sqlite:///{folder / 'none.db'}"] if args[0] in ("export", "curve") else []
    result = cli.invoke(app, [*args, *db], terminal_width=400)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())
    assert named in said and "names a folder (it ends in /): give the file's path" in said
    assert not (folder / "newd").exists() and not (folder / "none.db").exists()


def test_export_out_dir_under_a_file(folder: Path) -> None:
    db = f"sqlite:///{folder / 'none.db'}"
    out_dir = folder / "afile" / "kernels"
    result = cli.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out_dir), "--db", db])
    _refused(result, f"--out-dir: {folder / 'afile'} is not a directory")


def test_curve_outputs_checked_before_fetching(folder: Path) -> None:
    for flag, kwargs in (("--html", {"png": None}), ("--png", {"html": None})):
        with pytest.raises(CliError) as caught:
            check_curve_outputs(**{flag[2:]: folder / "somedir", **kwargs})
        assert str(caught.value) == f"{flag}: {folder / 'somedir'} is a directory"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('curve') / 'tuned.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        workload = {"op": "gemm", "m": 256, "n": 64, "k": 256}
        pipetune.tune(workload, "h100", budget=2, strategy="random", runner="simulated", db=url)
    return url


def test_curve_html_to_a_directory(tuned: str, folder: Path) -> None:
    result = cli.invoke(app, ["curve", "1", "--html", str(folder / "somedir"), "--db", tuned])
    _refused(result, f"--html: {folder / 'somedir'} is a directory")


def test_curve_png_and_html_to_one_file_are_refused(tuned: str, tmp_path: Path) -> None:
    """The page was written over the image: exit 0 and the PNG asked for lost."""
    both = tmp_path / "curve.out"
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    for html in (both, link / "curve.out"):
        args = ["curve", "1", "--png", str(both), "--html", str(html)]
        result = cli.invoke(app, [*args, "--db", tuned])
        _refused(result, f"--html: {html} is the file --png writes; give each its own")
        assert not both.exists()


def test_curve_html_is_still_written(tuned: str, tmp_path: Path) -> None:
    page = tmp_path / "curve.html"
    result = cli.invoke(app, ["curve", "1", "--html", str(page), "--db", tuned])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert text.rstrip().endswith("</html>") and "task 1: gemm 256x64x256" in text
    assert [p.name for p in tmp_path.iterdir()] == ["curve.html"]  # no temp file left


def _campaign_archive(path: Path) -> Path:
    """The smallest archive unpack takes: a simulated campaign's probe.json."""
    probe = json.dumps({"gpu": "h100", "runner": "simulated", "simulated": True}).encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("probe.json")
        info.size = len(probe)
        tar.addfile(info, io.BytesIO(probe))
    return path


@pytest.mark.parametrize("option", ["--data-dir", "--profile-dir"])
def test_campaign_unpack_into_a_file(folder: Path, option: str) -> None:
    archive = _campaign_archive(folder / "c.tar.gz")
    args = ["unpack", str(archive), option, str(folder / "afile"), "--allow-simulated"]
    result = cli.invoke(campaign_app, args)
    _refused(result, f"{option}: {folder / 'afile'} is not a directory")


def test_campaign_unpack_still_makes_its_folders(tmp_path: Path) -> None:
    archive = _campaign_archive(tmp_path / "c.tar.gz")
    data = tmp_path / "data"
    args = ["unpack", str(archive), "--data-dir", str(data), "--allow-simulated"]
    result = cli.invoke(campaign_app, [*args, "--profile-dir", str(tmp_path / "profiles")])
    assert result.exit_code == 0, result.output
    assert (data / "h100" / "campaign" / "probe.json").is_file()


def test_campaign_pack_a_directory(folder: Path) -> None:
    (folder / "d.tar.gz").mkdir()
    args = ["--runner", "simulated", "--operators", "BMM_GPT2_QK"]
    out = ["--out-dir", str(folder / "out"), "--pack", str(folder / "d.tar.gz")]
    result = cli.invoke(campaign_app, [*args, *out])
    _refused(result, f"--pack: {folder / 'd.tar.gz'} is a directory")
    assert not (folder / "out").exists()


def test_curve_refuses_its_paths_before_fetching_the_task(tuned: str, folder: Path) -> None:
    """A task that does not exist is never asked for: the path is wrong first."""
    result = cli.invoke(app, ["curve", "999", "--html", str(folder / "somedir"), "--db", tuned])
    _refused(result, f"--html: {folder / 'somedir'} is a directory")


def test_a_folder_this_user_cannot_write_in_is_refused_before_the_work(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only folder: the sweep measured first, then failed with exit 1 and a
    PermissionError naming its temporary file. (os.access is what the check asks: made to
    refuse the folder here, as the tests may run as root, whom no mode refuses.)"""
    import os

    from pipetune.clients.cli import paths

    locked = folder / "somedir"
    real = os.access
    monkeypatch.setattr(
        paths.os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode)
    )
    out = locked / "g.t4.json.gz"
    result = cli.invoke(sweep_app, [*GEMM, "--out", str(out)])
    _refused(result, f"--out: cannot write in {locked} (permission denied)")
    made = cli.invoke(sweep_app, [*GEMM, "--out", str(locked / "sub" / "g.t4.json.gz")])
    _refused(made, f"--out: cannot write in {locked} (permission denied)")
    with pytest.raises(CliError, match="cannot write in"):
        check_output_dir(locked / "new", "--out-dir")


def test_a_device_or_fifo_is_refused_and_a_link_is_written_through(folder: Path) -> None:
    """`dataset convert x /dev/full` replaced the device with a JSON file (the atomic write
    renames a new file over the path), and a symbolic link became a file, its target left
    as it was."""
    import os

    source = _dataset(folder)
    fifo = folder / "pipe"
    os.mkfifo(fifo)
    result = cli.invoke(dataset_app, ["convert", str(source), str(fifo)])
    _refused(result, f"TARGET: {fifo} is not a regular file")
    assert fifo.is_fifo()
    target = folder / "target.t4.json"
    target.write_text("old")
    link = folder / "link.t4.json"
    link.symlink_to(target)
    written = cli.invoke(dataset_app, ["convert", str(source), str(link)])
    assert written.exit_code == 0, written.output
    assert link.is_symlink() and json.loads(target.read_text())["results"]


def test_a_folder_no_file_can_be_made_in_is_refused_although_access_allows_it(
    folder: Path,
) -> None:
    """os.access says yes to root on any writable mount, /proc included: a sweep measured,
    then failed with exit 1 (FileNotFoundError of its temporary file), and `campaign --pack`
    there spun for ever. The check makes (and removes) a file: /proc refuses it."""
    proc = Path("/proc")
    result = cli.invoke(sweep_app, [*GEMM, "--out", str(proc / "x.t4.json.gz")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: --out: cannot write in /proc (")
    with pytest.raises(CliError, match=r"^--out-dir: cannot write in /proc \("):
        check_output_dir(proc / "sw", "--out-dir")
    pack = cli.invoke(
        campaign_app,
        ["--out-dir", str(folder / "c"), "--runner", "simulated", "--pack", "/proc/x.tar.gz"],
    )
    assert pack.exit_code == 2 and "--pack: cannot write in /proc (" in pack.stderr
    assert list(folder.glob(".pipetune-check-*")) == []  # the probe leaves nothing
    check_output_file(folder / "new.json", "--out")
    assert sorted(p.name for p in folder.iterdir()) == ["afile", "somedir"]


def test_a_loop_of_links_is_refused_by_name(folder: Path) -> None:
    """An output path that is a loop of symbolic links failed with OSError [Errno 40]."""
    (folder / "loop1").symlink_to(folder / "loop2")
    (folder / "loop2").symlink_to(folder / "loop1")
    source = _dataset(folder)
    result = cli.invoke(dataset_app, ["convert", str(source), str(folder / "loop1")])
    _refused(result, f"TARGET: {folder / 'loop1'}: Too many levels of symbolic links")
