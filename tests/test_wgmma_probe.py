"""benchmarks/wgmma_probe.py on the CPU: which shapes it runs, and its report. (Its `run`
needs a Hopper GPU; the kernels themselves are checked by tests/test_wgmma_emulated.py.)"""

from __future__ import annotations

import pytest

from benchmarks import wgmma_probe
from pipetune.workers.codegen.wgmma import PROBE_CONFIGS


def test_the_probe_runs_each_shape_with_one_reading_of_the_b_descriptor():
    canonical = wgmma_probe._configs(None)
    swapped = wgmma_probe._configs(None, "swapped")
    assert [c.id for c in canonical] == [c.id for c in PROBE_CONFIGS]
    assert [c.id for c in swapped] == [c.id + "_bswap" for c in PROBE_CONFIGS]
    named = wgmma_probe._configs(["wg128x128s4_bswap", "wg128x256s3", "wg64x256s4_tma_bswap"])
    assert [(c.id, c.loader) for c in named] == [
        ("wg128x128s4_bswap", "cp.async"),
        ("wg128x256s3", "cp.async"),
        ("wg64x256s4_tma_bswap", "tma"),
    ]
    assert wgmma_probe.loader_of("wg64x256s4_tma_bswap") == "tma"
    assert wgmma_probe.loader_of("wg128x128s4_bswap") == "cp.async"
    with pytest.raises(SystemExit, match="unknown probe shapes"):
        wgmma_probe._configs(["wg99x1s1"])


def test_shapes_lists_the_ids_a_device_call_names(capsys):
    assert wgmma_probe.main(["shapes", "--loader", "tma", "--epilogue", "staged"]) == 0
    ids = capsys.readouterr().out.strip().split(",")
    assert ids == [c.id for c in PROBE_CONFIGS if c.loader == "tma" and c.epilogue == "staged"]
    assert ids and all(i.endswith(("_tma_st", "_tma_st_p", "_tma_st_sk")) for i in ids)
    assert wgmma_probe.main(["shapes", "--persistent"]) == 0
    persistent = capsys.readouterr().out.strip().split(",")
    assert persistent == [c.id for c in PROBE_CONFIGS if c.persistent]
    assert "wg128x256s3_tma_st_p" in persistent
    assert not set(persistent) & set(wgmma_probe.shape_ids(persistent=False))
    assert len(wgmma_probe.shape_ids()) == len(PROBE_CONFIGS)
    assert wgmma_probe.main(["shapes", "--split"]) == 0
    split = capsys.readouterr().out.strip().split(",")
    assert split == [c.id for c in PROBE_CONFIGS if c.splits > 1] and "wg64x64s6_tma_k8" in split
    assert not set(split) & set(wgmma_probe.shape_ids(split=False))
    # Stream-K shapes are persistent ones; the persistent kernel alone is --no-stream-k.
    assert wgmma_probe.main(["shapes", "--stream-k"]) == 0
    stream_k = capsys.readouterr().out.strip().split(",")
    assert stream_k == [c.id for c in PROBE_CONFIGS if c.stream_k]
    assert "wg64x64s6_tma_st_sk" in stream_k
    assert set(stream_k) <= set(persistent)
    assert wgmma_probe.main(["shapes", "--persistent", "--no-stream-k"]) == 0
    alone = capsys.readouterr().out.strip().split(",")
    assert alone and all(i.endswith("_p") for i in alone)
    assert sorted(alone + stream_k) == sorted(persistent)


def test_the_probe_takes_the_suites_gemm_and_bmm_operators():
    chosen = wgmma_probe._operators(None)
    assert chosen and all(w.op in ("gemm", "bmm") for w in chosen.values())
    assert "MM_Square_4k" in chosen and "BMM_BERT_QK" in chosen
    with pytest.raises(SystemExit, match="not GEMM or BMM"):
        wgmma_probe._operators(["Conv2D_RN50_1"])


def _document():
    """A probe file's shape, with made-up numbers (this test's own, written nowhere)."""
    samples = {"MM_Square_4k": [0.20, 0.21, 0.22], "BMM_BERT_QK": [0.050, 0.052, 0.051]}
    return {
        "device": {"name": "test device"},
        "checks": {
            "wg128x128s4": {"correct": True, "error": 1e-4, "registers": 150},
            "wg128x256s3": {"fault": "CUDARuntimeError: an illegal memory access"},
        },
        "vendor": {
            "MM_Square_4k": {"samples_ms": [0.18, 0.18, 0.19]},
            "BMM_BERT_QK": {"error": "RuntimeError: no cuBLAS"},
        },
        "runs": {
            "wg128x128s4": {
                name: {"correct": True, "samples_ms": s} for name, s in samples.items()
            },
            "wg128x256s3": {"fault": "no answer within 240 s"},
            "wg128x128s4_tma": {"MM_Square_4k": {"correct": True, "samples_ms": [0.23, 0.24]}},
        },
    }


def test_the_report_compares_the_best_shape_with_the_library_and_mma_sync():
    rows = wgmma_probe.summary(_document(), {"MM_Square_4k": 350.0})
    assert len(rows) == 1  # BMM_BERT_QK has no library time to compare with
    row = rows[0]
    assert row["operator"] == "MM_Square_4k" and row["best_shape"] == "wg128x128s4"
    assert row["wgmma_us"] == pytest.approx(210.0)
    assert row["wgmma_vs_library"] == pytest.approx(180.0 / 210.0)
    assert row["mma_sync_vs_library"] == pytest.approx(180.0 / 350.0)
    # The best of each loader beside the best of both.
    assert row["cp.async_us"] == pytest.approx(210.0) and row["tma_us"] == pytest.approx(235.0)
    text = wgmma_probe.render([("probe.json", _document())], rows)
    assert "| wg128x256s3 | fault: CUDARuntimeError" in text
    row_text = "| MM_Square_4k | wg128x128s4 | 210.0 | 210.0 | 235.0 | 350.0 | 180.0 | 0.86 | 0.51"
    assert row_text in text
    assert "wgmma 0.86x of the library, mma.sync 0.51x" in text


def test_the_report_of_several_calls_takes_each_operators_best_ratio_within_its_call(
    tmp_path, monkeypatch, capsys
):
    import json

    # Call 2's machine ran everything slower, cuBLAS included: its shape is faster in µs
    # than call 1's yet further from its own cuBLAS, so call 1's row is the one kept.
    first = _document()
    second = _document()
    second["vendor"]["MM_Square_4k"]["samples_ms"] = [0.12, 0.12, 0.12]
    second["runs"] = {
        "wg128x128s4_tma_k2": {"MM_Square_4k": {"correct": True, "samples_ms": [0.19, 0.19]}}
    }
    paths = []
    for name, document in (("one.json", first), ("two.json", second)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(document))
    monkeypatch.setattr(wgmma_probe, "_mma_sync_best", lambda gpu: {})
    assert wgmma_probe.main(["report", *map(str, paths), "--gpu", "h200"]) == 0
    text = capsys.readouterr().out
    assert "| MM_Square_4k | wg128x128s4 | 210.0 |" in text and "| one.json |" in text
    assert "wgmma 0.86x of the library" in text
    # Both files' shape checks are shown, each under its own name.
    assert f"probe file {paths[0]}." in text and f"probe file {paths[1]}." in text
    # A call faster relative to its own cuBLAS wins the operator.
    second["vendor"]["MM_Square_4k"]["samples_ms"] = [0.18, 0.18, 0.18]
    paths[1].write_text(json.dumps(second))
    assert wgmma_probe.main(["report", *map(str, paths), "--gpu", "h200"]) == 0
    text = capsys.readouterr().out
    assert "| MM_Square_4k | wg128x128s4_tma_k2 | 190.0 |" in text and "| two.json |" in text


def test_report_of_a_missing_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        wgmma_probe.main(["report", str(tmp_path / "none.json")])
    assert exc.value.code == 2
    assert "no such probe file" in capsys.readouterr().err


@pytest.mark.parametrize(("behaviour", "correct"), [(b"ok", True), (b"wrong", False)])
def test_a_shape_is_checked_against_an_fp32_product_then_timed(monkeypatch, behaviour, correct):
    """The child's control flow on a numpy stand-in for CuPy (tests/fake_cupy.py): the
    kernel is compiled, loaded, launched on the campaign's inputs, checked, and timed only
    when right. The stand-in's "kernel" is chosen by the cubin's first line."""
    import sys

    import fake_cupy
    import numpy as np

    from pipetune.workers import compile as compile_module

    fake = fake_cupy.make()
    fake.full, fake.nan, fake.isnan = np.full, np.nan, np.isnan
    monkeypatch.setitem(sys.modules, "cupy", fake)

    class Built:
        cubin, registers = behaviour + b"\n", 150

    monkeypatch.setattr(compile_module, "compile_source", lambda *a, **k: Built())
    config = PROBE_CONFIGS[0]
    pattern_job = {**wgmma_probe.DIAGNOSIS_SHAPE, "pattern": "a_cols"}
    answer, diagnosed = wgmma_probe._measure(
        {"block_m": config.block_m, "block_n": config.block_n, "stages": config.stages},
        [wgmma_probe.CHECK_SHAPE, pattern_job],
        timed=True,
    )
    assert answer["correct"] is correct and answer["registers"] == 150
    assert ("samples_ms" in answer) is correct
    assert "c" not in answer  # only a pattern's C comes back whole
    if correct:
        assert answer["error"] < 1e-3
    assert diagnosed["pattern"] == "a_cols"
    assert wgmma_probe.pattern_agreement(diagnosed) == (1.0 if correct else 0.0)


def test_a_tma_shape_is_launched_with_its_two_tensor_maps(monkeypatch):
    """The TMA loader's maps are encoded from tensor_map_specs over A's and B's addresses and
    handed over after the scalars (the driver call itself needs a GPU)."""
    import sys

    import fake_cupy
    import numpy as np

    from pipetune.model.family import parse_any_workload
    from pipetune.workers import compile as compile_module
    from pipetune.workers.codegen import wgmma

    fake = fake_cupy.make()
    fake.full, fake.nan, fake.isnan = np.full, np.nan, np.isnan
    monkeypatch.setitem(sys.modules, "cupy", fake)

    class Built:
        cubin, registers = b"ok\n", 154

    monkeypatch.setattr(compile_module, "compile_source", lambda *a, **k: Built())
    encoded = []

    def encode(spec, address):
        encoded.append((spec, address))
        return bytes(range(128))

    monkeypatch.setattr(wgmma_probe, "encode_tensor_map", encode)
    monkeypatch.setattr(wgmma_probe, "_device_address", lambda x: x.shape)
    config = wgmma.WgmmaConfig(128, 256, 4, loader="tma", epilogue="staged")
    fields = {"block_m": 128, "block_n": 256, "stages": 4, "loader": "tma", "epilogue": "staged"}
    (answer,) = wgmma_probe._measure(fields, [wgmma_probe.CHECK_SHAPE], timed=False)
    assert answer["correct"]
    m, n, k = (wgmma_probe.CHECK_SHAPE[d] for d in "mnk")
    assert [spec for spec, _ in encoded] == list(wgmma.tensor_map_specs(m, n, k, 1, config))
    assert [address for _, address in encoded] == [(m, k), (k, n)]  # A's, then B's
    workload = parse_any_workload(wgmma_probe.CHECK_SHAPE)
    maps = wgmma_probe.tensor_maps(fake, config, workload, np.zeros((m, k)), np.zeros((k, n)))
    assert [bytes(x) for x in maps] == [bytes(range(128))] * 2
    cp_async = wgmma.WgmmaConfig(128, 256, 4)
    assert wgmma_probe.tensor_maps(fake, cp_async, workload, None, None) == ()


def _tma_kernel_stand_in(monkeypatch, kernel) -> None:
    """CuPy replaced by the numpy stand-in (tests/fake_cupy.py), every module's kernel by
    `kernel(grid, block, args, shared_mem)`, and the tensor maps by blank ones (their
    encoding needs the driver)."""
    import sys

    import fake_cupy
    import numpy as np

    from pipetune.workers import compile as compile_module

    fake = fake_cupy.make()
    fake.full, fake.nan, fake.isnan = np.full, np.nan, np.isnan
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(fake_cupy.KERNELS, b"stand-in", kernel)

    class Built:
        cubin, registers = b"stand-in\n", 90

    monkeypatch.setattr(compile_module, "compile_source", lambda *a, **k: Built())
    monkeypatch.setattr(wgmma_probe, "encode_tensor_map", lambda spec, address: bytes(128))
    monkeypatch.setattr(wgmma_probe, "_device_address", lambda x: 0)


def test_a_split_k_shape_runs_its_reduction_after_the_main_kernel(monkeypatch):
    """Split-K: the main kernel gets a workspace of splits x C in f32 after the tensor maps,
    and the reduction kernel (W, C, count) runs after it in every launch (so it is timed)."""
    import numpy as np

    from pipetune.workers.codegen import wgmma

    calls = []

    def split_kernel(grid, block, args, shared_mem=0):
        if args[0].dtype == np.float32:  # the reduction: W, C, count
            w, c, count = args
            calls.append(("reduce", grid, int(count)))
            c[...] = w.reshape(-1, int(count)).sum(axis=0).reshape(c.shape).astype(np.float16)
            return
        a, b, c = args[:3]
        w = args[-1]
        calls.append(("main", grid, w.size // c.size))
        part = (a.astype(np.float32) @ b.astype(np.float32)).ravel() / (w.size // c.size)
        w[...] = np.tile(part, w.size // c.size)

    _tma_kernel_stand_in(monkeypatch, split_kernel)
    fields = {"block_m": 128, "block_n": 128, "stages": 4, "loader": "tma", "splits": 3}
    (answer,) = wgmma_probe._measure(fields, [wgmma_probe.CHECK_SHAPE], timed=True)
    assert answer["correct"] and answer["samples_ms"]
    m, n = wgmma_probe.CHECK_SHAPE["m"], wgmma_probe.CHECK_SHAPE["n"]
    tiles = -(-m // 128) * -(-n // 128)
    assert calls[0] == ("main", (tiles, 3, 1), 3)
    assert calls[1] == ("reduce", (-(-m * n // 2 // wgmma.REDUCE_THREADS), 1, 1), m * n)
    assert [c[0] for c in calls] == ["main", "reduce"] * (len(calls) // 2)


def test_a_stream_k_shape_gets_its_workspace_and_zeroed_counters(monkeypatch):
    """Stream-K: one block per SM up to one per K step, the scalars with the tile count, then
    the tensor maps, the f32 workspace (two partial tiles per block) and one u32 counter per
    tile, zero before the first launch; the kernel must leave them zero for the next."""
    import numpy as np

    from pipetune.workers.codegen import wgmma

    calls = []

    def stream_k_kernel(grid, block, args, shared_mem=0):
        a, b, c = args[:3]
        scalars, workspace, arrivals = args[3:7], args[-2], args[-1]
        assert len(args) == 11  # A, B, C, M, N, K, tiles, the two maps, W, the counters
        calls.append((grid, block, tuple(int(s) for s in scalars), workspace, arrivals.copy()))
        c[...] = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)

    _tma_kernel_stand_in(monkeypatch, stream_k_kernel)
    config = wgmma.WgmmaConfig(64, 64, 6, loader="tma", epilogue="staged", persistent=True,
                               stream_k=True)  # fmt: skip
    fields = {"block_m": 64, "block_n": 64, "stages": 6, "loader": "tma", "epilogue": "staged",
              "persistent": True, "stream_k": True}  # fmt: skip
    (answer,) = wgmma_probe._measure(fields, [wgmma_probe.CHECK_SHAPE], timed=True)
    assert answer["correct"] and answer["samples_ms"]
    m, n, k = (wgmma_probe.CHECK_SHAPE[d] for d in "mnk")
    tiles, steps = -(-m // 64) * -(-n // 64), -(-k // 64)
    grid, block, scalars, workspace, arrivals = calls[0]
    assert grid == (min(132, tiles * steps), 1, 1) and block == (config.threads, 1, 1)
    assert scalars == (m, n, k, tiles)
    floats, counters = wgmma.stream_k_buffers(config, grid[0], tiles)
    assert workspace.dtype == np.float32 and workspace.size == floats
    assert arrivals.dtype == np.uint32 and arrivals.size == counters and not arrivals.any()


@pytest.mark.parametrize("pattern", wgmma_probe.PATTERNS)
def test_each_diagnosis_pattern_puts_an_index_in_every_element(pattern):
    """A right kernel's C holds each element's row (or column) index, exactly in fp16;
    a kernel that misplaces elements scores below 1."""
    import numpy as np

    a, b = wgmma_probe.pattern_inputs(pattern, 128, 128, 128)
    c = (a.astype(np.float32) @ b.astype(np.float32)).tolist()
    assert wgmma_probe.pattern_agreement({"pattern": pattern, "c": c}) == 1.0
    shuffled = np.asarray(c)[:, ::-1] if pattern.endswith("_cols") else np.asarray(c)[::-1]
    assert wgmma_probe.pattern_agreement({"pattern": pattern, "c": shuffled.tolist()}) < 0.1


def test_the_report_shows_the_diagnosis_of_a_failing_shape():
    import numpy as np

    document = _document()
    good = np.indices((4, 4))[0].tolist()
    document["diagnosis"] = {
        "wg128x256s3": [{"pattern": "b_rows", "c": good}, {"pattern": "b_cols", "c": good}],
        "wg128x256s3_bswap": {"fault": "no answer within 240 s"},
    }
    text = wgmma_probe.render([("probe.json", document)], [])
    assert (
        "Diagnosis of wg128x256s3 (share of elements where they belong): b_rows 1.000, "
        "b_cols 0.250." in text
    )
    assert "Diagnosis of wg128x256s3_bswap: fault: no answer" in text


def test_best_names_the_fastest_shape_of_an_operator(tmp_path, capsys):
    import json

    path = tmp_path / "probe.json"
    path.write_text(json.dumps(_document()))
    assert wgmma_probe.main(["best", str(path), "--operator", "MM_Square_4k"]) == 0
    assert capsys.readouterr().out.strip() == "wg128x128s4"
    assert wgmma_probe.main(["best", str(path), "--operator", "MM_BERT_FC1"]) == 1
