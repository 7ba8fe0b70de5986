"""`pipetune campaign unpack ARCHIVE`: a campaign's archive into the repository.

    sweeps/<op>.t4.json.gz   -> DATA_DIR/<gpu>/<op>.t4.json.gz
    profile.json             -> PROFILE_DIR/<gpu>.json (model.hardware applies it; by default
                                the user's profile folder, hardware.user_profile_dir())
    probe, correctness, baselines and campaign .json -> DATA_DIR/<gpu>/campaign/

Only finished operators are unpacked (parts of an unfinished one are not a dataset), of
any kernel family. Every dataset is read back and checked as a pipetune dataset, the
profile through model.hardware, and every baseline's throughput against its latency in its
family's unit (TFLOP/s for the GEMMs, GB/s for the memory-intensive operators; a GEMM entry
from before there were units gives ``tflops`` only), before anything is written. A
simulated archive is refused unless ``allow_simulated`` (and then its files say
simulated, and its profile is written only to a folder named explicitly: in the user's
profile folder the model would apply the spec sheet's noise as a calibration); existing
files are kept unless ``force``.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu, load_profile, user_profile_dir
from pipetune.model.workloads import WorkloadError
from pipetune.workers.campaign import layout
from pipetune.workers.datasets import DatasetError, check_pipetune, read_t4


class UnpackError(ValueError):
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
    skipped_parts: list[str] = field(default_factory=list)
    # operator -> (latency µs, throughput, its family's unit) of each timed baseline
    baselines: dict[str, tuple[float, float, str]] = field(default_factory=dict)


def check_baselines(document: dict[str, Any]) -> dict[str, tuple[float, float, str]]:
    """Each timed baseline's (latency, throughput, unit), the throughput recomputed from the
    latency in its family's unit; UnpackError where the file says otherwise."""
    rows = {}
    for name, entry in (document.get("operators") or {}).items():
        if "latency_us" not in entry:
            continue  # an operator whose library call failed: recorded with its error
        try:
            workload = parse_any_workload(entry["workload"])
        except (KeyError, WorkloadError) as exc:
            raise UnpackError(f"baselines.json: {name}: not a workload ({exc})") from None
        fam = family_of(workload)
        unit = entry.get("unit", "TFLOP/s" if "tflops" in entry else None)
        if unit != fam.throughput_unit:
            raise UnpackError(
                f"baselines.json: {name} is given in {unit}, its family ({fam.name}) "
                f"counts {fam.throughput_unit}"
            )
        rate = fam.throughput_of(workload, float(entry["latency_us"]))
        stated = entry.get("throughput", entry.get("tflops"))
        if stated is None or abs(float(stated) - rate) > 1e-6 * rate:
            raise UnpackError(
                f"baselines.json: {name}: {stated} {unit} does not follow from "
                f"{entry['latency_us']} µs ({rate:.6g} {unit})"
            )
        rows[name] = (float(entry["latency_us"]), rate, unit)
    return rows


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
        except layout.LayoutError as exc:
            raise UnpackError(str(exc)) from None
        probe = layout.read_json(folder / "probe.json")
        if probe is None or not probe.get("gpu"):
            raise UnpackError(f"{archive}: no probe.json with the GPU it was measured on")
        gpu, runner = str(probe["gpu"]), str(probe.get("runner"))
        get_gpu(gpu)  # a key the model knows
        if probe.get("simulated") and not allow_simulated:
            raise UnpackError(
                f"{archive} is a simulated campaign (runner {runner}): its numbers are the "
                "model's, not measurements; it is not unpacked into the repository"
            )
        result = Unpacked(gpu=gpu, runner=runner)
        plan: list[tuple[Path, Path]] = []
        for path in sorted((folder / layout.SWEEPS_DIR).glob("*.t4.json.gz")):
            if ".part" in path.name:
                result.skipped_parts.append(path.name)
                continue
            try:
                check_pipetune(read_t4(path))
            except DatasetError as exc:
                raise UnpackError(f"{path.name}: {exc}") from None
            plan.append((path, data_dir / gpu / path.name))
        profile, profile_target = folder / "profile.json", None
        if profile.exists():
            target, _ = load_profile(profile)
            if target != gpu:
                raise UnpackError(f"profile.json is for {target}, the campaign ran on {gpu}")
            if profile_dir is None and probe.get("simulated"):
                result.profile_left_out = (
                    "its profile is simulated, and the model would apply it from your profile "
                    "folder as if measured (--profile-dir FOLDER writes it there)"
                )
            else:
                folder_of_profile = user_profile_dir() if profile_dir is None else profile_dir
                profile_target = folder_of_profile / f"{gpu}.json"
                plan.append((profile, profile_target))
        baselines = layout.read_json(folder / "baselines.json")
        if baselines is not None:
            result.baselines = check_baselines(baselines)
        for name in ("probe", "correctness", "baselines", "campaign"):
            source = folder / f"{name}.json"
            if source.exists():
                plan.append((source, data_dir / gpu / "campaign" / source.name))
        clashes = [str(target) for _, target in plan if target.exists()]
        if clashes and not force:
            raise UnpackError(f"would overwrite {', '.join(clashes)} (pass --force)")
        for source, target in plan:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            if target.name.endswith(".t4.json.gz"):
                result.datasets.append(target)
            elif target == profile_target:
                result.profile = target
            else:
                result.documents.append(target)
    return result
