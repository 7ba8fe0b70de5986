"""`pipetune campaign unpack ARCHIVE`: a campaign's archive into the repository.

    sweeps/<op>.t4.json.gz   -> DATA_DIR/<gpu>/<op>.t4.json.gz
    profile.json             -> PROFILE_DIR/<gpu>.json (model.hardware applies it; by default
                                the user's profile folder, hardware.user_profile_dir())
    probe, correctness, baselines and campaign .json -> DATA_DIR/<gpu>/campaign/
    sweeps/<op>.partNNN.t4.json.gz -> DATA_DIR/<gpu>/campaign/parts/ (an unfinished operator)

Finished operators become datasets, of any kernel family. The parts of an operator a paused
campaign left unfinished are not a dataset: they are kept below the phase documents, where
nothing that reads datasets looks, and a later call with ``--have DATA_DIR/<gpu>`` goes on
from them (layout.from_unpacked) rather than measuring them again; committed parts of an
operator the archive holds whole (merged since) are removed.

Every JSON document is read, every dataset and part read back and checked as a
pipetune dataset of the operator its file names, measured on the probe's GPU by the probe's
kind of runner, the profile as model.hardware checks one it loads, and every baseline's
throughput against its latency in its family's unit (TFLOP/s for the GEMMs, GB/s for the
memory-intensive operators; a GEMM entry from before there were units gives ``tflops``
only), before anything is written; each file is written atomically. A
simulated archive is refused unless ``allow_simulated`` (and then its files say
simulated, and its profile is written only to a folder named explicitly, never the user's
profile folder or the shipped one: there the model would apply the spec sheet's noise as a
calibration); existing
files are kept unless ``force``.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipetune.model.errors import PipetuneError
from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import (
    HardwareError,
    get_gpu,
    parse_profile,
    profile_dirs,
    resolve_gpu_key,
    user_profile_dir,
)
from pipetune.model.trials import is_simulated
from pipetune.model.workloads import WorkloadError
from pipetune.workers.campaign import layout
from pipetune.workers.campaign.operators import operator_workload
from pipetune.workers.datasets import DatasetError, check_pipetune, read_t4
from pipetune.workers.datasets.files import write_all_atomic

PROFILE = layout.PHASE_FILES["profile"]


class UnpackError(PipetuneError, ValueError):
    """The archive cannot be unpacked as asked (exit 2)."""


@dataclass
class Unpacked:
    gpu: str
    runner: str
    datasets: list[Path] = field(default_factory=list)
    profile: Path | None = None
    # Why the archive's profile was not written, where it was left out.
    profile_left_out: str | None = None
    documents: list[Path] = field(default_factory=list)
    # the parts of unfinished operators, kept for the call that continues the campaign
    parts: list[Path] = field(default_factory=list)
    # operator -> (latency µs, throughput, its family's unit) of each timed baseline
    baselines: dict[str, tuple[float, float, str]] = field(default_factory=dict)


def check_baselines(document: dict[str, Any]) -> dict[str, tuple[float, float, str]]:
    """Each timed baseline's (latency, throughput, unit), the throughput recomputed from the
    latency in its family's unit; UnpackError where the file says otherwise."""
    rows = {}
    operators = document.get("operators") or {}
    if not isinstance(operators, dict):
        raise UnpackError("baselines.json: 'operators' is not a JSON object")
    for name, entry in operators.items():
        if not isinstance(entry, dict):
            raise UnpackError(f"baselines.json: {name}: not a JSON object")
        if "latency_us" not in entry:
            continue  # an operator whose library call failed: recorded with its error
        latency = entry["latency_us"]
        number = isinstance(latency, int | float) and not isinstance(latency, bool)
        if not number or not 0 < latency < math.inf:
            raise UnpackError(f"baselines.json: {name}: latency_us {latency!r} is not a time")
        try:
            workload = parse_any_workload(entry["workload"])
        except (KeyError, WorkloadError) as exc:
            raise UnpackError(f"baselines.json: {name}: not a workload ({exc})") from None
        # Read by operator name (the library's time next to that operator's sweep): an entry
        # timed on another shape would pass for the operator's.
        expected = operator_workload(name)
        if expected is not None and workload != expected:
            raise UnpackError(
                f"baselines.json: {name}: timed on {workload.label()}, but {name} is "
                f"{expected.label()}"
            )
        fam = family_of(workload)
        unit = entry.get("unit", "TFLOP/s" if "tflops" in entry else None)
        if unit != fam.throughput_unit:
            raise UnpackError(
                f"baselines.json: {name} is given in {unit}, its family ({fam.name}) "
                f"counts {fam.throughput_unit}"
            )
        rate = fam.throughput_of(workload, float(entry["latency_us"]))
        stated = entry.get("throughput", entry.get("tflops"))
        number = isinstance(stated, int | float) and not isinstance(stated, bool)
        if not number or not abs(float(stated) - rate) <= 1e-6 * rate:
            raise UnpackError(
                f"baselines.json: {name}: {stated} {unit} does not follow from "
                f"{entry['latency_us']} µs ({rate:.6g} {unit})"
            )
        rows[name] = (float(entry["latency_us"]), rate, unit)
    return rows


def check_profile(document: dict[str, Any], gpu: str, simulated: bool = False) -> None:
    """UnpackError unless the profile is one for ``gpu`` that get_gpu would load: the same
    checks, before it is written (one it refuses made every later command naming the GPU
    fail); in a measured campaign (``simulated`` False), unless it was measured too."""
    try:
        target, overrides = parse_profile(document, PROFILE)
        get_gpu(gpu, calibrated=False).with_overrides(overrides, profile=PROFILE)
    except HardwareError as exc:
        message = str(exc)
        raise UnpackError(
            message if message.startswith(PROFILE) else f"{PROFILE}: {message}"
        ) from None
    if target != gpu:
        raise UnpackError(f"{PROFILE} is for {target}, the campaign ran on {gpu}")
    if not simulated and document.get("simulated") is True:
        raise UnpackError(
            f"{PROFILE} is simulated, in a measured campaign (simulated and measured data "
            "never mix)"
        )


def check_sweep(path: Path, folder: Path, gpu: str, simulated: bool) -> None:
    """UnpackError unless the sweep at ``path`` (an operator's whole, or one part of it) is a
    pipetune dataset of the operator its name names, measured on the probe's GPU by the
    probe's kind of runner: it is filed under DATA_DIR/<gpu>/<operator>, where another's
    would pass for that one's."""
    member = path.relative_to(folder).as_posix()
    try:
        info = check_pipetune(read_t4(path))
    except DatasetError as exc:
        # (Its message names the file in the temporary folder the archive was unpacked in.)
        message = str(exc).replace(str(path), member)
        shown = message if message.startswith(member) else f"{member}: {message}"
        raise UnpackError(shown) from None
    operator = layout.sweep_operator(path.name)
    expected = operator_workload(operator)
    if expected is None:
        raise UnpackError(f"{member}: {operator} is not an operator pipetune knows")
    if info.gpu != gpu:
        raise UnpackError(
            f"{member}: a dataset of {info.gpu}, but the archive's probe.json was measured on {gpu}"
        )
    if info.workload != expected:
        raise UnpackError(
            f"{member}: a dataset of {info.workload.label()}, but {operator} is {expected.label()}"
        )
    if is_simulated(info.runner) != simulated:
        kind = "simulated" if simulated else "measured"
        raise UnpackError(
            f"{member}: runner {info.runner}, in a {kind} campaign (simulated and measured "
            "data never mix)"
        )


def _applied_from(folder: Path) -> bool:
    """Whether the model applies profiles from ``folder`` (the user's profile folder, or the
    profiles shipped with the model)."""
    try:
        here = folder.resolve()
        return any(here == applied.resolve() for applied, _ in profile_dirs())
    except OSError:
        return False


def _writable(target: Path) -> bool:
    """Whether target can be written as a file: not a folder, under no file."""
    if target.is_dir():
        return False
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir()


def unpack(
    archive: Path,
    data_dir: Path,
    profile_dir: Path | None = None,
    *,
    allow_simulated: bool = False,
    force: bool = False,
) -> Unpacked:
    with tempfile.TemporaryDirectory(prefix="pipetune-unpack-") as scratch:
        try:
            folder = layout.extract(archive, Path(scratch))
            # Every document read first, each named as the archive names it.
            documents = layout.check_documents(folder, str(archive))
        except layout.LayoutError as exc:
            raise UnpackError(str(exc)) from None
        probe = documents.get("probe.json")
        if probe is None or not probe.get("gpu"):
            raise UnpackError(f"{archive}: no probe.json with the GPU it was measured on")
        try:
            gpu = resolve_gpu_key(str(probe["gpu"]))  # a key the model knows
        except HardwareError as exc:
            raise UnpackError(f"{archive}: probe.json: {exc}") from None
        runner, simulated = str(probe.get("runner")), bool(probe.get("simulated"))
        if simulated and not allow_simulated:
            raise UnpackError(
                f"{archive} is a simulated campaign (runner {runner}): its numbers are the "
                "model's, not measurements; it is not unpacked into the repository"
            )
        result = Unpacked(gpu=gpu, runner=runner)
        plan: list[tuple[Path, Path]] = []
        parts = data_dir / gpu / layout.UNPACKED_PARTS
        for path in sorted((folder / layout.SWEEPS_DIR).glob("*.t4.json.gz")):
            check_sweep(path, folder, gpu, simulated)
            where = parts if layout.is_part(path.name) else data_dir / gpu
            plan.append((path, where / path.name))
        profile, profile_target = folder / PROFILE, None
        if PROFILE in documents:
            check_profile(documents[PROFILE], gpu, simulated)
            if simulated and (profile_dir is None or _applied_from(profile_dir)):
                # (a --profile-dir that names the user's profile folder, or the shipped one,
                # is where the model applies profiles from, as the default is)
                result.profile_left_out = (
                    "its profile is simulated, and the model would apply it from "
                    f"{profile_dir or 'your profile folder'} as if measured (--profile-dir "
                    "ANOTHER_FOLDER writes it there)"
                )
            else:
                folder_of_profile = user_profile_dir() if profile_dir is None else profile_dir
                profile_target = folder_of_profile / f"{gpu}.json"
                plan.append((profile, profile_target))
        if "baselines.json" in documents:
            result.baselines = check_baselines(documents["baselines.json"])
        for name in ("probe", "correctness", "baselines", "campaign"):
            source = folder / f"{name}.json"
            if source.exists():
                plan.append((source, data_dir / gpu / "campaign" / source.name))
        blocked = [str(target) for _, target in plan if not _writable(target)]
        if blocked:
            raise UnpackError(f"cannot write {', '.join(blocked)}: a folder or under a file")
        clashes = [str(target) for _, target in plan if target.exists()]
        if clashes and not force:
            raise UnpackError(f"would overwrite {', '.join(clashes)} (pass --force)")
        # All or none: a write that fails (a full disk) must not leave part of a campaign,
        # least of all its profile, which the model would apply, and whose files would then
        # refuse the unpack's retry as an overwrite.
        write_all_atomic([(target, source.read_bytes()) for source, target in plan])
        _remove_merged_parts(data_dir / gpu, {target for _, target in plan})
        for _, target in plan:
            if target.parent == parts:
                result.parts.append(target)
            elif target.name.endswith(".t4.json.gz"):
                result.datasets.append(target)
            elif target == profile_target:
                result.profile = target
            else:
                result.documents.append(target)
    return result


def _remove_merged_parts(folder: Path, written: set[Path]) -> None:
    """Remove the committed parts (under ``folder``, a GPU's data) of the operators whose
    whole dataset was just written: merged since they were unpacked, they would be taken for
    a checkpoint again."""
    parts = folder / layout.UNPACKED_PARTS
    whole = {p.name.removesuffix(".t4.json.gz") for p in written if p.parent == folder}
    for path in parts.glob("*.t4.json.gz"):
        if path not in written and layout.sweep_operator(path.name) in whole:
            path.unlink()
    with contextlib.suppress(OSError):  # (only where it is empty)
        parts.rmdir()
