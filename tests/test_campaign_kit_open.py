"""`make gpu-kit`'s calls measure only what the committed data lacks: a convolution or a suite
operator whose committed sweep is missing, or measured by an older revision of its kernel
generator, is offered by name, and the operators committed and current are not measured
again (a lent GPU has 15 minutes a session)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from pipetune.workers.campaign.kit import (
    DeviceCall,
    KitError,
    attention_device_command,
    conv_device_command,
    llama_device_command,
    open_calls,
    resweep_convolutions,
    suite_option,
)
from pipetune.workers.campaign.operators import resolve_operators, suite_in_order

COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200"


def _as_measured_before_its_loader_changed(path: Path) -> None:
    """Rewrite a committed sweep as the kernels before the generator's current revision made
    it: its records without a generator revision (revision 1, as the H100's convolutions)."""
    document = json.loads(gzip.decompress(path.read_bytes()))
    for record in document["results"]:
        record["measurements"] = [
            m for m in record["measurements"] if m["name"] != "generator_revision"
        ]
    path.write_bytes(gzip.compress(json.dumps(document).encode()))


def _operators_of(call: DeviceCall) -> list[str]:
    value = call.command.split("--operators ", 1)[1].split(" ", 1)[0]
    return list(resolve_operators(value))


def _h200_data(tmp_path: Path) -> Path:
    """A complete H200 campaign with the current convolutions (the committed ones) and every
    suite operator committed (empty stand-ins: their generators are at their first
    revision, so a stand-in is never read)."""
    data = tmp_path / "data"
    folder = data / "h200"
    (folder / "campaign").mkdir(parents=True)
    (folder / "campaign" / "campaign.json").write_text('{"state": "complete"}')
    (data / "hopper" / "h200" / "campaign").mkdir(parents=True)
    (data / "hopper" / "h200" / "campaign" / "campaign.json").write_text('{"state": "complete"}')
    for op in resweep_convolutions():
        shutil.copy(COMMITTED / f"{op}.t4.json.gz", folder)
    for suite in ("llama", "swiglu", "bf16", "bias_gelu", "hopper_fused", "attention"):
        for op in suite_in_order(suite):
            where = data / "hopper" / "h200" if op.startswith("WG_") else folder
            (where / f"{op}.t4.json.gz").write_bytes(b"")
    return data


def _campaign_calls(data: Path) -> list[DeviceCall]:
    return [c for c in open_calls("h200", data) if " campaign --operators " in c.command]


def test_one_stale_and_one_missing_convolution_are_all_the_call_measures(tmp_path):
    data = _h200_data(tmp_path)
    assert _campaign_calls(data) == []  # everything committed and current: nothing offered
    (data / "h200" / "Conv3D_2.t4.json.gz").unlink()
    _as_measured_before_its_loader_changed(data / "h200" / "Conv2D_RN50_3.t4.json.gz")
    (call,) = _campaign_calls(data)
    assert _operators_of(call) == ["Conv2D_RN50_3", "Conv3D_2"]
    assert call.command == conv_device_command(operators=["Conv3D_2", "Conv2D_RN50_3"])
    assert "Conv2D_RN50_3, Conv3D_2 only: the other 6 are committed and current" in call.heading
    assert call.timeout_s == 600


def test_a_suite_missing_one_operator_is_offered_that_operator_alone(tmp_path):
    data = _h200_data(tmp_path)
    llama = list(suite_in_order("llama"))
    (data / "h200" / f"{llama[3]}.t4.json.gz").unlink()
    # The attention suite's wgmma operator lies in the Hopper family's folder.
    (data / "hopper" / "h200" / "WG_BMM_GPT2_QK_NK.t4.json.gz").unlink()
    calls = _campaign_calls(data)
    assert [_operators_of(c) for c in calls] == [[llama[3]], ["WG_BMM_GPT2_QK_NK"]]
    assert calls[0].command == llama_device_command(operators=[llama[3]])
    assert calls[1].command == attention_device_command(operators=["WG_BMM_GPT2_QK_NK"])
    assert [c.timeout_s for c in calls] == [300, 300]
    # A suite with nothing committed is still named whole, as README gives its call.
    for op in llama:
        (data / "h200" / f"{op}.t4.json.gz").unlink(missing_ok=True)
    assert _campaign_calls(data)[0].command == llama_device_command()
    assert " --operators llama " in llama_device_command()


def test_the_operators_option_keeps_the_suite_s_order_and_refuses_a_stranger():
    swiglu = list(suite_in_order("swiglu"))
    assert suite_option("swiglu") == "swiglu"
    assert suite_option("swiglu", swiglu[::-1]) == "swiglu"
    assert suite_option("swiglu", [swiglu[1]]) == swiglu[1]
    with pytest.raises(KitError, match="MM_RN50_FC: not among"):
        suite_option("swiglu", ["MM_RN50_FC"])
