"""pipetune: analytical-model-guided autotuning of pipelined GPU kernels.

    import pipetune
    result = pipetune.tune({"op": "gemm", "m": 1024, "n": 64, "k": 2048}, "h100", budget=16)
    pipetune.best_schedule(pipetune.Gemm(m=1024, n=64, k=2048), "h100")
    k = pipetune.kernel({"op": "gemm", "m": 1024, "n": 64, "k": 2048}, "h100")
    c = k(a, b)                                   # CuPy arrays or PyTorch CUDA tensors
    with pipetune.Client("http://host:8000") as client: ...

This folder is installed as the ``pipetune`` package itself (pyproject's ``package-dir``
maps ``pipetune`` here and ``pipetune.model``, ``pipetune.tuner``, ``pipetune.workers``,
``pipetune.service``, ``pipetune.clients`` and ``pipetune.migrations`` to the repository's
top-level folders), so nothing but ``pipetune`` lands at the top of site-packages.

The names are exported lazily (PEP 562): ``import pipetune`` loads nothing but the version,
so a GPU machine that lacks the service's dependencies imports it, and each name loads its
module on first use.
"""

from __future__ import annotations

from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

__version__: str = _version("pipetune")

if TYPE_CHECKING:
    from pipetune.clients.library.arrays import ArgumentError
    from pipetune.clients.library.kernel import TunedKernel, kernel
    from pipetune.clients.library.lookup import best_schedule
    from pipetune.clients.library.tuning import TuneResult, tune
    from pipetune.clients.library.weights import interleave_gate_up
    from pipetune.clients.sdk import Client
    from pipetune.model.errors import InvalidArgumentError, PipetuneError
    from pipetune.model.hopper.workloads import (
        HopperBmm,
        HopperGemm,
        HopperGemmBiasGelu,
        HopperGemmSwiglu,
    )
    from pipetune.model.memops.workloads import (
        BiasGelu,
        LayerNorm,
        Reduce,
        RMSNorm,
        SiluMul,
        Softmax,
    )
    from pipetune.model.space import Schedule
    from pipetune.model.workloads import Bmm, Conv2d, Conv3d, Gemm, GemmBiasGelu, GemmSwiglu

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "Client": "pipetune.clients.sdk",
    "tune": "pipetune.clients.library.tuning",
    "TuneResult": "pipetune.clients.library.tuning",
    "best_schedule": "pipetune.clients.library.lookup",
    "kernel": "pipetune.clients.library.kernel",
    "TunedKernel": "pipetune.clients.library.kernel",
    "ArgumentError": "pipetune.clients.library.arrays",
    "PipetuneError": "pipetune.model.errors",
    "InvalidArgumentError": "pipetune.model.errors",
    "Schedule": "pipetune.model.space",
    "Gemm": "pipetune.model.workloads",
    "GemmSwiglu": "pipetune.model.workloads",
    "GemmBiasGelu": "pipetune.model.workloads",
    "interleave_gate_up": "pipetune.clients.library.weights",
    "Bmm": "pipetune.model.workloads",
    "Conv2d": "pipetune.model.workloads",
    "Conv3d": "pipetune.model.workloads",
    "Reduce": "pipetune.model.memops.workloads",
    "Softmax": "pipetune.model.memops.workloads",
    "LayerNorm": "pipetune.model.memops.workloads",
    "RMSNorm": "pipetune.model.memops.workloads",
    "SiluMul": "pipetune.model.memops.workloads",
    "BiasGelu": "pipetune.model.memops.workloads",
    "HopperGemm": "pipetune.model.hopper.workloads",
    "HopperBmm": "pipetune.model.hopper.workloads",
    "HopperGemmBiasGelu": "pipetune.model.hopper.workloads",
    "HopperGemmSwiglu": "pipetune.model.hopper.workloads",
}

__all__ = [
    "ArgumentError",
    "BiasGelu",
    "Bmm",
    "Client",
    "Conv2d",
    "Conv3d",
    "Gemm",
    "GemmBiasGelu",
    "GemmSwiglu",
    "HopperBmm",
    "HopperGemm",
    "HopperGemmBiasGelu",
    "HopperGemmSwiglu",
    "InvalidArgumentError",
    "LayerNorm",
    "PipetuneError",
    "RMSNorm",
    "Reduce",
    "Schedule",
    "SiluMul",
    "Softmax",
    "TuneResult",
    "TunedKernel",
    "__version__",
    "best_schedule",
    "interleave_gate_up",
    "kernel",
    "tune",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipetune' has no attribute {name!r}")
    from pipetune.lazy import load_module  # (here: `import pipetune` loads nothing else)

    value = getattr(load_module(module), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})
