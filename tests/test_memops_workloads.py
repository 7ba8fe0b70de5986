"""The memory-intensive operators: validation names the bad field, sizes and bytes."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from pipetune.model.memops.workloads import (
    BiasGelu,
    LayerNorm,
    Reduce,
    RMSNorm,
    SiluMul,
    Softmax,
    bias_gelu,
    layernorm,
    op_key,
    parse_mem_workload,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.model.workloads import WorkloadError


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"op": "softmax", "rows": 4096, "cols": 770}, "cols", "multiple of 8"),
        ({"op": "softmax", "rows": 4096, "cols": 4}, "cols", "greater than or equal to 8"),
        ({"op": "softmax", "rows": 4096, "cols": (1 << 20) + 8}, "cols", "less than or equal"),
        ({"op": "layernorm", "rows": 0, "cols": 768}, "rows", "greater than or equal to 1"),
        ({"op": "reduce", "rows": (1 << 24) + 1, "cols": 8}, "rows", "less than or equal"),
        ({"op": "softmax", "rows": 1 << 22, "cols": 1024}, "rows", "2^31-1"),
        ({"op": "softmax", "rows": 4096.0, "cols": 768}, "rows", "valid integer"),
        ({"op": "softmax", "rows": "4096", "cols": 768}, "rows", "valid integer"),
        ({"op": "softmax", "rows": True, "cols": 768}, "rows", "valid integer"),
        ({"op": "softmax", "cols": 768}, "rows", "required"),
        ({"op": "reduce", "rows": 8, "cols": 8, "reduction": "mean"}, "reduction", "'sum'"),
        ({"op": "layernorm", "rows": 8, "cols": 8, "eps": 0.0}, "eps", "greater than 0"),
        ({"op": "layernorm", "rows": 8, "cols": 8, "eps": float("nan")}, "eps", "finite number"),
        ({"op": "layernorm", "rows": 8, "cols": 8, "eps": float("inf")}, "eps", "finite number"),
        # 0 in the kernels' float32, though labelled eps=1e-300
        ({"op": "layernorm", "rows": 8, "cols": 8, "eps": 1e-300}, "eps", "smallest normal"),
        ({"op": "layernorm", "rows": 8, "cols": 8, "eps": 1e-39}, "eps", "smallest normal"),
        ({"op": "rmsnorm", "rows": 8, "cols": 8, "eps": 0.0}, "eps", "greater than 0"),
        ({"op": "rmsnorm", "rows": 8, "cols": 8, "eps": 1e-39}, "eps", "smallest normal"),
        ({"op": "rmsnorm", "rows": 8, "cols": 12}, "cols", "multiple of 8"),
        # inf and 0 in the kernels' float32, though labelled scale=1e+308 and scale=1e-300
        ({"op": "softmax", "rows": 8, "cols": 8, "scale": 1e308}, "scale", "float32's normal"),
        ({"op": "softmax", "rows": 8, "cols": 8, "scale": 3.5e38}, "scale", "float32's normal"),
        ({"op": "softmax", "rows": 8, "cols": 8, "scale": 1e-300}, "scale", "float32's normal"),
        ({"op": "softmax", "rows": 8, "cols": 8, "scale": 5e-324}, "scale", "float32's normal"),
        ({"op": "softmax", "rows": 8, "cols": 8, "scale": 0.0}, "scale", "greater than 0"),
        ({"op": "rmsnorm", "rows": 8, "cols": 8, "beta": 0.5}, "beta", "Extra inputs"),
        # x holds gate and up side by side: twice the elements of the output
        ({"op": "silu_mul", "rows": 1 << 17, "cols": 1 << 14}, "rows", "rows x 2 x cols"),
        ({"op": "silu_mul", "rows": 8, "cols": 20}, "cols", "multiple of 8"),
        ({"op": "bias_gelu", "rows": 8, "cols": 8, "approximate": "x"}, "approximate", "tanh"),
        ({"op": "softmax", "rows": 8, "cols": 8, "axis": 0}, "axis", "Extra inputs"),
        ({"op": "softmax", "rows": 8, "cols": 8, "dtype": "float32"}, "dtype", "float16"),
        ({"op": "mean", "rows": 8, "cols": 8}, "op", "unknown operator"),
        ({"op": ["softmax"], "rows": 8, "cols": 8}, "op", "unknown operator"),
    ],
)
def test_bad_input_names_the_field(data, field, words):
    with pytest.raises(WorkloadError) as info:
        parse_mem_workload(data)
    assert info.value.field == field
    assert words in info.value.reason


def test_not_a_dict():
    with pytest.raises(WorkloadError) as info:
        parse_mem_workload(["softmax"])  # type: ignore[arg-type]
    assert info.value.field == "workload"


def test_the_ops_their_types_and_keys():
    assert isinstance(reduce(4, 8), Reduce) and op_key(reduce(4, 8)) == "reduce-sum"
    assert op_key(reduce(4, 8, "max")) == "reduce-max"
    assert isinstance(softmax(4, 8), Softmax) and op_key(softmax(4, 8)) == "softmax"
    assert isinstance(layernorm(4, 8), LayerNorm) and layernorm(4, 8).eps == 1e-5
    assert isinstance(bias_gelu(4, 8), BiasGelu) and bias_gelu(4, 8).approximate == "none"
    assert isinstance(rmsnorm(4, 8), RMSNorm) and op_key(rmsnorm(4, 8)) == "rmsnorm"
    assert rmsnorm(4, 8).eps == 1e-5 and rmsnorm(4, 8).has_output_pass
    assert isinstance(silu_mul(4, 8), SiluMul) and op_key(silu_mul(4, 8)) == "silu_mul"
    assert not silu_mul(4, 8).has_reduction and not silu_mul(4, 8).has_output_pass
    assert silu_mul(1 << 16, (1 << 14) - 8).row_inputs == 2  # under 2^31 elements of x


def test_bytes_moved_with_perfect_reuse():
    # x read once, output written once, parameter vectors read once.
    assert softmax(4096, 768).compulsory_bytes == 2 * 2 * 4096 * 768
    assert reduce(4096, 768).compulsory_bytes == 2 * 4096 * 768 + 2 * 4096
    assert layernorm(4096, 768).compulsory_bytes == 2 * (2 * 4096 * 768 + 2 * 768)
    assert bias_gelu(4096, 3072).compulsory_bytes == 2 * (2 * 4096 * 3072 + 3072)
    assert rmsnorm(4096, 4096).compulsory_bytes == 2 * (2 * 4096 * 4096 + 4096)  # gamma only
    assert silu_mul(2048, 11008).input_bytes == 2 * 2048 * 2 * 11008  # gate and up
    assert silu_mul(2048, 11008).output_bytes == 2 * 2048 * 11008


def test_canonical_form_round_trips_and_hashes_differ_by_op():
    w = layernorm(4096, 768, 1e-12)
    assert parse_mem_workload(w.canonical()) == w
    assert softmax(4096, 768).workload_hash != layernorm(4096, 768).workload_hash
    assert reduce(8, 8).workload_hash != reduce(8, 8, "max").workload_hash
    assert "layernorm 4096x768" in w.label()
    assert rmsnorm(4096, 768).workload_hash != layernorm(4096, 768).workload_hash
    assert rmsnorm(4096, 768, 1e-6).label() == "rmsnorm 4096x768 eps=1e-06"


def test_a_layernorm_s_hash_is_what_it_was():
    """The recorded datasets and the service's rows find a workload by its hash: the norms
    sharing their eps field must not move layer norm's (the value before rmsnorm existed)."""
    assert layernorm(4096, 768, 1e-12).workload_hash == "b8cf5667c0399c38"


def test_cli_exits_2_with_one_line_naming_the_field():
    proc = subprocess.run(
        [sys.executable, "-m", "pipetune.clients.cli", "model", "rank", "softmax",
         "--rows", "4096", "--cols", "770"],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cols: must be a multiple of 8")


def test_the_smallest_eps_float32_holds_is_accepted():
    assert layernorm(8, 8, 2.0**-126).eps == 2.0**-126


def test_the_scales_at_float32_s_normal_range_s_ends_are_accepted():
    assert softmax(8, 8, scale=2.0**-126).scale == 2.0**-126
    largest = float.fromhex("0x1.fffffep+127")
    assert softmax(8, 8, scale=largest).scale == largest


def test_attention_s_softmax_scales_masks_and_keeps_the_plain_one_s_identity():
    plain = softmax(8, 16)
    # The hash every recorded softmax has (computed before scale and causal existed).
    assert plain.workload_hash == "13751882da5f8600" and plain.canonical() == {
        "op": "softmax", "rows": 8, "cols": 16, "dtype": "float16"}  # fmt: skip
    assert softmax(8, 16, scale=1.0, causal=False).workload_hash == plain.workload_hash
    square = softmax(32, 16, 0.125, causal=True)
    # The default query length is written out: two spellings, one workload.
    assert square == softmax(32, 16, 0.125, causal=True, queries=16) and square.queries == 16
    # NumPy's integers too (a library caller's shapes): the default was left unset for them.
    assert softmax(np.int64(32), np.int64(16), 0.125, causal=True) == square
    assert square.canonical() == {"op": "softmax", "rows": 32, "cols": 16, "dtype": "float16",
                                  "scale": 0.125, "causal": True, "queries": 16}  # fmt: skip
    assert square.label() == "softmax 32x16 scale=0.125 causal"
    assert softmax(32, 16, causal=True, queries=4).label() == "softmax 32x16 causal q=4"
    # What the kernels read: query i of L sees 16 - L + 1 + i keys.
    assert square.read_fraction == sum(range(1, 17)) / (16 * 16)
    assert square.input_bytes == 2 * 2 * sum(range(1, 17)) and square.output_bytes == 2 * 32 * 16
    assert softmax(4, 16, causal=True, queries=1).read_fraction == 1.0
    assert plain.read_fraction == 1.0 and plain.mask_queries == 0


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"queries": 4}, "queries", "set causal too"),
        ({"causal": True, "queries": 32}, "queries", "at most cols (16)"),
        ({"causal": True, "queries": 5}, "queries", "must divide rows (12)"),
        ({"causal": True, "queries": 0}, "queries", "greater than or equal to 1"),
        ({"scale": 0.0}, "scale", "greater than 0"),
        ({"scale": float("nan")}, "scale", "finite number"),
        ({"causal": 1}, "causal", "valid boolean"),
    ],
)
def test_a_mask_or_scale_a_softmax_cannot_have_is_refused_naming_the_field(fields, field, reason):
    with pytest.raises(WorkloadError, match=re.escape(reason)) as caught:
        parse_mem_workload({"op": "softmax", "rows": 12, "cols": 16, **fields})
    assert caught.value.field == field
