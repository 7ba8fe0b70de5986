"""`pipetune kernel ...` commands (kernel_app; the lead mounts it on the main CLI)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

import pipetune
from pipetune.clients.cli.kernel_cmds import kernel_app
from pipetune.workers.compile import check_arch, clear_memory, nvrtc_version

app = typer.Typer()
app.add_typer(kernel_app, name="kernel")
runner = CliRunner()

GEMM = ["gemm", "--m", "1024", "--n", "512", "--k", "256"]
KNOBS = {
    "block_row_warps": 2,
    "block_col_warps": 2,
    "warp_row_tiles": 2,
    "warp_col_tiles": 2,
    "chunk": 2,
    "smem_stages": 3,
    "reg_stages": 2,
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPETUNE_CACHE_DIR", str(tmp_path))
    clear_memory()


def test_source_prints_the_kernel():
    result = runner.invoke(app, ["kernel", "source", *GEMM, "--schedule", json.dumps(KNOBS)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("// pipetune generated kernel: variant gemm_kn")
    assert 'extern "C" __global__ void __launch_bounds__(128, 1)' in result.stdout
    assert "pipetune_gemm_kn_s_2_2_2_2_2_3_2(" in result.stdout


def test_source_for_a_conv():
    conv = ["conv2d", "--n", "2", "--h", "14", "--w", "14", "--c", "64", "--k", "64"]
    args = ["kernel", "source", *conv, "--r", "3", "--s", "3", "--pad", "1"]
    result = runner.invoke(app, [*args, "--schedule", json.dumps(KNOBS), "--gpu", "a100"])
    assert result.exit_code == 0, result.output
    assert "constexpr int CONV_DIMS = 2;" in result.stdout


def test_source_takes_the_schedule_ids_that_tables_and_exports_show():
    """`pipetune tasks`, `schedule` and export show schedules by id: given back to
    --schedule, one printed "not valid JSON"."""
    by_json = runner.invoke(app, ["kernel", "source", *GEMM, "--schedule", json.dumps(KNOBS)])
    schedule_id = "s-" + "-".join(str(v) for v in KNOBS.values())
    by_id = runner.invoke(app, ["kernel", "source", *GEMM, "--schedule", schedule_id])
    assert by_json.exit_code == 0 and by_id.exit_code == 0, by_id.output
    assert by_id.stdout == by_json.stdout
    hopper = ["kernel", "source", "hopper_gemm", "--m", "512", "--n", "512", "--k", "512"]
    result = runner.invoke(app, [*hopper, "--schedule", "wg128x256s3_p"])
    assert result.exit_code == 0, result.output
    assert "pipetune_gemm_kn_wg128x256s3_tma_st_p" in result.stdout


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ('{"chunk": 2', "--schedule: not valid JSON (Expecting ',' delimiter)"),
        # An id cut short said only what a JSON parser makes of it ("Expecting value").
        ("s-2-2-2", "--schedule: 's-2-2-2' is no schedule id of gemm's family (tensor_gemm;"),
        # A schedule id of another family's; an id of the family's with a value out of range.
        ("wg128x256s3_p", "--schedule: 'wg128x256s3_p' is a schedule of another kernel family"),
        ("s-2-2-2-2-3-3-2", "--schedule: chunk must be one of [1, 2, 4, 8], got 3"),
        ("[" * 50_000 + "]" * 50_000, "--schedule: not valid JSON (nested too deeply)"),
        # What is wrong with the object names the option that held it (it did not).
        ("[1, 2]", "--schedule: a schedule must be an object"),
        (json.dumps({**KNOBS, "chunk": 3}), "--schedule: chunk must be one of [1, 2, 4, 8], got 3"),
        (json.dumps({k: v for k, v in KNOBS.items() if k != "reg_stages"}),
         "--schedule: missing knob"),
        (json.dumps({**KNOBS, "unroll": 2}), "--schedule: unknown knob(s): unroll"),
        # A knob given twice kept the last value without a word.
        (json.dumps(KNOBS)[:-1] + ', "chunk": 1}', '--schedule: the knob "chunk" is given twice'),
        # 16 warps of 16x16 tiles: A's and B's 64x16 tiles are 128 16-byte chunks each,
        # which 512 threads cannot share evenly.
        (
            json.dumps({**KNOBS, "block_row_warps": 4, "block_col_warps": 4,
                        "warp_row_tiles": 1, "warp_col_tiles": 1, "chunk": 1}),
            "--schedule: s-4-4-1-1-1-3-2 is outside the valid space of gemm 1024x512x256 on h100: "
            "tile loads not divisible by the threads",
        ),
    ],
)  # fmt: skip
def test_source_rejects_bad_schedules_with_exit_2(schedule, message):
    result = runner.invoke(app, ["kernel", "source", *GEMM, "--schedule", schedule])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_source_rejects_bad_workloads_and_gpus():
    bad_k = ["gemm", "--m", "64", "--n", "64", "--k", "60", "--schedule", json.dumps(KNOBS)]
    result = runner.invoke(app, ["kernel", "source", *bad_k])
    assert result.exit_code == 2 and "multiple of 8" in result.stderr
    args = ["kernel", "source", *GEMM, "--schedule", json.dumps(KNOBS), "--gpu", "v100"]
    assert runner.invoke(app, args).exit_code == 2


def test_compile_json_reports_each_sampled_schedule():
    args = ["kernel", "compile", *GEMM, "--arch", "sm_80", "--sample", "6", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["arch"] == "sm_80" and doc["sampled"] == 6 == len(doc["results"])
    assert doc["space_size"] >= 6
    for row in doc["results"]:
        assert row["ok"] is True
        assert set(row["schedule"]) == set(KNOBS)
        assert 0 < row["registers"] <= 255 and row["spills"] == 0
        assert row["compile_ms"] > 0 and row["smem_bytes"] > 0
    stages = {row["schedule"]["reg_stages"] for row in doc["results"]}
    assert stages == {1, 2}


def test_compile_defaults_to_the_gpu_arch_and_prints_a_table():
    bmm = ["bmm", "--b", "4", "--m", "256", "--n", "256", "--k", "128"]
    result = runner.invoke(app, ["kernel", "compile", *bmm, "--gpu", "a100", "--sample", "2"])
    assert result.exit_code == 0, result.output
    assert "sm_80" in result.stdout and "0 schedule(s) spill registers" in result.stdout


@pytest.mark.parametrize(
    "extra",
    [
        ["--arch", "sm90"],
        ["--arch", "compute_90"],
        ["--arch", "sm_99"],  # (an NvrtcError "invalid option" and exit 1, after the work)
        ["--arch", ""],  # (taken as "the GPU's own", which it does not say)
        ["--sample", "0"],
        ["--gpu", "x"],
        ["--seed", "-1"],  # (numpy's "expected non-negative integer", exit 1)
    ],
)
def test_compile_rejects_bad_options_with_exit_2(extra):
    result = runner.invoke(app, ["kernel", "compile", *GEMM, *extra, "--json"])
    assert result.exit_code == 2
    assert result.stdout == "" and result.stderr.startswith("error: ")


def test_an_arch_specific_family_compiled_for_another_arch_is_refused():
    """The Hopper family's wgmma kernels for sm_80 all failed to compile, exit 1."""
    shape = ["hopper_gemm", "--m", "1024", "--n", "768", "--k", "3072", "--gpu", "h100"]
    result = runner.invoke(app, ["kernel", "compile", *shape, "--arch", "sm_80", "--sample", "1"])
    assert result.exit_code == 2
    assert "--arch: hopper_gemm kernels use sm_90a-only instructions on h100" in result.stderr


@pytest.mark.parametrize("arch", [[], ["--arch", "sm_90"]])
def test_an_arch_specific_familys_compile_names_the_target_it_built_for(arch):
    """The wgmma kernels are built for sm_90a, but the document and the table said sm_90."""
    shape = ["hopper_gemm", "--m", "1024", "--n", "768", "--k", "3072", "--gpu", "h100"]
    args = ["kernel", "compile", *shape, *arch, "--sample", "1", "--workers", "1"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["arch"] == "sm_90a"
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "schedules, sm_90a" in table.stdout


@pytest.mark.parametrize(
    "shape",
    [
        ["gemm", "--m", "1024", "--n", "64", "--k", "2048"],
        ["softmax", "--rows", "1024", "--cols", "768"],
    ],
)
def test_a_target_older_than_sm_80_is_refused_before_compiling(shape):
    """Every tensor-core kernel, and every memops kernel storing float16 vectors, failed to
    compile one by one (ptxas: cp.async requires sm_80), exit 1."""
    args = ["kernel", "compile", *shape, "--arch", "sm_75", "--sample", "4", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "error: --arch: pipetune's kernels need sm_80 or newer (cp.async, mma.sync m16n8k16, "
        "cvt.rn.f16x2.f32), not sm_75"
    )


@pytest.mark.parametrize(("arch", "kind"), [("sm_80a", "arch"), ("sm_90f", "family")])
def test_an_arch_or_family_target_nvrtc_does_not_have_is_refused_before_compiling(arch, kind):
    """sm_80a and sm_90f passed the arch check (an SM number NVRTC knows, a suffix) and every
    schedule failed to compile on its own ("invalid or no value specified with --nv_arch
    flag"), exit 1; sm_90a and sm_100f are targets NVRTC has."""
    args = ["kernel", "compile", *GEMM, "--arch", arch, "--sample", "2", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    major_minor = ".".join(map(str, nvrtc_version()))
    assert result.stderr.strip() == (
        f"error: --arch: NVRTC {major_minor} has no {kind}-specific target {arch}; use {arch[:-1]}"
    )
    with pytest.raises(pipetune.InvalidArgumentError) as info:
        check_arch(arch)
    assert info.value.argument == "arch"
    for good in ("sm_90a", "sm_100f"):
        assert check_arch(good) == good


# ---- without a shape: the kernel takes its shape as arguments -------------------------


def test_source_without_a_shape_prints_the_variants_kernel():
    result = runner.invoke(app, ["kernel", "source", "gemm", "--schedule", json.dumps(KNOBS)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("// pipetune generated kernel: variant gemm_kn")
    nk = ["kernel", "source", "gemm", "--b-layout", "nk", "--schedule", json.dumps(KNOBS)]
    result = runner.invoke(app, nk)
    assert result.exit_code == 0 and "pipetune_gemm_nk_s_2_2_2_2_2_3_2(" in result.stdout
    result = runner.invoke(app, ["kernel", "source", "conv3d", "--schedule", json.dumps(KNOBS)])
    assert result.exit_code == 0 and "constexpr int CONV_DIMS = 3;" in result.stdout


def test_source_without_a_shape_still_checks_the_gpu_rules():
    sixteen_warps = {**KNOBS, "block_row_warps": 4, "block_col_warps": 4,
                     "warp_row_tiles": 1, "warp_col_tiles": 1, "chunk": 1}  # fmt: skip
    args = ["kernel", "source", "bmm", "--schedule", json.dumps(sixteen_warps)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "error: --schedule: s-4-4-1-1-1-3-2 is outside the valid space of bmm kernels (any "
        "shape) on h100: tile loads not divisible by the threads"
    )


@pytest.mark.parametrize(
    ("command", "message"),
    [
        # Without a shape these options were dropped unchecked: float16 kernels compiled for
        # --dtype float32, and a stride of 0 passed.
        (["source", "gemm", "--dtype", "float32", "--schedule", json.dumps(KNOBS)],
         "error: dtype: unsupported dtype 'float32': pipetune's tensor-core kernels take "
         "float16 or bfloat16 inputs"),
        (["compile", "conv2d", "--dtype", "int8", "--sample", "1"],
         "error: dtype: unsupported dtype 'int8': pipetune's tensor-core kernels take "
         "float16 or bfloat16 inputs"),
        (["compile", "conv2d", "--stride", "0", "--sample", "1"],
         "error: stride: Input should be greater than or equal to 1 (got 0)"),
        (["source", "conv3d", "--pad", "65", "--schedule", json.dumps(KNOBS)],
         "error: pad: Input should be less than or equal to 64 (got 65)"),
    ],
)  # fmt: skip
def test_options_given_without_a_shape_are_checked_not_dropped(command, message):
    result = runner.invoke(app, ["kernel", *command])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == message


def test_argument_options_without_a_shape_need_no_cross_field_rule():
    # pad 5 and stride 3 are arguments of any conv kernel: the unconstrained shape's 3x3
    # filter (which pad must be under) is not the caller's, so it does not refuse them.
    args = ["kernel", "source", "conv2d", "--pad", "5", "--stride", "3"]
    result = runner.invoke(app, [*args, "--schedule", json.dumps(KNOBS)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("op", ["softmax", "hopper_gemm"])
def test_compile_help_does_not_promise_a_shapeless_compile_where_a_shape_is_needed(op):
    # The help said "(of every shape when none is given)" for every operator, and the
    # command then refused these without a shape.
    helptext = " ".join(runner.invoke(app, ["kernel", "compile", op, "--help"]).stdout.split())
    assert "of every shape when none is given" not in helptext
    optional = "gemm, gemm_swiglu, gemm_bias_gelu, bmm, conv2d, conv3d"
    assert f"the shape is optional for {optional}: without one" in helptext
    result = runner.invoke(app, ["kernel", "compile", op, "--sample", "1"])
    assert result.exit_code == 2 and "give the shape" in result.stderr


@pytest.mark.parametrize(
    ("op", "options", "variant"),
    [
        ("gemm_swiglu", [], "gemm_swiglu_kn"),
        ("gemm_bias_gelu", ["--approximate", "tanh", "--b-layout", "nk"], "gemm_bias_gelu_nk"),
    ],
)
def test_the_fused_gemms_print_a_source_without_a_shape(op, options, variant):
    """The help promised a shapeless source for the whole GEMM family; the fused GEMMs asked
    for their shape (and an --approximate without a shape was a TypeError)."""
    args = ["kernel", "source", op, *options, "--schedule", json.dumps(KNOBS)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"// pipetune generated kernel: variant {variant}, ")
    bad = runner.invoke(app, ["kernel", "source", op, "--approximate", "x"])
    assert bad.exit_code == 2


def test_part_of_a_shape_is_refused_naming_what_is_missing():
    args = ["kernel", "source", "gemm", "--m", "64", "--schedule", json.dumps(KNOBS)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --n, --k: give the whole shape or none of it"
    result = runner.invoke(app, ["kernel", "compile", "conv2d", "--n", "2", "--json"])
    assert result.exit_code == 2 and "--h, --w, --c, --k, --r, --s:" in result.stderr


def test_compile_without_a_shape_samples_every_schedule_valid_on_the_gpu():
    from pipetune.model.hardware import get_gpu
    from pipetune.model.space import Space
    from pipetune.workers.codegen.sample import unconstrained_workload

    args = ["kernel", "compile", "gemm", "--arch", "sm_90", "--sample", "4", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"] is None and doc["variant"] == "gemm_kn"
    space = Space.enumerate(unconstrained_workload("gemm"), get_gpu("h100"))
    assert doc["space_size"] == len(space) and doc["space_workload"]["op"] == "gemm"
    assert doc["sampled"] == 4 == len(doc["results"])
    for row in doc["results"]:
        assert row["ok"] is True and row["spills"] == 0
        assert row["kernel"].startswith("pipetune_gemm_kn_")
    table = runner.invoke(app, ["kernel", "compile", "conv2d", "--sample", "1"])
    assert table.exit_code == 0, table.output
    assert "conv2d kernels (any shape; valid on h100): 1 of" in " ".join(table.stdout.split())


@pytest.mark.parametrize(
    ("command", "knobs"),
    [
        (GEMM, KNOBS),
        (
            ["softmax", "--rows", "4", "--cols", "32768"],
            {"threads_per_row": 32, "rows_per_block": 1, "blocks_per_row": 16, "vector_width": 8,
             "row_cache": 2, "split_mode": 1, "max_waves": 1},
        ),
    ],
    ids=["gemm", "softmax"],
)  # fmt: skip
def test_source_launch_prints_the_launch_document_of_any_schedule(command, knobs):
    """How to launch a schedule without tuning it first: only `pipetune export` (tuned
    workloads) and the Python API gave the grid, shared memory, argument order and notes."""
    import pipetune

    args = ["kernel", "source", *command, "--schedule", json.dumps(knobs), "--launch"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    shape = dict(zip(command[1::2], command[2::2], strict=True))
    workload = {"op": command[0], **{k.lstrip("-"): int(v) for k, v in shape.items()}}
    expected = pipetune.kernel(workload, "h100", knobs).launch_document()
    assert doc == json.loads(json.dumps(expected))
    assert doc["schedule"] == knobs and doc["schedule_origin"] == "given"
    assert doc["grid"] and doc["arguments"] and doc["notes"]


def test_source_launch_needs_the_shape():
    result = runner.invoke(
        app, ["kernel", "source", "gemm", "--schedule", json.dumps(KNOBS), "--launch"]
    )
    assert result.exit_code == 2
    assert "--launch: give the shape" in result.output


def test_a_categorical_knob_refused_says_what_each_code_means():
    """architecture.md names row_cache's values global, smem, registers; a schedule that
    said "registers" was told only "must be one of [0, 1, 2]"."""
    from pipetune.model.knobs import knob_value_problems
    from pipetune.model.memops.space import KNOBS as MEMOPS_KNOBS

    row_cache = next(k for k in MEMOPS_KNOBS if k.name == "row_cache")
    (problem,) = knob_value_problems([row_cache], {"row_cache": "registers"})
    codes = "0 (global), 1 (smem), 2 (registers)"
    assert problem == f"row_cache must be one of {codes}, got 'registers'"
