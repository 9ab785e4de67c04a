"""TEST FIXTURE, not a model: a small OpenAI-compatible HTTP server that soakd's tests drive
in place of a real inference server (vLLM, ``transformers serve``), and that can plant faults
on a real process.

It generates no text worth reading: every completion is ``max_tokens`` (default 8) tokens of
placeholder text, one a content chunk (``--tokens-per-chunk`` K: K a chunk), paced by
``--ttft-ms`` and ``--itl-ms``. What it does
honestly is everything soakd measures around a model: a real uvicorn process with its own pid
and RSS, real sockets, SSE framed the way ``transformers serve`` and vLLM frame it, and a
Prometheus ``/metrics`` page with vLLM's metric names. The planted faults (``--help`` lists
them) are real behaviour of that process: memory it really keeps, sleeps it really takes,
connections it really resets, an exit it really makes.

Run as a script::

    python tests/openai_test_server.py --port 0 [options]

It prints one line, ``READY <port>``, to stdout (flushed) once it listens; port 0 picks a free
port. Tests start it with :func:`start_server`, which does that and returns a
:class:`ServerProcess`.

Endpoints: ``GET /health``, ``GET /version``, ``GET /metrics``, ``GET /v1/models``,
``POST /v1/chat/completions`` (``stream`` true: SSE; false: one ``chat.completion`` JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

MODEL_ID = "fixture-model"
VERSION = "fixture-1"
DEFAULT_MAX_TOKENS = 8
# Prompt tokens charged per image_url part (the usage numbers are an estimate, not a tokenizer).
IMAGE_TOKENS = 64
PAGE = 4096

# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="openai_test_server.py",
        description=(
            "TEST FIXTURE, not a model: an OpenAI-compatible /v1/chat/completions server that "
            "streams placeholder tokens and can plant faults on its own process. Prints "
            "'READY <port>' to stdout once it listens."
        ),
        epilog=(
            "Completion requests are numbered from 1 in order of arrival; only authorised, "
            "well-formed POST /v1/chat/completions requests are counted. When several "
            "--*-every faults fall on one request, the first of fail, reset, malformed, empty "
            "wins. --die-after-requests beats them all."
        ),
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    g.add_argument("--model-id", default=MODEL_ID, help=f"served model id (default {MODEL_ID})")
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/* (else 401, OpenAI error JSON); "
        "/health, /version and /metrics stay open, as in vLLM",
    )
    g.add_argument(
        "--ttft-ms", type=float, default=5.0, help="delay before the first token (default 5)"
    )
    g.add_argument("--itl-ms", type=float, default=2.0, help="delay between tokens (default 2)")
    g.add_argument(
        "--tokens-per-chunk",
        type=int,
        default=1,
        metavar="K",
        help="streamed: each content chunk carries K tokens, sent once the Kth is generated "
        "(a server that batches its stream: chunk gaps K x --itl-ms); usage counts tokens",
    )
    g.add_argument(
        "--max-running",
        type=int,
        default=0,
        help="serve at most N completions at once; the rest wait in a real queue counted by "
        "vllm:num_requests_waiting (0 = no limit)",
    )
    g.add_argument(
        "--no-done",
        action="store_true",
        help="end streams without the final 'data: [DONE]' line, as transformers serve 5.x "
        "does (vLLM and OpenAI send it)",
    )
    f = p.add_argument_group("planted faults")
    f.add_argument(
        "--leak-mb-per-request",
        type=float,
        default=0.0,
        metavar="X",
        help="each counted completion (planted failures too) allocates X MB, writes every "
        "page of it and keeps it: the server's RSS grows by about X MB per request",
    )
    f.add_argument(
        "--slow-ms-per-request",
        type=float,
        default=0.0,
        metavar="X",
        help="request k waits --ttft-ms + X*(k-1) ms for its first token: TTFT grows by X ms "
        "with each request",
    )
    f.add_argument(
        "--waiting-rise-per-s",
        type=float,
        default=0.0,
        metavar="X",
        help="vllm:num_requests_waiting reports X * seconds since start (plus any real queue)",
    )
    f.add_argument(
        "--kv-rise-per-s",
        type=float,
        default=0.0,
        metavar="X",
        help="vllm:kv_cache_usage_perc reports X * seconds since start, capped at 1.0",
    )
    f.add_argument(
        "--never-ready",
        action="store_true",
        help="accept TCP connections but never answer any HTTP request (/health, /v1/models, "
        "completions, /metrics all hang): a server that never becomes ready",
    )
    f.add_argument(
        "--fail-every",
        type=int,
        default=0,
        metavar="N",
        help="every Nth completion answers HTTP --fail-status with an OpenAI error JSON",
    )
    f.add_argument(
        "--fail-status",
        type=int,
        default=500,
        metavar="S",
        help="status for --fail-every (default 500)",
    )
    f.add_argument(
        "--malformed-every",
        type=int,
        default=0,
        metavar="N",
        help="every Nth completion is malformed: streamed, the role chunk then a "
        "'data: {not json' line and the stream ends; not streamed, a 200 JSON body "
        "'{not json'",
    )
    f.add_argument(
        "--empty-every",
        type=int,
        default=0,
        metavar="N",
        help="every Nth completion has zero content tokens (finish_reason 'stop' at once)",
    )
    f.add_argument(
        "--reset-every",
        type=int,
        default=0,
        metavar="N",
        help="every Nth completion has its TCP connection reset (RST) mid-response: "
        "streamed, after the role chunk and the first token; not streamed, before any byte",
    )
    f.add_argument(
        "--echo-auth",
        action="store_true",
        help="--fail-every's error body echoes the request's Authorization header, and its "
        "credential (a Basic one decoded) as is, in base64 and URL-encoded, as a careless "
        "server or proxy does",
    )
    f.add_argument(
        "--usage-only",
        action="store_true",
        help="streamed: every token's delta has empty content (tokens that decode to no "
        "text); only the usage chunk counts them",
    )
    f.add_argument(
        "--huge-usage",
        action="store_true",
        help="usage.completion_tokens is 10**23, streamed and not",
    )
    f.add_argument(
        "--keepalive-ms",
        type=float,
        default=0.0,
        metavar="X",
        help="streamed: after the role chunk, an SSE comment every X ms and never a token: "
        "a request that never ends though bytes keep coming",
    )
    f.add_argument(
        "--cut-every",
        type=int,
        default=0,
        metavar="N",
        help="every Nth streamed completion ends cleanly after its first token: no "
        "finish_reason, no usage, no [DONE] (a stream cut short, not reset)",
    )
    f.add_argument(
        "--odd-shapes",
        action="store_true",
        help="streamed: every completion's token chunk has a wrong shape, request k the "
        "(k mod 4)th of: choices not a list, a choice not an object, delta a string, "
        "content a list",
    )
    f.add_argument(
        "--die-after-requests",
        type=int,
        default=0,
        metavar="N",
        help="the process exits with os._exit(1) when completion request N arrives, before "
        "answering it: a server killed mid-run",
    )
    return p


# ---------------------------------------------------------------------------------------------
# The app


def _every(n: int, k: int) -> bool:
    return n > 0 and k % n == 0


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _error_kind(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")


def _count_prompt(messages: list[Any]) -> tuple[int, int]:
    """(images, estimated prompt tokens); raises ValueError naming a malformed part."""
    images = 0
    chars = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            chars += len(content or "")
            continue
        if not isinstance(content, list):
            raise ValueError(f"messages[{i}].content must be a string or a list of parts")
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                chars += len(part["text"])
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else None
                if not isinstance(url, str) or not url:
                    raise ValueError(f"messages[{i}].content[{j}].image_url.url is required")
                if url.startswith("data:"):
                    _, sep, data = url.partition(",")
                    try:
                        if not sep or not data:
                            raise binascii.Error("empty")
                        base64.b64decode(data, validate=True)
                    except (binascii.Error, ValueError):
                        raise ValueError(
                            f"messages[{i}].content[{j}]: image data URL is not valid base64"
                        ) from None
                images += 1
            elif kind not in ("input_audio", "video_url"):  # accepted, not counted
                raise ValueError(f"messages[{i}].content[{j}]: unsupported part {kind!r}")
    return images, len(messages) + chars // 4 + images * IMAGE_TOKENS


def _echo(authorization: str) -> str:
    """What a careless server says back about the credential it was sent."""
    scheme, _, cred = authorization.partition(" ")
    if scheme.lower() == "basic":
        cred = base64.b64decode(cred).decode("utf-8", "replace")
    b64 = base64.b64encode(cred.encode()).decode()
    return (
        f"; you sent Authorization: {authorization}; credential {cred}, base64 {b64}, "
        f"url-encoded {quote(cred, safe='')}"
    )


def _odd_chunk(k: int) -> bytes:
    """A chunk event of a wrong shape (--odd-shapes), one of four by request number."""
    delta = {"content": "tok "}
    shapes: list[dict[str, Any]] = [
        {"object": "chat.completion.chunk", "choices": {"0": {"delta": delta}}},
        {"object": "chat.completion.chunk", "choices": ["tok "]},
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": "tok "}]},
        {"object": "chat.completion.chunk", "choices": [{"delta": {"content": ["tok "]}}]},
    ]
    return json.dumps(shapes[k % 4]).encode()


@dataclass
class State:
    opts: argparse.Namespace
    started: float = field(default_factory=time.monotonic)
    requests: int = 0  # completion requests counted so far (the k of request k)
    running: int = 0
    waiting: int = 0
    preemptions: int = 0  # the fixture never preempts: vllm:num_preemptions_total stays 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    leaked: list[bytearray] = field(default_factory=list)
    gate: asyncio.Semaphore | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started


# Live transports by client address, so --reset-every can reset the request's own connection.
_TRANSPORTS: dict[tuple[str, int], asyncio.Transport] = {}


def _protocol_class() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TrackedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if self.client is not None:
                _TRANSPORTS[self.client] = transport

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client is not None:
                _TRANSPORTS.pop(self.client, None)
            super().connection_lost(exc)

    return TrackedH11Protocol


async def _reset_connection(client: Any) -> None:
    """Close the request's connection with a TCP RST (SO_LINGER 0, then abort)."""
    transport = _TRANSPORTS.get(tuple(client)) if client else None
    if transport is None:  # not found: fall back to an aborted response (incomplete read)
        raise ConnectionAbortedError("planted reset")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    await asyncio.sleep(0.01)  # let uvicorn see the disconnect before the app returns


def create_app(opts: argparse.Namespace) -> Any:
    state = State(opts)
    if opts.max_running > 0:
        state.gate = asyncio.Semaphore(opts.max_running)
    app = FastAPI(title="soakd OpenAI test fixture", docs_url=None, redoc_url=None)
    app.state.fixture = state
    labels = ["model_name", "engine"]
    label_values = [opts.model_id, "0"]

    class FixtureCollector:
        def collect(self) -> Iterator[Any]:
            t = state.elapsed()
            fams: list[Any] = []
            g = GaugeMetricFamily(
                "vllm:num_requests_running", "Requests in model execution.", labels=labels
            )
            g.add_metric(label_values, state.running)
            fams.append(g)
            g = GaugeMetricFamily(
                "vllm:num_requests_waiting", "Requests waiting to be processed.", labels=labels
            )
            g.add_metric(label_values, state.waiting + opts.waiting_rise_per_s * t)
            fams.append(g)
            g = GaugeMetricFamily(
                "vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100%.", labels=labels
            )
            g.add_metric(label_values, min(1.0, max(0.0, opts.kv_rise_per_s * t)))
            fams.append(g)
            for name, doc, value in (
                ("vllm:num_preemptions", "Cumulative preemptions.", state.preemptions),
                ("vllm:prompt_tokens", "Prefill tokens processed.", state.prompt_tokens),
                ("vllm:generation_tokens", "Generation tokens.", state.generation_tokens),
            ):
                c = CounterMetricFamily(name, doc, labels=labels)
                c.add_metric(label_values, value)
                fams.append(c)
            g = GaugeMetricFamily(
                "fixture_unrelated_metric", "Not a serving metric; soakd must ignore it."
            )
            g.add_metric([], 12345.0)
            fams.append(g)
            yield from fams

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FixtureCollector())  # type: ignore[arg-type]

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": opts.model_id, "object": "model", "created": 0, "owned_by": "fixture"}],
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(
            generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "invalid_request_error")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(
                400, "'messages' must be a non-empty list", "invalid_request_error", "messages"
            )
        model = body.get("model")
        if model is not None and model != opts.model_id:
            return _error(404, f"The model `{model}` does not exist.", "not_found_error", "model")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            return _error(
                400,
                "'max_tokens' must be a non-negative integer",
                "invalid_request_error",
                "max_tokens",
            )
        try:
            images, prompt_tokens = _count_prompt(messages)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error", "messages")
        stream = bool(body.get("stream", False))
        stream_options = body.get("stream_options") or {}
        include_usage = bool(
            isinstance(stream_options, dict) and stream_options.get("include_usage")
        )

        state.requests += 1
        k = state.requests
        if opts.die_after_requests > 0 and k == opts.die_after_requests:
            print(f"openai_test_server: dying on request {k}", file=sys.stderr, flush=True)
            os._exit(1)
        if opts.leak_mb_per_request > 0:
            size = int(opts.leak_mb_per_request * (1 << 20))
            buf = bytearray(size)
            buf[::PAGE] = b"\x01" * len(range(0, size, PAGE))  # touch every page
            state.leaked.append(buf)
        if _every(opts.fail_every, k):
            echo = _echo(request.headers.get("authorization", "")) if opts.echo_auth else ""
            return _error(
                opts.fail_status,
                f"planted failure on request {k}{echo}",
                _error_kind(opts.fail_status),
            )
        reset = _every(opts.reset_every, k)
        malformed = not reset and _every(opts.malformed_every, k)
        empty = _every(opts.empty_every, k)
        n_tokens = 0 if empty else max_tokens
        ttft = (opts.ttft_ms + opts.slow_ms_per_request * (k - 1)) / 1000.0
        itl = opts.itl_ms / 1000.0
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        headers = {
            "x-request-id": cid,
            "x-fixture-request": str(k),
            "x-fixture-images": str(images),
        }
        client = request.scope.get("client")
        state.prompt_tokens += prompt_tokens

        async def admitted() -> None:
            if state.gate is not None:
                state.waiting += 1
                try:
                    await state.gate.acquire()
                finally:
                    state.waiting -= 1
            state.running += 1

        def release() -> None:
            state.running -= 1
            if state.gate is not None:
                state.gate.release()

        def usage(completion: int) -> dict[str, int]:
            if opts.huge_usage:
                completion = 10**23
            return {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            }

        finish = "length" if n_tokens and n_tokens == max_tokens else "stop"

        if not stream:
            await admitted()
            try:
                if reset:
                    await _reset_connection(client)
                    return Response(status_code=500)
                await asyncio.sleep(ttft + itl * max(0, n_tokens - 1) if n_tokens else 0)
                state.generation_tokens += n_tokens
            finally:
                release()
            if malformed:
                return Response(b"{not json", media_type="application/json", headers=headers)
            out = {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": opts.model_id,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "tok " * n_tokens},
                        "finish_reason": finish,
                    }
                ],
                "usage": usage(n_tokens),
            }
            return JSONResponse(out, headers=headers)

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            obj = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": opts.model_id,
                "choices": choices,
                **extra,
            }
            return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

        async def events() -> AsyncIterator[bytes]:
            await admitted()
            try:
                yield chunk([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
                if malformed:
                    yield b"data: {not json\n\n"
                    return
                if opts.keepalive_ms > 0:
                    while True:  # bytes keep coming, the answer never does
                        await asyncio.sleep(opts.keepalive_ms / 1000)
                        yield b": keepalive\n\n"
                sent = 0
                content = "" if opts.usage_only else "tok "
                held = 0  # tokens generated and not yet sent (--tokens-per-chunk)
                for i in range(n_tokens):
                    await asyncio.sleep(ttft if i == 0 else itl)
                    sent, held = sent + 1, held + 1
                    state.generation_tokens += 1
                    if held < opts.tokens_per_chunk and i < n_tokens - 1:
                        continue
                    if opts.odd_shapes:
                        yield b"data: " + _odd_chunk(k) + b"\n\n"
                    else:
                        delta = {"content": content * held}
                        yield chunk([{"index": 0, "delta": delta, "finish_reason": None}])
                    held = 0
                    if reset or _every(opts.cut_every, k):
                        break
                if _every(opts.cut_every, k):
                    return  # the response ends cleanly here: a stream cut short
                if reset:
                    await asyncio.sleep(0.005)
                    await _reset_connection(client)
                    return
                yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}])
                if include_usage:
                    yield chunk([], usage=usage(sent))
                if not opts.no_done:
                    yield b"data: [DONE]\n\n"
            finally:
                release()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if opts.never_ready:
                await asyncio.Event().wait()  # never answers
            path = scope.get("path", "")
            if opts.api_key and path.startswith("/v1"):
                headers = dict(scope.get("headers") or [])
                if headers.get(b"authorization", b"").decode("latin-1") != (
                    f"Bearer {opts.api_key}"
                ):
                    response = _error(401, "Invalid or missing API key.", "authentication_error")
                    await response(scope, receive, send)
                    return
        await app(scope, receive, send)

    return asgi


# ---------------------------------------------------------------------------------------------
# Entry point


async def _serve(opts: argparse.Namespace) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in opts.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((opts.host, opts.port))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(opts),
        http=_protocol_class(),
        lifespan="off",
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=1,
        workers=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            raise SystemExit("openai_test_server: uvicorn exited before it started")
        await asyncio.sleep(0.01)
    print(f"READY {port}", flush=True)
    await task


def main(argv: list[str] | None = None) -> None:
    opts = build_parser().parse_args(argv)
    asyncio.run(_serve(opts))


# ---------------------------------------------------------------------------------------------
# Test helper


@dataclass
class ServerProcess:
    """A started fixture server: a real child process listening on 127.0.0.1:``port``."""

    proc: subprocess.Popen[bytes]
    port: int
    stderr_path: Path
    _stderr_kept: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:PORT`` (for /health, /metrics, /version)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        return f"{self.root_url}/v1"

    @property
    def metrics_url(self) -> str:
        return f"{self.root_url}/metrics"

    def stderr_text(self) -> str:
        """What the server wrote to stderr so far (kept after :meth:`stop`)."""
        if self._stderr_kept is not None:
            return self._stderr_kept
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 5 s; returns the exit code (-15 after a clean SIGTERM:
        uvicorn re-raises the signal). Keeps the stderr text, removes its temp file. Safe to
        call twice."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._stderr_kept is None:
            self._stderr_kept = self.stderr_text()
            self.stderr_path.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    *args: str, extra_env: Mapping[str, str] | None = None, timeout: float = 20
) -> ServerProcess:
    """Launch this file as a subprocess with CLI ``args`` (``--port 0`` unless given), wait for
    ``READY <port>`` and return the :class:`ServerProcess`. Raises RuntimeError, with the
    server's stderr, if it exits or is not ready within ``timeout`` seconds."""
    argv = [sys.executable, str(Path(__file__).resolve()), *args]
    if not any(a == "--port" or a.startswith("--port=") for a in args):
        argv += ["--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    fd, name = tempfile.mkstemp(prefix="openai-fixture-", suffix=".stderr")
    stderr_path = Path(name)
    with os.fdopen(fd, "wb") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env
        )
    assert proc.stdout is not None
    server = ServerProcess(proc, 0, stderr_path)
    deadline = time.monotonic() + timeout
    out = b""
    stdout_fd = proc.stdout.fileno()
    os.set_blocking(stdout_fd, False)
    try:
        while True:
            for line in out.splitlines():
                if line.startswith(b"READY "):
                    server.port = int(line.split()[1])
                    return server
            if proc.poll() is not None:
                raise RuntimeError(
                    f"openai_test_server exited with {proc.returncode} before READY; "
                    f"stdout: {out.decode(errors='replace')!r}; stderr:\n{server.stderr_text()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"openai_test_server not READY within {timeout} s; "
                    f"stderr:\n{server.stderr_text()}"
                )
            try:
                data = os.read(stdout_fd, 4096)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if data:
                out += data
            else:
                time.sleep(0.02)
    except BaseException:
        server.stop()
        raise


if __name__ == "__main__":
    main()
