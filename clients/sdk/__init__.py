"""The pipetune Python SDK over httpx: `Client` for users, `WorkerApi` for the GPU workers.
Every body is built and parsed with the wire contract's models (model/wire.py)."""

from pipetune.clients.sdk.client import (
    API_KEY_ENV,
    DEFAULT_SERVER,
    SERVER_ENV,
    Client,
    default_server,
)
from pipetune.clients.sdk.errors import (
    TRANSIENT,
    ApiError,
    AuthError,
    ClientClosedError,
    ConflictError,
    InvalidArgumentError,
    InvalidRequestError,
    NotFoundError,
    NotPipetuneError,
    PipetuneError,
    ProtocolError,
    RequestBuildError,
    RetryLaterError,
    ServerError,
    ServiceUnavailableError,
    WaitTimeoutError,
)
from pipetune.clients.sdk.worker_api import WorkerApi

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_SERVER",
    "SERVER_ENV",
    "TRANSIENT",
    "ApiError",
    "AuthError",
    "Client",
    "ClientClosedError",
    "ConflictError",
    "InvalidArgumentError",
    "InvalidRequestError",
    "NotFoundError",
    "NotPipetuneError",
    "PipetuneError",
    "ProtocolError",
    "RequestBuildError",
    "RetryLaterError",
    "ServerError",
    "ServiceUnavailableError",
    "WaitTimeoutError",
    "WorkerApi",
    "default_server",
]
