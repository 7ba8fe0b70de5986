"""The HTTP layer shared by the user client and the worker client: one httpx.Client, error
statuses turned into the SDK's exceptions, bodies parsed with the wire contract's models."""

from __future__ import annotations

import datetime as dt
import email.utils
import html
import ipaddress
import os
import re
import reprlib
import ssl
import urllib.request
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from pipetune.clients.sdk.errors import (
    ApiError,
    ClientClosedError,
    InvalidArgumentError,
    NotPipetuneError,
    ProtocolError,
    RequestBuildError,
    ServiceUnavailableError,
    error_class,
)
from pipetune.model.wire import READING, FieldError, OpName, secret_char_ok

M = TypeVar("M", bound=BaseModel)

DEFAULT_TIMEOUT_S = 30.0
# The variables httpx (trust_env) reads for the certificate authorities it trusts, in order.
CERT_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")
# Locations FastAPI puts before a body field, and the tags of the workload union: neither is
# part of the field name a person typed.
_LOCATION_PREFIXES = {"body", "query", "path", "header"}
_UNION_TAGS = {op.value for op in OpName}  # every kernel family's operators


def _field_of(loc: list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATION_PREFIXES:
        parts = parts[1:]
    parts = [p for p in parts if p not in _UNION_TAGS and not p.startswith("function-")]
    return ".".join(parts)


def _http_date(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # (an HTTP date is GMT; a date without a zone is read so)
        when = when.replace(tzinfo=dt.UTC)
    return when


def retry_after_s(value: str | None, date: str | None = None) -> float | None:
    """A Retry-After header's wait in seconds: delay-seconds, or an HTTP date (RFC 9110);
    None for none or one that does not parse. `date`: the answer's Date header, the time by
    the same clock as an HTTP-date Retry-After: the wait is the difference of the two, so
    that a client whose clock is off the server's waits what was asked (against its own
    clock, minutes behind made a wait of seconds one of minutes, minutes ahead none)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    when = _http_date(value)
    if when is None:
        return None
    sent = _http_date(date) or dt.datetime.now(dt.UTC)
    return max(0.0, (when - sent).total_seconds())


def clean_msg(msg: str) -> str:
    # pydantic prefixes a validator's ValueError text; the text alone is the reason.
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg


def argument_error(exc: ValidationError) -> InvalidArgumentError:
    """A wire model's refusal of what the caller passed, as the InvalidArgumentError naming
    the argument (its first error: a rule between fields is named by its field)."""
    first = exc.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        return InvalidArgumentError(cause.field, cause.reason)
    field = ".".join(str(p) for p in first["loc"]) or "argument"
    reason = clean_msg(first["msg"])
    shown = shown_value(first.get("input"))
    # A validator's own reason may quote the value ("unknown GPU 'x'; known: ..."): said
    # once, not again as "(got 'x')".
    return InvalidArgumentError(field, reason if shown in reason else f"{reason} (got {shown})")


def shown_value(value: Any) -> str:
    """`value`'s repr for a message, cut short (reprlib); an int too long for Python to
    print (over 4300 digits: repr raises ValueError) is described instead."""
    try:
        return reprlib.repr(value)
    except ValueError:
        return f"an {type(value).__name__} this large"


def explain(body: Any, fallback: str) -> tuple[str, str | None]:
    """(one-line reason, field or None) from an error body.

    pipetune's 422 is {"field", "reason", "detail": [...]} (model.wire.ValidationErrorBody);
    its other errors are {"detail": "..."}; FastAPI's stock 422 is {"detail": [{"loc",
    "msg"}, ...]}. Anything else falls back to the status line or the text.
    """
    if not isinstance(body, dict):
        return fallback, None
    # (Values of other types than the service's, a proxy's JSON, are read as absent.)
    field = body.get("field") if isinstance(body.get("field"), str) else None
    if isinstance(body.get("reason"), str):
        reason = body["reason"]
        listed = body.get("detail")
        more = len(listed) - 1 if isinstance(listed, list) else 0
        text = f"{field}: {reason}" if field else reason
        return text + (f" (and {more} more)" if more > 0 else ""), field
    detail = body.get("detail", body.get("error", body.get("message")))
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        loc = first.get("loc")
        named = first.get("field") if isinstance(first.get("field"), str) else None
        field = named or _field_of(list(loc) if isinstance(loc, list | tuple) else []) or None
        reason = clean_msg(str(first.get("reason") or first.get("msg") or "invalid"))
        text = f"{field}: {reason}" if field else reason
        more = len(detail) - 1
        return text + (f" (and {more} more)" if more else ""), field
    if isinstance(detail, str) and detail:
        return detail, None
    return fallback, None


def header_value_problem(value: object) -> str | None:
    """Why `value` cannot be an HTTP header value (model.wire.secret_char_ok: visible ASCII
    only), None if it can. The words never quote the value: it is usually a credential, and
    messages end up in logs and tracebacks."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    for i, char in enumerate(value):
        if secret_char_ok(char):
            continue
        base = "must be printable ASCII without spaces to go in an HTTP header"
        return f"{base}, but it {_where_char(value, i)}"
    return None


def _where_char(value: str, i: int) -> str:
    """What the character at value[i] is, and where, for a message that never quotes
    `value`: 'ends with a newline (read from a file? strip it)', 'contains a space or tab'."""
    char = value[i]
    if char == "\n":
        kind = "a newline"
    elif char == "\r":
        kind = "a carriage return"
    elif char in " \t":
        kind = "a space or tab"
    elif char.isascii():
        kind = "a control character"
    elif char.isspace():
        kind = "a non-ASCII space"
    else:
        kind = "a non-ASCII character"
    if not value[i:].strip():
        # The usual case: a value read from a file or pasted with its line ending.
        return f"ends with {kind} (read from a file? strip it)"
    return f"contains {kind}"


def shown_url(url: str) -> str:
    """`url` with the password of its user info (http://user:PASSWORD@host) as ***, for
    messages and logs: httpx sends a URL's user info as basic auth (a service behind a
    proxy that asks for it), so the password is a credential like the token or API key.
    Text that does not parse as a URL is cut at the same place, by hand."""
    scheme, sep, rest = url.partition("//")
    if not sep:
        return url
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if not at or not colon:
        return url
    return f"{scheme}//{user}:***@{host}{rest[end:]}"


def server_problem(server: object) -> str | None:
    """Why `server` is not the address of a service (None when it is one): a malformed URL
    is the caller's mistake, not a service that is down. The one rule of the SDK (Client,
    pipetune.best_schedule) and the CLI (--server, exit 2)."""
    if not isinstance(server, str):
        return f"must be an http(s) URL string, not {type(server).__name__}"
    shown = shown_url(server)  # (a password in it is a credential: not repeated)
    for i, char in enumerate(server):
        if char.isspace() or not char.isprintable():
            # Before urlsplit, which drops tabs and line endings where it finds them
            # (httpx refused the URL at the first request: InvalidURL, no argument named).
            return f"not an http(s) URL: {shown!r}: it {_where_char(server, i)}"
    try:
        parts = urlsplit(server)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        # Python's reason ("Port out of range 0-65535", "Port could not be cast to integer
        # value as 'x'"): the URL alone did not say what was wrong with it.
        return f"not an http(s) URL: {shown!r} ({str(exc).split(' as ')[0].lower()})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL: {shown!r} (e.g. http://127.0.0.1:8000)"
    if any(c.isspace() or c in _NOT_IN_A_HOST for c in parts.hostname):
        # ("http://exa mple:8000" went to the resolver and read as a service that is down.)
        return f"not an http(s) URL: {shown!r} (its host {parts.hostname!r} cannot be one)"
    return None


# Characters no host name or address holds (RFC 3986 excludes them from a URL's host); a
# non-ASCII name is an IDNA one, which httpx encodes.
_NOT_IN_A_HOST = frozenset('"<>\\^`{|}')


_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.IGNORECASE | re.DOTALL)


def page_summary(text: str, limit: int = 100) -> str:
    """A web page's text in one short line: tags (and scripts and styles) gone."""
    return _one_line(html.unescape(_TAG.sub(" ", text)), limit)


def _what_is_wrong(exc: Exception) -> str:
    """A refused answer's first problem as one clause ("tasks: Field required", and how many
    more): pydantic's own text ran over several lines and ended in a link to its docs."""
    if not isinstance(exc, ValidationError):
        return _one_line(str(exc))
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "the body"
    more = f"; {len(errors) - 1} more" if len(errors) > 1 else ""
    return _one_line(f"{where}: {first['msg']}{more}")


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def is_loopback_name(host: str) -> bool:
    """Whether `host` (a name or address, an IPv6 one bracketed or bare) is localhost or a
    loopback address, by its text: only this machine can be reached there."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, less
    the hosts NO_PROXY lists), None for none: what httpx reads (urllib's getproxies) and
    how it matches NO_PROXY ("*" every host; a name that host and the names under it; an
    address that address; with a scheme, that scheme's only). By hand: urllib's own
    matching (proxy_bypass) is undocumented, and on macOS reads the system's settings too,
    which httpx does not."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    host = (parts.hostname or "").lower()
    for entry in (e.strip().lower() for e in proxies.get("no", "").split(",")):
        scheme, _, name = entry.rpartition("://")
        name = name.strip("[]").lstrip(".")
        if entry == "*" or (
            name and scheme in ("", parts.scheme) and (host == name or host.endswith(f".{name}"))
        ):
            return None
    return proxy


class Http:
    """A base URL, default headers and the error mapping. Safe to share between threads:
    nothing here changes after __init__ but httpx's pool, which is."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        base_url = base_url.rstrip("/")
        # What messages, logs and exported files name (ServiceUnavailableError's text, the
        # worker's "waiting_for_service server=..."): the password stays with httpx.
        self.base_url = shown_url(base_url)
        # Where the service's address is this machine's own, directly: a proxy the
        # environment names (HTTP_PROXY on a cluster or behind a company's firewall) reaches
        # its own loopback, never this one, and every request was refused there, told the
        # service could not be reached (`serve --local-workers` and `make demo` included).
        # (An explicit transport is what makes httpx leave the environment's proxies.)
        self._proxy: str | None = None
        if transport is None:
            if is_loopback_name(urlsplit(base_url).hostname or ""):
                transport = httpx.HTTPTransport()
            else:
                self._proxy = environment_proxy(base_url)
        self._client = httpx.Client(
            base_url=base_url,
            headers={"User-Agent": "pipetune-sdk/1", **headers},
            timeout=timeout_s,
            transport=transport,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        acts_anew: bool = False,
    ) -> httpx.Response:
        """`acts_anew`: the request acts again each time it is sent (creating a task), so an
        answer lost after it was sent is said to have maybe acted (ServiceUnavailableError's
        maybe_acted); the rest (a result per lease, a lease per request id) are idempotent."""
        if self._client.is_closed:  # (httpx's RuntimeError is no PipetuneError)
            raise ClientClosedError(
                f"{method} {path}: this client of {self.base_url} is closed (close() or the "
                "end of its `with` block); make a new one"
            )
        kwargs: dict[str, Any] = {}
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        if params:
            kwargs["params"] = {k: v for k, v in params.items() if v is not None}
        try:
            response = self._client.request(method, path, json=json, **kwargs)
        except httpx.LocalProtocolError as exc:
            # httpx refused to build the request (a TransportError subclass, so it comes
            # first): nothing was sent, the service was never tried. h11's text quotes an
            # illegal header, which is usually a credential, so that text is not shown.
            reason = str(exc)
            if not reason or reason.startswith("Illegal header"):
                reason = "an illegal header name or value (not shown: it may hold a secret)"
            raise RequestBuildError(
                f"could not build the request {method} {path}: {_one_line(reason)}"
            ) from None
        except httpx.TimeoutException as exc:
            raise ServiceUnavailableError(
                self.base_url,
                f"timed out: {type(exc).__name__}",
                _maybe_acted(exc, method, path) if acts_anew else None,
            ) from None
        except httpx.TransportError as exc:
            reason = _one_line(str(exc) or type(exc).__name__) + _certificate_hint(exc)
            if self._proxy is not None:  # (the refusal may be the proxy's, not the service's)
                reason += (
                    f"; through the proxy the environment names, {shown_url(self._proxy)} "
                    "(NO_PROXY lists the hosts reached directly)"
                )
            raise ServiceUnavailableError(
                self.base_url, reason, _maybe_acted(exc, method, path) if acts_anew else None
            ) from None
        except httpx.DecodingError as exc:  # (a body whose Content-Encoding is not its own)
            raise ProtocolError(
                f"{method} {path}: the answer's body cannot be decoded: "
                f"{_one_line(str(exc) or type(exc).__name__)}"
            ) from None
        if response.status_code >= 400:
            raise self._error(response, method, path)
        return response

    def _error(self, response: httpx.Response, method: str, path: str) -> ApiError:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        # A page (HTML) said in a few words, not dumped whole: its tags gone, its text cut.
        fallback = (
            f"not a pipetune answer: {page_summary(body)}"
            if isinstance(body, str) and body.strip()
            else response.reason_phrase
        )
        reason, field = explain(body, fallback or f"HTTP {response.status_code}")
        cls = error_class(response.status_code)
        return cls(
            response.status_code,
            _one_line(reason),
            method=method,
            path=path,
            field=field,
            body=body,
            retry_after_s=retry_after_s(
                response.headers.get("retry-after"), response.headers.get("date")
            ),
        )

    def call(
        self,
        model: type[M],
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        acts_anew: bool = False,
    ) -> M:
        """One request whose 2xx body is `model` (`acts_anew`: as request's)."""
        response = self.request(
            method, path, json=json, params=params, timeout_s=timeout_s, acts_anew=acts_anew
        )
        try:
            body = response.json()
        except ValueError:
            kind = response.headers.get("content-type") or "no content type"
            if _cut_off_json(response):
                # JSON that ends early (a connection closed mid-body by a proxy): an answer
                # lost on its way, not a web page where the API belongs.
                raise ServiceUnavailableError(
                    self.base_url,
                    f"its answer to {method} {path} (HTTP {response.status_code}) was cut "
                    f"off after {len(response.content)} bytes",
                    f"{method} {path}" if acts_anew else None,
                ) from None
            raise NotPipetuneError(
                f"{self.base_url} does not answer as a pipetune service: {method} {path} "
                f"answered HTTP {response.status_code} with {kind.split(';')[0]}, not JSON "
                f"({page_summary(response.text) or 'an empty body'})"
            ) from None
        try:
            # Leniently: a newer service's answers may carry fields this client predates.
            return model.model_validate(body, context=READING)
        except (ValueError, ValidationError) as exc:
            raise ProtocolError(
                f"{method} {path}: the answer is not a {model.__name__} "
                f"({_what_is_wrong(exc)}): is {self.base_url} a pipetune service of a version "
                "this client reads?"
            ) from None

    def close(self) -> None:
        self._client.close()


def _certificate_hint(exc: BaseException) -> str:
    """What to do where `exc` is a refused certificate: a service behind a company's TLS
    proxy is signed by its own authority, which certifi's bundle (httpx's default) lacks,
    and the refusal said only "certificate verify failed". httpx reads the OpenSSL variables
    (SSL_CERT_FILE, SSL_CERT_DIR), which few know; "" for any other failure."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, ssl.SSLCertVerificationError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return ""
    # (httpx reads the first of them that is set, as OpenSSL does)
    named = next((name for name in CERT_VARIABLES if os.environ.get(name)), None)
    if named is not None:
        return f"; {named}={os.environ[named]} does not hold the authority that signed it"
    return (
        "; to trust the authority that signed it, set SSL_CERT_FILE to its certificates "
        "(a PEM file) or SSL_CERT_DIR to a folder of them"
    )


def _maybe_acted(exc: httpx.TransportError, method: str, path: str) -> str | None:
    """ "METHOD path" where the request may have reached the service before `exc` ended it
    (its answer lost, timed out, cut off); None where it cannot have (no connection made)."""
    never_sent = (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.PoolTimeout,
        httpx.UnsupportedProtocol,
        httpx.ProxyError,
    )
    return None if isinstance(exc, never_sent) else f"{method} {path}"


def _cut_off_json(response: httpx.Response) -> bool:
    """Whether a body that does not parse is JSON that ends early: the answer says JSON and
    begins as an object or a list does."""
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return kind == "application/json" and response.content.lstrip()[:1] in (b"{", b"[")
