"""Benchmark: search strategies and peers, best-in-k-trials on recorded datasets.

Run (each writes the `pipetune bench tuner --json` document to --save):

    python -m benchmarks.bench_tuner run --dev-set ../shared/datasets --strategies auto,peers \\
        --batch 1 --seeds 30 --jobs 2 --save /tmp/after-b1.json
    python -m benchmarks.bench_tuner run --datasets A B --prior P Q --strategies auto,random \\
        --batch 8 --seeds 30 --save /tmp/transfer.json
    python -m benchmarks.bench_tuner run --datasets benchmarks/data/h100/MM_*.t4.json.gz \\
        --learned-prior benchmarks/data/h200 --strategies auto --save /tmp/learned.json

Render runs as markdown tables (per dataset and geomean, mean ± standard error, P scores),
optionally into a section of benchmarks/RESULTS.md:

    python -m benchmarks.bench_tuner render --title T --section NAME [--write] RUN.json ...

Runs of the same settings over consecutive seed ranges (`--first-seed`) merge into one:

    python -m benchmarks.bench_tuner merge --save ALL.json PART1.json PART2.json

Two runs on the same seeds (a change against the code before it, batch 8 against batch 1)
compare seed by seed: B - A per budget, geomean and per dataset, with the standard error of
the paired differences, smaller than an unpaired difference's the more of their trials the
two searches share (each seed's design and draws are the same in both):

    python -m benchmarks.bench_tuner compare BEFORE.json AFTER.json [--strategy S --against T]

Each rendered document is labelled by its file's stem ("before-b8", "after-b1", ...), or by
its folder and stem where two share a stem ("x/run", "y/run"), so a before/after table is the
documents of both, rendered together. The development set is the Kernel Tuner caches in the
shared datasets folder (the T4 copy of the A100 convolution is the same space and is left
out).

Input a mode refuses (an option out of range, a file that is not a run document, runs that
do not pool or pair) exits 2 with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.results import write_section


class Refused(SystemExit):
    """Input a mode refuses: `main` says the message on stderr and exits 2, a usage error as
    argparse's own (`raise SystemExit("message")` exited 1, the status of a failure). A
    SystemExit, so that a caller of merge or budget_list that catches nothing still stops."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = 2


def dev_set(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.kt-cache.json.gz"))


def run(args: argparse.Namespace) -> None:
    from benchmarks.campaign_data import committed_gpu_of
    from pipetune.clients.cli.bench_cmds import (
        _priors,
        asked_strategies,
        recorded_datasets,
        runnable_strategies,
    )
    from pipetune.clients.cli.errors import CliError
    from pipetune.tuner.bench import bench
    from pipetune.tuner.peers import PeerFailedError
    from pipetune.tuner.transfer import TransferError
    from pipetune.workers.datasets import DatasetError

    files = [*(dev_set(args.dev_set) if args.dev_set else []), *(args.datasets or [])]
    if not files:
        raise Refused("--datasets: give at least one dataset file (or a --dev-set of caches)")
    budgets = budget_list(args.budgets)
    try:
        # As `pipetune bench tuner` chooses: the strategies whose packages are installed,
        # then of a group those that can run on the datasets (the ones that need the
        # analytical model are left out on another kernel's recording), named ones refused.
        names, named, missing = asked_strategies(args.strategies)
        # The committed campaigns' datasets with their shipped profile, the user's own files
        # with the user's (committed_gpu_of); likewise the priors and the learned corpus.
        loaded = recorded_datasets(files, gpu_of_file=committed_gpu_of)
        names, model_left_out = runnable_strategies(names, named, loaded)
        priors = _priors(args.prior or [], loaded, gpu_of_file=committed_gpu_of)
        learned = learned_priors(loaded, args.learned_prior or [], priors)
    except (CliError, DatasetError) as exc:
        raise Refused(str(exc)) from None
    try:
        doc = bench(
            loaded,
            names,
            budgets,
            args.seeds,
            progress=lambda m: print(m, file=sys.stderr, flush=True),
            batch=args.batch,
            priors=priors,
            jobs=args.jobs,
            prior_trials=args.prior_trials,
            first_seed=args.first_seed,
            learned=learned,
            early=args.early,
        )
    except PeerFailedError as exc:  # every strategy asked for was a peer that failed
        raise Refused(f"--strategies: {exc}") from None
    except TransferError as exc:  # (as `pipetune bench tuner`: no task there to start from)
        raise Refused(f"--prior-trials: {exc}") from None
    doc["left_out"] = {**missing, **model_left_out, **doc["left_out"]}
    doc["command"] = recorded_command(sys.argv[1:])
    args.save.write_text(json.dumps(doc))


def recorded_command(argv: list[str]) -> str:
    """The run's command as a reader re-runs it from the repository root: under `-m`,
    sys.argv[0] is this file's absolute path on the machine that ran it (RESULTS.md showed
    `/work/main/benchmarks/bench_tuner.py run ...`, which runs nowhere)."""
    return shlex.join(["python", "-m", "benchmarks.bench_tuner", *argv])


def rerunnable(command: str) -> str:
    """A command recorded before `recorded_command`, with the file's path as its first word
    (`/work/main/benchmarks/bench_tuner.py run ...`), as `python -m` runs it anywhere."""
    return re.sub(
        r"(?:^|(?<= ))\S*benchmarks/bench_tuner\.py ", "python -m benchmarks.bench_tuner ", command
    )


def budget_list(text: str) -> list[int]:
    """--budgets as `pipetune bench tuner` takes it: sorted, each once, each at least 1
    (render's columns are the sorted budgets; 0 read the whole run's best)."""
    from pipetune.clients.cli.bench_cmds import _int_list
    from pipetune.clients.cli.errors import CliError

    try:
        return _int_list(text, "--budgets")
    except CliError as exc:
        raise Refused(str(exc)) from None


def learned_priors(loaded: list, corpus_paths: list[Path], priors: dict) -> dict:
    """Each of pipetune's datasets' prior learned from the --learned-prior datasets of its
    family, its own shape (tuner.learned_prior.shape_of) left out on every GPU, but for the
    datasets with a --prior (they run from it): `pipetune bench tuner --learned-prior`; the
    corpus read as `run`'s datasets (committed_gpu_of)."""
    from benchmarks.campaign_data import committed_gpu_of
    from pipetune.clients.cli.bench_cmds import _learned

    learned = _learned(corpus_paths, loaded, priors, gpu_of_file=committed_gpu_of)
    for name, prior in learned.items():
        print(f"{name}: prior {prior.source}", file=sys.stderr, flush=True)
    return learned


# What merge, compare and render read of every run document, and of each of its results.
RUN_FIELDS: dict[str, type] = {"results": list, "datasets": list, "seeds": int}
RESULT_FIELDS = ("strategy", "budget", "per_dataset")


def load_run(path: Path) -> dict:
    """A saved run (`run --save`, `merge --save`). Refused, naming the file, where it is
    none: a missing file, a folder, not JSON, or JSON of something else (each was a
    traceback, exit 1: FileNotFoundError, JSONDecodeError, KeyError)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        why: str | None = exc.strerror or str(exc)
    except ValueError as exc:  # (JSONDecodeError, UnicodeDecodeError)
        why = f"not JSON: {exc}"
    else:
        why = _not_a_run(doc)
    if why is not None:
        raise Refused(f"{path}: not a bench_tuner run document ({why})")
    return doc


def _not_a_run(doc: object) -> str | None:
    """What a JSON document lacks of a run document (None: nothing)."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    for field, kind in RUN_FIELDS.items():
        if not isinstance(doc.get(field), kind):
            return f"no {kind.__name__} {field!r}"
    if not all(isinstance(r, dict) and all(f in r for f in RESULT_FIELDS) for r in doc["results"]):
        return f"a result without {', '.join(RESULT_FIELDS)}"
    return None


def run_labels(paths: list[Path]) -> list[str]:
    """What each run is called in render's and compare's tables: as a benchmark names its
    datasets (bench_cmds.dataset_names), its file's stem, or its folder and stem where two
    files share a stem. By the stem alone, render kept the last of two runs named `run.json`
    and dropped the other without a word. Refused where two are still one name (the same
    file given twice)."""
    from pipetune.clients.cli.bench_cmds import dataset_names
    from pipetune.clients.cli.errors import CliError

    try:
        return dataset_names(paths)
    except CliError as exc:
        raise Refused(str(exc)) from None


def load_runs(paths: list[Path]) -> dict[str, dict]:
    """Each run (load_run) under its label (run_labels), in the order given."""
    return dict(zip(run_labels(paths), map(load_run, paths), strict=True))


def merge(paths: list[Path]) -> dict:
    """One document from runs of the same settings over consecutive seed ranges: pooled means
    and standard errors per dataset (exact, from each part's mean and standard error), then
    the geomean and P scores as `bench` computes them."""
    from pipetune.tuner.metrics import geomean, mean_p_score, p_score, p_score_se

    parts = sorted(map(load_run, paths), key=lambda d: d.get("first_seed", 0))
    base = parts[0]
    for nxt, prev in zip(parts[1:], parts, strict=False):
        if nxt.get("first_seed", 0) != prev.get("first_seed", 0) + prev["seeds"]:
            raise Refused("the seed ranges must be consecutive")
    for part in parts[1:]:
        if problem := _unlike(base, part):
            raise Refused(f"{problem}: runs of other settings do not pool")
    # Each part's results by (strategy, budget): by position, a strategy that one part lost
    # (a peer that failed there) put another strategy's seeds under its name.
    keyed = [{(r["strategy"], r["budget"]): r for r in d["results"]} for d in parts]
    results = []
    for r in base["results"]:
        key = (r["strategy"], r["budget"])
        per = {}
        for ds in base["datasets"]:
            cells = [
                (d["seeds"], k[key]["per_dataset"][ds]) for d, k in zip(parts, keyed, strict=True)
            ]
            n = sum(c[0] for c in cells)
            mean = sum(k * c["best_in_k"] for k, c in cells) / n
            # pooled variance: within-part sums of squares plus between-part spread
            ss = sum((k - 1) * (c["se"] * np.sqrt(k)) ** 2 for k, c in cells)
            ss += sum(k * (c["best_in_k"] - mean) ** 2 for k, c in cells)
            se = float(np.sqrt(ss / (n - 1) / n))
            rnd = cells[0][1]["random"]
            per[ds] = {
                "best_in_k": mean,
                "se": se,
                "p_score": p_score(mean, rnd),
                "p_se": p_score_se(se, rnd),
                "random": rnd,
            }
            if all("per_seed" in c for _, c in cells):  # (older runs do not have them)
                per[ds]["per_seed"] = [v for _, c in cells for v in c["per_seed"]]
        g = geomean([v["best_in_k"] for v in per.values()])
        p_mean, p_se = mean_p_score(per)
        # (As bench's _summary: a dataset nothing succeeded on has no relative error.)
        rel = [v["se"] / v["best_in_k"] if v["best_in_k"] > 0 else 0.0 for v in per.values()]
        results.append(
            {
                "strategy": r["strategy"],
                "budget": r["budget"],
                "best_in_k": g,
                "se": float(g * np.sqrt(np.sum(np.square(rel))) / len(per)),
                "p_score": p_mean,
                "p_se": p_se,
                "per_dataset": per,
            }
        )
    command = " + ".join(d.get("command", "?") for d in parts)
    seeds = sum(d["seeds"] for d in parts)
    return {**base, "results": results, "seeds": seeds, "command": command}


# What must agree for two runs' seeds to pool: the same searches on the same spaces.
# (peer_rules: how the peers were run; a run from before them pools only where they are empty)
POOLED_SETTINGS = (
    "datasets",
    "batch",
    "early",
    "priors",
    "prior_trials",
    "learned_priors",
    "peer_rules",
)


def _unlike(a: dict, b: dict) -> str | None:
    """How two saved runs differ in what they measured (None where their seeds pool)."""
    for key in POOLED_SETTINGS:
        # (A document from before a setting existed says nothing of it: its default.)
        default = 8 if key == "batch" else None
        in_a, in_b = a.get(key, default) or None, b.get(key, default) or None
        if in_a != in_b:
            return f"{key} differ ({in_a!r} against {in_b!r})"
    for what, field in (("strategies", "strategy"), ("budgets", "budget")):
        in_a = sorted({r[field] for r in a["results"]})
        in_b = sorted({r[field] for r in b["results"]})
        if in_a != in_b:
            return f"{what} differ ({in_a} against {in_b})"
    return None


class CompareError(ValueError):
    """Two runs that cannot be compared seed by seed (the message says why)."""


def _per_seed(doc: dict, label: str, strategy: str | None) -> tuple[str, dict[int, dict]]:
    """A run's strategy (the only one, or the one named) and its per-dataset results by
    budget, each with its seeds' figures."""
    strategies = list(dict.fromkeys(r["strategy"] for r in doc["results"]))
    if strategy is None:
        if len(strategies) != 1:
            raise CompareError(f"{label} has strategies {', '.join(strategies)}: name one")
        strategy = strategies[0]
    if strategy not in strategies:
        raise CompareError(f"{label} has no strategy '{strategy}' ({', '.join(strategies)})")
    rows = {r["budget"]: r["per_dataset"] for r in doc["results"] if r["strategy"] == strategy}
    for per in rows.values():
        if any("per_seed" not in cell for cell in per.values()):
            raise CompareError(f"{label} was saved without per-seed figures: run it again")
    return strategy, rows


def compare(paths: list[Path], strategies: tuple[str | None, str | None]) -> str:
    """Run B against run A on the same seeds and datasets: per budget, the difference of
    the geomean (B - A) and of each dataset's mean, with standard errors of the paired
    differences (the same seed's design and draws on both sides), as markdown."""
    from pipetune.tuner.metrics import paired_difference, paired_geomean_difference

    (label_a, a), (label_b, b) = load_runs(paths).items()
    for key in ("first_seed", "seeds"):
        if a.get(key, 0) != b.get(key, 0):
            raise CompareError(f"{key}: {a.get(key, 0)} in {label_a}, {b.get(key, 0)} in {label_b}")
    if a["datasets"] != b["datasets"]:
        raise CompareError(f"{label_a} and {label_b} ran on different datasets")
    name_a, rows_a = _per_seed(a, label_a, strategies[0])
    name_b, rows_b = _per_seed(b, label_b, strategies[1])
    budgets = [k for k in rows_a if k in rows_b]
    if not budgets:
        raise CompareError(f"{label_a} and {label_b} share no budget")

    def cell(difference: tuple[float, float]) -> str:
        return f"{difference[0]:+.3f} ± {difference[1]:.3f}"

    head = "| B - A | " + " | ".join(f"k={k}" for k in budgets) + " |"
    lines = [head, "|---|" + "---:|" * len(budgets)]
    seeds = {k: {ds: rows_a[k][ds]["per_seed"] for ds in a["datasets"]} for k in budgets}
    seeds_b = {k: {ds: rows_b[k][ds]["per_seed"] for ds in a["datasets"]} for k in budgets}
    lines.append(
        "| geomean | "
        + " | ".join(cell(paired_geomean_difference(seeds[k], seeds_b[k])) for k in budgets)
        + " |"
    )
    for ds in a["datasets"]:
        lines.append(
            f"| {ds} | "
            + " | ".join(cell(paired_difference(seeds[k][ds], seeds_b[k][ds])) for k in budgets)
            + " |"
        )
    first = a.get("first_seed", 0)
    lines += [
        "",
        f"A = `{label_a}` ({name_a}, {_batch(a, name_a)}), B = `{label_b}` ({name_b}, "
        f"{_batch(b, name_b)}), seeds {first}..{first + a['seeds'] - 1} in both; "
        "mean ± standard error of the seeds' paired differences.",
    ]
    return "\n".join(lines)


def _batch(doc: dict, strategy: str) -> str:
    """How a run's strategy proposed its trials: a peer one at a time (the run's `batch` is
    pipetune's), pipetune's strategies in the run's batches."""
    from pipetune.tuner.peers import PEERS

    if strategy in PEERS:
        return f"batch {doc.get('peer_batch', 1)} (peer)"
    return f"batch {doc.get('batch', 8)}"


def _run_per_budget(doc: dict) -> list[str]:
    """The run's peers that ran once per budget: those of its peer_rules that plan by their
    budget (a run saved before the rules ran every peer once, at its largest budget)."""
    from pipetune.tuner.peers import PLANS_BY_BUDGET

    return [s for s in doc.get("peer_rules", {}) if s in PLANS_BY_BUDGET]


def _cell(r: dict) -> str:
    # Documents written before standard errors were reported carry the mean only.
    se = r.get("se")
    return f"{r['best_in_k']:.3f}" + (f" ± {se:.3f}" if se is not None else "")


def _by_budget(doc: dict, strategy: str, budgets: list[int]) -> list[dict | None]:
    """The strategy's result at each of the table's budgets (None where the run has none):
    the columns are the budgets sorted, whatever order a run stored them in."""
    found = {r["budget"]: r for r in doc["results"] if r["strategy"] == strategy}
    return [found.get(k) for k in budgets]


def render(paths: list[Path]) -> str:
    from pipetune.clients.library.labels import SIMULATED_LABEL

    docs = load_runs(paths)
    first = next((d for d in docs.values() if "random" in d), next(iter(docs.values())))
    budgets = sorted({r["budget"] for r in first["results"]})
    datasets = first["datasets"]
    # Datasets whose latencies are the analytical model's (tuner.bench's `simulated`): on
    # them the model's own strategies are scored against its own predictions.
    simulated = {ds for doc in docs.values() for ds in doc.get("simulated", ())}
    head = "| run | strategy | " + " | ".join(f"k={k}" for k in budgets) + " |"
    rule = "|---|---|" + "---:|" * len(budgets)
    lines = ["### Geomean over datasets (P score below each row)", ""]
    if simulated_here := [ds for ds in datasets if ds in simulated]:
        lines += [
            f"{len(simulated_here)} of the {len(datasets)} datasets are {SIMULATED_LABEL}: "
            + ", ".join(simulated_here)
            + ".",
            "",
        ]
    lines += [head, rule]
    for label, doc in docs.items():
        if doc["datasets"] != datasets:
            continue  # a geomean over other datasets does not compare
        for strategy in dict.fromkeys(r["strategy"] for r in doc["results"]):
            rows = _by_budget(doc, strategy, budgets)
            lines.append(
                f"| {label} | {strategy} | "
                + " | ".join("" if r is None else _cell(r) for r in rows)
                + " |"
            )
            lines.append(
                "| | P score | "
                + " | ".join(
                    ""
                    if r is None
                    else "n/a"  # (random search reaches the optimum on every dataset)
                    if r["p_score"] is None
                    else f"{r['p_score']:+.2f}" + (f" ± {r['p_se']:.2f}" if "p_se" in r else "")
                    for r in rows
                )
                + " |"
            )
    for ds in datasets:
        prior = first.get("priors", {}).get(ds)
        title = f"### {ds}" + (f" ({SIMULATED_LABEL})" if ds in simulated else "")
        lines += ["", title + (f" (prior: {prior})" if prior else ""), "", head, rule]
        lines.append(
            "| | random (exact) | "
            + " | ".join(f"{first['random'][ds][str(k)]:.3f}" for k in budgets)
            + " |"
        )
        for label, doc in docs.items():
            if ds not in doc["datasets"]:
                continue
            for strategy in dict.fromkeys(r["strategy"] for r in doc["results"]):
                rows = _by_budget(doc, strategy, budgets)
                lines.append(
                    f"| {label} | {strategy} | "
                    + " | ".join("" if r is None else _cell(r["per_dataset"][ds]) for r in rows)
                    + " |"
                )
    lines += ["", "Runs:"]
    for label, doc in docs.items():
        lines.append(
            f"- `{label}`: {doc['seeds']} seeds ({doc.get('first_seed', 0)}.."
            f"{doc.get('first_seed', 0) + doc['seeds'] - 1}), pipetune batch "
            f"{doc.get('batch', 8)}"
            + (
                f" (each proposed with {doc['early']} trials unmeasured)"
                if doc.get("early")
                else ""
            )
            + ", peers one trial at a time"
            + (
                f" ({', '.join(per_budget)} run once per budget: they plan by it)"
                if (per_budget := _run_per_budget(doc))
                else ""
            )
            + f"; `{rerunnable(doc.get('command', '?'))}`"
        )
        # What was asked for and is in no table (a peer that failed, a strategy that needs
        # the analytical model on another kernel's recording, a package not installed).
        lines += [f"  - left out: {why}" for why in doc.get("left_out", {}).values()]
    return "\n".join(lines)


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high` (None: no bound), the limits that
    `pipetune bench tuner` declares for the same option (--batch 0 ran no trial and wrote
    best-in-k 0.0, --seeds 0 a document of NaN)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"at least {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def main() -> None:
    from pipetune.clients.cli.bench_cmds import MAX_SEEDS, max_jobs
    from pipetune.model.wire import MAX_BATCH_SIZE

    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("--dev-set", type=Path)
    r.add_argument("--datasets", type=Path, nargs="*")
    r.add_argument("--prior", type=Path, nargs="*")
    r.add_argument("--prior-trials", type=_int_in(1))
    r.add_argument(
        "--learned-prior",
        type=Path,
        nargs="*",
        help="measured datasets (files or folders) whose cost model is the prior of each"
        " dataset of the same family, its own shape left out",
    )
    r.add_argument("--strategies", default="auto,peers")
    r.add_argument("--budgets", default="10,20,50,100")
    r.add_argument("--batch", type=_int_in(1, MAX_BATCH_SIZE), default=8)
    r.add_argument(
        "--early",
        type=_int_in(0),
        default=0,
        help="propose each batch while this many trials of the batch before it are"
        " unmeasured (the service's early proposals: PIPETUNE_PROPOSE_EARLY of the batch)",
    )
    r.add_argument("--seeds", type=_int_in(1, MAX_SEEDS), default=30)
    r.add_argument("--jobs", type=_int_in(1, max_jobs()), default=1)
    r.add_argument("--first-seed", type=_int_in(0), default=0)
    r.add_argument("--save", type=Path, required=True)
    m = sub.add_parser("merge")
    m.add_argument("docs", type=Path, nargs="+")
    m.add_argument("--save", type=Path, required=True)
    c = sub.add_parser("compare", help="run B against run A, seed by seed")
    c.add_argument("docs", type=Path, nargs=2, metavar="RUN.json", help="A, then B")
    c.add_argument("--strategy", help="A's strategy (needed where A ran several)")
    c.add_argument("--against", help="B's strategy (default: --strategy, or B's only one)")
    w = sub.add_parser("render")
    w.add_argument("docs", type=Path, nargs="+")
    w.add_argument("--title", default="Tuner on recorded spaces")
    w.add_argument("--section")
    w.add_argument("--preamble", default="")
    w.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.mode == "run" and args.early > args.batch - 1:  # (as `pipetune bench tuner`)
        r.error(f"--early: at most --batch - 1 ({args.batch - 1}), got {args.early}")
    if args.mode == "run" and args.prior_trials is not None and not args.prior:
        # (Recorded, and ignored: a prior of N trials of nothing.)
        r.error("--prior-trials: give the --prior dataset the trials are taken from")
    try:
        _run_mode(args)
    except (Refused, CompareError) as exc:
        print(f"{args.mode}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run_mode(args: argparse.Namespace) -> None:
    """The mode `main` parsed, run."""
    if args.mode == "run":
        run(args)
        return
    if args.mode == "merge":
        args.save.write_text(json.dumps(merge(args.docs)))
        return
    if args.mode == "compare":
        print(compare(args.docs, (args.strategy, args.against or args.strategy)))
        return
    body = (args.preamble + "\n\n" if args.preamble else "") + render(args.docs)
    print(body)
    if args.write and args.section:
        write_section(args.section, args.title, body)


if __name__ == "__main__":
    main()
