"""Weights as the fused GEMM + SwiGLU takes them (model/workloads.py GemmSwiglu): the gate
and up projections' weights in one array, interleaved in groups of SWIGLU_INTERLEAVE
output features. A one-time transform of a model's weights, in the caller's own array
library (numpy, CuPy or PyTorch: whatever the weights are), with no copy back to the host.
"""

from __future__ import annotations

from typing import Any

from pipetune.clients.library.frameworks import library_of
from pipetune.model.errors import InvalidArgumentError
from pipetune.model.workloads import SWIGLU_INTERLEAVE

LAYOUTS = ("kn", "nk")


def interleave_gate_up(gate: Any, up: Any, b_layout: str = "kn") -> Any:
    """The B of ``gemm_swiglu`` from the two projections' weights.

    ``b_layout="kn"``: gate and up are K×N (``x @ gate``), the result K×2N whose columns
    16t..16t+7 are gate's 8t..8t+7 and 16t+8..16t+15 up's. ``"nk"``: they are N×K, as
    ``torch.nn.Linear`` stores its weight, and the result 2N×K interleaves their rows.
    N must be a multiple of 8 (the workload's ``n``)."""
    if b_layout not in LAYOUTS:
        raise InvalidArgumentError("b_layout", f"must be 'kn' or 'nk', got {b_layout!r}")
    import numpy

    for name, array in (("gate", gate), ("up", up)):
        if getattr(array, "ndim", None) != 2:
            raise InvalidArgumentError(name, "must be a 2-D array of weights")
        if isinstance(array, numpy.matrix):
            # Two-dimensional whatever it is reshaped to: the interleaving's 4-D reshape
            # failed with NumPy's AxisError.
            raise InvalidArgumentError(
                name, "must be an array, not a numpy.matrix (numpy.asarray makes one of it)"
            )
    if str(gate.dtype) != str(up.dtype):
        # Concatenated, the two were promoted to a type the kernel does not take (fp16 and
        # fp32 made fp32), and the mistake surfaced only at the kernel's call.
        raise InvalidArgumentError(
            "up", f"must have gate's dtype {gate.dtype}, got {up.dtype}: convert one first"
        )
    if tuple(gate.shape) != tuple(up.shape):
        raise InvalidArgumentError(
            "up", f"must have gate's shape {tuple(gate.shape)}, got {tuple(up.shape)}"
        )
    feature_axis = 1 if b_layout == "kn" else 0
    n = int(gate.shape[feature_axis])
    if 0 in tuple(gate.shape):
        # (An empty B came back, which no gemm_swiglu workload takes: n >= 8, k >= 1.)
        raise InvalidArgumentError("gate", f"must not be empty, got shape {tuple(gate.shape)}")
    if n % SWIGLU_INTERLEAVE:
        raise InvalidArgumentError(
            "gate",
            f"its {n} output features must be a multiple of {SWIGLU_INTERLEAVE} (axis "
            f"{feature_axis} with b_layout {b_layout!r})",
        )
    groups = n // SWIGLU_INTERLEAVE
    if b_layout == "kn":
        k = int(gate.shape[0])
        parts = [a.reshape(k, groups, 1, SWIGLU_INTERLEAVE) for a in (gate, up)]
        return _concatenate(gate, parts, axis=2).reshape(k, 2 * n)
    k = int(gate.shape[1])
    parts = [a.reshape(groups, 1, SWIGLU_INTERLEAVE, k) for a in (gate, up)]
    return _concatenate(gate, parts, axis=1).reshape(2 * n, k)


def _concatenate(like: Any, parts: list[Any], axis: int) -> Any:
    """Concatenation in the library of `like` (numpy's and CuPy's `concatenate`, PyTorch's
    `cat`)."""
    library = library_of(like)
    if library == "torch":
        import torch

        return torch.cat(parts, dim=axis)
    if library == "cupy":
        import cupy

        return cupy.concatenate(parts, axis=axis)
    import numpy

    return numpy.concatenate(parts, axis=axis)
