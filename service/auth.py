"""Who may call what: worker tokens for the worker routes, optional API keys for the rest.

Tokens and keys are held only as sha256 digests and compared in constant time. With no
worker token configured every worker route is refused (`serve` generates one). With no API
key configured the user routes are open (the embedded single-user default).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from pipetune.service.context import ServiceDep
from pipetune.service.settings import token_hash

_bearer = HTTPBearer(auto_error=False, description="worker token or API key")
_worker_header = APIKeyHeader(name="X-Worker-Token", auto_error=False)
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)


def _known(secret: str | None, digests: list[str]) -> str | None:
    """The secret's digest if it is one of the digests (every digest compared)."""
    if not secret:
        return None
    digest = token_hash(secret)
    found = False
    for known in digests:
        found |= hmac.compare_digest(digest, known)
    return digest if found else None


def _either_known(
    header: str | None, bearer: HTTPAuthorizationCredentials | None, digests: list[str]
) -> str | None:
    """The digest of whichever secret is known: the route's own header first, then
    Authorization: Bearer. One rule for worker tokens and API keys (the API key's header
    alone was read where both came, so a stale X-API-Key beside a valid bearer key was
    refused, where a stale X-Worker-Token beside a valid bearer token was not)."""
    digest = _known(header, digests)
    if digest is None and bearer is not None:
        digest = _known(bearer.credentials, digests)
    return digest


def _unauthorised(what: str) -> HTTPException:
    return HTTPException(401, f"{what} required", headers={"WWW-Authenticate": "Bearer"})


# The dependencies are async (they do no I/O): FastAPI would run plain functions in a worker
# thread, one hand-off per dependency per request.


async def worker_token(
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    header: Annotated[str | None, Depends(_worker_header)],
    service: ServiceDep,
) -> str:
    """The digest of a valid worker token (X-Worker-Token or Authorization: Bearer). The
    dedicated header first, as user_access takes X-API-Key first: where a proxy on the way
    sets an Authorization of its own, a valid X-Worker-Token was refused for it."""
    digest = _either_known(header, bearer, service.settings.worker_token_hashes)
    if digest is None:
        raise _unauthorised("a valid worker token")
    return digest


async def user_access(
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    header: Annotated[str | None, Depends(_api_key_header)],
    service: ServiceDep,
) -> None:
    digests = service.settings.api_key_hashes
    if not digests:
        return
    if _either_known(header, bearer, digests) is None:
        raise _unauthorised("a valid API key")


WorkerToken = Annotated[str, Depends(worker_token)]
