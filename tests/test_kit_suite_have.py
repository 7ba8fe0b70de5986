"""`make gpu-kit`'s suite calls go on from the parts an earlier call left of an unfinished
operator and `campaign unpack` kept in the committed data (<gpu>/campaign/parts/, the Hopper
family's under hopper/<gpu>/), as a campaign continued with `--have` does: the call copies
them into its out-dir and is given that folder as its --have, so the sweeps measure only the
parts that are not there (the kit's suite calls measured every part again)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

from pipetune.workers.campaign import layout
from pipetune.workers.campaign.kit import (
    DeviceCall,
    install_line,
    llama_device_command,
    open_calls,
    resweep_convolutions,
)
from pipetune.workers.campaign.operators import suite_in_order
from pipetune.workers.campaign.run import Campaign, CampaignOptions, check_options

COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200"
SUITES = ("llama", "swiglu", "bf16", "bias_gelu", "hopper_fused", "attention")
LLAMA = list(suite_in_order("llama"))
UNFINISHED = LLAMA[2]


def _data(tmp_path: Path) -> Path:
    """An H200 whose campaigns are complete and every suite operator committed (empty
    stand-ins: their generators are at their first revision, so a stand-in is never read);
    no convolution is committed (a convolution call is offered, and nothing read for it)."""
    data = tmp_path / "data"
    for folder in (data / "h200", data / "hopper" / "h200"):
        (folder / "campaign").mkdir(parents=True)
        (folder / "campaign" / "campaign.json").write_text('{"state": "complete"}')
    for suite in SUITES:
        for op in suite_in_order(suite):
            where = data / "hopper" / "h200" if op.startswith("WG_") else data / "h200"
            (where / f"{op}.t4.json.gz").write_bytes(b"")
    return data


def _keep_parts(folder: Path, op: str, count: int) -> list[Path]:
    """Parts of ``op`` as `campaign unpack` keeps them (stand-ins)."""
    parts = folder / layout.UNPACKED_PARTS
    parts.mkdir(parents=True, exist_ok=True)
    paths = [parts / f"{op}.part{k:03d}.t4.json.gz" for k in range(count)]
    for path in paths:
        path.write_bytes(b"")
    return paths


def _call_of(data: Path, operator: str) -> DeviceCall:
    (call,) = [c for c in open_calls("h200", data) if f" --operators {operator} " in c.command]
    return call


def _prepare(command: str, cwd: Path) -> None:
    """The shell the call runs before it installs the kit (where it lays out its out-dir)."""
    before = command.split(install_line(), 1)[0]
    done = subprocess.run(["bash", "-c", before + "true"], cwd=cwd, capture_output=True)
    assert done.returncode == 0, done.stderr


def test_a_suite_call_goes_on_from_the_kept_parts_of_its_unfinished_operator(tmp_path):
    data = _data(tmp_path)
    (data / "h200" / f"{UNFINISHED}.t4.json.gz").unlink()
    kept = _keep_parts(data / "h200", UNFINISHED, 2)
    _keep_parts(data / "h200", LLAMA[0], 1)  # of an operator committed since: not a checkpoint
    call = _call_of(data, UNFINISHED)
    assert f"going on from the parts of {UNFINISHED} kept in the data" in call.heading
    assert " --gpu h200 --have .campaign-l " in call.command  # its out-dir, parts laid in

    work = tmp_path / "device"
    work.mkdir()
    (work / ".campaign-l").mkdir()
    (work / ".campaign-l" / "left-by-an-earlier-try").write_text("")  # removed first
    _prepare(call.command, work)
    out = work / ".campaign-l"
    assert sorted(p.name for p in (out / "sweeps").iterdir()) == [p.name for p in kept]
    assert sorted(p.name for p in out.iterdir()) == ["sweeps"]

    # The campaign takes its out-dir as its --have, and its sweeps find the parts there.
    options = CampaignOptions(
        out_dir=out, have=out, operators=UNFINISHED, runner="simulated", gpu="h200"
    )
    check_options(options)
    campaign = Campaign(options, log=lambda line: None)
    campaign.open_have(tmp_path / "scratch")
    campaign.adopt()
    assert sorted(layout.parts_present(out, UNFINISHED)) == [0, 1]


def test_a_suite_call_without_kept_parts_starts_its_operators_afresh(tmp_path):
    data = _data(tmp_path)
    (data / "h200" / f"{UNFINISHED}.t4.json.gz").unlink()
    call = _call_of(data, UNFINISHED)
    assert call.command == llama_device_command(operators=[UNFINISHED])
    assert "--have" not in call.command and "going on" not in call.heading


def test_the_wgmma_operator_s_parts_are_kept_in_the_hopper_family_s_folder(tmp_path):
    data = _data(tmp_path)
    op = "WG_BMM_GPT2_QK_NK"
    (data / "hopper" / "h200" / f"{op}.t4.json.gz").unlink()
    (kept,) = _keep_parts(data / "hopper" / "h200", op, 1)
    call = _call_of(data, op)
    assert " --gpu h200 --have .campaign-at " in call.command
    work = tmp_path / "device"
    work.mkdir()
    _prepare(call.command, work)
    assert [p.name for p in (work / ".campaign-at" / "sweeps").iterdir()] == [kept.name]


def _as_an_older_revision(path: Path) -> None:
    """The records of a sweep as the kernels before their generator's current revision made
    them (no generator revision: revision 1, as the H100's convolutions)."""
    document = json.loads(gzip.decompress(path.read_bytes()))
    for record in document["results"]:
        record["measurements"] = [
            m for m in record["measurements"] if m["name"] != "generator_revision"
        ]
    path.write_bytes(gzip.compress(json.dumps(document).encode()))


def test_parts_of_an_older_generator_revision_are_measured_again(tmp_path):
    data = _data(tmp_path)
    op = "Conv3D_2"
    assert op in resweep_convolutions()
    (part,) = _keep_parts(data / "h200", op, 1)
    shutil.copy(COMMITTED / f"{op}.t4.json.gz", part)  # (the current loader's records)
    call = _call_of(data, ",".join(resweep_convolutions()))
    assert " --gpu h200 --have .campaign-c " in call.command
    assert f"going on from the parts of {op} kept in the data" in call.heading
    _as_an_older_revision(part)
    call = _call_of(data, ",".join(resweep_convolutions()))
    assert "--have" not in call.command  # merged, it would leave the sweep stale again
