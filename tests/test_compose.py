"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the services
and their wiring, that every PIPETUNE_* variable they set is one the code reads, and that
every `pipetune ...` command they run exists with the options given."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.service.settings import Settings
from pipetune.workers.runners import TIME_SCALE_ENV

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()
SERVICES = COMPOSE["services"]
runner = CliRunner()


def _cli_envvars(command: Any) -> set[str]:
    """Every envvar an option of the command tree reads (typer's click objects)."""
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        names.update([envvar] if isinstance(envvar, str) else envvar or [])
    for sub in getattr(command, "commands", {}).values():
        names |= _cli_envvars(sub)
    return names


def variables_the_code_reads() -> set[str]:
    prefix = Settings.model_config["env_prefix"]
    settings = {f"{prefix}{name}".upper() for name in Settings.model_fields}
    return settings | _cli_envvars(typer.main.get_command(app)) | {TIME_SCALE_ENV}


def pipetune_commands(command: list[str] | str) -> list[list[str]]:
    """The `pipetune ...` invocations of a compose command or Dockerfile CMD."""
    if isinstance(command, list) and command[:2] == ["sh", "-c"]:
        command = command[2]
    parts = [shlex.split(p) for p in command.split("&&")] if isinstance(command, str) else [command]
    found = []
    for words in parts:
        if words and words[0] == "exec":
            words = words[1:]
        if words and words[0] == "pipetune":
            found.append(words[1:])
    return found


def check_command_exists(args: list[str]) -> None:
    path = [
        a for a in args[: next((i for i, a in enumerate(args) if a.startswith("-")), len(args))]
    ]
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, f"pipetune {' '.join(path)}: {result.output}"
    for option in (a for a in args if a.startswith("--")):
        assert option in result.stdout, f"pipetune {' '.join(path)} has no {option}"


def test_the_three_services_and_a_simulated_one():
    assert {"postgres", "service", "worker"} <= set(SERVICES)
    assert SERVICES["worker-sim"]["profiles"] == ["sim"]


def test_postgres_is_healthchecked_and_the_service_waits_for_it():
    assert "pg_isready" in " ".join(SERVICES["postgres"]["healthcheck"]["test"])
    service = SERVICES["service"]
    assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    url = service["environment"]["PIPETUNE_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://pipetune:") and "@postgres:5432/pipetune" in url


def test_the_service_migrates_at_start_and_is_healthchecked():
    service = SERVICES["service"]
    commands = pipetune_commands(service["command"])
    assert [c[:2] for c in commands] == [["db", "upgrade"], ["serve", "--host"]]
    # (In its container it listens on every interface; compose publishes it: see below.)
    assert "0.0.0.0" in commands[1] and service["ports"][0].endswith(":8000:8000")
    assert "/healthz" in " ".join(service["healthcheck"]["test"])
    assert service["build"]["target"] == "service"


def test_the_worker_gets_a_gpu_and_finds_the_service():
    worker = SERVICES["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    env = worker["environment"]
    assert env["PIPETUNE_SERVER"] == "http://service:8000"
    assert worker["depends_on"]["service"]["condition"] == "service_healthy"
    assert worker["build"]["target"] == "worker"
    (command,) = pipetune_commands(worker["command"])
    assert command[:3] == ["worker", "--runner", "cupy"]
    # Drain on SIGTERM needs time to finish the trials in hand.
    assert worker["stop_signal"] == "SIGTERM" and worker["stop_grace_period"] == "2m"


def _stage_healthchecks() -> dict[str, bool]:
    """Each Dockerfile stage (its AS name) and whether it sets a HEALTHCHECK."""
    stages: dict[str, bool] = {}
    current = None
    for line in DOCKERFILE.splitlines():
        if match := re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE):
            current = match.group(1)
            stages[current] = False
        elif current and line.startswith("HEALTHCHECK") and "NONE" not in line.split():
            stages[current] = True
    return stages


def test_a_container_that_serves_nothing_inherits_no_service_healthcheck():
    """worker-sim runs the service image, whose HEALTHCHECK asks :8000/healthz, with only a
    worker inside: "unhealthy" for good, and `docker compose up --wait` failed."""
    stages = _stage_healthchecks()
    assert stages == {"service": True, "worker": False}
    for name, spec in SERVICES.items():
        target = spec.get("build", {}).get("target")
        commands = pipetune_commands(spec.get("command", []))
        serves = any(c[:1] == ["serve"] for c in commands)
        if target in stages and stages[target] and not serves:
            assert spec.get("healthcheck", {}).get("disable") is True, name


def test_postgres_is_not_published_on_the_host():
    # Only the service connects; a host's own PostgreSQL on 5432 stopped `up`.
    assert "ports" not in SERVICES["postgres"]


def test_the_open_service_is_published_on_loopback_and_answers_its_own_names_only():
    """The service was published on every interface of the host with its user routes open
    (no API keys by default) and no Host guard: anyone on the network, or a web page by DNS
    rebinding, could create, read and cancel tasks."""
    service = SERVICES["service"]
    assert service["ports"] == ["${PUBLISH_ADDRESS:-127.0.0.1}:8000:8000"]
    allowed = service["environment"]["PIPETUNE_ALLOWED_HOSTS"]
    default = re.fullmatch(r"\$\{PIPETUNE_ALLOWED_HOSTS:-(.*)\}", allowed)
    assert default is not None, allowed
    names = Settings(allowed_hosts=default.group(1), worker_tokens=["t"]).allowed_hosts
    # The workers' URL inside compose, and the host's own names (its health check asks
    # 127.0.0.1, which the guard lets by whatever the Host).
    server = SERVICES["worker"]["environment"]["PIPETUNE_SERVER"]
    assert server == "http://service:8000" and "service" in names
    assert {"localhost", "127.0.0.1"} <= set(names) and "*" not in names


def test_service_and_workers_share_the_worker_token():
    service_tokens = SERVICES["service"]["environment"]["PIPETUNE_WORKER_TOKENS"]
    for name in ("worker", "worker-sim"):
        assert SERVICES[name]["environment"]["PIPETUNE_WORKER_TOKEN"] == service_tokens
    assert service_tokens.startswith("${PIPETUNE_WORKER_TOKEN:?")  # required, never a default


def test_every_pipetune_variable_set_is_read_by_the_code():
    read = variables_the_code_reads()
    assert {"PIPETUNE_DATABASE_URL", "PIPETUNE_WORKER_TOKENS", "PIPETUNE_SERVER"} <= read
    assert "PIPETUNE_WORKER_TOKEN" in read
    for name, service in SERVICES.items():
        for variable in service.get("environment", {}):
            if variable.startswith("PIPETUNE_"):
                assert variable in read, f"{name} sets {variable}, which nothing reads"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_command_exists_with_its_options(name: str):
    command = SERVICES[name].get("command")
    if command is None:
        assert name == "postgres"
        return
    commands = pipetune_commands(command)
    assert commands, f"{name} runs no pipetune command"
    for args in commands:
        check_command_exists(args)


def test_the_dockerfile_builds_both_targets_with_existing_commands():
    targets = re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, flags=re.M)
    assert targets == ["service", "worker"]
    cmds = re.findall(r"^CMD (\[.*\])$", DOCKERFILE, flags=re.M)
    assert len(cmds) == 2
    for cmd in cmds:
        (args,) = pipetune_commands(yaml.safe_load(cmd))
        check_command_exists(args)
    # Editable install: `pipetune db upgrade` reads the Alembic scripts next to the sources.
    for directory in ("model", "tuner", "workers", "service", "clients", "migrations"):
        assert f"COPY {directory} {directory}" in DOCKERFILE
    assert "pip install -e '.[gpu]'" in DOCKERFILE and "/healthz" in DOCKERFILE


def test_the_readme_has_a_compose_section():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Compose", 1)[1].split("\n## ", 1)[0]
    assert "docker compose up" in section and "PIPETUNE_WORKER_TOKEN" in section


def _reserves_a_gpu(service: dict) -> bool:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return any("gpu" in d.get("capabilities", []) for d in devices.get("devices", []))


def test_the_no_gpu_compose_command_starts_no_service_that_needs_a_gpu():
    """The README gave `docker compose --profile sim up -d` as the way to run without a GPU,
    but that also starts the GPU worker, whose device reservation fails on such a host. The
    no-GPU command names its services: each exists, none reserves a GPU, and what they
    depend on is among them."""
    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.endswith("worker-sim"))
    words = shlex.split(line)
    assert words[:2] == ["docker", "compose"] and "up" in words
    named = {w for w in words[words.index("up") + 1 :] if not w.startswith("-")}
    assert named and named <= set(SERVICES), named
    assert _reserves_a_gpu(SERVICES["worker"])  # (the check below can fail)
    for name in named:
        assert not _reserves_a_gpu(SERVICES[name]), name
        assert set(SERVICES[name].get("depends_on", {})) <= named, name
    assert all("sim" in SERVICES[n].get("profiles", ["sim"]) for n in named)


def test_each_stage_copies_every_file_the_package_build_names():
    """The build reads pyproject's readme and license files: the Dockerfile copied no docs/,
    so the images' wheels lacked the licence (setuptools warns now, refuses from 2027)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = [project["readme"], *project["license-files"]]
    stages = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]
    installing = [s for s in stages if "pip install" in s]
    assert installing
    for stage in installing:
        copied = [
            word
            for line in stage.splitlines()
            if line.startswith("COPY ")
            for word in shlex.split(line)[1:-1]
        ]
        for path in needed:
            assert any(path == c or path.startswith(c.rstrip("/") + "/") for c in copied), (
                f"{stage.splitlines()[0]}: {path} is not copied"
            )
