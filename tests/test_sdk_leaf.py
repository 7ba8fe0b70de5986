"""The SDK is a leaf: it imports the wire contract (model/wire.py), the error root
(model/errors.py) and NumPy's scalars made plain numbers for JSON (model/plain_numbers.py,
itself importing nothing of pipetune's) and nothing else of pipetune's, so a program that
only talks to a service loads no tuner, service or worker code (docs/architecture.md,
"Dependency direction")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parents[1] / "clients" / "sdk"
ALLOWED = (
    "pipetune.clients.sdk",
    "pipetune.model.wire",
    "pipetune.model.errors",
    "pipetune.model.plain_numbers",
)


def _pipetune_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(n for n in names if n == "pipetune" or n.startswith("pipetune."))
    return found


def test_the_sdk_imports_only_itself_the_wire_contract_and_the_error_root():
    files = sorted(SDK.glob("*.py"))
    assert files
    for path in files:
        for module in _pipetune_imports(path):
            ok = any(module == a or module.startswith(f"{a}.") for a in ALLOWED)
            assert ok, f"{path.name} imports {module}"


def test_importing_the_sdk_loads_no_tuner_service_or_worker_code():
    code = (
        "import sys, pipetune.clients.sdk\n"
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'pipetune.tuner', 'pipetune.service', 'pipetune.workers', 'pipetune.clients.cli'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
