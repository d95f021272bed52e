"""The endpoint's HTTP surface on its own: loopback only, the run's token, OpenAI-style errors that
leave the server serving, and server-sent events as the openai package parses them."""

from __future__ import annotations

import asyncio
import json

from rlctl.agents.completions import ApiError
from rlctl.agents.http_server import EndpointServer


async def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    writer.close()
    return status, headers, body


def _post(path: str, body: bytes, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


GOOD = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_loopback_token_and_openai_style_errors_without_stopping():
    seen = []

    async def handler(episode, req):
        seen.append((episode, req.messages[0]["content"]))
        if req.messages[0]["content"] == "boom":
            raise ApiError(400, "not this one", "messages")
        return {"ok": episode}

    async def main():
        server = EndpointServer(handler, episodes=2)
        await server.start()
        try:
            assert server._server.sockets[0].getsockname()[0] == "127.0.0.1"
            assert server.base_url(1).startswith("http://127.0.0.1:")
            path = "/1/v1/chat/completions"
            no_token = await _raw(server.port, _post(path, GOOD, None))
            wrong = await _raw(server.port, _post(path, GOOD, "not-the-token"))
            bad_json = await _raw(server.port, _post(path, b"{not json", server.token))
            bad_role = json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode()
            role = await _raw(server.port, _post(path, bad_role, server.token))
            penalty = json.dumps(
                {"messages": [{"role": "user", "content": "x"}], "presence_penalty": 1}
            ).encode()
            pen = await _raw(server.port, _post(path, penalty, server.token))
            boom = json.dumps({"messages": [{"role": "user", "content": "boom"}]}).encode()
            handler_error = await _raw(server.port, _post(path, boom, server.token))
            no_episode = await _raw(server.port, _post("/7/v1/chat/completions", GOOD, server.token))
            ok = await _raw(server.port, _post(path, GOOD, server.token))
            return no_token, wrong, bad_json, role, pen, handler_error, no_episode, ok, server.errors
        finally:
            await server.close()

    no_token, wrong, bad_json, role, pen, handler_error, no_episode, ok, errors = asyncio.run(main())
    for status, _, body in (no_token, wrong):
        assert status == 401
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
    for status, _, body in (bad_json, role, pen, handler_error):
        assert status == 400
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert json.loads(role[2])["error"]["param"] == "messages[0]"
    assert json.loads(pen[2])["error"]["param"] == "presence_penalty"
    assert no_episode[0] == 404
    assert ok[0] == 200 and json.loads(ok[2]) == {"ok": 1}  # still serving after every error
    assert seen == [(1, "boom"), (1, "hi")]  # nothing unauthorised or malformed reached the handler
    assert errors == 7


def test_streamed_answer_is_server_sent_events_ending_in_done():
    events = [{"id": "a", "choices": [{"index": 0, "delta": {"content": "x"}}]}, {"id": "a", "choices": []}]

    async def handler(episode, req):
        return events

    async def main():
        server = EndpointServer(handler, episodes=1)
        await server.start()
        try:
            body = json.dumps({"messages": [{"role": "user", "content": "q"}], "stream": True}).encode()
            return await _raw(server.port, _post("/0/v1/chat/completions", body, server.token))
        finally:
            await server.close()

    status, headers, body = asyncio.run(main())
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    # de-chunk, then split the SSE frames
    data, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        data, rest = data + rest[:n], rest[n + 2 :]
    frames = [f.removeprefix(b"data: ").decode() for f in data.split(b"\n\n") if f]
    assert [json.loads(f) for f in frames[:-1]] == events and frames[-1] == "[DONE]"
