"""Shared OpenAPI response declarations."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Path
from pydantic import BeforeValidator

from pipetune.model.wire import ID_MAX, ValidationErrorBody

_DIGITS = re.compile(r"0|[1-9][0-9]*")


def _digits_only(value: Any) -> Any:
    # An id in a path is its decimal digits, no leading zero: pydantic's lax integers took
    # /v1/tasks/1.0, /+1, / 1 and /01 as task 1, one resource under many addresses.
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError(
            f"an id is a whole number written in digits, no leading zero, got {value!r}"
        )
    return value


# Row ids are 32-bit integers in the database: a larger one is refused before any query.
RowId = Annotated[int, Path(ge=1, le=ID_MAX), BeforeValidator(_digits_only)]

_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def _integer_only(value: Any) -> Any:
    # A count in a query is written as one, as in a body (strict there): ?limit=1.0 and
    # ?limit=%201 were read as 1.
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        raise ValueError(f"a whole number written in digits, got {value!r}")
    return value


# Where a query parameter is an integer: Annotated[int, Query(...), QUERY_INT].
QUERY_INT = BeforeValidator(_integer_only)

ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrorBody, "description": "invalid input: field and reason"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such resource"}}

UNAUTHORISED = "no valid credential: a worker token, or an API key where the service has keys"
TOO_LARGE = "the request body is over the service's limit (PIPETUNE_MAX_BODY_BYTES)"
ENCODED = "the request body is compressed (Content-Encoding): send the JSON uncompressed"
UNAVAILABLE = (
    "the database is unavailable or locked past its deadline; retry after the Retry-After "
    "header's seconds"
)
_SCHEMAS = "#/components/schemas/"
# FastAPI's own 422 body ({"detail": [{"loc", "msg", "type"}]}), which it documents for every
# route with parameters that does not declare a 422 of its own: pipetune never answers it
# (service.errors answers every invalid request with ValidationErrorBody).
_STOCK_422 = ("HTTPValidationError", "ValidationError")


def with_project_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document `schema` (changed in place) with every 422 described as the
    ValidationErrorBody the service answers, and FastAPI's stock 422 body gone: a route that
    did not declare ERRORS documented a body it never sends, and a client generated from
    the schema mis-read its every 422. Also 401 where a route takes a credential, 413 and
    415 where it reads a body, and 503 on the API's routes (each reads or writes the
    database)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    name = ValidationErrorBody.__name__
    if name not in components:  # (no route declared ERRORS: the body's schema added here)
        body = ValidationErrorBody.model_json_schema(ref_template=_SCHEMAS + "{model}")
        for key, value in body.pop("$defs", {}).items():
            components.setdefault(key, value)
        components[name] = body
    ours = {
        "description": ERRORS[422]["description"],
        "content": {"application/json": {"schema": {"$ref": _SCHEMAS + name}}},
    }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.get("responses") if isinstance(operation, dict) else None
            if not responses:
                continue
            if "422" in responses:
                responses["422"] = ours
            # Answered on every route they can happen on, and documented nowhere (a client
            # generated from the schema had no case for them): derived from the route's own
            # description, a credential it takes (service/auth.py) and a body it reads
            # (service/middleware.py's limit).
            if operation.get("security"):
                responses.setdefault("401", {"description": UNAUTHORISED})
            if operation.get("requestBody"):
                responses.setdefault("413", {"description": TOO_LARGE})
                responses.setdefault("415", {"description": ENCODED})
            if path.startswith("/v1/"):
                responses.setdefault("503", {"description": UNAVAILABLE})
    for stock in _STOCK_422:
        components.pop(stock, None)
    return schema
