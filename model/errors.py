"""The root of what pipetune raises on purpose, so that a user's code can catch all of it with
one `except pipetune.PipetuneError` (as Optuna's OptunaError or httpx's HTTPError allow).

It lives here, at the bottom of the package, because the model's own input errors
(WorkloadError, HardwareError, ScheduleError) derive from it and the model imports nothing
of the clients. Each subclass also derives from the built-in exception it was before
(ValueError for bad input, RuntimeError for a refusal of the environment, KeyError for an
unknown name), so code written against those keeps working.
"""

from __future__ import annotations


class PipetuneError(Exception):
    """Base class of every error pipetune raises on purpose: bad input, a service that cannot
    be reached or refuses, a database that cannot be read, a kernel that cannot be launched."""


class InvalidArgumentError(PipetuneError, ValueError):
    """An argument refused before anything was done with it; `argument` names it."""

    def __init__(self, argument: str, reason: str):
        super().__init__(f"{argument}: {reason}")
        self.argument = argument
        self.reason = reason


class InvalidArgumentTypeError(PipetuneError, TypeError):
    """An argument of a type the call cannot take (a TypeError, as Python's own are);
    `argument` names it."""

    def __init__(self, argument: str, reason: str):
        super().__init__(f"{argument}: {reason}")
        self.argument = argument
        self.reason = reason
