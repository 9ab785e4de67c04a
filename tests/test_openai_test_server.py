"""The OpenAI-compatible test fixture (tests/openai_test_server.py) against real started
processes: its SSE and JSON shapes, auth, metrics, and every planted fault it promises."""

from __future__ import annotations

import base64
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.openai_test_server import MODEL_ID, ServerProcess, start_server

KEY = "sk-fixture"
AUTH = {"Authorization": f"Bearer {KEY}"}
IMAGE = "data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode()
# One client for the whole file (a fresh httpx client per call costs ~50 ms of TLS setup,
# which would swamp the TTFT checks); trust_env off so no proxy setting can interfere.
HTTP = httpx.Client(timeout=5, trust_env=False)


def body(max_tokens: int = 4, *, stream: bool = True, images: int = 1, **extra: Any) -> dict:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "describe the frame"}]
    parts += [{"type": "image_url", "image_url": {"url": IMAGE}} for _ in range(images)]
    return {
        "model": MODEL_ID,
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": parts}],
        **extra,
    }


def sse(server: ServerProcess, payload: dict, headers: dict | None = None) -> list[str]:
    """The ``data:`` payloads of one streamed completion, in order."""
    url = f"{server.base_url}/chat/completions"
    with HTTP.stream("POST", url, json=payload, headers=headers) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def post(server: ServerProcess, payload: dict, **kw: Any) -> httpx.Response:
    return HTTP.post(f"{server.base_url}/chat/completions", json=payload, **kw)


def metrics(server: ServerProcess) -> dict[str, float]:
    """Sample name -> value from /metrics, parsed with prometheus_client's own parser."""
    text = HTTP.get(server.metrics_url).text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def ttft(server: ServerProcess) -> float:
    """Seconds from sending a streamed request to its first content chunk."""
    t0 = time.perf_counter()
    url = f"{server.base_url}/chat/completions"
    with HTTP.stream("POST", url, json=body(1)) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                return time.perf_counter() - t0
    raise AssertionError("no content chunk")


# The servers this file uses, started in parallel once for the module (a start is ~0.4 s of
# interpreter and import time; one by one they would take most of the file's budget).
SPECS: dict[str, tuple[str, ...]] = {
    "plain": ("--api-key", KEY),
    "leak": ("--leak-mb-per-request", "10"),
    "slow": ("--slow-ms-per-request", "40", "--ttft-ms", "5"),
    "never_ready": ("--never-ready",),
    "fail": ("--fail-every", "3", "--fail-status", "503"),
    "faults": ("--reset-every", "3", "--malformed-every", "4", "--empty-every", "5"),
    "die": ("--die-after-requests", "3"),
    "queue": ("--max-running", "1", "--ttft-ms", "200"),
    "no_done": ("--no-done",),
    "rise": ("--waiting-rise-per-s", "200", "--kv-rise-per-s", "0.02"),
    "kv_cap": ("--kv-rise-per-s", "1000"),
}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerProcess]]:
    with ThreadPoolExecutor(len(SPECS)) as pool:
        futures = {name: pool.submit(start_server, *args) for name, args in SPECS.items()}
        try:
            yield {name: f.result() for name, f in futures.items()}
        finally:
            for f in futures.values():
                if f.exception() is None:
                    pool.submit(f.result().__exit__, None, None, None)


@pytest.fixture
def plain(servers: dict[str, ServerProcess]) -> ServerProcess:
    return servers["plain"]


def test_sse_stream_shape(plain: ServerProcess) -> None:
    """A stream is: role chunk, max_tokens 1-token content chunks, finish, usage, [DONE]."""
    events = sse(plain, body(5, stream_options={"include_usage": True}), AUTH)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]]
    assert len(content) == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert len(chunks) == 1 + 5 + 1 + 1


def test_sse_without_include_usage_has_no_usage_chunk(plain: ServerProcess) -> None:
    """Without stream_options.include_usage the finish chunk is followed by [DONE]."""
    events = sse(plain, body(2), AUTH)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_non_streaming_usage_and_image_count(plain: ServerProcess) -> None:
    """A non-streamed completion is one chat.completion JSON; usage counts max_tokens."""
    r = post(plain, body(6, stream=False, images=3), headers=AUTH)
    assert r.status_code == 200
    out = r.json()
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["choices"][0]["finish_reason"] == "length"
    usage = out["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert r.headers["x-fixture-images"] == "3"


def test_api_key_required_except_health(plain: ServerProcess) -> None:
    """With --api-key, /v1/* without the right bearer key is a 401; /health stays open."""
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = post(plain, body(), headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        assert HTTP.get(f"{plain.base_url}/models", headers=headers).status_code == 401
    assert HTTP.get(f"{plain.root_url}/health").json() == {"status": "ok"}
    models = HTTP.get(f"{plain.base_url}/models", headers=AUTH).json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == MODEL_ID
    assert HTTP.get(f"{plain.root_url}/version").json() == {"version": "fixture-1"}


def test_bad_request_is_400(plain: ServerProcess) -> None:
    """No messages list, or a broken image data URL, is a 400 with an OpenAI error JSON."""
    r = post(plain, {"model": MODEL_ID}, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"
    bad = body()
    bad["messages"][0]["content"][1]["image_url"]["url"] = "data:image/png;base64,@@@"
    assert post(plain, bad, headers=AUTH).status_code == 400


def test_metrics_parse_with_vllm_names(plain: ServerProcess) -> None:
    """/metrics parses as Prometheus text with the vLLM names and one unrelated metric."""
    values = metrics(plain)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "fixture_unrelated_metric",
    ):
        assert name in values, name
    assert 0.0 <= values["vllm:kv_cache_usage_perc"] <= 1.0


def test_leak_grows_server_rss_not_client(servers: dict[str, ServerProcess]) -> None:
    """--leak-mb-per-request X grows the server's RSS ~X MB a request, not the client's."""
    server = servers["leak"]
    proc, me = psutil.Process(server.pid), psutil.Process()
    post(server, body(1, stream=False)).raise_for_status()  # warm-up
    rss0, mine0 = proc.memory_info().rss, me.memory_info().rss
    for _ in range(10):
        post(server, body(1, stream=False)).raise_for_status()
    grown = (proc.memory_info().rss - rss0) / (1 << 20)
    mine = (me.memory_info().rss - mine0) / (1 << 20)
    assert 0.7 * 100 <= grown <= 1.5 * 100, grown
    assert mine < 20, mine


def test_slow_ms_grows_ttft(servers: dict[str, ServerProcess]) -> None:
    """--slow-ms-per-request X makes each request's time to first token X ms longer."""
    server = servers["slow"]
    ttft(server)  # warm-up: request 1
    times = [ttft(server) for _ in range(5)]
    steps = [b - a for a, b in itertools.pairwise(times)]
    assert all(step >= 0.25 * 0.040 for step in steps), times
    assert times[-1] - times[0] >= 0.75 * 4 * 0.040, times


def test_never_ready_accepts_but_never_answers(servers: dict[str, ServerProcess]) -> None:
    """--never-ready accepts TCP connections but /health and /v1/models never answer."""
    server = servers["never_ready"]
    socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    for url in (f"{server.root_url}/health", f"{server.base_url}/models"):
        with pytest.raises(httpx.ReadTimeout):
            HTTP.get(url, timeout=0.5)
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 5


def test_fail_every_gives_status(servers: dict[str, ServerProcess]) -> None:
    """--fail-every N --fail-status S answers every Nth completion with HTTP S."""
    server = servers["fail"]
    responses = [post(server, body(1, stream=i % 2 == 0)) for i in range(6)]
    assert [r.status_code for r in responses] == [200, 200, 503, 200, 200, 503]
    assert responses[2].json()["error"]["code"] == 503


def test_stream_faults_reset_malformed_empty(servers: dict[str, ServerProcess]) -> None:
    """--reset-every, --malformed-every and --empty-every each hit exactly their Nth request."""
    server = servers["faults"]
    assert len(sse(server, body(3))) == 1 + 3 + 1 + 1  # 1
    assert len(sse(server, body(3))) == 1 + 3 + 1 + 1  # 2
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):  # 3: reset
        sse(server, body(3))
    events = sse(server, body(3))  # 4: malformed
    assert events[-1] == "{not json"
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant"}
    events = sse(server, body(3, stream_options={"include_usage": True}))  # 5: empty
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any(c["choices"] and "content" in c["choices"][0]["delta"] for c in chunks)
    assert chunks[1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 0
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):  # 6: reset
        post(server, body(3, stream=False))
    assert post(server, body(3, stream=False)).json()["usage"]["completion_tokens"] == 3
    r = post(server, body(3, stream=False))  # 8: malformed
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        r.json()
    assert server.proc.poll() is None


def test_die_after_requests_ends_process(servers: dict[str, ServerProcess]) -> None:
    """--die-after-requests N makes the process exit with status 1 on request N, unanswered."""
    server = servers["die"]
    assert post(server, body(1)).status_code == 200
    assert post(server, body(1, stream=False)).status_code == 200
    with pytest.raises(httpx.TransportError):
        post(server, body(1))
    assert server.proc.wait(5) == 1
    assert "dying on request 3" in server.stderr_text()


def test_waiting_and_kv_rise_with_time(servers: dict[str, ServerProcess]) -> None:
    """--waiting-rise-per-s / --kv-rise-per-s X make those gauges rise by X per second."""
    w, kv = "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
    a = metrics(servers["rise"])
    time.sleep(0.2)
    b = metrics(servers["rise"])
    assert 0.8 * 0.2 * 200 <= b[w] - a[w] <= 1.0 * 200
    assert 0.8 * 0.2 * 0.02 <= b[kv] - a[kv] <= 1.0 * 0.02
    assert b[kv] < 1.0


def test_kv_rise_caps_at_one(servers: dict[str, ServerProcess]) -> None:
    """vllm:kv_cache_usage_perc never reports more than 1.0, however fast it rises."""
    assert metrics(servers["kv_cap"])["vllm:kv_cache_usage_perc"] == 1.0


def test_max_running_queues_requests(servers: dict[str, ServerProcess]) -> None:
    """--max-running N serves N completions at once; the rest show as waiting."""
    seen: list[tuple[float, float]] = []
    server = servers["queue"]
    threads = [threading.Thread(target=sse, args=(server, body(1))) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        m = metrics(server)
        seen.append((m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]))
        if seen[-1] == (1.0, 2.0):
            break
        time.sleep(0.02)
    for t in threads:
        t.join(5)
    after = metrics(server)
    assert (1.0, 2.0) in seen, seen
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0


def test_no_done_ends_stream_without_done(servers: dict[str, ServerProcess]) -> None:
    """--no-done ends each stream with no [DONE] line, as transformers serve does."""
    server = servers["no_done"]
    events = sse(server, body(2, stream_options={"include_usage": True}))
    assert "[DONE]" not in events
    assert json.loads(events[-1])["choices"] == []


def test_startup_failure_raises_with_stderr() -> None:
    """start_server raises with the server's stderr when the server cannot start."""
    with pytest.raises(RuntimeError, match="unrecognized arguments"):
        start_server("--no-such-option")
