"""Error responses: every 422 names the field and the reason (model/wire.py
ValidationErrorBody); domain errors map to 403/404/409; a database that cannot be reached
(restarting, failing over, out of connections) is a 503 with Retry-After, which workers and
the SDK retry, not a 500."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipetune.model.family import all_ops
from pipetune.model.hardware import HardwareError
from pipetune.model.wire import ErrorItem, FieldError, ValidationErrorBody
from pipetune.model.workloads import WorkloadError
from pipetune.service.db import (
    DISK_FULL_WINDOW_S,
    DatabaseGoneError,
    is_unavailable,
    refusal_cause,
    unavailable_reason,
)
from pipetune.service.routers.bounded_json import TooManyFieldsError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
DATABASE_UNAVAILABLE = "the database is unavailable; retry shortly"
# A full disk is a 503 too (workers and the SDK retry it, and the service resumes by itself
# once there is room), but named: the database answers, so "unavailable" misled.
DATABASE_FULL = "the database's disk is full: writes fail until space is freed; retry later"
DATABASE_CORRUPT = (
    "the database is corrupt: what reads its damaged part fails until it is restored from a "
    "backup; retry later"
)
DATABASE_READ_ONLY = (
    "the database is read-only: writes fail until it is writable again (a read-only mount or "
    "file, a standby after a failover); retry later"
)
# Each cause of refused work's answer (service.db.refusal_cause).
_REFUSED = {
    "corrupt": DATABASE_CORRUPT,
    "full": DATABASE_FULL,
    "read-only": DATABASE_READ_ONLY,
}
# A full disk does not clear in a second, as a restart or a failover may: a retry a second
# later only fails again (and keeps /healthz unhealthy). Clients are told to come back after
# the window /healthz reports it for, when it is healthy again if no write has failed since.
RETRY_AFTER_FULL_S = math.ceil(DISK_FULL_WINDOW_S)
# A 422 says what was wrong, not all of it again: a quoted value is cut to SHOWN_CHARS and a
# reason to REASON_CHARS, and at most MAX_ITEMS problems are listed (a body of 20,000 unknown
# keys, or a 400 KB string, made a 422 of megabytes).
SHOWN_CHARS = 80
REASON_CHARS = 500
MAX_ITEMS = 20
UNPARSABLE_BODY = "not JSON text: undecodable bytes (send UTF-8), or nested too deeply"
LONG_NUMBER = "a number in the body has more digits than any size, id or count can (4300)"


class ServiceError(Exception):
    status_code = 400

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class NotFoundError(ServiceError):
    status_code = 404


class ForbiddenError(ServiceError):
    status_code = 403


class ConflictError(ServiceError):
    status_code = 409


class DatabaseFullError(ServiceError):
    """Writes failed for a full disk or a read-only database within the last while
    (Database.write_problem)."""

    status_code = 503


class DatabaseStalledError(ServiceError):
    """The database has not answered within the statement deadline (stopped, its storage
    hung): /healthz names it (service/db.py, Database.stall_problem)."""

    status_code = 503


class InputError(ServiceError):
    """Bad input found past request validation (e.g. a workload with no valid schedule)."""

    status_code = 422

    def __init__(self, loc: list[str | int], reason: str):
        super().__init__(f"{'.'.join(map(str, loc))}: {reason}")
        self.loc = loc
        self.reason = reason


_PREFIXES = ("Value error, ", "Assertion failed, ")


def _reason(error: dict[str, Any]) -> str:
    msg = str(error.get("msg", "invalid"))
    for prefix in _PREFIXES:
        msg = msg.removeprefix(prefix)
    if error.get("type") == "json_invalid":
        ctx = error.get("ctx") or {}
        return f"malformed JSON: {ctx.get('error', msg)}"
    return msg


def _item(error: dict[str, Any]) -> ErrorItem:
    ops = all_ops()  # every family's: the workload union puts the op tag in the location
    kind = str(error.get("type", "value_error"))
    raw = list(error.get("loc", ()))
    # The tag is never the last part of an extra key's location: that is the key the caller
    # sent, whatever its name ("gemm" where "workload" belongs), and the reason is about it.
    key = [raw.pop()] if kind == "extra_forbidden" and raw else []
    loc: list[str | int] = [p for p in raw if not (isinstance(p, str) and p in ops)] + key
    reason = _reason(error)
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, WorkloadError | FieldError):
        # A model validator reports at the model (a workload's: at the operator); the field
        # is in the error.
        loc = [*loc, cause.field]
        reason = cause.reason
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        loc = [*loc, "op"]
        known = ", ".join(ops)
        sent = error.get("input")
        if kind == "union_tag_invalid" and isinstance(sent, dict) and "op" in sent:
            # The value as the caller sent it (pydantic's tag is its str(): null read 'None').
            reason = f"unknown operator {_json_text(sent['op'])}; known: {known}"
        else:
            reason = f"missing; one of: {known}"
    elif kind == "json_invalid":
        loc = ["body"]
    if "input" in error and kind not in ("missing", "json_invalid", "extra_forbidden"):
        value = error["input"]
        shown = cut_text(_json_text(value), SHOWN_CHARS)
        # pydantic's own messages never show the input ("greater than 0" for an eps of 0):
        # always said; the project's reasons usually do ("..., got 100", in Python's words
        # or JSON's): said where not.
        python = cut_text(repr(value), SHOWN_CHARS)
        said = any(f"got {text}" in reason for text in (shown, python))
        # The project's own reasons (a model validator's) may quote the value otherwise
        # ("unknown GPU 'v100'; known: ..."): said there too.
        ours = isinstance(cause, WorkloadError | FieldError) or kind == "value_error"
        quoted = ours and any(text in reason for text in (shown, python))
        scalar = isinstance(value, int | float | str | bool) or value is None
        if scalar and not (said or quoted):
            reason = f"{reason} (got {shown})"
    reason = cut_text(reason, REASON_CHARS)
    names = [p for p in loc if isinstance(p, str) and p not in ("body", "query", "path")]
    field = names[-1] if names else "body"
    return ErrorItem(loc=loc, field=field, reason=reason, type=kind)


def _json_text(value: Any) -> str:
    """A value as the caller wrote it in JSON (null, true, 5, "abc", NaN), not as Python
    prints it (None, True, '5')."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON's (a query string's bytes): Python's words
        return repr(value)
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate cannot be sent back as itself: escaped
        return json.dumps(value)
    return text


def cut_text(text: str, limit: int) -> str:
    """`text` up to `limit` characters, saying how many more it had."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _content_type_hint(request: Request, items: list[ErrorItem]) -> None:
    """A body sent as anything but JSON reaches validation as raw bytes, whose complaint
    ("a valid dictionary") does not say that the content type is what is wrong."""
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    maintype, _, subtype = media.partition("/")
    # What FastAPI decodes as JSON (anything else, text/json and no header included, reaches
    # validation undecoded).
    if maintype == "application" and (subtype == "json" or subtype.endswith("+json")):
        return
    sent = (
        f"not {cut_text(content_type, SHOWN_CHARS)}" if content_type else "no Content-Type was sent"
    )
    for item in items:
        if item.loc == ["body"]:
            item.reason = f"send the body as JSON (Content-Type: application/json); {sent}"


def validation_body(errors: list[dict[str, Any]], request: Request | None = None) -> dict[str, Any]:
    items = [_item(e) for e in errors[:MAX_ITEMS]] or [
        ErrorItem(loc=["body"], field="body", reason="invalid request", type="value_error")
    ]
    if request is not None:
        _content_type_hint(request, items)
    body = ValidationErrorBody(field=items[0].field, reason=items[0].reason, detail=items)
    return body.model_dump(mode="json")


def _one_problem(loc: list[str | int], reason: str, kind: str) -> JSONResponse:
    item = ErrorItem(loc=loc, field=str(loc[-1]), reason=reason, type=kind)
    body = ValidationErrorBody(field=item.field, reason=item.reason, detail=[item])
    return JSONResponse(body.model_dump(mode="json"), status_code=422)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_body(list(exc.errors()), request), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Any:
        # FastAPI answers a body it cannot decode (bytes that are not UTF-8, JSON nested past
        # Python's recursion limit) with a bare 400; it is the body that is wrong: a 422.
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
            if isinstance(exc.__cause__, TooManyFieldsError):  # (routers/bounded_json.py)
                return _one_problem(["body"], str(exc.__cause__), "json_invalid")
            if "integer string conversion" in str(exc.__cause__):  # Python's digit limit
                return _one_problem(["body"], LONG_NUMBER, "json_invalid")
            return _one_problem(["body"], UNPARSABLE_BODY, "json_invalid")
        return await http_exception_handler(request, exc)

    @app.exception_handler(InputError)
    async def _input(_request: Request, exc: InputError) -> JSONResponse:
        return _one_problem(exc.loc, exc.reason, "value_error")

    async def _database(_request: Request, exc: Exception) -> JSONResponse:
        if not is_unavailable(exc):
            raise exc  # an integrity error, a bad statement: a bug, a 500 with its traceback
        # One line, no traceback, no SQL or parameters: the cause is outside the service.
        log.warning("database unavailable: %s", unavailable_reason(exc))
        detail = _REFUSED.get(refusal_cause(exc))
        return JSONResponse(
            {"detail": detail or DATABASE_UNAVAILABLE},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_FULL_S if detail else RETRY_AFTER_S)},
        )

    app.add_exception_handler(sa_exc.DBAPIError, _database)
    app.add_exception_handler(sa_exc.TimeoutError, _database)

    @app.exception_handler(DatabaseGoneError)
    async def _gone(_request: Request, exc: DatabaseGoneError) -> JSONResponse:
        # No Retry-After: the replica serves its old file or none until it is restarted.
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.exception_handler(HardwareError)
    async def _hardware(_request: Request, exc: HardwareError) -> JSONResponse:
        # A GPU's profile the service reads (its user's or PIPETUNE_PROFILE_DIR's, edited or
        # written half since it started) that no longer parses: the service's own fault, said
        # in one line; a bare 500 read "not a pipetune answer" at the CLI.
        log.error("hardware model: %s", exc)
        return JSONResponse(
            {"detail": f"the service's hardware model cannot be used: {exc}"}, status_code=500
        )

    @app.exception_handler(ServiceError)
    async def _service(_request: Request, exc: ServiceError) -> JSONResponse:
        # A stall or a full disk passes (a SQLite file deleted does not): a worker may retry.
        headers = None
        if isinstance(exc, DatabaseFullError):
            headers = {"Retry-After": str(RETRY_AFTER_FULL_S)}
        elif isinstance(exc, DatabaseStalledError):
            headers = {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)
