"""What the SDK raises: one exception per way a call can fail, each with a one-line message.

- ServiceUnavailableError: the service could not be reached (refused, DNS, timeout).
- ApiError and its subclasses: the service answered 4xx/5xx; `reason` is the server's own
  explanation (for a 422, "field: reason").
- ProtocolError: the service answered 2xx with a body that is not the wire contract's.
- WaitTimeoutError: Client.wait() gave up before the task finished.
- InvalidArgumentError: an argument the SDK cannot send (refused before any request).
- RequestBuildError: httpx could not build the request (e.g. an illegal header); nothing sent.
- ClientClosedError: a call on a Client (or WorkerApi) after close() or its `with` block.

InvalidArgumentError, RequestBuildError are also ValueErrors: the caller passed something
wrong. All of them derive from PipetuneError (pipetune.model.errors), as everything else
pipetune raises on purpose does.
"""

from __future__ import annotations

from typing import Any

# The root and the refused argument are the whole package's (the model's input errors derive
# from them too); the SDK re-exports them, where they were first defined.
from pipetune.model.errors import InvalidArgumentError as InvalidArgumentError
from pipetune.model.errors import PipetuneError as PipetuneError


class ServiceUnavailableError(PipetuneError):
    """No answer (or no whole one). `maybe_acted`: the request may have reached the service
    (it was sent, and its answer was lost, timed out or cut off) and acts anew each time it
    is sent: sent again, it may act twice (`Client.tune` would make a second task)."""

    def __init__(self, base_url: str, reason: str, maybe_acted: str | None = None):
        said = f"cannot reach the pipetune service at {base_url} ({reason})"
        if maybe_acted:
            said += f"; {maybe_acted} may have reached it: look before sending it again"
        super().__init__(said)
        self.base_url = base_url
        self.reason = reason
        # "POST /v1/tasks" where the request may have acted; None where it was not sent
        # (no connection) or only reads.
        self.maybe_acted = maybe_acted


class ProtocolError(PipetuneError):
    """A 2xx answer that does not parse as the wire contract says it should."""


class NotPipetuneError(ProtocolError):
    """A 2xx answer that is no JSON at all: a web page, not a pipetune service (the base URL
    names something else: another application, a proxy's page, a wrong port)."""


class WaitTimeoutError(PipetuneError):
    def __init__(self, task_id: int, timeout_s: float, state: str):
        super().__init__(f"task {task_id} is still {state} after {timeout_s:g} s")
        self.task_id = task_id
        self.timeout_s = timeout_s
        self.state = state


class RequestBuildError(PipetuneError, ValueError):
    """httpx refused to build the request (an illegal header, say): nothing was sent, so the
    service was never tried. Not a ServiceUnavailableError, which would send one looking for
    a network fault."""


class ClientClosedError(PipetuneError, RuntimeError):
    """A call on a client after its close() (or after its `with` block): nothing was sent.
    Also a RuntimeError, which is what httpx raised for it before."""


class ApiError(PipetuneError):
    """The service answered with an error status."""

    def __init__(
        self,
        status_code: int,
        reason: str,
        *,
        method: str = "",
        path: str = "",
        field: str | None = None,
        body: Any = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(reason)
        self.status_code = status_code
        self.reason = reason
        self.method = method
        self.path = path
        self.field = field
        self.body = body
        # The answer's Retry-After, in seconds from when it came (None: it had none).
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        where = f" from {self.method} {self.path}" if self.method else ""
        return f"{self.reason} (HTTP {self.status_code}{where})"

    @property
    def from_a_page(self) -> bool:
        """Whether the answer was no JSON (a web page's text): every pipetune answer, errors
        included, is JSON, so a page is a proxy's or another application's."""
        return isinstance(self.body, str)


class InvalidRequestError(ApiError, ValueError):
    """400 or 422: the request itself is wrong (bad workload, unknown GPU, bad budget). A
    ValueError, as bad input found before the request is (the README's contract: a bad
    workload the service refused was no ValueError, and `except ValueError` missed it)."""

    @property
    def argument(self) -> str | None:
        """The field the service named, as InvalidArgumentError's `argument` names one."""
        return self.field


class AuthError(ApiError):
    """401 or 403: a missing or wrong API key or worker token."""


class NotFoundError(ApiError):
    """404: no such task, worker or job."""


class ConflictError(ApiError):
    """409: the request does not fit the resource's state."""


class ServerError(ApiError):
    """5xx: the service failed; retrying later may help."""


class RetryLaterError(ApiError):
    """408 or 429: the service, or a proxy in front of it, asks to be asked again later (it
    has not judged the request)."""


# Errors that say nothing of the request, only of the moment: the service unreachable,
# failing (5xx: a database outage is a 503 "retry shortly"), or asking to be asked later
# (408, 429: a proxy's rate limit included). Whoever polls or retries (Client.wait, the
# worker daemon) goes on through these.
TRANSIENT: tuple[type[Exception], ...] = (ServiceUnavailableError, ServerError, RetryLaterError)

# The longest Retry-After obeyed: a longer one (a misconfigured proxy's hour) is read as this.
MAX_RETRY_AFTER_S = 300.0


def asked_wait_s(exc: BaseException) -> float | None:
    """How long a failed call's answer asked to be left alone (its Retry-After, at most
    MAX_RETRY_AFTER_S); None where it asked nothing (or there was no answer)."""
    asked = getattr(exc, "retry_after_s", None)
    return None if asked is None else min(float(asked), MAX_RETRY_AFTER_S)


def error_class(status_code: int) -> type[ApiError]:
    if status_code in (400, 422):
        return InvalidRequestError
    if status_code in (401, 403):
        return AuthError
    if status_code == 404:
        return NotFoundError
    if status_code == 409:
        return ConflictError
    if status_code in (408, 429):
        return RetryLaterError
    if status_code >= 500:
        return ServerError
    return ApiError
