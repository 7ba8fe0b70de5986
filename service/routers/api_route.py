"""The API's routes: the credential checked first (service/auth.py: a request without it is
refused before its query and body are read), bounded JSON bodies (bounded_json.py), and query
strings that hold only the parameters the route takes.

A request body's unknown field is refused (422; model/wire.py: "a misspelt option must not
pass silently"), but FastAPI ignores a query parameter it was not told of: `GET
/v1/tasks?stat=done&limt=1` answered every task in every state, as if nothing had been asked,
and a script that misspelt a filter acted on the wrong tasks. An API route now answers such
a request with a 422 naming the parameter and the ones the route takes.

The check is in the route class (FastAPI's way of changing how a route reads its request),
not a dependency: the names a route takes are known once, when it is built, and a request
without a query string (every worker's lease and result) costs one dictionary lookup. The
dashboard's page keeps BoundedJsonRoute (its own address carries the page's state, `?task=`,
which its script reads), as do /healthz and /metrics, which probes and scrapers configured
elsewhere call (a Prometheus job may add parameters of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

from pipetune.service.auth import check_credential, credential_of
from pipetune.service.routers.bounded_json import BoundedJsonRoute


class ApiRoute(BoundedJsonRoute):
    query_names: tuple[str, ...] = ()

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        # (APIRoute builds its handler while it is constructed, its dependant known by then.)
        self.query_names = _query_names(self.dependant)
        known = frozenset(self.query_names)
        credential = credential_of(self.dependant)
        handler = super().get_route_handler()

        async def strict_query(request: Request) -> Response:
            if credential is not None:  # before the query and the body are read (auth.py)
                check_credential(request, credential)
            if request.scope.get("query_string"):
                unknown = [name for name in request.query_params if name not in known]
                if unknown:
                    raise RequestValidationError([self._unknown(name) for name in unknown])
            return await handler(request)

        return strict_query

    def _unknown(self, name: str) -> dict[str, Any]:
        takes = ", ".join(self.query_names) if self.query_names else "no query parameters"
        return {
            "type": "extra_forbidden",
            "loc": ("query", name),
            "msg": f"not a query parameter of this route; it takes {takes}",
        }


def _query_names(dependant: Dependant) -> tuple[str, ...]:
    """Every query parameter of a route, its dependencies' included, in declaration order (the
    names as sent: an alias where one is declared). Walked here rather than through FastAPI's
    own flattening, whose name and signature have changed between its releases."""
    names = [param.alias for param in dependant.query_params]
    for sub in dependant.dependencies:
        names.extend(name for name in _query_names(sub) if name not in names)
    return tuple(names)
