"""The worker's retries (tenacity): registering, leasing and posting results go on with
exponential backoff through connection failures and 5xx until the service is back, so a
service restart loses nothing. A result gives up after `give_up_after_s` (by then its lease
has long expired and the service has queued the job again anyway); a 4xx is final (the
service has judged the request, retrying cannot change its mind), but for 408 and 429,
which ask to be asked later. An answer's Retry-After (a proxy's rate limit, say) is waited
out, up to MAX_RETRY_AFTER_S, where it asks for longer than the backoff would wait."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    wait_exponential,
)

from pipetune.clients.sdk import TRANSIENT, ProtocolError
from pipetune.clients.sdk.errors import MAX_RETRY_AFTER_S, asked_wait_s

T = TypeVar("T")
__all__ = ["MAX_RETRY_AFTER_S", "TRANSIENT_REGISTERED", "call_with_retries"]
# Once registered, also an answer that does not parse (a proxy's error page with status
# 200): the service that registered the worker is there, and leases and results are
# idempotent to retry. (At registration it more likely means --server names something
# else, which retrying would hide: there it is final.)
TRANSIENT_REGISTERED: tuple[type[Exception], ...] = (*TRANSIENT, ProtocolError)


def call_with_retries(
    call: Callable[[], T],
    *,
    give_up_after_s: float | None,
    abort: threading.Event,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    initial_s: float = 0.5,
    max_wait_s: float = 5.0,
    transient: tuple[type[Exception], ...] = TRANSIENT,
) -> T:
    """call() until it succeeds, retrying `transient` errors; re-raises the last error when
    `give_up_after_s` has passed (None: never) or `abort` is set (a stop, a second SIGTERM).
    `on_retry(attempt, error, wait_s)` is called before each wait."""

    def _aborted(state: RetryCallState) -> bool:
        return abort.is_set()

    def _before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            exc = state.outcome.exception()
            wait = state.next_action.sleep if state.next_action else 0.0
            if exc is not None:
                on_retry(state.attempt_number, exc, wait)

    backoff = wait_exponential(multiplier=initial_s, max=max_wait_s)

    def _wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        asked = None if exc is None else asked_wait_s(exc)
        wait = backoff(state)
        if asked is not None:
            wait = max(wait, asked)
        if give_up_after_s is not None:
            # Never past the deadline: a Retry-After of 300 s kept a result (or the start)
            # waiting that long past --result-retry (--register-timeout) before the last try.
            left = give_up_after_s - (state.seconds_since_start or 0.0)
            wait = min(wait, max(0.0, left))
        return wait

    retrying = Retrying(
        retry=retry_if_exception_type(transient),
        wait=_wait,
        stop=(stop_never if give_up_after_s is None else stop_after_delay(give_up_after_s))
        | _aborted,
        # Sleep on the abort event so that a second SIGTERM ends the wait at once.
        sleep=lambda seconds: abort.wait(seconds) and None,
        before_sleep=_before_sleep,
        reraise=True,
    )
    return retrying(call)
