"""pipetune's clients: the Python SDK (`Client`, `WorkerApi` and their exceptions) and the
`pipetune` CLI (clients.cli)."""

from clients.sdk import (
    ApiError,
    AuthError,
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PipetuneError,
    ProtocolError,
    ServerError,
    ServiceUnavailableError,
    WaitTimeoutError,
    WorkerApi,
)

__all__ = [
    "ApiError",
    "AuthError",
    "Client",
    "ConflictError",
    "InvalidRequestError",
    "NotFoundError",
    "PipetuneError",
    "ProtocolError",
    "ServerError",
    "ServiceUnavailableError",
    "WaitTimeoutError",
    "WorkerApi",
]
