"""Who may read and who may write.

- Writes (any method but GET/HEAD/OPTIONS) need `Authorization: Bearer <STAGEPROF_API_TOKEN>`
  when the token is set (401 otherwise). When it is unset, writes are accepted only from a
  loopback client that also addressed the server by a loopback name (403 otherwise; the Host
  check stops DNS-rebinding pages from writing through a local browser).
- Reads are open unless `reads_open` is false; then they need the API token or the read
  token (or, with no token configured, a loopback client).
- `/healthz` and the static assets are always open.
"""

import hmac
import ipaddress
from dataclasses import dataclass

from server.settings import Settings

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = ("/healthz", "/static/", "/favicon.ico")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


@dataclass(frozen=True)
class Refusal:
    status_code: int
    detail: str


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def is_loopback_client(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_host_header(host_header: str | None) -> bool:
    if not host_header:
        return False
    name = host_header.strip().lower()
    if name.startswith("["):
        name = name[: name.find("]") + 1]
    else:
        name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    return name in LOOPBACK_NAMES


def _matches(token: str | None, *secrets: str | None) -> bool:
    if token is None:
        return False
    given = token.encode()
    return any(s is not None and hmac.compare_digest(given, s.encode()) for s in secrets)


def check_access(
    settings: Settings,
    *,
    method: str,
    path: str,
    authorization: str | None,
    client_host: str | None,
    host_header: str | None,
) -> Refusal | None:
    """None when the request may go on, else why not."""
    if path.startswith(OPEN_PATHS):
        return None
    token = bearer_token(authorization)
    api_token = settings.api_token.get_secret_value() if settings.api_token else None
    read_token = settings.read_token.get_secret_value() if settings.read_token else None
    loopback = is_loopback_client(client_host) and is_loopback_host_header(host_header)
    if method.upper() in READ_METHODS:
        if settings.reads_open or _matches(token, api_token, read_token):
            return None
        if api_token is None and read_token is None and loopback:
            return None
        return Refusal(401, "reads need a bearer token on this server")
    if api_token is not None:
        if _matches(token, api_token):
            return None
        return Refusal(401, "writes need 'Authorization: Bearer <STAGEPROF_API_TOKEN>'")
    if loopback:
        return None
    return Refusal(
        403,
        "STAGEPROF_API_TOKEN is unset, so writes are accepted only from loopback clients "
        "addressing the server as localhost",
    )
