"""`pipetune campaign` on the CPU: usage mistakes exit 2 with one line, a missing GPU exits 1
with a summary written anyway, a correctness failure stops the campaign before any sweep
(a family's failures against its own schedules), ``--have`` never mixes GPUs or simulated
with measured data and checks a family an earlier call did not, a memory-intensive operator
goes through every phase as a GEMM does (its baseline in GB/s), and `campaign unpack` keeps
simulated files out of the repository."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.campaign_cmds import campaign_app
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import ALCOP, MEMOPS
from pipetune.workers.campaign import run as campaign_run
from pipetune.workers.campaign.correctness import selection
from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS
from pipetune.workers.datasets import check_pipetune, read_t4
from pipetune.workers.runners.sim_runner import SimulatedLaunchRunner

cli = CliRunner()
SIM = ["--runner", "simulated", "--operators", "BMM_GPT2_QK"]
no_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="has CuPy")


pytestmark = pytest.mark.usefixtures("campaign_caches")


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ([], "--out-dir: required"),
        (["--gpu", "v100"], "--gpu: unknown GPU 'v100'"),
        (["--runner", "replay"], "--runner: one of cupy, simulated"),
        (["--operators", "MM_Nope"], "--operators: unknown operator or suite 'MM_Nope'"),
        (
            ["--operators", "MM_RN50_FC,Softmax_BERT_b1_s12"],
            "--operators: unknown operator or suite 'Softmax_BERT_b1_s12' (did you mean "
            "Softmax_BERT_b1_s128",
        ),
        # an empty value (an unset variable in a script) ran the whole default campaign
        (["--operators", ""], "--operators: no operator named"),
        (["--minutes", "0"], "--minutes: must be more than 0 and at most 10080 (a week), got 0"),
        # inf crashed after the probe, writing a summary JSON cannot hold; nan said "positive"
        (["--minutes", "inf", *SIM], "--minutes: must be more than 0 and at most 10080"),
        (["--minutes", "nan", *SIM], "--minutes: must be more than 0 and at most 10080"),
        # 1e308 minutes passed as finite and became an infinite budget in seconds
        (["--minutes", "1e308", *SIM], "--minutes: must be more than 0 and at most 10080"),
        (["--pack", "c.zip"], "--pack: a .tar.gz or .tar file name"),
        (["--have", "no/such/dir"], "--have no/such/dir: no such folder or archive"),
    ],
)
def test_usage_mistakes_exit_2_with_one_line(tmp_path, args, reason):
    out = [] if not args else ["--out-dir", str(tmp_path / "out")]
    result = cli.invoke(campaign_app, [*out, *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_bad_simulated_time_scale_is_a_usage_mistake(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "fast")
    result = cli.invoke(campaign_app, ["--out-dir", str(tmp_path / "out"), *SIM])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "PIPETUNE_SIMULATED_TIME_SCALE must be" in lines[0], lines
    assert "CUDA" not in lines[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", [".", "sub"])
def test_an_archive_in_the_out_dir_s_own_place_is_refused(tmp_path, where):
    """--pack naming the out-dir (or a folder it is in) ran the whole call, then could not
    write the archive over the folder (exit 1, nothing to bring back)."""
    archive = tmp_path / "c.tar.gz"
    out = archive / where
    result = cli.invoke(campaign_app, ["--out-dir", str(out), "--pack", str(archive), *SIM])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the --out-dir's own path" in lines[0], lines
    assert not archive.exists()


def test_an_out_dir_in_use_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "probe.json").write_text("{}")
    result = cli.invoke(campaign_app, ["--out-dir", str(tmp_path / "out"), *SIM])
    assert result.exit_code == 2 and "not empty" in result.stderr


@no_cupy
def test_without_a_gpu_the_cupy_campaign_exits_1_and_still_writes_its_summary(tmp_path):
    pack = tmp_path / "c.tar.gz"
    result = cli.invoke(campaign_app, ["--out-dir", str(tmp_path / "out"), "--pack", str(pack)])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: the cupy runner needs CuPy")
    summary = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert summary["state"] == "failed" and "needs CuPy" in summary["reason"]
    with tarfile.open(pack) as tar:
        assert tar.getnames() == ["campaign.json"]


def test_a_complete_call_names_its_quarantine_on_its_last_line(tmp_path, monkeypatch):
    """README: a quarantine is named on the call's last line, complete or paused."""
    import pipetune.workers.campaign as campaign_package
    from pipetune.workers.campaign import CampaignOutcome

    note = "correctness: quarantined hopper_gemm tile_loop=2 (40 of 40 checked failed)"
    summary = {"state": "complete", "quarantine": note, "calls": [{"phases": []}]}
    outcome = CampaignOutcome(0, "complete", f"complete; {note}", summary)
    monkeypatch.setattr(campaign_package, "run_campaign", lambda options: outcome)
    result = cli.invoke(campaign_app, ["--out-dir", str(tmp_path / "out"), "--runner", "simulated"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == f"complete; {note}"


def _every(chosen, step: int) -> tuple[str, ...]:
    """Every ``step``-th schedule of a correctness selection, over all its cases, as the
    simulated runner names a (workload, schedule): failures that no knob value or kind of
    kernel explains, so that no quarantine can keep the campaign going."""
    pairs = [(w, x) for _, w, s in chosen for x in s]
    return tuple(f"{w.workload_hash}/{x.id}" for w, x in pairs[step - 1 :: step])


def _with_wrong_kernels(cache_root: Path, wrong: tuple[str, ...], args: list[str]):
    """`pipetune campaign ARGS` on the simulated launch runner, with the given (workload
    hash/schedule id) computing wrong results in the correctness phase; the run's shared
    caches in `cache_root` (conftest.campaign_cache_root)."""

    def open_runner(options, gpu):
        return SimulatedLaunchRunner(gpu, settings=CAMPAIGN_SETTINGS, wrong=wrong)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPETUNE_CACHE_DIR", str(cache_root / "cubins"))
        patch.setenv("PIPETUNE_REFERENCE_CACHE", str(cache_root / "references"))
        patch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        patch.setattr(campaign_run, "open_runner", open_runner)
        return cli.invoke(campaign_app, args)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, campaign_cache_root):
    """A simulated campaign whose correctness phase meets 61 wrong kernels of 612 (10%),
    spread over every case and knob value."""
    folder = tmp_path_factory.mktemp("stopped")
    wrong = _every(selection(get_gpu("h100"), ["tensor_gemm"]), 10)
    args = ["--out-dir", str(folder / "out"), "--pack", str(folder / "c.tar.gz"), *SIM]
    return folder, _with_wrong_kernels(campaign_cache_root, wrong, args)


def test_a_correctness_failure_stops_the_campaign_before_any_sweep(stopped):
    folder, result = stopped
    assert result.exit_code == 1
    assert "correctness: 61 of 612 schedules failed" in result.stderr.strip().splitlines()[-1]
    correctness = json.loads((folder / "out" / "correctness.json").read_text())
    assert correctness["verdict"] == "stop" and len(correctness["mismatches"]) == 61
    assert correctness["quarantined"] == {}
    assert all(m["status"] == "wrong_result" for m in correctness["mismatches"])
    summary = json.loads((folder / "out" / "campaign.json").read_text())
    assert summary["state"] == "stopped"
    assert summary["phases"]["profile"] == "missing" and summary["phases"]["sweeps"] == "missing"
    with tarfile.open(folder / "c.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["campaign.json", "correctness.json", "probe.json"]


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--runner", "cupy"], "--have holds a simulated campaign"),
        (["--runner", "simulated", "--gpu", "h200"], "a campaign stays on one GPU model"),
    ],
)
def test_have_never_mixes_gpus_or_simulated_and_measured_data(stopped, tmp_path, args, reason):
    folder, _ = stopped
    have = ["--have", str(folder / "c.tar.gz")]
    result = cli.invoke(campaign_app, ["--out-dir", str(tmp_path / "o"), *have, *args])
    assert result.exit_code == 2, result.output
    assert reason in result.stderr.strip().splitlines()[-1]


def test_a_stopped_campaign_stays_stopped(stopped, tmp_path):
    folder, _ = stopped
    have = ["--have", str(folder / "c.tar.gz")]
    result = cli.invoke(campaign_app, ["--out-dir", str(tmp_path / "o"), *have, *SIM])
    assert result.exit_code == 1 and "correctness: 61 of 612" in result.stderr
    assert not (tmp_path / "o" / "profile.json").exists()


def test_unpack_keeps_simulated_archives_out_unless_asked(stopped, tmp_path):
    folder, _ = stopped
    archive = str(folder / "c.tar.gz")
    where = ["--data-dir", str(tmp_path / "data"), "--profile-dir", str(tmp_path / "profiles")]
    refused = cli.invoke(campaign_app, ["unpack", archive, *where])
    assert refused.exit_code == 2 and "simulated campaign" in refused.stderr
    assert not (tmp_path / "data").exists()
    done = cli.invoke(campaign_app, ["unpack", archive, *where, "--allow-simulated"])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "data" / "h100" / "campaign" / "correctness.json").exists()
    again = cli.invoke(campaign_app, ["unpack", archive, *where, "--allow-simulated"])
    assert again.exit_code == 2 and "would overwrite" in again.stderr


def test_the_plan_refuses_an_empty_operators_value():
    result = cli.invoke(campaign_app, ["plan", "--operators", ""])
    assert result.exit_code == 2 and "--operators: no operator named" in result.stderr


def test_the_plan_command_prints_the_calls():
    result = cli.invoke(campaign_app, ["plan", "--operators", "alcop", "--json"])
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert document["trials"] == 51971 and document["fits"]


def test_by_default_the_campaign_plans_the_alcop_suite_then_the_memops_suite():
    result = cli.invoke(campaign_app, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    families = [r["family"] for r in document["operators"]]
    assert families == ["tensor_gemm"] * 23 + ["memops"] * len(MEMOPS)
    assert document["trials"] == 51971 + 26072


def test_the_memops_suite_resolves_and_plans():
    result = cli.invoke(campaign_app, ["plan", "--operators", "memops", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [r["operator"] for r in document["operators"]] == list(MEMOPS)
    assert {r["family"] for r in document["operators"]} == {"memops"}
    assert document["trials"] == 26072 and document["distinct_kernels"] == 4484
    assert document["fits"]


MIXED = ["--runner", "simulated", "--operators", "MM_RN50_FC,Softmax_BERT_b1_s128"]


@pytest.fixture(scope="module")
def memops_stopped(tmp_path_factory, campaign_cache_root):
    """A simulated campaign over a GEMM and a softmax whose correctness phase meets 7 wrong
    memory-intensive kernels spread over their cases: 8 of 1172 schedules in all (0.7%), but
    8 of the 560 memops ones (1.4%)."""
    folder = tmp_path_factory.mktemp("memops-stopped")
    args = ["--out-dir", str(folder / "out"), *MIXED]
    wrong = _every(selection(get_gpu("h100"), ["memops"]), 64)
    return folder, _with_wrong_kernels(campaign_cache_root, wrong, args)


def test_a_family_s_failures_stop_the_campaign_though_all_families_pass(memops_stopped):
    folder, result = memops_stopped
    assert result.exit_code == 1, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert "correctness: 8 of 560 schedules failed (memops)" in last
    correctness = json.loads((folder / "out" / "correctness.json").read_text())
    assert (correctness["schedules"], correctness["failed"]) == (1172, 8)
    assert correctness["verdict"] == "stop"
    assert {m["family"] for m in correctness["mismatches"]} == {"memops"}
    assert correctness["families"]["tensor_gemm"]["verdict"] == "pass"
    summary = json.loads((folder / "out" / "campaign.json").read_text())
    assert summary["state"] == "stopped" and summary["phases"]["sweeps"] == "missing"
    assert not (folder / "out" / "baselines.json").exists()


@pytest.fixture(scope="module")
def continued(tmp_path_factory, campaign_cache_root):
    """Two simulated calls: a softmax alone, then (``--have``) the softmax and a GEMM."""
    folder = tmp_path_factory.mktemp("continued")
    results = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPETUNE_CACHE_DIR", str(campaign_cache_root / "cubins"))
        patch.setenv("PIPETUNE_REFERENCE_CACHE", str(campaign_cache_root / "references"))
        patch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
        first = ["--runner", "simulated", "--operators", "Softmax_BERT_b1_s128"]
        for call, args in ((1, first), (2, ["--have", str(folder / "c1.tar.gz"), *MIXED])):
            out = [
                "--out-dir",
                str(folder / f"out{call}"),
                "--pack",
                str(folder / f"c{call}.tar.gz"),
            ]
            results.append(cli.invoke(campaign_app, [*out, *args]))
    return folder, results


def test_a_memops_operator_goes_through_every_phase(continued):
    folder, (first, _) = continued
    assert first.exit_code == 0, first.output
    out = folder / "out1"
    summary = json.loads((out / "campaign.json").read_text())
    assert summary["state"] == "complete" and summary["sweeps"]["done"] == ["Softmax_BERT_b1_s128"]
    correctness = json.loads((out / "correctness.json").read_text())
    assert list(correctness["families"]) == ["memops"] and correctness["verdict"] == "pass"
    assert correctness["schedules"] == 560 and correctness["by_stages"] == {}
    assert set(correctness["by_variant"]) == {
        "reduce-sum", "reduce-max", "softmax", "softmax-causal", "layernorm", "rmsnorm",
        "bias_gelu", "bias_gelu-tanh", "silu_mul", "rmsnorm.bfloat16", "softmax.bfloat16",
    }  # fmt: skip
    counts = {kind: sum(c.values()) for kind, c in correctness["by_variant"].items()}
    assert all(n == (28 if kind.endswith(".bfloat16") else 56) for kind, n in counts.items())
    assert len(correctness["by_mapping"]) == 10
    assert all(correctness["tails"][axis] > 0 for axis in ("rows", "segment", "lanes"))
    baseline = json.loads((out / "baselines.json").read_text())["operators"]["Softmax_BERT_b1_s128"]
    assert baseline["unit"] == "GB/s" and baseline["simulated"] and "tflops" not in baseline
    softmax = MEMOPS["Softmax_BERT_b1_s128"]
    gbs = softmax.compulsory_bytes / (baseline["latency_us"] * 1e-6) / 1e9
    assert baseline["throughput"] == pytest.approx(gbs) and 1000 < gbs < 4000
    dataset = read_t4(out / "sweeps" / "Softmax_BERT_b1_s128.t4.json.gz")
    assert check_pipetune(dataset).runner == "simulated" and len(dataset) == 341
    assert set(dataset.records[0].configuration) == {
        "threads_per_row", "rows_per_block", "blocks_per_row", "vector_width", "row_cache",
        "split_mode", "max_waves",
    }  # fmt: skip


def test_a_later_call_checks_the_family_an_earlier_one_did_not(continued):
    folder, (_, second) = continued
    assert second.exit_code == 0, second.output
    out = folder / "out2"
    summary = json.loads((out / "campaign.json").read_text())
    assert summary["state"] == "complete" and set(summary["phases"].values()) == {"done"}
    assert summary["sweeps"]["done"] == ["MM_RN50_FC", "Softmax_BERT_b1_s128"]
    phases = {p["phase"]: p for p in summary["calls"][1]["phases"]}
    assert phases["correctness"]["families"] == ["tensor_gemm"]
    assert phases["correctness"]["schedules"] == 612
    correctness = json.loads((out / "correctness.json").read_text())
    assert list(correctness["families"]) == ["memops", "tensor_gemm"]
    assert correctness["schedules"] == 1172 and len(correctness["by_stages"]) == 12
    assert correctness["added_later"][0]["families"] == ["tensor_gemm"]
    baselines = json.loads((out / "baselines.json").read_text())["operators"]
    assert {n: b["unit"] for n, b in baselines.items()} == {
        "Softmax_BERT_b1_s128": "GB/s",
        "MM_RN50_FC": "TFLOP/s",
    }
    gemm = baselines["MM_RN50_FC"]
    assert gemm["tflops"] == pytest.approx(ALCOP["MM_RN50_FC"].flops / gemm["latency_us"] / 1e6)
    with tarfile.open(folder / "c1.tar.gz") as tar:  # the softmax was not measured again
        first = tar.extractfile("sweeps/Softmax_BERT_b1_s128.t4.json.gz").read()
    assert (out / "sweeps" / "Softmax_BERT_b1_s128.t4.json.gz").read_bytes() == first


def test_unpack_takes_memops_datasets_and_baselines_in_their_unit(continued, tmp_path):
    from pipetune.workers.campaign.unpack import unpack

    folder, _ = continued
    result = unpack(
        folder / "c2.tar.gz", tmp_path / "data", tmp_path / "profiles", allow_simulated=True
    )
    assert sorted(p.name for p in result.datasets) == [
        "MM_RN50_FC.t4.json.gz",
        "Softmax_BERT_b1_s128.t4.json.gz",
    ]
    assert check_pipetune(read_t4(tmp_path / "data" / "h100" / "Softmax_BERT_b1_s128.t4.json.gz"))
    assert {n: row[2] for n, row in result.baselines.items()} == {
        "Softmax_BERT_b1_s128": "GB/s",
        "MM_RN50_FC": "TFLOP/s",
    }


def test_a_campaign_imports_no_service_database_or_xgboost(tmp_path):
    """The whole simulated campaign in a process where those packages cannot be imported."""
    blocked = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg", "xgboost")
    script = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None  # import raises ImportError\n"
        "from pipetune.clients.cli.main import run\n"
        "sys.argv = ['pipetune', 'campaign', *sys.argv[1:]]\n"
        "run()\n"
    )
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", script, "--out-dir", str(out), *SIM],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "campaign.json").read_text())
    assert summary["state"] == "complete" and summary["sweeps"]["done"] == ["BMM_GPT2_QK"]


def test_a_campaign_goes_on_from_the_unpacked_repository_data(continued, tmp_path):
    # A later session has no archive, only what `campaign unpack` committed: --have takes
    # that folder, skips what it holds and measures the rest; unpack --force writes the whole.
    from pipetune.workers.campaign.unpack import unpack

    folder, _ = continued
    data = tmp_path / "data"
    unpack(folder / "c1.tar.gz", data, tmp_path / "profiles", allow_simulated=True)
    have = data / "h100"
    assert (have / "campaign" / "probe.json").exists()
    out = ["--out-dir", str(tmp_path / "out"), "--pack", str(tmp_path / "c.tar.gz")]
    result = cli.invoke(campaign_app, [*out, "--have", str(have), *MIXED])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert summary["state"] == "complete"
    assert summary["sweeps"]["done"] == ["MM_RN50_FC", "Softmax_BERT_b1_s128"]
    phases = {p["phase"]: p["status"] for p in summary["calls"][-1]["phases"]}
    assert phases["probe"] == "skipped (--have)" and phases["baselines"] == "done"
    # A simulated campaign's profile is its own simulated one: it took the profile the model
    # applies to the H100 (measured, runner cupy) into the simulated archive.
    profile = json.loads((tmp_path / "out" / "profile.json").read_text())
    assert profile["simulated"] is True and phases["profile"] == "done"
    committed = (have / "Softmax_BERT_b1_s128.t4.json.gz").read_bytes()
    swept = tmp_path / "out" / "sweeps"
    assert (swept / "Softmax_BERT_b1_s128.t4.json.gz").read_bytes() == committed
    again = unpack(
        tmp_path / "c.tar.gz", data, tmp_path / "profiles", allow_simulated=True, force=True
    )
    assert sorted(p.name for p in again.datasets) == [
        "MM_RN50_FC.t4.json.gz",
        "Softmax_BERT_b1_s128.t4.json.gz",
    ]
    assert (have / "Softmax_BERT_b1_s128.t4.json.gz").read_bytes() == committed


def _measured_archive(path, probe):
    """An archive of a measured campaign's probe and the shipped H100 profile (a measured one)."""
    from pipetune.model.hardware import PROFILE_DIR

    with tarfile.open(path, "w:gz") as tar:
        tar.add(PROFILE_DIR / "h100.json", arcname="profile.json")
        probe_file = path.with_suffix(".probe.json")
        probe_file.write_text(json.dumps(probe))
        tar.add(probe_file, arcname="probe.json")
    return path


def test_unpack_puts_the_profile_where_the_installed_model_reads_it(tmp_path, monkeypatch):
    # It wrote ./model/profiles/<gpu>.json relative to the current folder, which an installed
    # pipetune never reads: by default the profile goes to the user's profile folder.
    from pipetune.model import hardware

    archive = _measured_archive(tmp_path / "c.tar.gz", {"gpu": "h100", "runner": "cupy"})
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "own"))
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(campaign_app, ["unpack", str(archive), "--data-dir", "data"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "own" / "h100.json").read_bytes() == (
        hardware.PROFILE_DIR / "h100.json"
    ).read_bytes()
    assert not (tmp_path / "model").exists()
    assert str(tmp_path / "own" / "h100.json") in result.stdout
    assert get_gpu("h100").profile == "calibrated(user):h100.json"


def test_unpack_leaves_a_simulated_profile_out_of_the_users_folder(
    continued, tmp_path, monkeypatch
):
    # A simulated campaign tried out with --allow-simulated must not calibrate the user's model.
    from pipetune.model import hardware

    folder, _ = continued
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "own"))
    monkeypatch.chdir(tmp_path)
    archive = str(folder / "c1.tar.gz")
    args = ["unpack", archive, "--data-dir", "data", "--allow-simulated"]
    result = cli.invoke(campaign_app, args)
    assert result.exit_code == 0, result.output
    assert "profile not written: its profile is simulated" in result.stderr
    assert not (tmp_path / "own").exists() and not (tmp_path / "model").exists()
    assert (tmp_path / "data" / "h100" / "Softmax_BERT_b1_s128.t4.json.gz").exists()
    named = cli.invoke(campaign_app, [*args, "--force", "--profile-dir", "sim-profiles"])
    assert named.exit_code == 0, named.output
    assert (tmp_path / "sim-profiles" / "h100.json").exists()


def test_unpack_leaves_a_simulated_profile_out_of_the_users_folder_named_explicitly(
    continued, tmp_path, monkeypatch
):
    # --profile-dir naming the user's own profile folder calibrated the model with the spec
    # sheet's noise ("calibrated(user):h100.json"), as the default folder would have.
    from pipetune.model import hardware

    folder, _ = continued
    own = tmp_path / "own"
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(own))
    archive = str(folder / "c1.tar.gz")
    args = ["unpack", archive, "--data-dir", str(tmp_path / "data"), "--allow-simulated"]
    result = cli.invoke(campaign_app, [*args, "--profile-dir", str(own)])
    assert result.exit_code == 0, result.output
    assert "profile not written: its profile is simulated" in result.stderr
    assert not (own / "h100.json").exists()


def test_unpack_refuses_a_simulated_profile_in_a_measured_campaign(tmp_path, monkeypatch):
    # profile_phase marks a simulated profile so that unpack never installs it as measured;
    # unpack looked at the probe's runner only, and wrote the marked profile where the
    # model applies it.
    from pipetune.model import hardware
    from pipetune.workers.campaign.profile_phase import run_profile

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(run_profile("h100", simulated=True)))
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"gpu": "h100", "runner": "cupy"}))
    archive = tmp_path / "c.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(profile, arcname="profile.json")
        tar.add(probe, arcname="probe.json")
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "own"))
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(campaign_app, ["unpack", str(archive), "--data-dir", "data"])
    assert result.exit_code == 2, result.output
    assert "profile.json is simulated, in a measured campaign" in result.stderr
    assert not (tmp_path / "own").exists() and not (tmp_path / "data").exists()


def test_a_later_call_naming_fewer_operators_goes_on_with_the_campaign_s_others(
    continued, tmp_path
):
    """A --have call naming only some of the campaign's operators summed up only those: it
    said "complete" of a campaign whose other operators were unswept, and the kit offered
    no call to finish them. The campaign goes on whole: its earlier operators first."""
    folder, (_, second) = continued
    assert second.exit_code == 0, second.output
    have = tmp_path / "have"
    shutil.copytree(folder / "out2", have)
    (have / "sweeps" / "MM_RN50_FC.t4.json.gz").unlink()  # (as if a call had paused there)
    # (campaign_caches, the module's: the fixture's caches, its kernels compiled once)
    args = ["--runner", "simulated", "--operators", "Softmax_BERT_b1_s128", "--have", str(have)]
    result = cli.invoke(campaign_app, [*args, "--out-dir", str(tmp_path / "out3")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out3" / "campaign.json").read_text())
    assert summary["operators"] == ["MM_RN50_FC", "Softmax_BERT_b1_s128"]
    assert summary["state"] == "complete"
    assert summary["sweeps"]["done"] == ["MM_RN50_FC", "Softmax_BERT_b1_s128"]
    assert (tmp_path / "out3" / "sweeps" / "MM_RN50_FC.t4.json.gz").exists()
