"""`pipetune bench tuner`: search strategies and peers on recorded datasets, offline."""

from __future__ import annotations

import sys
from collections.abc import Collection
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import typer
from rich.table import Table

from pipetune.clients.cli.errors import CliError, reported
from pipetune.clients.cli.output import console, print_json, stderr_console
from pipetune.clients.library.labels import SIMULATED_LABEL
from pipetune.model.trials import is_measured
from pipetune.model.wire import MAX_BATCH_SIZE, StrategyName
from pipetune.tuner.peers import (
    LIGHT_PEERS,
    PEERS,
    PeerFailedError,
    peer_time_limit_s,
    unavailable,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipetune.tuner.bench import Dataset

    # For each dataset file, the spec of its GPU key to evaluate it with (recorded_dataset's
    # gpu_of), or None for get_gpu's (this user's profile first).
    GpuOfFile = Callable[[Path], Callable[[str], Any] | None]

# The tuner (XGBoost, SciPy) and the dataset readers load only when a benchmark runs, so
# every other `pipetune` command starts without them.
STRATEGIES: tuple[str, ...] = get_args(StrategyName)
ALL_STRATEGIES = (*STRATEGIES, *PEERS)  # every name --strategies accepts

bench_app = typer.Typer(help="Offline benchmarks on recorded datasets (no GPU needed).")

GROUPS = {"ours": STRATEGIES, "peers": LIGHT_PEERS, "all": (*STRATEGIES, *LIGHT_PEERS)}

# Runs per strategy and dataset: more than enough for any standard error (the benchmark's
# result arrays are seeds x budgets; an unbounded count was a MemoryError, exit 1).
MAX_SEEDS = 10_000


def _name_levels(path: Path) -> tuple[str, ...]:
    """A file's names, shortest first: its stem; its folder and stem; its name without
    the .json and .gz endings (convolution_A100.t4 beside convolution_A100.kt-cache, the
    same space in two formats); its folder and that; its whole path."""
    stem = path.name.split(".")[0]
    name = path.name
    for ending in (".gz", ".json"):
        name = name.removesuffix(ending)
    resolved = path.resolve()
    folder = resolved.parent.name
    return stem, f"{folder}/{stem}", name, f"{folder}/{name}", str(resolved)


def dataset_names(paths: list[Path]) -> list[str]:
    """What each dataset is called in a benchmark's tables and JSON: its file's stem, or,
    where another file shares it, the shortest of its longer names that no other file
    shares (`_name_levels`: h100/MM_RN50_FC beside h200/MM_RN50_FC). Results are kept per
    name, so two datasets under one name would be merged into one (the last file's
    figures reported for both): the same file given twice is refused."""
    levels = [_name_levels(p) for p in paths]
    names = []
    for i, own in enumerate(levels):
        others = [other for j, other in enumerate(levels) if j != i]
        names.append(
            next(
                (name for n, name in enumerate(own) if all(o[n] != name for o in others)),
                own[-1],
            )
        )
    for i, name in enumerate(names):
        if name in names[:i]:
            raise CliError(f"{paths[i]}: given twice", 2)
    return names


def recorded_datasets(paths: list[Path], *, gpu_of_file: GpuOfFile | None = None) -> list[Dataset]:
    """The datasets of a benchmark run, each under its own name (`dataset_names`). One in
    which nothing ran has no optimum to normalise best-in-k by (its table would be NaN) and
    is refused (DatasetError)."""
    from pipetune.workers.datasets import DatasetError

    loaded = [
        _recorded(p, gpu_of_file, n) for p, n in zip(paths, dataset_names(paths), strict=True)
    ]
    for ds in loaded:
        if ds.lacking and not ds.quarantined:
            # Best-in-k is measured against the space's optimum: over a partial recording (a
            # task's export, a sweep with --limit) a search of its few schedules scored 1.000
            # against the best of what it holds. (The replay runner refuses one the same way.)
            raise DatasetError(
                f"{ds.name} holds {len(ds.configs.configs)} of the "
                f"{len(ds.configs.configs) + ds.lacking} schedules of its workload's valid "
                "space: a search is scored against the optimum of an exhaustive sweep "
                "(`pipetune sweep` without --limit), which a partial recording does not know"
            )
        if not len(ds.configs.configs):
            raise DatasetError(f"{ds.name}: no configuration recorded: nothing to search")
        if not (ds.configs.throughput > 0).any():
            raise DatasetError(
                f"{ds.name}: every configuration failed: no optimum to measure a search against"
            )
    return loaded


def recorded_dataset(
    path: Path, name: str | None = None, *, gpu_of: Callable[[str], Any] | None = None
) -> Dataset:
    """A dataset file as the tuner sees it: pipetune's own (any kernel family: GEMMs,
    memory-intensive operators) with its family's schedule space, or a foreign recorded
    space (Kernel Tuner cache, T4 of another kernel) by its knobs. `name`: what the results
    call it (default: the file's stem). `gpu_of`: the spec of the dataset's GPU key
    (default: get_gpu, with this user's profile)."""
    import numpy as np

    from pipetune.model.hardware import get_gpu
    from pipetune.tuner.bench import Dataset
    from pipetune.tuner.offline import RecordedSpace
    from pipetune.tuner.recorded import RecordedConfigs
    from pipetune.workers.datasets import DatasetError, check_pipetune, load_dataset
    from pipetune.workers.datasets.pipetune import record_revision

    ds = load_dataset(path)
    name = name or path.name.split(".")[0]
    times = ds.times_ms()
    objective = np.where(np.isfinite(times) & (times > 0), times, np.inf)
    if "pipetune" not in ds.metadata:
        # The records' own configurations, not copies (Dataset.configurations): the records
        # are dropped on return, and a copy held a second million dicts at the peak.
        configs = [r.configuration for r in ds.records]
        present = {
            k: _distinct_values(str(path), k, list(map(itemgetter(k), configs))) for k in ds.knobs
        }
        kt = ds.metadata.get("kernel_tuner", {}).get("tune_params")
        if isinstance(kt, dict) and set(kt) >= set(ds.knobs):
            # (A value listed twice is one value: Kernel Tuner's own search space, which the
            # peers build from this list, refuses the duplicate configurations it makes.)
            params = {k: _distinct_values(str(path), k, list(kt[k])) for k in ds.knobs}
        else:
            params = {k: sorted(present[k], key=_value_order) for k in ds.knobs}
        return Dataset(name, RecordedConfigs(name, params, configs, objective))
    info = check_pipetune(ds)
    full = info.family.enumerate(info.workload, (gpu_of or get_gpu)(info.gpu))
    position = {s.id: i for i, s in enumerate(full)}
    rows, latency, revisions = [], [], []
    for record, ms in zip(ds.records, objective, strict=True):
        row = position.get(info.family.parse_schedule(dict(record.configuration)).id)
        if row is not None:  # a schedule outside today's valid space cannot be proposed
            rows.append(row)
            latency.append(ms * 1e-3)
            revisions.append(record_revision(record))
    if not rows:
        raise DatasetError(f"{name}: none of its schedules is in the current valid space")
    order = np.argsort(rows)
    recorded = RecordedSpace(
        full.subset(np.array(rows)[order]), np.array(latency)[order], np.array(revisions)[order]
    )
    configs = RecordedConfigs.from_recorded_space(name, recorded)
    # The valid schedules it lacks (a campaign's sweep lacks those of quarantined knob
    # values by design, and says which: `quarantined`).
    lacking = len(full) - len(set(rows))
    quarantined = bool(ds.metadata["pipetune"].get("quarantined"))
    return Dataset(name, configs, recorded, info.runner, lacking=lacking, quarantined=quarantined)


def _recorded(path: Path, gpu_of_file: GpuOfFile | None, name: str | None = None) -> Dataset:
    """recorded_dataset with the GPU spec `gpu_of_file` chooses for this file (None: get_gpu's,
    with this user's profile)."""
    return recorded_dataset(path, name, gpu_of=gpu_of_file(path) if gpu_of_file else None)


def _value_order(value: Any) -> tuple:
    """Where a knob value goes in its knob's list of values, for a file that lists none (a
    T4 file): numbers in numeric order, then any other value by its type and text. The
    search reads a value's index as its position on an ordered knob (ForeignSpace), and
    ordered as text (1, 16, 2, 32, 4) a block size's neighbours were not its neighbours: the
    same space scored otherwise as a T4 file than as the Kernel Tuner cache it came from."""
    if isinstance(value, int | float):  # (bools too: False < True)
        return (0, value, "")
    return (1, type(value).__name__, str(value))


def _distinct_values(name: str, knob: str, values: list) -> list:
    """A knob's values, each once (in order); DatasetError where two of them differ only in
    type (1, 1.0, True): a file keeps them apart, but the search compares configurations by
    value (RecordedConfigs.row_of, the peers' spaces), which made them one configuration, the
    others' trials scored with the last one's time."""
    from pipetune.workers.datasets import DatasetError
    from pipetune.workers.datasets.records import shown

    if len(set(map(type, values))) == 1:
        # One type (every knob of a well-formed file): equal values are the same value, and
        # deduplicating them in C is what the per-value tuples below give (4 s of a million
        # configurations of 17 knobs).
        return list(dict.fromkeys(values))
    typed = list(dict.fromkeys((type(v).__name__, v) for v in values))
    by_value: dict = {}
    for _, v in typed:
        if v in by_value:
            raise DatasetError(
                f"{name}: knob {shown(knob)} has values {shown(by_value[v])} and {shown(v)}, "
                "equal as numbers but of different types: the tuner cannot tell them apart"
            )
        by_value[v] = v
    return [v for _, v in typed]


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CliError(f"{option}: expected comma-separated integers, got {text!r}", 2) from None
    if not values or min(values) < 1:
        raise CliError(f"{option}: every value must be at least 1, got {text!r}", 2)
    return sorted(set(values))


def _strategies(text: str) -> tuple[list[str], set[str]]:
    """The strategies asked for, in order, and those of them named on their own (not only
    through a group: a group's member that cannot run on the datasets is left out, a
    strategy named on its own is refused)."""
    names: list[str] = []
    named: set[str] = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part not in GROUPS:
            named.add(part)
        for name in GROUPS.get(part, (part,)):
            if name not in ALL_STRATEGIES:
                known = ", ".join((*ALL_STRATEGIES, *GROUPS))
                raise CliError(f"--strategies: unknown strategy '{name}'; known: {known}", 2)
            if name not in names:
                names.append(name)
    if not names:  # ("" or ","): a benchmark of nothing would print empty tables, exit 0
        raise CliError("--strategies: name at least one strategy or group", 2)
    return names, named


def installed_strategies(names: list[str], named: set[str]) -> tuple[list[str], dict[str, str]]:
    """The strategies whose packages are installed, and why each other one was left out,
    said before anything runs: a peer's missing package was found only once the strategies
    before it had run, and ended the benchmark as an unexpected error (exit 1). Named on
    its own such a peer is refused (CliError), of a group left out, as runnable_strategies
    does."""
    missing = {name: why for name in names if (why := unavailable(name))}
    if refused := [name for name in missing if name in named]:
        raise CliError(f"--strategies: {refused[0]} cannot run here: {missing[refused[0]]}", 2)
    names = [name for name in names if name not in missing]
    if not names:
        # Once per reason: `peers` without kernel_tuner said its one reason 18 times over.
        raise CliError(f"--strategies: {'; '.join(dict.fromkeys(missing.values()))}", 2)
    return names, {name: f"{name}: {why}" for name, why in missing.items()}


def asked_strategies(text: str) -> tuple[list[str], set[str], dict[str, str]]:
    """--strategies checked before anything runs, for `pipetune bench tuner` and
    benchmarks/bench_tuner.py alike: the strategies asked for that can run here, those
    named on their own (`_strategies`), and why each other one was left out
    (`installed_strategies`); CliError (exit 2) for a name unknown, a peer time limit that is
    no number of seconds, or a named peer whose package is missing."""
    names, named = _strategies(text)
    if any(name in PEERS for name in names):
        try:
            peer_time_limit_s()
        except ValueError as exc:
            raise CliError(str(exc), 2) from None
    names, missing = installed_strategies(names, named)
    return names, named, missing


def runnable_strategies(
    names: list[str], named: set[str], loaded: list[Dataset]
) -> tuple[list[str], dict[str, str]]:
    """The strategies that can run on the datasets, and why each other one was left out.
    Those that need the analytical model cannot run on another kernel's recording: named on
    their own (`_strategies`) they are refused (CliError), of a group (the default `ours`)
    left out."""
    from pipetune.tuner.bench import KNOB_ONLY

    needs_model = [s for s in names if s not in KNOB_ONLY and s not in PEERS]
    not_ours = [ds.name for ds in loaded if ds.ours is None]
    left_out: dict[str, str] = {}
    if needs_model and not_ours:
        if refused := [s for s in needs_model if s in named]:
            raise CliError(
                f"{not_ours[0]} is not a pipetune dataset: {', '.join(refused)} need the "
                f"analytical model (use {', '.join(KNOB_ONLY)} or peers)",
                2,
            )
        which = ", ".join(not_ours)
        verb = "is not a pipetune dataset" if len(not_ours) == 1 else "are not pipetune datasets"
        for s in needs_model:
            left_out[s] = f"{s}: needs the analytical model, and {which} {verb}"
        names = [s for s in names if s not in left_out]
        if not names:
            raise CliError(f"--strategies: {'; '.join(left_out.values())}", 2)
    return names, left_out


def _not_a_prior(prior: Dataset, ds: Dataset) -> str | None:
    """Why `prior` cannot be `ds`'s prior (None: it can): pipetune's datasets by their
    workload and GPU (every operator of a family has the same knobs), others by their knobs
    and measurements (a file name says nothing: the same kernel's caches from two GPUs are
    often both `kernel.json`, and a renamed copy of the dataset would hand it its answers)."""
    if set(prior.configs.knob_names) != set(ds.configs.knob_names):
        return "other knobs"
    if prior.ours is not None and ds.ours is not None:
        mine, theirs = ds.ours.space, prior.ours.space
        if theirs.workload.workload_hash != mine.workload.workload_hash:
            return f"another workload ({theirs.workload.label()})"
        if theirs.gpu.key == mine.gpu.key:
            return f"the same GPU ({mine.gpu.key})"
        return None
    return "the dataset itself (the same measurements)" if _same_measurements(prior, ds) else None


def _same_measurements(a: Dataset, b: Dataset) -> bool:
    """Whether two foreign datasets record the same times for the same configurations."""
    import numpy as np

    if len(a.configs.configs) != len(b.configs.configs):
        return False
    rows = b.configs.row_of()
    try:
        order = [rows[b.configs.key(c)] for c in a.configs.configs]
    except KeyError:
        return False
    return bool(np.array_equal(a.configs.objective_ms, b.configs.objective_ms[order]))


def _check_a_strategy_takes_the_prior(names: list[str], prior: bool, learned: bool) -> None:
    """A prior that no strategy of the run takes is refused: `--strategies random --prior F`
    ran without a word, as if the prior had been compared."""
    from pipetune.tuner.strategies import STRATEGY_MAP

    if not (prior or learned) or any(
        name in STRATEGY_MAP and STRATEGY_MAP[name].uses_prior for name in names
    ):
        return
    option = "--prior" if prior else "--learned-prior"
    takes = ", ".join(n for n, spec in STRATEGY_MAP.items() if spec.uses_prior)
    raise CliError(
        f"{option}: none of the strategies run ({', '.join(names)}) takes a prior; {takes} do",
        2,
    )


def _priors(
    priors: list[Path], loaded: list[Dataset], *, gpu_of_file: GpuOfFile | None = None
) -> dict:
    """Each dataset's prior: the one --prior file with the same knobs that is not itself
    (each read with the GPU spec `gpu_of_file` chooses, as recorded_datasets)."""
    if not priors:
        return {}
    from pipetune.tuner.bench import prior_for
    from pipetune.tuner.transfer import TransferError
    from pipetune.workers.datasets import DatasetError

    try:
        candidates = [(p, _recorded(p, gpu_of_file)) for p in priors]
    except DatasetError as exc:
        raise CliError(f"--prior: {exc}", 2) from None
    chosen = {}
    for ds in loaded:
        why_not = {p: _not_a_prior(c, ds) for p, c in candidates}
        same = [(p, c) for p, c in candidates if why_not[p] is None]
        if len(same) != 1:
            if same:
                found = "several files are"
            else:
                reasons = ", ".join(f"{p.name}: {why}" for p, why in why_not.items())
                found = f"no file fits ({reasons})"
            raise CliError(
                f"--prior: for {ds.name}, {found}; give one recorded dataset of the same kernel "
                "on another GPU per dataset",
                2,
            )
        chosen[ds.name] = same[0][1]
        # A prior with nothing usable (every configuration failed there, none in common) is
        # the user's choice of file: refused here, as bad input, not mid-run.
        try:
            prior_for(ds, chosen[ds.name].configs)
        except TransferError as exc:
            raise CliError(f"--prior: {exc}", 2) from None
    return chosen


def _learned(
    paths: list[Path],
    loaded: list[Dataset],
    priors: Collection[str],
    *,
    gpu_of_file: GpuOfFile | None = None,
) -> dict:
    """--learned-prior: measured pipetune datasets (files, or folders of *.t4.json.gz) whose
    cost model is the prior of each loaded dataset of their family, its own shape left out;
    none for the datasets named in `priors` (they run from their --prior). Each is read
    with the GPU spec `gpu_of_file` chooses, as recorded_datasets."""
    from pipetune.tuner.learned_prior import unseen_shape_priors
    from pipetune.workers.datasets import DatasetError

    if not paths:  # (no --learned-prior: nothing to learn, nothing to say of it)
        return {}
    files = [f for p in paths for f in (sorted(p.glob("*.t4.json.gz")) if p.is_dir() else [p])]
    if not files:
        raise CliError(
            f"--learned-prior: no *.t4.json.gz dataset in {', '.join(map(str, paths))}", 2
        )
    try:
        corpus = [_recorded(f, gpu_of_file) for f in files]
    except DatasetError as exc:
        raise CliError(f"--learned-prior: {exc}", 2) from None
    for f, ds in zip(files, corpus, strict=True):
        if ds.ours is None:
            raise CliError(
                f"--learned-prior: {f.name} is not a pipetune dataset: only pipetune's "
                "measured datasets can teach a prior",
                2,
            )
        if not is_measured(ds.runner):
            # As the service's learned prior: simulated latencies are the analytical model
            # plus noise, which would teach the model its own predictions as measurements.
            raise CliError(
                f"--learned-prior: {f.name} holds {ds.runner or 'unlabelled'} results, not "
                "GPU measurements: only measured datasets can teach a prior",
                2,
            )
    records = [ds.ours for ds in corpus if ds.ours is not None]
    # A dataset with a --prior runs from it (tuner.bench.bench drops a learned one): none is
    # fitted for it, and nothing said of why it has none.
    learners = [ds for ds in loaded if ds.name not in priors]
    learned, why_not = unseen_shape_priors(learners, records)
    for note in _unlearned(loaded, learners, why_not, files, records):
        stderr_console.print(f"note: --learned-prior: {note}")
    return learned


def _unlearned(
    loaded: list[Dataset],
    learners: list[Dataset],
    why_not: dict[str, str],
    files: list[Path],
    records: list,
) -> list[str]:
    """What --learned-prior was given and does not use, said beside the run: a dataset that
    runs from its --prior (of `loaded`, not of `learners`, the datasets a prior was fitted
    for), a dataset left with the analytical model's prior (`why_not`, by
    tuner.learned_prior.unseen_shape_priors), and a file of no benchmarked dataset's family
    (it teaches nothing here)."""
    from pipetune.model.family import family_of
    from pipetune.tuner.learned_prior import generator_line, newest_revisions

    fitted = {ds.name for ds in learners}
    notes = [
        f"{ds.name} runs from its --prior: no learned prior there"
        for ds in loaded
        if ds.name not in fitted
    ]
    notes += [
        f"{name}: {why}: it keeps the analytical model's prior" for name, why in why_not.items()
    ]
    families = {family_of(ds.ours.space.workload).name for ds in loaded if ds.ours is not None}
    notes += [
        f"{f.name} ({family_of(r.space.workload).name}) is of no benchmarked dataset's "
        "family: it teaches nothing here"
        for f, r in zip(files, records, strict=True)
        if family_of(r.space.workload).name not in families
    ]
    # Older revisions are left out of the priors of their own line's datasets only
    # (tuner.learned_prior.current_measurements): another line's datasets learn from them.
    lines = {generator_line(ds.ours) for ds in learners if ds.ours is not None}
    newest = newest_revisions(records)
    for f, r in zip(files, records, strict=True):
        line = generator_line(r)
        stale = r.revision_of_rows() < newest[line]
        if stale.any() and line in lines:
            whole = "all" if stale.all() else f"{int(stale.sum())} of"
            notes.append(
                f"{f.name}: {whole} its measurements are of an older revision of "
                f"{line} than the newest given ({newest[line]}): left out of the priors of "
                f"{line}'s datasets"
            )
    return notes


JOBS_PER_CPU = 4


def max_jobs() -> int:
    """The most worker processes `bench tuner --jobs` starts: a few per CPU (each replays
    whole spaces; more only contend)."""
    import os

    return JOBS_PER_CPU * (os.cpu_count() or 1)


def _cell(
    value: float | None, se: float | None, seeds: int, digits: int = 3, sign: str = ""
) -> str:
    """A mean with its standard error; over one seed the value alone (a standard error of
    one run is undefined: it showed "± 0.000", as if the figure were exact); "n/a" for an
    undefined P score (random search reaches the optimum on every dataset)."""
    if value is None:
        return "n/a"
    shown = f"{value:{sign}.{digits}f}"
    return shown if seeds < 2 else f"{shown} ± {se:.{digits}f}"


@bench_app.command("tuner")
@reported
def tuner(
    paths: list[Path] = typer.Argument(None, help="more dataset files"),
    dataset: list[Path] = typer.Option(None, "--dataset", help="a T4 file or Kernel Tuner cache"),
    strategies: str = typer.Option(
        "ours", "--strategies", help="names, or ours|peers|all (ours: " + ",".join(STRATEGIES) + ")"
    ),
    budgets: str = typer.Option(
        "10,20,50,100", "--budgets", help="comma-separated k of the best-in-k columns"
    ),
    seeds: int = typer.Option(
        20, "--seeds", min=1, max=MAX_SEEDS, help="runs per strategy and dataset"
    ),
    batch: int = typer.Option(
        8,
        "--batch",
        min=1,
        max=MAX_BATCH_SIZE,
        help="trials pipetune proposes per round (8: the service's default batch); "
        "the peers always propose one at a time",
    ),
    prior: list[Path] = typer.Option(
        None,
        "--prior",
        help="a recorded dataset of the same kernel on another GPU: warm-starts bo, "
        "analytical+xgb and auto (repeat it for several kernels)",
    ),
    prior_trials: int | None = typer.Option(
        None,
        "--prior-trials",
        min=1,
        help="warm-start from only the first N trials that auto makes on the --prior dataset "
        "(what a finished task there holds: the service's prior_task), not the whole dataset",
    ),
    learned_prior: list[Path] = typer.Option(
        None,
        "--learned-prior",
        help="measured pipetune datasets (files or folders): a cost model of their other "
        "shapes, over the analytical model's terms, is the prior of bo, analytical+xgb and "
        "auto on each dataset of their family (its own shape left out on every GPU)",
    ),
    early: int = typer.Option(
        0,
        "--early",
        min=0,
        help="pipetune proposes each batch while this many trials of the batch before it are "
        "unmeasured, believed at their predictions (the service's early proposals)",
    ),
    jobs: int = typer.Option(1, "--jobs", min=1, help="worker processes (results do not change)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Best-in-k-trials of each strategy, normalised to each dataset's exhaustive best."""
    from pipetune.tuner.bench import bench
    from pipetune.tuner.transfer import TransferError
    from pipetune.workers.datasets import DatasetError

    files = [*(dataset or []), *(paths or [])]
    if not files:
        raise CliError("--dataset: give at least one dataset file", 2)
    if early > batch - 1:  # (was cut to batch - 1 without a word)
        raise CliError(
            f"--early: at most --batch - 1 ({batch - 1}): a batch is proposed while part of "
            f"the one before is unmeasured, not all of it; got {early}",
            2,
        )
    if jobs > max_jobs():  # (each one a process: 100000 of them filled the memory)
        raise CliError(f"--jobs: at most {max_jobs()} here ({JOBS_PER_CPU} per CPU)", 2)
    ks = _int_list(budgets, "--budgets")
    names, named, missing = asked_strategies(strategies)
    try:
        loaded = recorded_datasets(files)
    except DatasetError as exc:
        raise CliError(str(exc), 2) from None
    names, model_left_out = runnable_strategies(names, named, loaded)
    _check_a_strategy_takes_the_prior(names, bool(prior), bool(learned_prior))
    priors = _priors(prior or [], loaded)
    if prior_trials is not None and not priors:
        raise CliError("--prior-trials: give the --prior dataset the trials are taken from", 2)
    learned = _learned(learned_prior or [], loaded, priors)
    with console.status("benchmarking") as status:
        try:
            doc = bench(
                loaded,
                names,
                ks,
                seeds,
                progress=lambda m: status.update(m),
                batch=batch,
                priors=priors,
                jobs=jobs,
                prior_trials=prior_trials,
                learned=learned,
                early=early,
            )
        except PeerFailedError as exc:  # every strategy asked for was a peer that failed
            raise CliError(f"--strategies: {exc}", 2) from None
        except TransferError as exc:
            # The first --prior-trials trials of auto on the prior (one task per seed, made
            # as the run goes) all failed: no task there that could be a prior. (The whole
            # --prior was checked before the run, in _priors.)
            raise CliError(
                f"--prior-trials: {exc}: a task of {prior_trials} trials there has no "
                "success to start from (give more trials, or another --prior)",
                2,
            ) from None
    doc["left_out"] = {**missing, **model_left_out, **doc["left_out"]}
    if as_json:
        print_json(doc)
        return
    print_tables(doc, doc["strategies"], ks)
    for why in doc["left_out"].values():
        print(f"left out: {why}", file=sys.stderr)


def print_tables(doc: dict, names: list[str], ks: list[int]) -> None:
    """Per dataset, then the geomean with the P score line: mean ± standard error."""
    results = {(r["strategy"], r["budget"]): r for r in doc["results"]}
    peers_present = any(n in PEERS for n in names)
    note = (
        f"pipetune proposes {doc['batch']} trial(s) per round"
        + (
            f", each while {doc['early']} of the round before are unmeasured"
            if doc["early"]
            else ""
        )
        + ". "
        + ("The peers propose one at a time. " if peers_present else "")
        + (
            f"Mean ± standard error over {doc['seeds']} seeds."
            if doc["seeds"] > 1
            else "One seed: one run each, no standard error."
        )
    )
    if doc["seeds"] > 1 and any(
        cell["se"] == 0 for r in doc["results"] for cell in r["per_dataset"].values()
    ):
        # A search with no random draw (a prior's ranking, a grid) gives every seed the same
        # figure: its "± 0.000" is one run, not a precise mean.
        note += " ± 0.000: the same figure on every seed (a search without a random draw there)."
    for ds in doc["datasets"]:
        prior = doc["priors"].get(ds)
        learned = doc.get("learned_priors", {}).get(ds)
        title = f"{ds}: best-in-k" + (f" (prior: {prior})" if prior else "")
        if ds in doc.get("simulated", ()):
            title += f" ({SIMULATED_LABEL})"
        size = doc.get("configurations", {}).get(ds)
        if size is not None and max(ks) > size:  # (the cells were capped, said nowhere)
            title += f" ({size} configurations: a budget over that measures them all)"
        if learned:  # (which runs had one was said nowhere)
            title += f" (learned prior: {learned})"
        table = Table(title=title, caption=note)
        table.add_column("strategy")
        for k in ks:
            table.add_column(f"k={k}", justify="right")
        table.add_row(
            "random (exact expectation)", *[f"{doc['random'][ds][str(k)]:.3f}" for k in ks]
        )
        for name in names:
            cells = [results[(name, k)]["per_dataset"][ds] for k in ks]
            table.add_row(name, *[_cell(c["best_in_k"], c["se"], doc["seeds"]) for c in cells])
        console.print(table)
    simulated = doc.get("simulated", [])
    if simulated:
        note += (
            f" {len(simulated)} of the {len(doc['datasets'])} datasets are {SIMULATED_LABEL}: "
            + ", ".join(simulated)
            + "."
        )
    table = Table(
        title=f"best-in-k, geomean of {len(doc['datasets'])} datasets; "
        "P score = (strategy - random) / (optimum - random), mean over datasets",
        caption=note,
    )
    table.add_column("strategy")
    for k in ks:
        table.add_column(f"k={k}", justify="right")
    for name in names:
        rows = [results[(name, k)] for k in ks]
        table.add_row(name, *[_cell(r["best_in_k"], r["se"], doc["seeds"]) for r in rows])
        p_scores = [_cell(r["p_score"], r["p_se"], doc["seeds"], 2, "+") for r in rows]
        table.add_row("  P score", *p_scores, style="dim")
    console.print(table)
