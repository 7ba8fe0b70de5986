"""pipetune's clients: the Python SDK (`Client`, `WorkerApi` and their exceptions) and the
`pipetune` CLI (clients.cli)."""

from pipetune.clients.sdk import (
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
