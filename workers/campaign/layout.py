"""A campaign's files: one per phase, a folder of sweeps, and the archive that carries them.

::

    probe.json          the device, the library checks, the timing floor
    correctness.json    >= 300 schedules per kernel family verified against their references
    profile.json        `pipetune calibrate`'s hardware profile
    baselines.json      the vendor libraries' time per benchmark operator, in its unit
    sweeps/<operator>.t4.json.gz            an operator's whole space
    sweeps/<operator>.part003.t4.json.gz    a checkpoint: one part of an unfinished operator
    campaign.json       what ran in each call, how long each phase took, what is left

A later call given the folder or the archive (``--have``) skips what it holds. Every file is
written atomically (a temporary file renamed into place), so a call killed at any moment
leaves whole files; the archive is rewritten after every phase and every sweep part.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from pipetune.model.errors import PipetuneError
from pipetune.workers.datasets.files import write_atomic

PHASES: tuple[str, ...] = ("probe", "correctness", "profile", "baselines", "sweeps")
PHASE_FILES: dict[str, str] = {
    "probe": "probe.json",
    "correctness": "correctness.json",
    "profile": "profile.json",
    "baselines": "baselines.json",
}
SUMMARY_FILE = "campaign.json"
SWEEPS_DIR = "sweeps"
PACK_LIMIT_BYTES = 16 * 2**20  # the most one file may bring back from a device call
_PART = re.compile(r"^(?P<op>[A-Za-z0-9_]+)\.part(?P<k>\d{3})\.t4\.json\.gz$")
_MEMBER = re.compile(
    r"^(probe|correctness|profile|baselines|campaign)\.json$"
    r"|^sweeps/[A-Za-z0-9_]+(\.part\d{3})?\.t4\.json\.gz$"
)


class LayoutError(PipetuneError, ValueError):
    """A --have folder or archive that is not a campaign's."""


def sweep_path(folder: Path, operator: str) -> Path:
    return folder / SWEEPS_DIR / f"{operator}.t4.json.gz"


def part_path(folder: Path, operator: str, part: int) -> Path:
    return folder / SWEEPS_DIR / f"{operator}.part{part:03d}.t4.json.gz"


def sweep_operator(name: str) -> str:
    """The operator a sweep file's name names, whole (``Op.t4.json.gz``) or one part of it
    (``Op.part003.t4.json.gz``)."""
    match = _PART.match(name)
    return match["op"] if match else name.removesuffix(".t4.json.gz")


def is_part(name: str) -> bool:
    """Whether a sweep file's name is a part's (a checkpoint of an unfinished operator)."""
    return _PART.match(name) is not None


def parts_present(folder: Path, operator: str) -> dict[int, Path]:
    found = {}
    for path in (folder / SWEEPS_DIR).glob(f"{operator}.part*.t4.json.gz"):
        match = _PART.match(path.name)
        if match and match["op"] == operator:
            found[int(match["k"])] = path
    return dict(sorted(found.items()))


def read_json(path: Path, label: str | None = None) -> dict[str, Any] | None:
    """The JSON object at path, or None when there is none (a broken file is an error, named
    ``label``: a file unpacked into a temporary folder is named as its archive names it)."""
    shown = label or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise LayoutError(f"{shown}: not valid JSON (not UTF-8 text)") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LayoutError(f"{shown}: not valid JSON ({exc.msg})") from None
    except RecursionError:  # (json's decoder recurses per level: a crash, not a message)
        raise LayoutError(f"{shown}: not valid JSON (nested too deeply)") from None
    if not isinstance(document, dict):
        raise LayoutError(f"{shown}: not a JSON object")
    return document


def check_documents(folder: Path, where: str) -> dict[str, dict[str, Any]]:
    """Every phase document and the summary in folder that is there, by file name, each read
    as a JSON object (LayoutError naming ``where`` and the file): read before any is used or
    copied, so that a broken one is refused before anything is written."""
    documents = {}
    for name in (*PHASE_FILES.values(), SUMMARY_FILE):
        document = read_json(folder / name, f"{where}: {name}")
        if document is not None:
            documents[name] = document
    return documents


def write_json(path: Path, document: dict[str, Any]) -> Path:
    return write_atomic(path, json.dumps(document, indent=2, allow_nan=False) + "\n")


def members(folder: Path) -> list[str]:
    """The campaign files under folder, as archive member names, in a stable order."""
    names = []
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and _MEMBER.match(name):
            names.append(name)
    return names


def pack(folder: Path, archive: Path) -> int:
    """Write every campaign file of folder into one .tar.gz (or .tar) archive, atomically;
    its size in bytes."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    gz = archive.name.endswith((".tar.gz", ".tgz"))
    # Level 1: the sweeps inside are gzip files already; the archive is rewritten often.
    options: dict[str, Any] = {"compresslevel": 1} if gz else {}
    fd, tmp = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz" if gz else "w", **options) as tar:
            for name in members(folder):
                tar.add(folder / name, arcname=name, recursive=False)
        os.chmod(tmp, 0o644)
        # On disk before it replaces the last good archive, as write_all_atomic's files are:
        # renamed unflushed, a machine taken away in the moment (a device call's end) could
        # leave an empty or short file where the last good archive was.
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, archive)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return archive.stat().st_size


def extract(archive: Path, into: Path) -> Path:
    """Unpack a campaign archive (only its campaign files; nothing outside ``into``)."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            wanted: dict[str, tarfile.TarInfo] = {}
            for member in tar.getmembers():
                # `tar czf x.tar.gz -C dir .` names every member "./probe.json" and so on: the
                # same campaign file as the one pack() names "probe.json".
                name = member.name.removeprefix("./")
                if not (member.isfile() and _MEMBER.match(name)):
                    continue
                if name in wanted:  # which of the two is the campaign's cannot be told
                    raise LayoutError(f"{archive}: holds {name} twice")
                member.name = name
                wanted[name] = member
            if not wanted:
                raise LayoutError(f"{archive}: no campaign file in the archive")
            into.mkdir(parents=True, exist_ok=True)
            tar.extractall(into, members=list(wanted.values()), filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise LayoutError(f"{archive}: not a readable campaign archive ({exc})") from None
    return into


# Where `pipetune campaign unpack` puts the phase documents inside benchmarks/data/<gpu>/,
# and, below them, the parts of an operator the campaign left unfinished: kept out of the
# datasets' folder (a part is not a dataset), and kept, so that the call that continues the
# campaign from the committed data measures only the parts that are not there.
UNPACKED_DOCS = "campaign"
UNPACKED_PARTS = f"{UNPACKED_DOCS}/parts"


def is_unpacked(folder: Path) -> bool:
    """Whether a folder is what `pipetune campaign unpack` wrote (benchmarks/data/<gpu>/):
    the phase documents in campaign/, the finished operators' datasets beside them."""
    return (folder / UNPACKED_DOCS / PHASE_FILES["probe"]).is_file() and not (
        folder / PHASE_FILES["probe"]
    ).exists()


def from_unpacked(folder: Path, into: Path, profile: Path | None) -> Path:
    """The campaign layout of an unpacked campaign and its GPU's profile, so that a later
    campaign goes on from the committed data (--have benchmarks/data/<gpu>): what they hold
    is skipped, an unfinished operator goes on from its committed parts, the rest is
    measured, and `campaign unpack --force` writes the whole."""
    into.mkdir(parents=True, exist_ok=True)
    for name in (*PHASE_FILES.values(), SUMMARY_FILE):
        source = folder / UNPACKED_DOCS / name
        if source.is_file():
            shutil.copyfile(source, into / name)
    if profile is not None and profile.is_file():
        shutil.copyfile(profile, into / PHASE_FILES["profile"])
    (into / SWEEPS_DIR).mkdir(exist_ok=True)
    for path in sorted(folder.glob("*.t4.json.gz")):
        if _MEMBER.match(f"{SWEEPS_DIR}/{path.name}"):
            shutil.copyfile(path, into / SWEEPS_DIR / path.name)
    for path in sorted((folder / UNPACKED_PARTS).glob("*.t4.json.gz")):
        # (a part of an operator whose whole sweep is committed since is no checkpoint)
        whole = sweep_path(into, sweep_operator(path.name))
        if is_part(path.name) and not whole.exists():
            shutil.copyfile(path, into / SWEEPS_DIR / path.name)
    return into


def open_have(have: Path, scratch: Path) -> Path:
    """The folder a --have names: a campaign's folder as it is, an archive unpacked into
    scratch, or the repository's unpacked data laid out again in scratch (its profile the one
    the model applies to that GPU: hardware.applied_profile)."""
    if have.is_dir() and is_unpacked(have):
        from pipetune.model.hardware import applied_profile

        probe = read_json(have / UNPACKED_DOCS / PHASE_FILES["probe"]) or {}
        # A simulated campaign's unpacked data is continued with its own (simulated) profile,
        # made again: the applied profile is a measured one, and a simulated archive took it
        # (simulated and measured data never mix).
        measured = probe.get("runner") != "simulated"
        gpu = probe.get("gpu")
        found = applied_profile(gpu) if measured and isinstance(gpu, str) else None
        return from_unpacked(have, scratch, found[0] if found else None)
    if have.is_dir():
        if not members(have):
            # Else an unrelated folder was taken for an earlier call's that had done nothing,
            # and the campaign silently started again from scratch.
            raise LayoutError(
                f"{have}: no campaign file in the folder (probe.json, sweeps/... as "
                "`pipetune campaign --out-dir` writes them, or `campaign unpack`'s <gpu>/ folder)"
            )
        return have
    if have.is_file():
        return extract(have, scratch)
    raise LayoutError(f"--have {have}: no such folder or archive")


def adopt(have: Path, out: Path) -> list[str]:
    """Copy the campaign files of ``have`` into ``out`` (the archive of this call then holds
    everything so far); the names copied."""
    names = members(have)
    if have.resolve() == out.resolve():
        return names
    for name in names:
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(have / name, target)
    return names
