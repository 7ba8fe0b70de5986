"""`pipetune model ...` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app

runner = CliRunner()


def test_rank_json_document():
    result = runner.invoke(
        app,
        [
            "model",
            "rank",
            "gemm",
            "--m",
            "1024",
            "--n",
            "64",
            "--k",
            "2048",
            "--gpu",
            "h100",
            "--top",
            "10",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"] == {
        "op": "gemm",
        "m": 1024,
        "n": 64,
        "k": 2048,
        "dtype": "float16",
        "b_layout": "kn",
    }
    assert doc["gpu"] == "h100"
    assert len(doc["schedules"]) == 10
    first = doc["schedules"][0]
    assert set(first["schedule"]) >= {"smem_stages", "reg_stages", "chunk"}
    assert first["bottleneck"] in ("load", "use")
    latencies = [s["predicted_us"] for s in doc["schedules"]]
    assert latencies == sorted(latencies)


def test_top_larger_than_space_returns_the_whole_space():
    args = [
        "model",
        "rank",
        "bmm",
        "--b",
        "12",
        "--m",
        "512",
        "--n",
        "512",
        "--k",
        "64",
        "--top",
        "100000",
        "--json",
    ]
    doc = json.loads(runner.invoke(app, args).stdout)
    assert len(doc["schedules"]) == doc["space_size"]


def test_conv_commands_take_their_own_options():
    args = [
        "model",
        "rank",
        "conv3d",
        "--n",
        "8",
        "--d",
        "4",
        "--h",
        "14",
        "--w",
        "14",
        "--c",
        "256",
        "--k",
        "256",
        "--t",
        "3",
        "--r",
        "3",
        "--s",
        "3",
        "--pad",
        "1",
        "--top",
        "3",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "conv3d" in result.stdout


def test_bad_size_exits_2_with_one_line():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pipetune.clients.cli.main import run; run()",
            "model",
            "rank",
            "gemm",
            "--m",
            "-5",
            "--n",
            "64",
            "--k",
            "2048",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: m: Input should be greater than or equal to 1 (got -5)"]


def test_unknown_gpu_and_bad_top_exit_2():
    base = ["model", "rank", "gemm", "--m", "64", "--n", "64", "--k", "64"]
    unknown = runner.invoke(app, [*base, "--gpu", "v100"])
    # The line names the option, as every other usage error does.
    assert unknown.exit_code == 2 and "error: --gpu: unknown GPU 'v100'" in unknown.stderr
    assert runner.invoke(app, [*base, "--top", "0"]).exit_code == 2
    assert runner.invoke(app, [*base[:-2]]).exit_code == 2  # --k missing


def test_suite_reports_every_operator():
    result = runner.invoke(app, ["model", "suite", "alcop", "--gpu", "a100", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    names = [row["operator"] for row in doc["operators"]]
    assert "MM_RN50_FC" in names and "Conv3D_1" in names
    assert all(row["pipelining_speedup"] >= 1.0 for row in doc["operators"])
    assert runner.invoke(app, ["model", "suite", "nope"]).exit_code == 2


def test_gpus_lists_the_registry():
    doc = json.loads(runner.invoke(app, ["model", "gpus", "--json"]).stdout)
    assert {g["key"] for g in doc["gpus"]} >= {"a100", "h100", "h200"}


HOPPER_FC2 = ["--m", "1024", "--n", "768", "--k", "3072"]


def test_rank_a_hopper_gemm_in_its_familys_terms():
    args = ["model", "rank", "hopper_gemm", *HOPPER_FC2, "--gpu", "h100", "--top", "5"]
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["family"] == "hopper_gemm" and len(doc["schedules"]) == 5
    assert set(doc["schedules"][0]["schedule"]) == {"tile_m", "tile_n", "stages", "tile_loop"}
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    first = doc["schedules"][0]["schedule"]
    label = f"{first['tile_m']}x{first['tile_n']} s{first['stages']}"
    assert label in table.output and "TFLOP/s" in table.output
    # Its JSON says the TFLOP/s its table shows, as the mma.sync family's does.
    best = doc["schedules"][0]
    flops = 2 * 1024 * 768 * 3072
    assert best["predicted_tflops"] == pytest.approx(flops / best["predicted_us"] / 1e6)
    assert f"{best['predicted_tflops']:.1f}" in table.output


@pytest.mark.parametrize(
    ("args", "unit"),
    [
        (["gemm", "--m", "1", "--n", "8", "--k", "8"], "predicted_tflops"),
        (["softmax", "--rows", "1", "--cols", "8"], "predicted_gbs"),
        (["hopper_gemm", "--m", "1", "--n", "8", "--k", "8"], "predicted_tflops"),
    ],
)
def test_rank_tables_show_a_tiny_throughput_with_two_significant_digits(args, unit):
    """A 1x8x8 GEMM's TFLOP/s and a 1x8 softmax's GB/s read "0.0" and "0": every other
    command shows two significant digits where the unit's decimals would show 0."""
    rank = ["model", "rank", *args, "--gpu", "h100", "--top", "1"]
    doc = json.loads(runner.invoke(app, [*rank, "--json"]).stdout)
    value = doc["schedules"][0][unit]
    assert 0 < value < 0.05
    table = runner.invoke(app, rank)
    assert table.exit_code == 0, table.output
    assert f"{value:.2g}" in table.output, table.output


def test_a_hopper_shape_on_an_a100_exits_2_saying_why():
    for args in (
        ["model", "rank", "hopper_gemm", *HOPPER_FC2, "--gpu", "a100"],
        ["model", "suite", "hopper", "--gpu", "a100"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "needs a Hopper GPU" in result.output and "Traceback" not in result.output


def test_the_hopper_suite_reports_every_operator():
    result = runner.invoke(app, ["model", "suite", "hopper", "--gpu", "h200", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc["operators"]) == 15
    assert {row["family"] for row in doc["operators"]} == {"hopper_gemm"}
    assert all(row["baseline"] == "one block per tile" for row in doc["operators"])
    table = runner.invoke(app, ["model", "suite", "hopper", "--gpu", "h200"])
    assert table.exit_code == 0 and "WG_BMM_GPT2_QK" in table.output


def test_a_json_document_into_a_closed_pipe_ends_without_a_word():
    """`pipetune model gpus --json | true`: the reader is gone before the document is written.
    It printed "error: BrokenPipeError: [Errno 32] Broken pipe (set PIPETUNE_DEBUG=1 ...)"."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe fails with EPIPE
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from pipetune.clients.cli.main import run; run()",
                "model",
                "gpus",
                "--json",
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 1
    assert proc.stderr == ""


def test_rank_takes_attention_s_softmax_and_refuses_a_mask_it_cannot_have():
    base = ["model", "rank", "softmax", "--rows", "12288", "--cols", "1024", "--gpu", "h100"]
    result = runner.invoke(app, [*base, "--scale", "0.125", "--causal", "--queries", "8", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"] == {"op": "softmax", "rows": 12288, "cols": 1024, "dtype": "float16",
                               "scale": 0.125, "causal": True, "queries": 8}  # fmt: skip
    plain = json.loads(runner.invoke(app, [*base, "--json"]).stdout)
    # The mask hides part of each row, which the kernels do not read: less to move.
    assert doc["schedules"][0]["predicted_us"] < plain["schedules"][0]["predicted_us"]
    for extra, message in (
        (["--queries", "8"], "error: queries: is the causal mask's query length: set causal too"),
        (["--causal", "--queries", "5"], "error: queries: must divide rows (12288), got 5"),
        (["--scale", "0"], "error: scale: Input should be greater than 0 (got 0.0)"),
    ):
        bad = runner.invoke(app, [*base, *extra])
        assert bad.exit_code == 2 and bad.stderr.startswith(message), bad.output
