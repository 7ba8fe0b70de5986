"""The GPU kit and the CI rehearsal of a GPU campaign.

- ``make gpu-kit``'s builder gives pipetune's wheel and the cp312 manylinux wheels the GPU
  machine lacks, under 40 MiB, and the command it prints is the README's.
- The rehearsal: a fresh virtual environment with only the kit's wheels (built for this
  machine's Python by the same code, with the same package list) and the packages the GPU
  machine already has (those of them installed here), then the README's call 1 and call 2
  commands exactly as written there, with ``--operators alcop,memops --runner cupy``
  replaced by the simulated runner and the rehearsal's scope (a GEMM, a BMM and a softmax:
  both kernel families through every phase). Every file is checked; the second call skips
  what is done.

Building the kit downloads wheels with pip from the package registry (which CI reaches); where
pip cannot, the tests fail with pip's one-line reason rather than skip: a rehearsal that did
not run proves nothing about the first GPU call.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from pipetune.workers.campaign import kit as kit_module
from pipetune.workers.campaign.kit import (
    GPU_MACHINE_PACKAGES,
    KIT_DIR,
    KIT_LIMIT_BYTES,
    KIT_PACKAGES,
    WHEEL_LOCK,
    KitError,
    attention_device_command,
    bf16_device_command,
    bias_gelu_device_command,
    build_kit,
    conv_device_command,
    device_command,
    hopper_device_command,
    hopper_fused_device_command,
    llama_device_command,
    normalise,
    resweep_convolutions,
    swiglu_device_command,
    warps_along_n_command,
)
from pipetune.workers.campaign.operators import DEFAULT_OPERATORS, resolve_operators, suite_in_order
from pipetune.workers.datasets import check_pipetune, read_t4

ROOT = Path(__file__).resolve().parents[1]
# --minutes is a cap, not a length: at 2 the rehearsal paused before its end on a loaded 2-core
# CI box (its NVRTC compiles run on the CPU), and the test read a wall clock.
REHEARSAL = (
    "--runner simulated --minutes 10 --operators MM_RN50_FC,BMM_GPT2_QK,Softmax_BERT_b1_s128"
)
GEMM_OPERATORS = ("MM_RN50_FC", "BMM_GPT2_QK")
OPERATORS = (*GEMM_OPERATORS, "Softmax_BERT_b1_s128")
MEMOPS_KINDS = {
    "reduce-sum",
    "reduce-max",
    "softmax",
    "softmax-causal",
    "layernorm",
    "rmsnorm",
    "bias_gelu",
    "bias_gelu-tanh",
    "silu_mul",
}
NOT_ON_THE_GPU_MACHINE = ("fastapi", "sqlalchemy", "alembic", "xgboost", "uvicorn", "psycopg")
FROM_THE_KIT = ("pydantic", "pydantic_core", "tenacity", "platformdirs")


def readme_commands() -> list[str]:
    """The device commands in the README's GPU section, in order."""
    text = (ROOT / "README.md").read_text()
    return [line for line in text.splitlines() if line.startswith("set -o pipefail;")]


def kit_or_fail(out: Path, python_version: str):
    try:
        return build_kit(out, python_version)
    except KitError as exc:
        pytest.fail(f"the kit could not be built here: {exc}", pytrace=False)


def test_the_readme_gives_the_kit_s_commands():
    assert readme_commands() == [device_command(call) for call in (1, 2, 3)]
    stripped = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()]
    assert hopper_device_command() in stripped  # the Hopper family's campaign call
    assert conv_device_command() in stripped  # the convolutions swept again
    assert llama_device_command() in stripped  # the llama suite's first sweeps
    assert swiglu_device_command() in stripped  # the fused GEMM + SwiGLU against the pair
    assert bf16_device_command() in stripped  # the swiglu suite's GEMMs in bfloat16
    assert bias_gelu_device_command() in stripped  # FC1 with its bias and GELU fused
    assert hopper_fused_device_command() in stripped  # the fused GEMMs on the wgmma family
    assert attention_device_command() in stripped  # Q·Kᵀ over keys stored N x K, both families
    assert warps_along_n_command("h100") in stripped  # README's item 6, the kit's call


def test_the_wheel_is_built_under_the_tree_s_lock(tmp_path, monkeypatch):
    """Two kits built at once from one tree (two test workers) removed and rewrote each
    other's build/lib, and one of them failed ("Failed building wheel for pipetune"): the
    wheel is built holding the tree's lock, which another build then waits for."""
    held = []
    tree = tmp_path / "tree"  # a tree of its own: other workers' kits take the real one's lock
    monkeypatch.setattr(kit_module, "repo_root", lambda: tree)

    def fake_run(command, what):
        if what == "building pipetune's wheel":
            assert command[-1] == str(tree)
            with open(tree / WHEEL_LOCK, encoding="utf-8") as other:
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    held.append(True)
                else:
                    held.append(False)
        raise KitError("stop here")

    monkeypatch.setattr(kit_module, "_run", fake_run)
    with pytest.raises(KitError, match="stop here"):
        build_kit(tmp_path / "kit")
    assert held == [True]
    with open(tree / WHEEL_LOCK, encoding="utf-8") as after:  # released on the way out
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_convolutions_swept_again_are_the_alcop_suite_s_eight():
    names = resweep_convolutions()
    assert names == tuple(f"Conv2D_RN50_{i}" for i in (1, 2, 3, 4)) + tuple(
        f"Conv3D_{i}" for i in (1, 2, 3, 4)
    )
    # The call's --operators resolves to exactly those, in that order.
    value = conv_device_command().split("--operators ", 1)[1].split(" ", 1)[0]
    assert tuple(resolve_operators(value)) == names


def test_the_gpu_kit_is_complete_for_the_gpu_machine_and_small(tmp_path):
    # A module left in setuptools' build folder from an older tree must not ship.
    stale = ROOT / "build" / "lib" / "pipetune" / "workers" / "stale_module_for_test.py"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("raise ImportError('stale')\n")
    kit = kit_or_fail(tmp_path / KIT_DIR, "3.12")
    names = {normalise(w.name.split("-")[0]): w.name for w in kit.wheels}
    assert set(names) == {"pipetune", *map(normalise, KIT_PACKAGES)}
    assert "cp312-cp312-manylinux" in names["pydantic-core"]
    assert kit.bytes < KIT_LIMIT_BYTES
    manifest = json.loads((tmp_path / KIT_DIR / "KIT.json").read_text())
    assert manifest["python_version"] == "3.12" and len(manifest["wheels"]) == len(kit.wheels)
    # Carried only where the machine lacks them, or lacks the version pipetune needs.
    lacking = {normalise(n) for n in KIT_PACKAGES} - GPU_MACHINE_PACKAGES
    assert lacking == {"pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                       "platformdirs", "tenacity"}  # fmt: skip
    with zipfile.ZipFile(tmp_path / KIT_DIR / names["pipetune"]) as wheel:
        assert "pipetune/workers/campaign/run.py" in wheel.namelist()
        assert "pipetune/workers/stale_module_for_test.py" not in wheel.namelist()
    assert not stale.exists()


def link_gpu_machine_packages(site: Path) -> list[str]:
    """Symlink into ``site`` every file of the installed distributions the GPU machine also
    has (its own pip and setuptools stay the virtual environment's)."""
    # Some 15,000 files: os.path, not pathlib, whose per-path objects cost the module's setup
    # seconds; each folder made once.
    linked = []
    made: set[str] = set()
    for dist in importlib.metadata.distributions():
        name = normalise(dist.metadata["Name"])
        if name not in GPU_MACHINE_PACKAGES or name in ("pip", "setuptools", "wheel"):
            continue
        base = str(dist.locate_file(""))
        for file in dist.files or []:
            relative = str(file)
            if relative.split("/", 1)[0] == "..":
                continue  # scripts outside site-packages
            source = os.path.join(base, relative)
            target = os.path.join(site, relative)
            if os.path.isfile(source) and not os.path.lexists(target):
                folder = os.path.dirname(target)
                if folder not in made:
                    os.makedirs(folder, exist_ok=True)
                    made.add(folder)
                os.symlink(source, target)
        linked.append(name)
    return linked


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A stand-in GPU machine: (working tree with the kit, environment for its commands)."""
    root = tmp_path_factory.mktemp("gpu-machine")
    work = root / "work"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    kit_or_fail(work / KIT_DIR, version)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    (site,) = (venv / "lib").glob("python*/site-packages")
    linked = link_gpu_machine_packages(site)
    assert {"numpy", "typer", "rich", "httpx", "nvidia-cuda-nvrtc"} <= set(linked)
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(root / "home"),
        "OUT": str(root / "out"),
        "PIPETUNE_CACHE_DIR": str(root / "cubins"),
        "PIPETUNE_REFERENCE_CACHE": str(root / "references"),
        "PIPETUNE_SIMULATED_TIME_SCALE": "1",
    }
    return work, env


def run_device_command(work: Path, env: dict[str, str], call: int) -> subprocess.CompletedProcess:
    command = readme_commands()[call - 1]
    operators = f"--operators {DEFAULT_OPERATORS} "
    assert command.count("--runner cupy") == 1 and command.count(operators) == 1
    rehearsal = command.replace(operators, "").replace("--runner cupy", REHEARSAL)
    out = Path(env["OUT"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()  # the device tool gives every call an empty $OUT
    return subprocess.run(
        ["bash", "-c", rehearsal], cwd=work, env=env, capture_output=True, text=True, timeout=400
    )


def archive_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_readme_s_device_calls_run_in_a_gpu_machine_stand_in(machine):
    work, env = machine
    python = Path(env["PATH"].split(":")[0]) / "python3"
    for module in (*NOT_ON_THE_GPU_MACHINE, *FROM_THE_KIT):  # absent before the kit
        probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, env=env)
        assert probe.returncode != 0, module

    first = run_device_command(work, env, 1)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = Path(env["OUT"])
    assert sorted(p.name for p in out.iterdir()) == ["campaign-1.log", "campaign-1.tar.gz"]
    assert "campaign: complete" in (out / "campaign-1.log").read_text()
    files = archive_members(out / "campaign-1.tar.gz")
    expected = {
        "probe.json",
        "correctness.json",
        "profile.json",
        "baselines.json",
        "campaign.json",
        *(f"sweeps/{op}.t4.json.gz" for op in OPERATORS),
    }
    assert set(files) == expected
    check_files(work / ".campaign-1", files)
    for module in FROM_THE_KIT:  # installed by the README's line, where it said
        assert (work / ".gpu-site" / module).is_dir(), module
    shutil.copyfile(out / "campaign-1.tar.gz", work / KIT_DIR / "campaign-1.tar.gz")

    second = run_device_command(work, env, 2)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    again = archive_members(out / "campaign-2.tar.gz")
    assert set(again) == expected
    summary = json.loads(again["campaign.json"])
    assert summary["state"] == "complete" and len(summary["calls"]) == 2
    assert {p["phase"]: p["status"] for p in summary["calls"][1]["phases"]} == {
        phase: "skipped (--have)"
        for phase in ("probe", "correctness", "profile", "baselines", "sweeps")
    }
    for name in expected - {"campaign.json"}:
        assert again[name] == files[name], f"{name} was measured again"


def check_files(folder: Path, files: dict[str, bytes]) -> None:
    """Every file of the rehearsal is complete, and says simulated."""
    probe = json.loads(files["probe.json"])
    assert probe["verdict"] == "pass" and probe["simulated"] and probe["runner"] == "simulated"
    assert probe["gpu"] == "h100" and probe["timing_floor_us"] > 0
    assert all(check["ok"] for check in probe["checks"].values())
    correctness = json.loads(files["correctness.json"])
    assert correctness["schedules"] >= 300 and correctness["verdict"] == "pass"
    assert correctness["simulated"] and not correctness["verified"]
    assert set(correctness["by_variant"]) == {"gemm_kn", "gemm_nk", "gemm_swiglu_kn",
                                              "gemm_swiglu_nk", "gemm_bias_gelu_kn",
                                              "gemm_bias_gelu_nk", "bmm", "bmm_nk", "conv2d",
                                              "conv3d",
                                              "gemm_kn.bfloat16", "gemm_swiglu_nk.bfloat16",
                                              "gemm_bias_gelu_kn.bfloat16",
                                              "rmsnorm.bfloat16", "softmax.bfloat16",
                                              *MEMOPS_KINDS}  # fmt: skip
    assert len(correctness["by_stages"]) == 12
    assert all(correctness["tails"][axis] > 0 for axis in "mnk")
    assert all(correctness["tails"][axis] > 0 for axis in ("rows", "segment", "lanes"))
    assert list(correctness["families"]) == ["tensor_gemm", "memops"]
    profile = json.loads(files["profile.json"])
    assert profile["simulated"] and profile["gpu"] == "h100" and profile["overrides"]
    baselines = json.loads(files["baselines.json"])
    assert baselines["simulated"] and set(baselines["operators"]) == set(OPERATORS)
    gemms = [b for op, b in baselines["operators"].items() if op in GEMM_OPERATORS]
    assert all(b["tflops"] > 0 and b["simulated"] for b in gemms)
    softmax = baselines["operators"]["Softmax_BERT_b1_s128"]
    assert softmax["unit"] == "GB/s" and softmax["throughput"] > 0 and softmax["simulated"]
    summary = json.loads(files["campaign.json"])
    assert summary["state"] == "complete" and summary["simulated"]
    assert set(summary["phases"].values()) == {"done"}
    assert summary["calls"][0]["timing_floor_us"] == probe["timing_floor_us"]
    for op in OPERATORS:
        dataset = read_t4(folder / "sweeps" / f"{op}.t4.json.gz")
        info = check_pipetune(dataset)
        assert info.runner == "simulated" and info.device_name.startswith("simulated")
        settings = info.metadata["settings"]
        assert settings["simulated"] and settings["timing_floor_us"] == probe["timing_floor_us"]
        assert (settings["min_repeats"], settings["repeats"], settings["warmup"]) == (5, 10, 1)
        assert all(r.valid for r in dataset.records)
        assert (
            len(dataset)
            == {"MM_RN50_FC": 2032, "BMM_GPT2_QK": 686, "Softmax_BERT_b1_s128": 341}[op]
        )


def rehearse(machine, command: str, name: str) -> dict:
    """Run a README device call in the stand-in machine with simulated launches (`--runner
    cupy` replaced); returns its archive's members. `name`: its log's and archive's stem."""
    work, env = machine
    rehearsal = command.replace("--runner cupy", "--runner simulated")
    out = Path(env["OUT"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    done = subprocess.run(
        ["bash", "-c", rehearsal], cwd=work, env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "campaign: complete" in (out / f"{name}.log").read_text()
    return archive_members(out / f"{name}.tar.gz")


def test_the_hopper_campaign_call_runs_in_a_gpu_machine_stand_in(machine):
    """The README's call for the Hopper wgmma family, on two of its operators with simulated
    launches: the kit carries the family (its model, generator and campaign parts)."""
    command = hopper_device_command()
    files = rehearse(
        machine,
        command.replace("--operators hopper", "--operators WG_MM_RN50_FC,WG_BMM_BERT_SV"),
        "campaign-hopper",
    )
    assert {"sweeps/WG_MM_RN50_FC.t4.json.gz", "sweeps/WG_BMM_BERT_SV.t4.json.gz"} <= set(files)
    correctness = json.loads(files["correctness.json"])
    assert list(correctness["families"]) == ["hopper_gemm"] and correctness["verdict"] == "pass"


def test_the_llama_call_runs_in_a_gpu_machine_stand_in(machine):
    """The README's call for the llama suite, on one RMS norm and one SwiGLU with simulated
    launches: the kit carries the two ops' kernels, references and correctness cases."""
    command = llama_device_command()
    files = rehearse(
        machine,
        command.replace(
            "--operators llama", "--operators RMSNorm_LLaMA2_7B_t128,SwiGLU_LLaMA2_7B_t128"
        ),
        "campaign-llama",
    )
    assert {
        "sweeps/RMSNorm_LLaMA2_7B_t128.t4.json.gz",
        "sweeps/SwiGLU_LLaMA2_7B_t128.t4.json.gz",
    } <= set(files)
    correctness = json.loads(files["correctness.json"])
    assert list(correctness["families"]) == ["memops"] and correctness["verdict"] == "pass"
    checked = correctness["families"]["memops"]["by_variant"]
    assert checked["rmsnorm"]["ok"] > 0 and checked["silu_mul"]["ok"] > 0
    baselines = json.loads(files["baselines.json"])["operators"]
    assert set(baselines) == {"RMSNorm_LLaMA2_7B_t128", "SwiGLU_LLaMA2_7B_t128"}


def test_the_convolutions_call_runs_in_a_gpu_machine_stand_in(machine):
    """The README's re-sweep of the convolutions, on one Conv2D and one Conv3D with simulated
    launches: the kit carries the convolution loader, its launch constants and cuDNN's stand-
    in, and the call compiles the kernels it would time (a 15-minute loan is one call: a
    mistake found there costs the session's data)."""
    command = conv_device_command()
    operators = ",".join(resweep_convolutions())
    assert f"--operators {operators} " in command
    files = rehearse(machine, command.replace(operators, "Conv2D_RN50_1,Conv3D_4"), "campaign-conv")
    assert {"sweeps/Conv2D_RN50_1.t4.json.gz", "sweeps/Conv3D_4.t4.json.gz"} <= set(files)
    correctness = json.loads(files["correctness.json"])
    assert correctness["verdict"] == "pass"
    checked = correctness["families"]["tensor_gemm"]["by_variant"]
    assert checked["conv2d"]["ok"] > 0 and checked["conv3d"]["ok"] > 0  # the new loader
    baselines = json.loads(files["baselines.json"])["operators"]
    assert set(baselines) == {"Conv2D_RN50_1", "Conv3D_4"}


def parse_each_sweep_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """open_calls reads every convolution sweep it checks for stale kernels (seconds each):
    a test asking it about the same committed files, and copies of them, again and again
    has each content parsed once. Keyed by the bytes, so a changed file is read anew."""
    from pipetune.workers import datasets

    load = datasets.load_dataset
    parsed: dict[tuple[str, bool], datasets.Dataset] = {}

    def load_once(path: str | Path, *, allow_open: bool = False) -> datasets.Dataset:
        key = (hashlib.sha256(Path(path).read_bytes()).hexdigest(), allow_open)
        if key not in parsed:
            parsed[key] = load(path, allow_open=allow_open)
        return parsed[key]

    monkeypatch.setattr(datasets, "load_dataset", load_once)


def test_the_kit_offers_each_gpu_what_its_committed_data_lacks(tmp_path, monkeypatch):
    """`make gpu-kit` offered a whole campaign first, with a machine kind this workplace
    does not lend, on GPUs whose campaigns were committed; the call still open (the H200's
    persistent probe shapes) it did not print at all."""
    from pipetune.model.hardware import PROFILE_DIR
    from pipetune.workers.campaign.kit import (
        DATA_DIR,
        PROBE_CALLS,
        DeviceCall,
        calibrate_device_command,
        open_calls,
    )

    parse_each_sweep_once(monkeypatch)
    # The repository's data: campaigns, the current convolution loader, the Hopper family and
    # its persistent probe shapes on the H200 (measured 2026-12-04): nothing left there but
    # a measured K-step cost, which the H200's profile lacks (the H100's has one).
    profiles = PROFILE_DIR  # (the checkout's model/profiles)
    h200 = open_calls("h200", ROOT / DATA_DIR, profiles)
    # In README's order (GPU work, "in this order"): its item 5, the K step's calibration,
    # before the suites (items 7 to 12); it came last, where a session never reached it.
    assert [c.command for c in h200] == [
        calibrate_device_command("h200"),
        warps_along_n_command("h200"),  # (README's item 6: never offered before)
        llama_device_command(),
        swiglu_device_command(),
        bf16_device_command(),
        bias_gelu_device_command(),
        hopper_fused_device_command(),
        attention_device_command(),
    ]
    assert "calibrate --gpu h200 --out $OUT/h200.json" in h200[0].command
    assert h200[1].run()["timeout_s"] == 420
    h200 = [h200[0], *h200[2:]]
    assert h200[1].run()["timeout_s"] == 300 and h200[5].run()["timeout_s"] == 300
    assert h200[2].run()["timeout_s"] == 360 and h200[3].run()["timeout_s"] == 360
    assert h200[4].run()["timeout_s"] == 300 and h200[6].run()["timeout_s"] == 300
    with_k_step = tmp_path / "profiles"
    with_k_step.mkdir()
    doc = json.loads((profiles / "h200.json").read_text())
    doc["raw"]["k_step_cycles"] = 198.0
    (with_k_step / "h200.json").write_text(json.dumps(doc))
    assert [c.command for c in open_calls("h200", ROOT / DATA_DIR, with_k_step)] == [
        warps_along_n_command("h200"),
        llama_device_command(),
        swiglu_device_command(),
        bf16_device_command(),
        bias_gelu_device_command(),
        hopper_fused_device_command(),
        attention_device_command(),
    ]
    # The llama, swiglu, bf16 and bias_gelu suites measured, the hopper_fused one in the
    # Hopper family's folder and the attention one in both (stand-in files): not offered
    # again; without the persistent probe's file, that probe is.
    mirror = tmp_path / "data"
    shutil.copytree(ROOT / DATA_DIR / "h200", mirror / "h200")
    shutil.copytree(ROOT / DATA_DIR / "hopper", mirror / "hopper")
    suites = ("llama", "swiglu", "bf16", "bias_gelu")
    for op in [name for suite in suites for name in suite_in_order(suite)]:
        (mirror / "h200" / f"{op}.t4.json.gz").write_bytes(b"")
    for op in suite_in_order("hopper_fused"):
        (mirror / "hopper" / "h200" / f"{op}.t4.json.gz").write_bytes(b"")
    for op in suite_in_order("attention"):
        family = "hopper/h200" if op.startswith("WG_") else "h200"
        (mirror / family / f"{op}.t4.json.gz").write_bytes(b"")
    (mirror / "h200" / "wgmma-probe-persistent.json").unlink()
    (mirror / "h200" / "profile").mkdir(exist_ok=True)
    (mirror / "h200" / "profile" / "ncu-BMM_GPT2_QK-where.txt").write_text("")
    h200 = open_calls("h200", mirror, with_k_step)
    assert [c.command for c in h200] == [PROBE_CALLS["h200"][2]]
    assert h200[0].run() == {
        "timeout_s": 330, "carry": [".gpu-kit"], "command": PROBE_CALLS["h200"][2],
    }  # fmt: skip
    h100 = open_calls("h100", ROOT / DATA_DIR, profiles)
    assert [c.command for c in h100] == [
        conv_device_command(),  # its convolutions measure the loader before 2026-11-28
        hopper_device_command(),
        PROBE_CALLS["h100"][2],  # (README's item 3: it came last, after six suites)
        warps_along_n_command("h100"),
        llama_device_command(),
        swiglu_device_command(),
        bf16_device_command(),
        bias_gelu_device_command(),
        hopper_fused_device_command(),
        attention_device_command(),
    ]
    # A GPU with no campaign: the campaign's first call, and nothing else before it.
    assert open_calls("h100", tmp_path) == [
        DeviceCall(
            "the campaign, first call (README, GPU work, for the next calls)",
            600,
            device_command(1),
        )
    ]
    # Its probe kept under the name the heading gives: no longer offered.
    (mirror / "h200" / "wgmma-probe-persistent.json").write_text("{}")
    assert open_calls("h200", mirror, with_k_step) == []


def test_the_kit_goes_on_with_a_campaign_an_earlier_call_left_unfinished(tmp_path):
    """A call that paused at its deadline (or was cut off) is unpacked with the operators it
    finished and a campaign.json that says so: the kit took one dataset of the Hopper family
    for its whole campaign and offered the rest to no later GPU session."""
    from pipetune.workers.campaign.kit import open_calls

    data = tmp_path / "gpu data"  # (a --data folder with a space in its name: quoted)
    hopper = data / "hopper" / "h100"
    (hopper / "campaign").mkdir(parents=True)
    shutil.copyfile(
        ROOT / "benchmarks/data/hopper/h200/WG_MM_Square_1k.t4.json.gz",
        hopper / "WG_MM_Square_1k.t4.json.gz",
    )
    (data / "h100" / "campaign").mkdir(parents=True)
    (data / "h100" / "campaign" / "campaign.json").write_text('{"state": "complete"}')
    (hopper / "campaign" / "campaign.json").write_text('{"state": "paused"}')
    commands = [c.command for c in open_calls("h100", data)]
    assert hopper_device_command(have=str(hopper)) in commands
    assert f"--have {shlex.quote(str(hopper))} " in hopper_device_command(have=str(hopper))
    words = shlex.split(hopper_device_command(have=str(hopper)).split(" 2>&1")[0])
    assert words[words.index("--have") + 1] == str(hopper)
    for state in ("complete", "stopped"):  # then the family's campaign is not offered again
        (hopper / "campaign" / "campaign.json").write_text(json.dumps({"state": state}))
        assert not any("--operators hopper " in c.command for c in open_calls("h100", data))
    # The mma.sync campaign left unfinished: its next call, from the committed data, first.
    (data / "h100" / "campaign" / "campaign.json").write_text('{"state": "paused"}')
    (call,) = open_calls("h100", data)
    assert call.command == device_command(1, have=str(data / "h100"))
    assert f"--have {shlex.quote(str(data / 'h100'))} " in call.command
    # A campaign.json there that is not JSON: named in one line (make gpu-kit: "error: ...").
    (data / "h100" / "campaign" / "campaign.json").write_text('{"state":')
    with pytest.raises(KitError, match=r"campaign\.json: not valid JSON"):
        open_calls("h100", data)


def test_a_kit_folder_over_the_device_s_carry_is_refused_naming_what_fills_it(tmp_path):
    """The whole folder travels with a call (wheels and any archive put there for --have):
    over the device tool's 64 MiB carry the call would be refused after the GPU was started,
    so building the kit says so first, naming the files besides the wheels."""
    from pipetune.workers.campaign.kit import CARRY_LIMIT_BYTES, check_carry

    folder = tmp_path / KIT_DIR
    folder.mkdir()
    (folder / "pipetune-0-py3-none-any.whl").write_bytes(b"w" * 1024)
    with (folder / "campaign-3.tar.gz").open("wb") as archive:
        archive.truncate(CARRY_LIMIT_BYTES // 2)
    check_carry(folder)  # under the limit: fine
    with (folder / "campaign-old.tar.gz").open("wb") as archive:
        archive.truncate(CARRY_LIMIT_BYTES // 2)
    with pytest.raises(KitError, match=r"over the device.s 64 MiB a call") as refused:
        check_carry(folder)
    assert "campaign-3.tar.gz (32.0 MiB)" in str(refused.value)
    assert "campaign-old.tar.gz (32.0 MiB)" in str(refused.value)
    assert ".whl" not in str(refused.value)


def test_the_carry_counts_the_working_tree_that_travels_with_the_kit(tmp_path):
    """The device's 64 MiB hold the working tree too (tracked and untracked-not-ignored
    files): with two campaign archives in the kit the folder alone passed while the call,
    with the tree's 28 MiB, was over and would be refused once the GPU had started."""
    import subprocess

    from pipetune.workers.campaign.kit import (
        CARRY_LIMIT_BYTES,
        check_carry,
        travelling_tree_bytes,
    )

    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text(f"/{KIT_DIR}/\n/ignored.bin\n")
    (root / "tracked.bin").write_bytes(b"t" * 3000)
    subprocess.run(["git", "-C", str(root), "add", "tracked.bin", ".gitignore"], check=True)
    (root / "untracked.bin").write_bytes(b"u" * 2000)  # travels too
    (root / "ignored.bin").write_bytes(b"i" * 5000)  # does not
    folder = root / KIT_DIR
    folder.mkdir()
    (folder / "campaign-1.tar.gz").write_bytes(b"a" * 7000)  # counted with the kit
    tree = travelling_tree_bytes(root, folder)
    assert tree == 3000 + 2000 + len(f"/{KIT_DIR}/\n/ignored.bin\n")
    with (folder / "campaign-2.tar.gz").open("wb") as archive:
        archive.truncate(CARRY_LIMIT_BYTES - 7000 - tree // 2)
    check_carry(folder)  # the folder alone fits
    with pytest.raises(KitError, match=r"with the working tree's 0\.0 MiB, over the device's"):
        check_carry(folder, tree)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_each_probe_call_s_limit_holds_the_probe_and_every_profile(gpu):
    """The H100 probe call (limit 300 s) ran the probe for 150 s and then two ncu profiles
    of up to 150 s each: the second could be cut off by the call's limit and lost."""
    import re

    from pipetune.workers.campaign.kit import PROBE_CALLS

    _, limit, command = PROBE_CALLS[gpu]
    script = (ROOT / "benchmarks" / "wgmma_probe.sh").read_text()
    env = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', command.split("bash ")[0]))
    probe = int(env["PROBE_SECONDS"])
    profiled = env.get("PROFILE", "1") == "1"
    operators = env.get("PROFILE_OPERATORS", '"MM_Square_4k"').strip('"').split()
    ncu_default = int(re.search(r"timeout \$\{NCU_SECONDS:-(\d+)\} ncu", script).group(1))
    ncu = int(env.get("NCU_SECONDS", ncu_default))
    install_margin = 30  # the kit's pip install, nvidia-smi and the shape listing
    worst = probe + (len(operators) * ncu if profiled else 0) + install_margin
    assert worst <= limit, f"{gpu}: up to {worst} s in a call limited to {limit} s"
