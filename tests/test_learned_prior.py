"""A prior mean learned from other spaces' measurements (tuner/learned_prior.py), and the
tuner benchmark's use of it (a learned prior per dataset, its own workload left out)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipetune.model.analytical import evaluate
from pipetune.model.cost_model import predicted_log_throughput
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import MemSpace
from pipetune.model.memops.workloads import softmax
from pipetune.model.space import Space
from pipetune.model.workloads import bmm, gemm
from pipetune.tuner.bench import Dataset, bench
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.learned_prior import LearnedPriorError, corpus_for, learned_prior
from pipetune.tuner.offline import RecordedSpace
from pipetune.tuner.recorded import RecordedConfigs


def one_stage_twice_as_slow(space: Space) -> RecordedSpace:
    """'Measurements' with an effect the analytical model lacks: one-stage schedules 2x slower."""
    factor = np.where(space.knobs["smem_stages"] == 1, 2.0, 1.0)
    return RecordedSpace(space, evaluate(space).T_kernel * factor)


@pytest.fixture(scope="module")
def corpus(h100) -> list[RecordedSpace]:
    h200 = get_gpu("h200")
    return [
        one_stage_twice_as_slow(Space.enumerate(gemm(1024, 1024, 1024), h200)),
        one_stage_twice_as_slow(Space.enumerate(bmm(12, 512, 512, 64), h100)),
    ]


def test_the_corpus_is_the_same_family_without_the_space_itself(h100, corpus):
    target = Space.enumerate(gemm(1024, 1024, 1024), h100)  # measured on the H200 only
    memops = RecordedSpace(
        MemSpace.enumerate(softmax(4096, 768), h100), np.full(1, 1e-5)
    )  # another family: its features are other columns
    own = RecordedSpace(target, evaluate(target).T_kernel)
    assert corpus_for(target, [*corpus, memops, own]) == corpus


def test_the_learned_prior_carries_the_measured_effect_to_a_new_shape(h100, corpus):
    carried = []
    for workload in (gemm(2048, 768, 3072), gemm(512, 512, 2048), bmm(16, 256, 256, 128)):
        space = Space.enumerate(workload, h100)
        prior = learned_prior(space, corpus)
        assert prior.values.shape == (len(space),) and prior.recorded is None
        assert "2 measured shapes on h100, h200" in prior.source
        gap = prior.values - predicted_log_throughput(space)
        one_stage = space.knobs["smem_stages"] == 1
        carried.append(np.median(gap[~one_stage]) - np.median(gap[one_stage]))
    # The learned log 2 (0.69): the prior is the learned model's (which reads the analytical
    # model's terms, which know nothing of the effect). How much of it two shapes' trees
    # carry to a third varies by shape (0.27-0.71 here), so the mean over three shapes is
    # what is checked: more than half, never much more than all.
    assert 0.35 < np.mean(carried) < 0.8, carried


def test_the_prior_sits_where_the_corpus_measured_against_the_model(h100):
    """The learned model ranks; the prior's level (what a lookup reports as the pick's time)
    is the analytical model's, moved by how far the corpus measured from it."""
    corpus = [
        RecordedSpace(s, evaluate(s).T_kernel * 3.0)  # every schedule 3x slower than modelled
        for s in (Space.enumerate(w, h100) for w in (gemm(1024, 1024, 1024), gemm(512, 2048, 256)))
    ]
    space = Space.enumerate(gemm(2048, 768, 3072), h100)
    prior = learned_prior(space, corpus)
    modelled = np.median(predicted_log_throughput(space))
    assert np.median(prior.values) == pytest.approx(modelled - np.log(3.0), abs=1e-9)


def test_nothing_to_learn_from_is_a_clear_error(h100):
    space = Space.enumerate(gemm(512, 512, 512), h100)
    with pytest.raises(LearnedPriorError, match="tensor_gemm family"):
        learned_prior(space, [RecordedSpace(space, evaluate(space).T_kernel)])


def test_the_benchmark_hands_the_learned_prior_to_the_strategies_that_take_one(h100):
    space = Space.enumerate(gemm(512, 256, 1024), h100)
    # Measurements the analytical model ranks backwards...
    rec = RecordedSpace(space, 1e-8 / evaluate(space).T_kernel)
    ds = Dataset("noisy", RecordedConfigs.from_recorded_space("noisy", rec), rec)
    # ... and a prior that knows them (what a perfect cost model would learn).
    oracle = PriorMean(values=-np.log(rec.latency_s), source="the measurements themselves")
    with_prior = bench([ds], ["auto", "random"], [8], seeds=2, learned={ds.name: oracle})
    without = bench([ds], ["auto", "random"], [8], seeds=2)
    assert with_prior["learned_priors"] == {"noisy": "the measurements themselves"}
    by = {
        (label, r["strategy"]): r["best_in_k"]
        for label, doc in (("with", with_prior), ("without", without))
        for r in doc["results"]
    }
    assert by[("with", "random")] == by[("without", "random")]  # random takes no prior
    assert by[("with", "auto")] == 1.0 > by[("without", "auto")]  # the prior's best first


def test_the_benchmark_says_no_learned_prior_where_a_recorded_prior_drove_the_runs(h100):
    """A dataset given both a recorded prior (--prior) and a learned one runs from the
    recorded one: the document must not name the learned prior as its prior too."""
    workload = gemm(512, 256, 1024)
    space = Space.enumerate(workload, h100)
    rec = RecordedSpace(space, evaluate(space).T_kernel)
    ds = Dataset("here", RecordedConfigs.from_recorded_space("here", rec), rec)
    there = Space.enumerate(workload, get_gpu("h200"))
    other = RecordedSpace(there, evaluate(there).T_kernel)
    prior = Dataset("there", RecordedConfigs.from_recorded_space("there", other), other)
    learned = PriorMean(values=-np.log(rec.latency_s)[::-1].copy(), source="a learned one")
    both = bench([ds], ["auto"], [8], seeds=1, priors={"here": prior}, learned={"here": learned})
    recorded_only = bench([ds], ["auto"], [8], seeds=1, priors={"here": prior})
    assert both["results"] == recorded_only["results"]  # the learned prior was not used
    assert both["priors"] == {"here": "there"}
    assert both["learned_priors"] == {}


def test_the_benchmark_leaves_the_datasets_own_workload_out_on_every_gpu(tmp_path):
    """`bench_tuner run --learned-prior`: the H200's record of the same operator is not
    learned from (the shape must be unseen), the H200's other operator is."""
    import shutil
    from pathlib import Path

    from benchmarks.bench_tuner import learned_priors
    from pipetune.clients.cli.bench_cmds import recorded_dataset

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    for name in ("BMM_BERT_QK", "MM_RN50_FC", "Softmax_BERT_b1_s128"):
        shutil.copy(data / "h200" / f"{name}.t4.json.gz", tmp_path)
    target = recorded_dataset(data / "h100" / "BMM_BERT_QK.t4.json.gz")
    memops = recorded_dataset(data / "h100" / "Softmax_BERT_b1_s128.t4.json.gz")
    priors = learned_priors([target, memops], [tmp_path], {})
    assert priors[target.name].source.endswith("a cost model of 1 measured shape on h200")
    assert memops.name not in priors  # its own shape is the folder's only memops record


def test_pipetune_bench_tuner_takes_a_learned_prior(tmp_path):
    import json
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    shutil.copy(data / "h200" / "MM_RN50_FC.t4.json.gz", tmp_path)
    target = str(data / "h100" / "BMM_BERT_QK.t4.json.gz")
    args = ["bench", "tuner", "--dataset", target, "--strategies", "auto", "--seeds", "1"]
    result = CliRunner().invoke(
        app, [*args, "--budgets", "8", "--learned-prior", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (source,) = doc["learned_priors"].values()
    assert source.endswith("a cost model of 1 measured shape on h200")
    table = CliRunner().invoke(app, [*args, "--budgets", "8", "--learned-prior", str(tmp_path)])
    assert table.exit_code == 0, table.output
    # (the table said nothing of it; how the title wraps follows the table's width)
    assert "(learned prior: " in " ".join(table.output.split())
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = CliRunner().invoke(app, [*args, "--learned-prior", str(empty)])
    assert refused.exit_code == 2 and "no *.t4.json.gz dataset" in refused.output


def test_a_learned_prior_refuses_simulated_datasets_and_says_what_teaches_nothing(tmp_path):
    """`pipetune bench tuner --learned-prior` took a simulated dataset as measurements (the
    service never learns from simulated trials), and dropped without a word a dataset left
    with nothing to learn from and a file of another family."""
    import gzip
    import json
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(data / "h200" / "Softmax_BERT_b1_s128.t4.json.gz", corpus)  # its own shape
    shutil.copy(data / "h200" / "MM_RN50_FC.t4.json.gz", corpus)  # another family
    target = str(data / "h100" / "Softmax_BERT_b1_s128.t4.json.gz")
    args = ["bench", "tuner", target, "--strategies", "auto", "--seeds", "1", "--budgets", "4"]
    result = CliRunner().invoke(app, [*args, "--learned-prior", str(corpus), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["learned_priors"] == {}  # stdout stays the document
    said = " ".join(result.stderr.split())
    assert (
        "note: --learned-prior: Softmax_BERT_b1_s128: no measured space of the memops family "
        "other than this one to learn from: it keeps the analytical model's prior" in said
    )
    assert (
        "note: --learned-prior: MM_RN50_FC.t4.json.gz (tensor_gemm) is of no benchmarked "
        "dataset's family: it teaches nothing here" in said
    )

    doc = json.loads(gzip.decompress((data / "h200" / "MM_RN50_FC.t4.json.gz").read_bytes()))
    doc["metadata"]["pipetune"]["runner"] = "simulated"
    simulated = tmp_path / "MM_sim.t4.json.gz"
    simulated.write_bytes(gzip.compress(json.dumps(doc).encode()))
    refused = CliRunner().invoke(app, [*args, "--learned-prior", str(simulated)])
    assert refused.exit_code == 2, refused.output
    assert (
        "--learned-prior: MM_sim.t4.json.gz holds simulated results, not GPU measurements"
        in " ".join(refused.output.split())
    )


def test_a_model_that_ranks_nothing_is_no_prior(h100):
    """One measured trial of one shape (a one-record import): the trees predict one value
    over a whole new space, and that flat prior replaced the analytical model's ranking."""
    from pipetune.model.family import family_of

    source = Space.enumerate(gemm(1024, 1024, 1024), get_gpu("h200"))
    fam = family_of(source.workload)
    one = {k: np.asarray(source.knobs[k][:1]) for k in fam.knob_names}
    corpus = [RecordedSpace(fam.space_of(source.workload, source.gpu, one), np.array([2e-5]))]
    space = Space.enumerate(gemm(2048, 768, 3072), h100)
    with pytest.raises(LearnedPriorError, match="ranks no schedule of this space above another"):
        learned_prior(space, corpus)


def test_a_dataset_run_from_its_recorded_prior_is_not_said_to_keep_the_analytical_one():
    """`bench tuner --prior X --learned-prior Y`: a dataset with a recorded prior runs from it;
    the note said it kept the analytical model's prior, and a learned one was fitted for it."""
    from pathlib import Path

    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    args = [
        "bench",
        "tuner",
        str(data / "h200" / "BMM_BERT_QK.t4.json.gz"),
        "--prior",
        str(data / "h100" / "BMM_BERT_QK.t4.json.gz"),
        "--learned-prior",
        str(data / "h100" / "BMM_GPT2_QK.t4.json.gz"),
        "--strategies",
        "auto",
        "--seeds",
        "1",
        "--budgets",
        "4",
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["priors"] == {"BMM_BERT_QK": "BMM_BERT_QK"} and doc["learned_priors"] == {}
    said = " ".join(result.stderr.split())
    assert "keeps the analytical model's prior" not in said
    assert "note: --learned-prior: BMM_BERT_QK runs from its --prior: no learned prior there" in (
        said
    )


def test_the_benchmark_script_fits_no_learned_prior_where_a_recorded_prior_drives_the_runs(
    tmp_path, monkeypatch, capsys
):
    """`python -m benchmarks.bench_tuner run --prior X --learned-prior Y`, as `bench tuner`:
    the script fitted a learned prior for the dataset with a --prior too, and named it as
    that dataset's prior beside the run, while the runs used the recorded one."""
    import sys
    from pathlib import Path

    from benchmarks import bench_tuner

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    out = tmp_path / "run.json"
    args = ["run", "--datasets", str(data / "h200" / "BMM_BERT_QK.t4.json.gz")]
    args += ["--prior", str(data / "h100" / "BMM_BERT_QK.t4.json.gz")]
    args += ["--learned-prior", str(data / "h100" / "BMM_GPT2_QK.t4.json.gz")]
    args += ["--strategies", "auto", "--seeds", "1", "--budgets", "4", "--save", str(out)]
    monkeypatch.setattr(sys, "argv", ["bench_tuner", *args])
    bench_tuner.main()
    doc = json.loads(out.read_text())
    assert doc["priors"] == {"BMM_BERT_QK": "BMM_BERT_QK"} and doc["learned_priors"] == {}
    said = " ".join(capsys.readouterr().err.split())
    assert "BMM_BERT_QK: prior " not in said
    assert "note: --learned-prior: BMM_BERT_QK runs from its --prior: no learned prior there" in (
        said
    )
