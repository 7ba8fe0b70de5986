"""Who may call what: worker tokens for the worker routes, optional API keys for the rest.

Tokens and keys are held only as sha256 digests and compared in constant time. With no
worker token configured every worker route is refused (`serve` generates one). With no API
key configured the user routes are open (the embedded single-user default).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from pipetune.service.context import ServiceDep
from pipetune.service.settings import Settings, token_hash

_bearer = HTTPBearer(auto_error=False, description="worker token or API key")
# Each header its own scheme name: under the default one (the class's name) the two were one
# scheme in /openapi.json, X-API-Key, listed on the worker routes that refuse an API key.
_worker_header = APIKeyHeader(
    name="X-Worker-Token", scheme_name="WorkerToken", auto_error=False, description="worker token"
)
_api_key_header = APIKeyHeader(
    name="X-API-Key", scheme_name="ApiKey", auto_error=False, description="API key"
)


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


def _bearer_of(request: Request) -> HTTPAuthorizationCredentials | None:
    """Authorization: Bearer's credentials, as HTTPBearer(auto_error=False) reads them."""
    scheme, credentials = get_authorization_scheme_param(request.headers.get("authorization"))
    if scheme.lower() != "bearer" or not credentials:
        return None
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=credentials)


def _unauthorised(what: str) -> HTTPException:
    return HTTPException(401, f"{what} required", headers={"WWW-Authenticate": "Bearer"})


def _worker_digest(
    header: str | None, bearer: HTTPAuthorizationCredentials | None, settings: Settings
) -> str:
    """The digest of a valid worker token, else 401: the one rule of the worker routes."""
    digest = _either_known(header, bearer, settings.worker_token_hashes)
    if digest is None:
        raise _unauthorised("a valid worker token")
    return digest


def _user_allowed(
    header: str | None, bearer: HTTPAuthorizationCredentials | None, settings: Settings
) -> None:
    """401 unless an API key is known, where any is configured: the one rule of the user
    routes (open without keys)."""
    digests = settings.api_key_hashes
    if digests and _either_known(header, bearer, digests) is None:
        raise _unauthorised("a valid API key")


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
    return _worker_digest(header, bearer, service.settings)


async def user_access(
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    header: Annotated[str | None, Depends(_api_key_header)],
    service: ServiceDep,
) -> None:
    _user_allowed(header, bearer, service.settings)


WorkerToken = Annotated[str, Depends(worker_token)]


# The credential a route's dependencies ask for, checked again from the headers alone before
# the request's body and query are read (ApiRoute): FastAPI decodes and validates the body
# before it runs any dependency, and a 1 MB body of empty objects cost 35-55 ms of the event
# loop's CPU before its 401, so four clients without a credential held every other request
# (/healthz, the workers' leases) near 0.5 s. Each dependency's header and rule, as it reads
# and applies them.
Credential = tuple[APIKeyHeader, Callable[..., object]]
CREDENTIALS: dict[Callable[..., object], Credential] = {
    worker_token: (_worker_header, _worker_digest),
    user_access: (_api_key_header, _user_allowed),
}


def credential_of(dependant: Dependant) -> Credential | None:
    """The credential a route's dependencies check (CREDENTIALS), if any."""
    for sub in dependant.dependencies:
        found = CREDENTIALS.get(sub.call) or credential_of(sub)  # type: ignore[arg-type]
        if found:
            return found
    return None


def check_credential(request: Request, credential: Credential) -> None:
    """Refuse (401) a request without the credential `credential_of` found, by the route's
    own dependency's rule, from the request's headers alone."""
    header, rule = credential
    rule(request.headers.get(header.model.name), _bearer_of(request), _settings_of(request))


def _settings_of(request: Request) -> Settings:
    return request.app.state.service.settings
