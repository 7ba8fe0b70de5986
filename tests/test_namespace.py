"""One installed namespace: the repository's folders are pipetune.*, nothing else is installed
at the top of site-packages, and no module imports a folder by its bare name (which works
from a checkout but breaks, or picks up a user's own model.py, once installed)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import pipetune

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("model", "tuner", "workers", "service", "clients", "migrations")
# Code in strings (python -c, python -m, import_module) names modules too.
_FOLDER = rf"(?:{'|'.join(FOLDERS)})"
_BARE_IN_STRING = re.compile(
    rf"\bfrom\s+{_FOLDER}[.\w]*\s+import\b|\bimport\s+{_FOLDER}\.|-m\s+{_FOLDER}\."
    rf"|import_module\(\s*[\"']{_FOLDER}\."
)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _python_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in out if (ROOT / name).is_file()]


def test_no_module_imports_a_folder_by_its_bare_name():
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _BARE_IN_STRING.search(node.value):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in FOLDERS:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert offenders == []


def test_the_package_list_names_every_package_folder():
    setuptools_cfg = _pyproject()["tool"]["setuptools"]
    package_dir: dict[str, str] = setuptools_cfg["package-dir"]
    listed = set(setuptools_cfg["packages"])
    top_of = {folder: name for name, folder in package_dir.items()}
    found = {"pipetune"}
    # Every folder that ships a file, code or data (the profiles, the dashboard): a data
    # folder under a parent's package-data is what setuptools warns of and will stop shipping.
    tracked = subprocess.run(
        ["git", "ls-files", *FOLDERS], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for relative in {Path(name).parent for name in tracked}:
        if relative == Path(package_dir["pipetune"]):
            continue
        parts = relative.parts
        found.add(".".join([top_of[parts[0]], *parts[1:]]))
    assert listed == found


def test_version_matches_the_distribution_and_the_cli():
    assert pipetune.__version__ == _pyproject()["project"]["version"]
    out = subprocess.run(
        [sys.executable, "-m", "pipetune.clients.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"pipetune {pipetune.__version__}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--wheel-dir", str(out), str(ROOT)),
        ],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("pipetune-*.whl")
    return path


def test_the_wheel_holds_only_the_pipetune_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"pipetune", f"pipetune-{pipetune.__version__}.dist-info"}
    for needed in (
        "pipetune/__init__.py",
        "pipetune/py.typed",
        "pipetune/model/workloads.py",
        "pipetune/migrations/env.py",
        "pipetune/migrations/versions/0001_initial_schema.py",
        "pipetune/service/dashboard/index.html",
    ):
        assert needed in names


def test_every_folder_the_wheel_ships_is_a_listed_package(wheel):
    """The profiles and the dashboard were data under a parent package's package-data, which
    setuptools warns of at every build and says it will stop shipping: each folder of the
    wheel must be a package that `packages` names."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    with zipfile.ZipFile(wheel) as archive:
        folders = {
            name.rsplit("/", 1)[0].replace("/", ".")
            for name in archive.namelist()
            if name.startswith("pipetune/")
        }
    assert {"pipetune.model.profiles", "pipetune.service.dashboard"} <= folders
    assert folders - listed == set()


def test_the_wheel_ships_the_licence_it_declares(wheel):
    """The metadata said Apache-2.0 and no file held its text, which the licence asks to be
    given with every copy."""
    with zipfile.ZipFile(wheel) as archive:
        dist_info = f"pipetune-{pipetune.__version__}.dist-info"
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        text = archive.read(f"{dist_info}/licenses/docs/LICENSE").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: docs/LICENSE" in metadata
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_a_users_model_and_service_modules_do_not_shadow_pipetune(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"),
            *("--target", str(site), str(wheel)),
        ],
        check=True,
        capture_output=True,
    )
    user = tmp_path / "user"
    user.mkdir()
    for name in ("model.py", "service.py", "tuner.py"):
        (user / name).write_text("raise SystemExit('the user module was imported')\n")
    script = (
        "import pipetune, pipetune.model.workloads, pipetune.service.migrate; "
        "print(pipetune.__version__); print(pipetune.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=user,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    version, location = result.stdout.splitlines()  # (a temporary folder may hold spaces)
    assert version == pipetune.__version__
    assert Path(location).is_relative_to(site)


# A user's code as the README writes it, checked strictly against the installed package
# (py.typed): a field with a default must be optional to a type checker too, and a
# schedule of a type the API does not take must be an error.
USER_CODE = """
import pipetune
from pipetune.model.wire import TuneOptions

fc = pipetune.Gemm(m=1024, n=64, k=2048)
rows = [
    pipetune.Reduce(rows=64, cols=64),
    pipetune.Softmax(rows=4096, cols=768),
    pipetune.LayerNorm(rows=4096, cols=768),
    pipetune.BiasGelu(rows=64, cols=64),
]
hopper = [pipetune.HopperGemm(m=1024, n=768, k=3072), pipetune.HopperBmm(b=4, m=128, n=128, k=64)]
options = TuneOptions(budget=4)
doc = pipetune.best_schedule(fc, "h100")
kernel = pipetune.kernel(fc, "h100", schedule=doc.schedule)
# (The Hopper family's workloads were not in the API's argument types: an error to mypy.)
fused = pipetune.HopperGemmSwiglu(m=1024, n=4096, k=4096)
hopper_doc = pipetune.best_schedule(pipetune.HopperGemm(m=1024, n=64, k=2048), "h100")
hopper_kernel = pipetune.kernel(fused, "h100")
"""


def _mypy(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    (site / "user_code.py").write_text(code)
    flags = ["--strict", "--follow-imports=silent", "--ignore-missing-imports", "--no-incremental"]
    return subprocess.run(
        [sys.executable, "-m", "mypy", *flags, "--python-version", "3.11", "user_code.py"],
        cwd=site,
        capture_output=True,
        text=True,
    )


def test_a_users_code_type_checks_against_the_installed_package(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"),
            *("--target", str(site), str(wheel)),
        ],
        check=True,
        capture_output=True,
    )
    # (Field's default given by position was read as no default: "Missing named argument
    # 'dtype' for 'Softmax'", and TuneOptions(budget=4) lacked five.)
    result = _mypy(site, USER_CODE)
    assert result.returncode == 0, result.stdout
    # (kernel's schedule was typed `... | Any`: anything at all passed the check.)
    wrong = USER_CODE + 'pipetune.kernel(fc, "h100", schedule=12345)\n'
    result = _mypy(site, wrong)
    assert result.returncode == 1, result.stdout
    assert 'Argument "schedule" to "kernel"' in result.stdout
