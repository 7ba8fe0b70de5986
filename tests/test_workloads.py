"""Operators, their implicit-GEMM view, and validation with clear messages."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipetune.model.workloads import WorkloadError, bmm, conv2d, conv3d, gemm, parse_workload


def test_gemm_view_flops_and_bytes():
    w = gemm(1024, 64, 2048)
    v = w.gemm_view()
    assert (v.batch, v.m, v.n, v.k) == (1, 1024, 64, 2048)
    assert w.flops == 2 * 1024 * 64 * 2048
    assert w.operand_bytes == (2 * 1024 * 2048, 2 * 2048 * 64, 2 * 1024 * 64)


def test_a_gemm_label_tells_the_two_b_layouts_apart():
    # Both read "gemm 1000x504x328" (in model rank, tasks and export), though B's layout
    # picks another kernel.
    assert gemm(1000, 504, 328).label() == "gemm 1000x504x328"
    assert gemm(1000, 504, 328, b_layout="nk").label() == "gemm 1000x504x328 nk"


def test_a_bmm_of_b_stored_n_by_k_is_another_workload_and_a_kn_bmm_keeps_its_hash():
    """Attention's Q·Kᵀ over keys stored sequence-major: each B is N x K. The field came after
    BMMs were recorded: a kn BMM's hash is the one it had without it (computed then), so its
    tasks, trials and recorded sweeps keep their identity."""
    assert bmm(12, 512, 64, 512).workload_hash == "6546d50b44e045da"
    assert bmm(12, 512, 64, 512, dtype="bfloat16").workload_hash == "add915a38a827193"
    assert "b_layout" not in bmm(12, 512, 64, 512).canonical()
    nk = bmm(12, 512, 64, 512, b_layout="nk")
    assert (
        nk.canonical()["b_layout"] == "nk"
        and nk.workload_hash != bmm(12, 512, 64, 512).workload_hash
    )
    assert nk.label() == "bmm 12x512x64x512 nk"
    assert parse_workload(nk.canonical()) == nk
    assert parse_workload(bmm(2, 8, 8, 8).model_dump()) == bmm(2, 8, 8, 8)
    with pytest.raises(WorkloadError) as err:
        bmm(2, 64, 60, 64, b_layout="nk")
    assert err.value.field == "n" and "N of C" in str(err.value)
    with pytest.raises(WorkloadError) as err:
        bmm(2, 64, 64, 60, b_layout="nk")
    assert err.value.field == "k" and "K of A and B" in str(err.value)


def test_bmm_view():
    v = bmm(12, 512, 64, 512).gemm_view()
    assert (v.batch, v.m, v.n, v.k) == (12, 512, 64, 512)


def test_conv2d_implicit_gemm():
    w = conv2d(64, 56, 56, 64, 64, 3, 3, stride=1, pad=1)
    assert w.out_hw == (56, 56)
    v = w.gemm_view()
    assert (v.m, v.n, v.k) == (64 * 56 * 56, 64, 3 * 3 * 64)
    strided = conv2d(1, 224, 224, 8, 64, 7, 7, stride=2, pad=3)
    assert strided.out_hw == (112, 112)


def test_conv3d_implicit_gemm():
    w = conv3d(64, 14, 7, 7, 512, 512, 3, 3, 3, stride=1, pad=1)
    assert w.out_dhw == (14, 7, 7)
    v = w.gemm_view()
    assert (v.m, v.n, v.k) == (64 * 14 * 7 * 7, 512, 27 * 512)


def test_hash_is_canonical():
    a = parse_workload({"op": "gemm", "m": 128, "n": 64, "k": 256})
    b = parse_workload({"k": 256, "n": 64, "m": 128, "op": "gemm", "dtype": "float16"})
    assert a == b
    assert a.workload_hash == b.workload_hash
    assert a.workload_hash != gemm(128, 64, 264).workload_hash


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"op": "gemm", "m": -5, "n": 64, "k": 64}, "m", "greater than or equal to 1"),
        ({"op": "gemm", "m": 0, "n": 64, "k": 64}, "m", "greater than or equal to 1"),
        ({"op": "gemm", "m": 1.5, "n": 64, "k": 64}, "m", "integer"),
        ({"op": "gemm", "m": "64", "n": 64, "k": 64}, "m", "integer"),
        ({"op": "gemm", "m": True, "n": 64, "k": 64}, "m", "integer"),
        ({"op": "gemm", "m": 64, "n": 64, "k": 60}, "k", "multiple of 8"),
        ({"op": "gemm", "m": 64, "n": 60, "k": 64}, "n", "multiple of 8"),
        ({"op": "gemm", "m": 1 << 20, "n": 1 << 16, "k": 64}, "m", "2^31-1"),
        ({"op": "gemm", "m": 1 << 30, "n": 64, "k": 64}, "m", "less than or equal"),
        ({"op": "gemm", "m": 64, "n": 64, "k": 64, "dtype": "float32"}, "dtype", "bfloat16"),
        ({"op": "gemm", "m": 64, "n": 64}, "k", "required"),
        ({"op": "gemm", "m": 64, "n": 64, "k": 64, "q": 1}, "q", "not permitted"),
        ({"op": "softmax", "m": 64}, "op", "unknown operator"),
        (
            {"op": "conv2d", "n": 1, "h": 8, "w": 8, "c": 8, "k": 8, "r": 3, "s": 3, "pad": 3},
            "pad",
            "smaller",
        ),
        (
            {"op": "conv2d", "n": 1, "h": 2, "w": 8, "c": 8, "k": 8, "r": 5, "s": 3, "pad": 1},
            "r",
            "larger than the padded input (h 2 + 2 x pad 1 = 4)",  # the input's field too
        ),
        (
            {"op": "conv2d", "n": 1, "h": 8, "w": 8, "c": 3, "k": 8, "r": 3, "s": 3},
            "c",
            "multiple of 8",
        ),
    ],
)
def test_bad_workloads_name_field_and_reason(data, field, words):
    with pytest.raises(WorkloadError) as info:
        parse_workload(data)
    assert info.value.field == field
    assert words in info.value.reason


sizes = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(m=sizes, n=sizes, k=sizes, b=sizes)
def test_any_input_is_a_workload_or_a_workload_error(m, n, k, b):
    for data in (
        {"op": "gemm", "m": m, "n": n, "k": k},
        {"op": "bmm", "b": b, "m": m, "n": n, "k": k},
    ):
        try:
            w = parse_workload(data)
        except WorkloadError as exc:
            assert exc.field and exc.reason
        else:
            v = w.gemm_view()
            assert v.m * v.k < 2**31 and v.k % 8 == 0 and v.n % 8 == 0


def test_an_unhashable_or_huge_operator_is_a_workload_error():
    # Found importing corrupted datasets: a list as `op` raised TypeError (unhashable).
    for op in (["gemm"], {"name": "gemm"}, "x" * 5000):
        with pytest.raises(WorkloadError) as caught:
            parse_workload({"op": op, "m": 64, "n": 64, "k": 64})
        assert caught.value.field == "op" and len(caught.value.reason) < 200


conv_sizes = st.one_of(
    st.integers(min_value=-4, max_value=300),
    st.integers(min_value=2**31 - 8, max_value=2**64),  # overflow-prone products
    st.sampled_from([True, False, 0.5, 64.0, "64", None, [64]]),
)


@settings(max_examples=300, deadline=None)
@example(dims={"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "stride": 1, "pad": 1})
@example(dims={"n": 2**31, "h": 8, "w": 8, "c": 8, "k": 8, "r": 1, "s": 1, "stride": 1, "pad": 0})
@given(
    dims=st.fixed_dictionaries(
        {name: conv_sizes for name in ("n", "h", "w", "c", "k", "r", "s", "stride", "pad")}
    )
)
def test_any_conv2d_input_is_a_workload_or_a_workload_error(dims):
    try:
        w = parse_workload({"op": "conv2d", **dims})
    except WorkloadError as exc:
        assert exc.field in {*dims, "workload", "op"} and exc.reason
    else:
        # Accepted: every size a true positive int, the implicit GEMM indexable in int32.
        assert all(type(getattr(w, name)) is int for name in dims)
        p, q = w.out_hw
        assert p >= 1 and q >= 1 and w.pad < min(w.r, w.s)
        v = w.gemm_view()
        assert v.m * v.k < 2**31 and v.k % 8 == 0 and v.n % 8 == 0
        assert w.n * w.h * w.w * w.c < 2**31


# A batch over CUDA's grid z limit was accepted, tuned and reported, and only failed when the
# kernel was launched (a ValueError from the code generator naming no field).
BATCH_OVER_GRID_Z = {"op": "bmm", "b": 65536, "m": 64, "n": 64, "k": 64}


@pytest.mark.parametrize("op", ["bmm", "hopper_bmm"])
def test_a_batch_over_the_grid_z_limit_is_refused_naming_b(op):
    from pipetune.model.family import parse_any_workload
    from pipetune.model.hopper.workloads import parse_hopper_workload
    from pipetune.model.workloads import GRID_Z_LIMIT

    data = {**BATCH_OVER_GRID_Z, "op": op}
    parsers = [parse_any_workload, parse_workload if op == "bmm" else parse_hopper_workload]
    for parse in parsers:
        with pytest.raises(WorkloadError) as info:
            parse(data)
        assert info.value.field == "b"
        assert f"at most {GRID_Z_LIMIT}" in info.value.reason
        assert "grid's z dimension" in info.value.reason
        # The largest batch the grid holds is still a workload.
        assert parse({**data, "b": GRID_Z_LIMIT}).gemm_view().batch == GRID_Z_LIMIT


def test_the_grid_z_limit_is_the_code_generators():
    """One limit: what validation accepts, the mma.sync family's launch takes."""
    from pipetune.model.space import Schedule
    from pipetune.model.workloads import GRID_Z_LIMIT
    from pipetune.workers.codegen import generator

    kernel = generator.generate("bmm", Schedule(2, 2, 2, 1, 2, 3, 2))
    grid, _ = generator.launch(kernel, bmm(GRID_Z_LIMIT, 64, 64, 64))
    assert grid[2] == GRID_Z_LIMIT
    assert generator.GRID_Z_LIMIT is GRID_Z_LIMIT
