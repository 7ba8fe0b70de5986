"""Shared OpenAPI response declarations."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Path
from pydantic import BeforeValidator

from pipetune.model.wire import ID_MAX, ValidationErrorBody

_DIGITS = re.compile(r"[0-9]+")


def _digits_only(value: Any) -> Any:
    # An id in a path is its decimal digits: pydantic's lax integers took /v1/tasks/1.0,
    # /+1 and / 1 as task 1, one resource under many addresses.
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError(f"an id is a whole number written in digits, got {value!r}")
    return value


# Row ids are 32-bit integers in the database: a larger one is refused before any query.
RowId = Annotated[int, Path(ge=1, le=ID_MAX), BeforeValidator(_digits_only)]

ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrorBody, "description": "invalid input: field and reason"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such resource"}}
