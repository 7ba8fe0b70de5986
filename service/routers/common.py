"""Shared OpenAPI response declarations."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from pipetune.model.wire import ID_MAX, ValidationErrorBody

# Row ids are 32-bit integers in the database: a larger one is refused before any query.
RowId = Annotated[int, Path(ge=1, le=ID_MAX)]

ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrorBody, "description": "invalid input: field and reason"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such resource"}}
