"""Request bodies decoded with a bound on the fields of any one JSON object.

A body of 50,000 unknown fields (830 KB, inside the body limit) cost 330 ms of the event
loop's CPU before its 422: pydantic builds one "extra field" error per key, and the service
keeps 20 of them. Four clients sending such bodies held every other request (/healthz)
near 3 s. No object of the API has more than a few dozen fields, so an object past
MAX_FIELDS is refused while the JSON is decoded, before validation: a 422 naming the body
(service/errors.py turns the decoder's error into it). The route class is FastAPI's way of
changing how a request is read (a custom Request in a custom APIRoute).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

MAX_FIELDS = 256


class TooManyFieldsError(ValueError):
    """A JSON object of the body has more than MAX_FIELDS fields."""


def _bounded_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len(pairs) > MAX_FIELDS:
        raise TooManyFieldsError(
            f"a JSON object of the body has {len(pairs)} fields; none of this API's has more "
            f"than {MAX_FIELDS}"
        )
    return dict(pairs)  # (as json.loads builds it: a repeated key keeps its last value)


class BoundedJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=_bounded_object)
        return self._json


class BoundedJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(BoundedJsonRequest(request.scope, request.receive))

        return bounded
