"""ASGI middleware: access control, request-body guard, security headers, request metrics.

Pure ASGI (no BaseHTTPMiddleware), so a refused request is answered before its body is read.
"""

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.access import check_access
from server.metrics import Metrics
from server.settings import Settings

log = logging.getLogger(__name__)

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


async def _send_json(send: Send, status: int, detail: str, headers: list[Any] | None = None):
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class AccessMiddleware:
    """Refuses reads and writes the settings do not allow (see server.access)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        refusal = check_access(
            self.settings,
            method=scope["method"],
            path=scope["path"],
            authorization=_header(scope, b"authorization"),
            client_host=client[0] if client else None,
            host_header=_header(scope, b"host"),
        )
        if refusal is None:
            await self.app(scope, receive, send)
            return
        headers = [(b"www-authenticate", b"Bearer")] if refusal.status_code == 401 else []
        await _send_json(send, refusal.status_code, refusal.detail, headers)


class BodyGuardMiddleware:
    """Bodies: at most `max_bytes` (413), JSON under /v1 (415); NUL in the URL is a 400.

    The body is read here (it would be read whole anyway) and replayed to the app.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b"").lower():
            await _send_json(send, 400, "NUL characters are not allowed in the URL")
            return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _send_json(send, 413, self._too_large())
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, self._too_large())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and scope["path"].startswith("/v1/") and not _is_json(scope):
            detail = "send the body as JSON with 'Content-Type: application/json'"
            await _send_json(send, 415, detail)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return f"request body exceeds the limit of {self.max_bytes} bytes (max_model_bytes)"


def _is_json(scope: Scope) -> bool:
    ctype = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
    return ctype == "application/json" or (
        ctype.startswith("application/") and ctype.endswith("+json")
    )


class SecurityHeadersMiddleware:
    """nosniff, no referrer, no framing; a strict CSP on HTML (every asset is our own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                ]
                ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if ctype.startswith(b"text/html"):
                    headers.append((b"content-security-policy", CSP.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class MetricsMiddleware:
    """Counts requests by route template, method and status, and times them."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        began = time.perf_counter()

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None)
            if path is None:  # mounts set no route: label by prefix, never by raw path
                path = "/static" if scope["path"].startswith("/static/") else "unmatched"
            self.metrics.observe_request(
                method=scope["method"],
                route=path,
                status=status,
                seconds=time.perf_counter() - began,
            )
