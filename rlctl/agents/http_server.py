"""A small HTTP/1.1 server on asyncio streams: loopback only, one bearer token, JSON and SSE replies.

The endpoint's transport, with no web framework: ``POST /<episode>/v1/chat/completions`` and
``GET /<episode>/v1/models``. Each episode's client has its own base URL
(``http://127.0.0.1:PORT/<episode>/v1``), so a request names its episode without a custom header
(the agent code is unmodified OpenAI-client code). A request without the run's token gets 401; a
body that is not a valid request gets a 400 in OpenAI's error shape; a failure while serving gets a
500; none of them stops the server. Keep-alive connections are served until the client closes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from rlctl.agents.completions import ApiError, ChatRequest, parse_request

LOOPBACK = "127.0.0.1"
MAX_BODY = 64 << 20
# (episode, request) -> (the JSON reply) or (a list of SSE events) for a streamed request
Handler = Callable[[int, ChatRequest], Awaitable[Any]]
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    500: "Internal Server Error",
}


class EndpointServer:
    """Serves ``handler`` on a free loopback port; ``token`` is fresh per server (the run's key)."""

    def __init__(self, handler: Handler, episodes: int, model: str = "rlctl") -> None:
        self.handler, self.episodes, self.model = handler, episodes, model
        self.token = secrets.token_urlsafe(24)
        self.port = 0
        self.errors = 0  # requests answered with an error
        self.failure: BaseException | None = None  # an unexpected error while serving (the run fails)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):  # idle keep-alive connections
                writer.close()
            await self._server.wait_closed()

    def base_url(self, episode: int) -> str:
        return f"http://{LOOPBACK}:{self.port}/{episode}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the server is closing
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        line = await reader.readline()
        if not line:
            return False
        try:
            method, target, _ = line.decode("latin-1").split(" ", 2)
        except ValueError:
            await self._json(writer, 400, ApiError(400, "malformed request line").body(), close=True)
            return False
        headers: dict[str, str] = {}
        while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        try:
            length = int(headers.get("content-length", "0") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY or "chunked" in headers.get("transfer-encoding", ""):
            await self._json(
                writer,
                413,
                ApiError(413, "request body: a Content-Length up to 64 MiB is required").body(),
                close=True,
            )
            return False
        body = await reader.readexactly(length) if length else b""
        keep = headers.get("connection", "").lower() != "close"
        status, payload = await self._route(method, target, headers, body)
        if isinstance(payload, list):  # a streamed answer: its events, then [DONE]
            await self._sse(writer, payload)
        else:
            await self._json(writer, status, payload, close=not keep)
        return keep

    async def _route(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        given = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            self.errors += 1
            err = ApiError(
                401, "missing or wrong API key for this run's endpoint", kind="invalid_request_error"
            )
            return 401, err.body()
        parts = target.split("?", 1)[0].strip("/").split("/")
        if len(parts) < 3 or not parts[0].isdigit() or int(parts[0]) >= self.episodes or parts[1] != "v1":
            self.errors += 1
            return 404, ApiError(404, f"no such endpoint: {target}").body()
        episode, route = int(parts[0]), "/".join(parts[2:])
        if route == "models" and method == "GET":
            return 200, {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "owned_by": "rlctl"}],
            }
        if route != "chat/completions":
            self.errors += 1
            return 404, ApiError(404, f"no such endpoint: {target} (served: chat/completions, models)").body()
        if method != "POST":
            self.errors += 1
            return 405, ApiError(405, "chat/completions takes POST").body()
        try:
            return 200, await self.handler(episode, parse_request(body))
        except ApiError as err:
            self.errors += 1
            return err.status, err.body()
        except Exception as exc:  # a fault in serving, not in the request: answered, then the run fails
            self.errors += 1
            self.failure = self.failure or exc
            return 500, ApiError(500, f"internal error: {type(exc).__name__}: {exc}").body()

    async def _json(
        self, writer: asyncio.StreamWriter, status: int, payload: Any, close: bool = False
    ) -> None:
        data = json.dumps(payload).encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()

    async def _sse(self, writer: asyncio.StreamWriter, events: list[dict[str, Any]]) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        )
        for data in [*(json.dumps(e) for e in events), "[DONE]"]:
            frame = f"data: {data}\n\n".encode()
            writer.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
