"""NumPy's scalars as the Python numbers they hold, at the library's edge.

A caller who computes a size with NumPy (``np.prod(x.shape[:-1])``, ``arr.shape[0] * 2`` of an
``np.int64``) holds an ``np.int64``, which pydantic's strict integers refuse ("Input should be a
valid integer (got np.int64(4096))", a message that says the opposite of the truth) and JSON
cannot encode. JSON itself never carries such a value, so the REST API's strictness (a "64" or
a 64.0 is a mistake, not a size) is untouched. Written by hand: a few lines over ``numbers`` and
``operator.index``, with no NumPy import (the SDK does not need NumPy).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Mapping
from typing import Any

from pydantic import BeforeValidator


def plain_integer(value: Any) -> Any:
    """An integer of another type (NumPy's) as the int it holds; anything else as it is
    (bool stays a bool, for the validation that refuses it to see)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, int):
        return operator.index(value)
    return value


def plain(value: Any) -> Any:
    """``value`` with NumPy's integers and floats as Python's, through dicts, lists and
    tuples."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(item) for item in value)
    if isinstance(value, numbers.Integral):
        return plain_integer(value)
    if isinstance(value, numbers.Real) and not isinstance(value, float):
        return float(value)
    return value


# For a strict integer field that library callers fill: Annotated[int, Field(...), PLAIN_INTEGER]
# (the Field first, or /openapi.json publishes its bounds as "ge"/"le", not JSON Schema's).
PLAIN_INTEGER = BeforeValidator(plain_integer)
