"""Which revision of its code generator made a measured kernel (model.family.GeneratorRevision):
recorded per result by the runner that generates kernels, kept per record in datasets, per
job in the service, and read by the learned prior, which learns from each generator line's
newest revision only. Before it, the H100's convolutions measured with the loader that
divided taught the H200's convolutions, measured with the loader that multiplies, which
schedules win (benchmarks/RESULTS.md, "the learned prior's corpus")."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.bench_cmds import _unlearned, recorded_dataset
from pipetune.clients.cli.main import app
from pipetune.model.analytical import evaluate
from pipetune.model.family import FIRST_REVISION, GeneratorRevision, family, family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.workloads import softmax
from pipetune.model.space import Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm
from pipetune.tuner.bench import Dataset
from pipetune.tuner.learned_prior import (
    LearnedPriorError,
    current_measurements,
    fit_learned_model,
    learned_prior,
    newest_revisions,
    prior_from,
    unseen_shape_priors,
)
from pipetune.tuner.offline import RecordedSpace
from pipetune.tuner.recorded import RecordedConfigs
from pipetune.workers.datasets import DatasetError, check_pipetune, load_dataset, read_t4
from pipetune.workers.datasets.pipetune import dataset_from_results, record_revision
from pipetune.workers.datasets.t4 import write_t4

pytest_plugins = ["service_fixtures"]

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
CONV = conv2d(8, 14, 14, 64, 64, 3, 3, 1, 1)


def test_convolutions_have_their_own_line_at_revision_2_and_the_rest_revision_1():
    tensor = family("tensor_gemm")
    assert tensor.generator_revision(CONV) == GeneratorRevision("tensor_gemm.conv", 2)
    assert tensor.generator_revision(conv3d(2, 8, 14, 14, 32, 32, 3, 3, 3, 1, 1)).revision == 2
    for workload in (gemm(512, 512, 512), bmm(4, 128, 128, 64)):
        assert tensor.generator_revision(workload) == GeneratorRevision("tensor_gemm.gemm", 1)
    memops = softmax(1024, 768)
    assert family_of(memops).generator_revision(memops) == GeneratorRevision("memops", 1)


def test_a_result_says_a_revision_of_at_least_1_and_nothing_else():
    assert MeasureResult(status="ok", latency_us=5.0, generator_revision=2).generator_revision == 2
    assert MeasureResult(status="ok", latency_us=5.0).generator_revision is None
    for bad in (0, -1, 2.0, "2", True, 10**6):
        with pytest.raises(ValueError, match="generator_revision"):
            MeasureResult(status="ok", latency_us=5.0, generator_revision=bad)


def _recorded(workload, gpu: str, revisions) -> RecordedSpace:
    space = family_of(workload).enumerate(workload, get_gpu(gpu, calibrated=False))
    latency = evaluate(space).T_kernel
    rev = None if revisions is None else np.broadcast_to(revisions, len(space)).copy()
    return RecordedSpace(space, latency, rev)


def test_a_prior_for_a_line_reads_that_lines_newest_revision_and_every_other_line():
    old_conv = _recorded(conv2d(8, 28, 28, 64, 64, 3, 3, 1, 1), "h100", None)  # says none: 1
    new_conv = _recorded(conv2d(8, 28, 28, 64, 128, 3, 3, 1, 1), "h200", 2)
    gemm_1 = _recorded(gemm(1024, 1024, 1024), "h100", None)
    everything = [old_conv, new_conv, gemm_1]
    assert newest_revisions(everything) == {"tensor_gemm.conv": 2, "tensor_gemm.gemm": 1}
    # For a convolution: the old convolutions describe kernels that no longer exist.
    assert current_measurements(everything, "tensor_gemm.conv") == [new_conv, gemm_1]
    # For a GEMM: another line's, whatever its revision (its kernels are not the target's).
    assert current_measurements(everything, "tensor_gemm.gemm") == everything
    # Without a newer one, revision 1 is what there is to learn from.
    assert current_measurements([old_conv, gemm_1], "tensor_gemm.conv") == [old_conv, gemm_1]
    # A space measured partly by each revision keeps its newest rows.
    mixed_rev = np.where(np.arange(len(old_conv.latency_s)) % 3 == 0, 2, 1)
    mixed = RecordedSpace(old_conv.space, old_conv.latency_s, mixed_rev)
    (kept,) = current_measurements([mixed], "tensor_gemm.conv")
    assert len(kept.latency_s) == int((mixed_rev == 2).sum())
    assert np.array_equal(kept.latency_s, old_conv.latency_s[mixed_rev == 2])
    assert (kept.revision_of_rows() == 2).all()
    assert [s.id for s in kept.space] == [
        s.id for s, r in zip(old_conv.space, mixed_rev, strict=True) if r == 2
    ]


def test_a_learned_model_says_what_it_left_out():
    old_conv = _recorded(conv2d(8, 28, 28, 64, 64, 3, 3, 1, 1), "h100", None)
    new_conv = _recorded(conv2d(8, 28, 28, 64, 128, 3, 3, 1, 1), "h200", 2)
    learned = fit_learned_model([old_conv, new_conv], line="tensor_gemm.conv")
    assert (learned.stale_spaces, learned.stale_rows) == (1, len(old_conv.latency_s))
    assert learned.shapes == 1 and learned.gpus == ("h200",)
    everything = fit_learned_model([old_conv, new_conv])  # for no line: all of it
    assert (everything.stale_rows, everything.shapes) == (0, 2)
    target = family_of(CONV).enumerate(CONV, get_gpu("h200", calibrated=False))
    prior = learned_prior(target, [old_conv, new_conv])
    assert f"{len(old_conv.latency_s)} measurements of an older generator revision" in prior.source
    fresh = learned_prior(target, [new_conv])
    assert "older" not in fresh.source
    # The old-revision shape taught nothing: the prior is the one learned without it.
    assert np.array_equal(prior.values, fresh.values)
    # A model fitted for the convolutions' line does not rank a GEMM's space.
    gemm_space = Space.enumerate(gemm(512, 512, 512), get_gpu("h200", calibrated=False))
    with pytest.raises(LearnedPriorError, match=r"fitted for tensor_gemm\.conv"):
        prior_from(gemm_space, learned)


def _results(space, revision):
    latency = evaluate(space).T_kernel * 1e6
    return [
        MeasureResult(status="ok", latency_us=float(t), runner="cupy", generator_revision=revision)
        for t in latency
    ]


def test_datasets_keep_each_records_revision_and_name_the_line(tmp_path):
    space = Space.enumerate(CONV, get_gpu("h100", calibrated=False)).subset(np.arange(6))
    results = _results(space, 2)
    results[0] = results[0].model_copy(update={"generator_revision": None})  # not said
    data = dataset_from_results(CONV, space.gpu, list(space), results, runner="cupy")
    path = write_t4(data, tmp_path / "conv.t4.json")
    back = read_t4(path)
    assert back.metadata["pipetune"]["generator"] == "tensor_gemm.conv"
    assert [record_revision(r) for r in back.records] == [FIRST_REVISION] + [2] * 5
    assert check_pipetune(back).family.name == "tensor_gemm"
    recorded = recorded_dataset(path).ours
    assert recorded is not None
    assert sorted(recorded.revision_of_rows().tolist()) == [1, 2, 2, 2, 2, 2]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["metadata"]["pipetune"].update(generator="tensor_gemm.gemm"), "generator:"),
        (lambda d: d["results"][0]["measurements"].append(_rev(0)), "generator_revision"),
        (lambda d: d["results"][0]["measurements"].append(_rev("2")), "generator_revision"),
    ],
)
def test_a_file_whose_revision_or_line_cannot_be_is_refused_by_name(tmp_path, edit, message):
    space = Space.enumerate(CONV, get_gpu("h100", calibrated=False)).subset(np.arange(3))
    data = dataset_from_results(CONV, space.gpu, list(space), _results(space, None), runner="cupy")
    document = json.loads(Path(write_t4(data, tmp_path / "a.t4.json")).read_text(encoding="utf-8"))
    edit(document)
    path = tmp_path / "b.t4.json"
    path.write_text(json.dumps(document))
    with pytest.raises(DatasetError, match=message):
        check_pipetune(load_dataset(path))


def _rev(value):
    return {"name": "generator_revision", "value": value, "unit": ""}


def test_the_committed_convolutions_say_which_loader_measured_them():
    """The H200's convolutions were swept again on 2026-11-30 by the loader that multiplies
    (revision 2, said in their files); the H100's are the loader that divided (revision 1,
    said by nothing). The GEMMs and batched GEMMs are revision 1 everywhere."""
    for gpu, expected in (("h200", 2), ("h100", 1)):
        files = sorted((DATA / gpu).glob("Conv*.t4.json.gz"))
        assert len(files) == 8
        for path in files:
            data = read_t4(path)
            assert {record_revision(r) for r in data.records} == {expected}, path
    for path in sorted(DATA.glob("h*/*MM_*.t4.json.gz")):
        document = json.loads(gzip.decompress(path.read_bytes()))
        names = {m["name"] for r in document["results"] for m in r["measurements"]}
        assert "generator_revision" not in names, path


def _benchmarked(name: str, recorded: RecordedSpace) -> Dataset:
    return Dataset(name, RecordedConfigs.from_recorded_space(name, recorded), recorded, "cupy")


def test_the_benchmark_says_which_files_it_left_out_as_older(tmp_path):
    old_conv = _recorded(conv2d(8, 28, 28, 64, 64, 3, 3, 1, 1), "h100", None)
    new_conv = _recorded(conv2d(8, 28, 28, 64, 128, 3, 3, 1, 1), "h200", 2)
    files = [tmp_path / "old.t4.json.gz", tmp_path / "new.t4.json.gz"]
    loaded = [_benchmarked("conv", _recorded(CONV, "h200", 2))]
    notes = _unlearned(loaded, loaded, {}, files, [old_conv, new_conv])
    assert [n for n in notes if "revision" in n] == [
        "old.t4.json.gz: all its measurements are of an older revision of tensor_gemm.conv "
        "than the newest given (2): left out of the priors of tensor_gemm.conv's datasets"
    ]


def test_the_benchmark_of_another_line_says_nothing_of_older_revisions_it_learns_from(tmp_path):
    """A GEMM's learned prior keeps the older convolutions (another line's, whatever their
    revision): the benchmark of GEMMs alone must not say they were left out."""
    old_conv = _recorded(conv2d(8, 28, 28, 64, 64, 3, 3, 1, 1), "h100", None)
    new_conv = _recorded(conv2d(8, 28, 28, 64, 128, 3, 3, 1, 1), "h200", 2)
    files = [tmp_path / "old.t4.json.gz", tmp_path / "new.t4.json.gz"]
    target = _recorded(gemm(512, 512, 512), "h200", None)
    loaded = [_benchmarked("gemm", target)]
    prior = learned_prior(target.space, [old_conv, new_conv])
    assert "older" not in prior.source  # the GEMM's prior learned from both convolutions
    notes = _unlearned(loaded, loaded, {}, files, [old_conv, new_conv])
    assert not [n for n in notes if "revision" in n], notes


def test_an_imported_dataset_keeps_its_revisions_and_the_service_learns_from_the_newest(db_url):
    """Through the service's database (SQLite and PostgreSQL): `db import-dataset` stores
    each record's revision on its job, and a learned prior fitted to the tasks leaves the
    older revision of the convolution line out of a convolution's corpus only."""
    from sqlalchemy import select

    from pipetune.service.db import make_engine
    from pipetune.service.orm import JobRow
    from pipetune.service.priors import learned_model_of_tasks

    runner = CliRunner()
    files = (
        DATA / "h100" / "Conv2D_RN50_1.t4.json.gz",  # the loader that divided: revision 1
        DATA / "h200" / "BMM_BERT_QK.t4.json.gz",
        DATA / "h200" / "Conv2D_RN50_2.t4.json.gz",  # the loader that multiplies: revision 2
    )
    ids = []
    for path in files:
        result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url, "--json"])
        assert result.exit_code == 0, result.output
        ids.append(json.loads(result.stdout)["id"])
    engine = make_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            stored = [
                set(conn.scalars(select(JobRow.generator_revision).where(JobRow.task_id == i)))
                for i in ids
            ]
            for_convs = learned_model_of_tasks(conn, ids, "tensor_gemm.conv")
            for_gemms = learned_model_of_tasks(conn, ids, "tensor_gemm.gemm")
    finally:
        engine.dispose()
    assert stored == [{None}, {None}, {2}]
    old = read_t4(files[0])
    assert (for_convs.stale_spaces, for_convs.stale_rows) == (1, len(old.records))
    assert for_convs.gpus == ("h200",) and for_convs.shapes == 2
    assert (for_gemms.stale_rows, for_gemms.gpus, for_gemms.shapes) == (0, ("h100", "h200"), 3)


def test_a_line_is_a_set_of_ops_and_says_which():
    tensor = family("tensor_gemm")
    assert tensor.line_ops("tensor_gemm.conv") == {"conv2d", "conv3d"}
    assert {"gemm", "bmm"} <= tensor.line_ops("tensor_gemm.gemm")
    assert not tensor.line_ops("tensor_gemm.conv") & tensor.line_ops("tensor_gemm.gemm")
    assert tensor.line_ops("memops") == frozenset()
    for op in tensor.ops:
        assert op in tensor.line_ops(tensor.op_generator_revision(op).line)


def test_tasks_of_an_older_revision_take_no_place_among_the_tasks_learned_from(db_url, monkeypatch):
    """The service reads at most MAX_LEARNED_TASKS tasks, the largest first: a large task of
    the target's line measured by an older revision (which the prior leaves out whole) must
    not push out a smaller current one, nor a task of another line (kept at any revision)."""
    from pipetune.service import priors
    from pipetune.service.db import make_engine

    runner = CliRunner()
    files = (
        DATA / "h100" / "Conv2D_RN50_2.t4.json.gz",  # 2,648 trials, revision 1: stale
        DATA / "h200" / "Conv2D_RN50_1.t4.json.gz",  # 1,956 trials, revision 2
        DATA / "h200" / "BMM_BERT_QK.t4.json.gz",  # 686 trials of the GEMM line, revision 1
    )
    ids = []
    for path in files:
        result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url, "--json"])
        assert result.exit_code == 0, result.output
        ids.append(json.loads(result.stdout)["id"])
    stale, current, other_line = ids
    monkeypatch.setattr(priors, "MAX_LEARNED_TASKS", 2)
    engine = make_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            for_conv = priors.learned_tasks(conn, CONV, "h200")
            for_gemm = priors.learned_tasks(conn, gemm(1024, 1024, 1024), "h200")
    finally:
        engine.dispose()
    assert for_conv == sorted([current, other_line])
    # A GEMM's corpus keeps every convolution (another line): the two largest tasks.
    assert for_gemm == sorted([stale, current])


def test_a_prior_gpu_warm_starts_from_the_newest_revisions_sweep_though_an_older_has_more(
    tmp_path, db_url
):
    """`prior_gpu` picks the task of the workload on that GPU to warm-start from: one swept
    again after a change of the generator (revision 2, three trials) over the sweep before it
    (revision 1, six trials), whose timings are of kernels that no longer exist."""
    from service_support import client_for

    space = Space.enumerate(CONV, get_gpu("h100", calibrated=False))
    ids = []
    for name, rows, revision in (("old", 6, None), ("new", 3, 2), ("older", 8, None)):
        part = space.subset(np.arange(rows))
        results = _results(part, revision)
        data = dataset_from_results(CONV, part.gpu, list(part), results, runner="cupy")
        path = write_t4(data, tmp_path / f"{name}.t4.json")
        imported = CliRunner().invoke(
            app, ["db", "import-dataset", str(path), "--db", db_url, "--json"]
        )
        assert imported.exit_code == 0, imported.output
        ids.append(json.loads(imported.stdout)["id"])
    with client_for(db_url) as client:
        created = client.post(
            "/v1/tasks",
            json={"workload": CONV.canonical(), "gpu": "h200", "budget": 8, "prior_gpu": "h100"},
        )
    assert created.status_code == 201, created.text
    assert created.json()["prior_task"] == ids[1]


def test_dataset_info_says_which_generator_and_revisions_measured_a_file():
    result = CliRunner().invoke(
        app, ["dataset", "info", str(DATA / "h200" / "Conv3D_2.t4.json.gz"), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["generator"] == "tensor_gemm.conv"
    assert doc["generator_revisions"] == {"2": doc["configurations"]}


def test_a_corpus_that_ranks_nothing_is_not_said_to_be_missing(tmp_path):
    """Another shape whose schedules all took the same time teaches a cost model that ranks
    nothing: the dataset keeps the analytical model's prior, and the note says why, rather
    than that nothing but its own shape was given."""
    flat = _recorded(bmm(4, 128, 128, 64), "h100", None)
    flat = RecordedSpace(flat.space, np.full(len(flat.latency_s), 2e-5))
    target = _recorded(gemm(512, 512, 512), "h200", None)
    loaded = [_benchmarked("gemm", target)]
    learned, why_not = unseen_shape_priors(loaded, [flat])
    assert learned == {}
    notes = _unlearned(loaded, loaded, why_not, [tmp_path / "flat.t4.json.gz"], [flat])
    assert notes == [
        "gemm: a cost model of 1 measured shape ranks no schedule of this space above "
        "another: it keeps the analytical model's prior"
    ]
    _, why_not = unseen_shape_priors(loaded, [target])
    alone = _unlearned(loaded, loaded, why_not, [tmp_path / "own.t4.json.gz"], [target])
    assert alone == [
        "gemm: no measured space of the tensor_gemm family other than this one to learn from: "
        "it keeps the analytical model's prior"
    ]
