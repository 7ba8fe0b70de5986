"""pipetune: analytical-model-guided autotuning of pipelined GPU kernels.

This folder is installed as the ``pipetune`` package itself (pyproject's ``package-dir``
maps ``pipetune`` here and ``pipetune.model``, ``pipetune.tuner``, ``pipetune.workers``,
``pipetune.service``, ``pipetune.clients`` and ``pipetune.migrations`` to the repository's
top-level folders), so nothing but ``pipetune`` lands at the top of site-packages.
"""

from importlib.metadata import version as _version

__version__: str = _version("pipetune")

__all__ = ["__version__"]
