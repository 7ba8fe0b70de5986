"""A kernel family's worker-side parts, resolved by the names the family declares
(model/family.py): model/ names them, workers/ imports them, so model/ never imports
workers/ (DESIGN.md's dependency direction)."""

from __future__ import annotations

import importlib
from types import ModuleType

from pipetune.model.family import KernelFamily, family


def _module(name: str, what: str, fam: KernelFamily) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        message = f"family {fam.name}: its {what} {name} cannot be imported: {exc}"
        raise ImportError(message) from exc


def codegen_for(family_or_name: KernelFamily | str) -> ModuleType:
    """The family's code generator module (``generate(workload, schedule)``, ...)."""
    fam = family(family_or_name) if isinstance(family_or_name, str) else family_or_name
    return _module(fam.codegen_module, "code generator", fam)


def reference_for(family_or_name: KernelFamily | str) -> ModuleType:
    """The family's reference check module (``make_inputs``, ``reference``, ``check``)."""
    fam = family(family_or_name) if isinstance(family_or_name, str) else family_or_name
    return _module(fam.reference_module, "reference check", fam)
