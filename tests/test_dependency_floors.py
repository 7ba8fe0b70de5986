"""The lowest versions pyproject.toml allows are versions pipetune works with.

A user whose environment already pins an older release that pyproject's bounds accept gets
that release, so each floor is a promise, and most were not kept. At the floors named before
this test, every command failed at import (pydantic-settings 2.2 has no `NoDecode`; FastAPI
before 0.117 refuses a 204 route typed `-> None`; SQLAlchemy before 2.0.33 cannot map
`Mapped[dict[str, Any]]`; psycopg before 3.3.6 has no `Connection.wait(timeout=)`), and past
the imports: SQLAlchemy 2.0 leaves a URL's %XX encoded (a data folder with a space in its
name held the database elsewhere), FastAPI before 0.132 takes a JSON body sent without its
Content-Type, uvicorn before 0.41 answers a Ctrl-C in its start with a traceback, pydantic
before 2.10 publishes no `propertyNames`, and typer before 0.27 words its usage errors
otherwise (before 0.16 it breaks on the click pip installs beside it).

The slow tests here install the wheel with every runtime dependency at its floor into a
fresh virtual environment and run a cross-section of this suite there; the rest of the
suite runs on the newest releases (make test installs them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

# A cross-section of the suite, run against the floors: the service's routes (FastAPI,
# Starlette, pydantic, pydantic-settings), both queues (SQLAlchemy, Alembic, psycopg), a
# served process (uvicorn), the CLI (typer, rich), the SDK (httpx, tenacity), the metrics
# (prometheus-client), the curves (plotly, scipy), the tuner's surrogates (numpy, scipy,
# scikit-learn, threadpoolctl, XGBoost), the kernel compiler (NVRTC, cuda-bindings), and
# the tests that failed at the floors pyproject.toml named before (each line says which).
CROSS_SECTION = (
    "tests/test_service_api.py",
    "tests/test_service_queue.py",
    "tests/test_e2e_serve.py",
    "tests/test_cli_client.py",
    "tests/test_sdk_transient.py",
    "tests/test_metrics.py",
    "tests/test_best_curve.py",
    "tests/test_tuner.py",
    "tests/test_tuner_bo.py",
    "tests/test_cost_model.py",
    "tests/test_compile.py",
    "tests/test_cli_help.py",  # typer before 0.27 (and click 8.2 under typer before 0.16)
    "tests/test_sqlite_url_of_path.py",  # SQLAlchemy 2.0
    "tests/test_serve_interrupt.py",  # uvicorn before 0.41
    "tests/test_sdk_unknown_values.py",  # pydantic before 2.10
    "tests/test_tuner_lbfgsb.py",  # scipy before 1.15 (the fits' fallback)
    # FastAPI before 0.132
    "tests/test_service_validation.py::test_a_body_sent_as_another_content_type_says_so",
)
# What the cross-section needs beyond pipetune's own dependencies (the newest: only the
# runtime dependencies' floors are promised).
TEST_TOOLS = ("pytest", "hypothesis")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def runtime_requirements() -> list[Requirement]:
    return [Requirement(line) for line in _project()["dependencies"]]


def floor_of(requirement: Requirement) -> str:
    """The version a `>=` bound names; the requirement's one lower bound."""
    lows = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    if len(lows) != 1:
        raise ValueError(f"{requirement} names no single '>=' floor")
    return lows[0]


def floor_pins() -> list[str]:
    return [f"{req.name}=={floor_of(req)}" for req in runtime_requirements()]


def oldest_python() -> str:
    return floor_of(Requirement(f"python{_project()['requires-python']}"))


def floor_python() -> str | None:
    """An interpreter of the oldest Python pyproject supports, where the floors are promised
    (a newer Python starts at the first releases built for it: numpy 1.26 has no wheel for
    3.13); None where this machine has none."""
    if sys.version_info[:2] == Version(oldest_python()).release[:2]:
        return sys.executable
    return shutil.which(f"python{oldest_python()}")


def test_every_runtime_dependency_names_one_floor():
    """A dependency without a floor takes whatever the user has, however old: the floors
    test below could not check it."""
    for requirement in runtime_requirements():
        assert floor_of(requirement), requirement


def test_a_requirement_without_a_floor_is_refused():
    with pytest.raises(ValueError, match="no single '>=' floor"):
        floor_of(Requirement("example<2"))
    assert floor_of(Requirement("example[extra]>=1.2,<2")) == "1.2"


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def floor_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with pipetune's wheel, every runtime dependency at its floor."""
    work = tmp_path_factory.mktemp("floors")
    built = _run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--wheel-dir", str(work / "wheel"), str(ROOT)),
        ]
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (work / "wheel").glob("pipetune-*.whl")
    interpreter = floor_python()
    if interpreter is None:
        pytest.skip(f"the floors are promised on Python {oldest_python()}; this machine has none")
    made = _run([interpreter, "-m", "venv", str(work / "venv")])
    assert made.returncode == 0, made.stderr
    python = work / "venv" / "bin" / "python"
    pins = work / "floors.txt"
    pins.write_text("\n".join(floor_pins()) + "\n")
    installed = _run(
        [
            *(str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
            *("--constraint", str(pins), str(wheel), *TEST_TOOLS),
        ],
        timeout=900,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


def test_the_floors_are_what_the_environment_holds(floor_environment):
    """The constraint file held: each runtime dependency is at exactly its floor, and
    pipetune is imported from the environment's wheel, not from this checkout."""
    script = (
        "import importlib.metadata as m, sys, pipetune\n"
        "for pin in sys.argv[1:]:\n"
        "    name, version = pin.split('==')\n"
        "    print(pin, m.version(name))\n"
        "print(pipetune.__file__)\n"
    )
    shown = _run([str(floor_environment), "-c", script, *floor_pins()], cwd="/")
    assert shown.returncode == 0, shown.stderr
    *versions, location = shown.stdout.splitlines()
    assert len(versions) == len(floor_pins())
    for line in versions:
        pin, version = line.split()
        assert Version(pin.split("==")[1]) == Version(version), line  # 1.26 is 1.26.0
    assert Path(location).is_relative_to(floor_environment.parents[1]), location


def test_every_module_imports_at_the_floors(floor_environment):
    script = (
        "import importlib, pkgutil, pipetune\n"
        "for info in pkgutil.walk_packages(pipetune.__path__, 'pipetune.'):\n"
        "    if '.migrations.' in info.name or info.name.endswith('__main__'):\n"
        "        continue  # Alembic's scripts run inside Alembic; __main__ runs the CLI\n"
        "    importlib.import_module(info.name)\n"
        "    print(info.name)\n"
    )
    imported = _run([str(floor_environment), "-c", script], cwd="/")
    assert imported.returncode == 0, imported.stderr
    assert "pipetune.service.app" in imported.stdout.split()


def test_a_cross_section_of_the_suite_passes_at_the_floors(floor_environment):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    tested = _run(
        [
            *(str(floor_environment), "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *CROSS_SECTION,
        ],
        cwd=ROOT,
        env=env,
        timeout=1200,
    )
    assert tested.returncode == 0, tested.stdout[-6000:] + tested.stderr[-2000:]
    assert " passed" in tested.stdout.splitlines()[-1]
