"""What a served model's timings and counts mean, pinned (issue 35, bench/mutants/served.py):
time to first token is the ``infer`` stage from the request sent to the first content token,
``decode`` the rest of the stream, the output tokens come from ``usage`` (counted chunks
without it), the inter-token intervals are each chunk's gap in ms, the request's deadline
covers the whole answer, and which answers are errors.

Two real servers: tests/openai_test_server.py (a fixture process with planted delays, soaked
through the runner and the store, its rows and its report summary read back), and a scripted
SSE server on a real socket in this process for the answers the fixture cannot shape (usage
apart from the chunks, each end-of-stream marker alone, token counts at their bounds,
uneven gaps). Timing assertions are lower bounds from the planted delays, and upper bounds
that hold by arithmetic (a median of five gaps is at most a third of their sum), never a
busy host's speed."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.config import load_settings
from soakd.observers.base import RunResult
from soakd.records import Frame, StageOutput
from soakd.run.runner import run_soak
from soakd.workloads.base import WorkloadContext
from soakd.workloads.openai import MAX_TOKENS, OpenAIStaged, RequestFailed, _percentiles
from tests.conftest import SERVED_SHORT_RUN
from tests.openai_test_server import ServerProcess, start_server

TTFT_MS, ITL_MS, TOKENS = 80.0, 20.0, 6  # planted on the fixture: 5 gaps after the first


# --- a soak of the fixture with planted delays, through the runner and the store


@pytest.fixture(scope="module")
def fixture_server() -> Iterator[ServerProcess]:
    srv = start_server("--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS))
    yield srv
    srv.stop()


def _soak(srv: ServerProcess, db: Path, *more: str) -> RunResult:
    return run_soak(
        load_settings(
            overrides=[
                "workload.kind=openai",
                f"workload.base_url={srv.base_url!r}",
                f"workload.max_tokens={TOKENS}",
                "workload.ready_timeout_s=10",
                f"run.db={str(db)!r}",
                "run.fps=3",
                "run.warmup_s=0.5",
                *SERVED_SHORT_RUN,
                *more,
            ]
        )
    )


@pytest.fixture(scope="module")
def soaked(
    fixture_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, RunResult]:
    db = tmp_path_factory.mktemp("served") / "s.db"
    # a JPEG of 640x480 takes preprocess a measurable time
    big = ("source.width=640", "source.height=480")
    return db, _soak(fixture_server, db, "run.duration=2.5", *big)


def _rows(db: Path, run_id: str, where: str = "error IS NULL AND first = 0") -> list[sqlite3.Row]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return conn.execute(
            "SELECT *, json_extract(extra, '$.itl_p50_ms') AS itl_p50, "
            "json_extract(extra, '$.itl_p95_ms') AS itl_p95, "
            "json_extract(extra, '$.itl_max_ms') AS itl_max, "
            "json_extract(extra, '$.chunks') AS chunks, "
            "json_extract(extra, '$.usage_tokens') AS usage_tokens "
            f"FROM frames WHERE run_id = ? AND {where} ORDER BY frame_id",
            (run_id,),
        ).fetchall()


def test_time_to_first_token_is_the_infer_stage_and_excludes_preprocess(soaked) -> None:
    """infer_ms >= the planted TTFT on every answer; the JPEG and body are pre_ms, not TTFT."""
    db, res = soaked
    rows = _rows(db, res.run_id)
    assert len(rows) >= 4
    assert all(r["infer_ms"] >= TTFT_MS for r in rows), [r["infer_ms"] for r in rows]
    # a 640x480 JPEG, base64 and the request body: tenths of a ms at least; an empty pre
    # stage (its clock read after it ran) reads microseconds
    assert float(np.median([r["pre_ms"] for r in rows])) > 0.1


def test_decode_is_the_rest_of_the_stream_after_the_first_token(soaked) -> None:
    """decode_ms covers the planted gaps after the first token (5 x ITL, half at least)."""
    db, res = soaked
    rows = _rows(db, res.run_id)
    assert all(r["decode_ms"] >= 0.5 * (TOKENS - 1) * ITL_MS for r in rows)


def test_a_request_s_tokens_and_inter_token_gaps_land_on_its_row_in_ms(soaked) -> None:
    """out_tokens from usage, six content chunks, and each gap in ms: the median at most a
    third of the five gaps' sum (decode), the largest at least half the planted gap."""
    db, res = soaked
    rows = _rows(db, res.run_id)
    for r in rows:
        assert (r["out_tokens"], r["chunks"], r["usage_tokens"]) == (TOKENS, TOKENS, TOKENS)
        assert 0.5 * ITL_MS <= r["itl_max"] <= r["decode_ms"] + 5
        assert r["itl_p50"] <= r["decode_ms"] / 3 + 5
        assert r["itl_p50"] <= r["itl_p95"] <= r["itl_max"]


def test_the_report_s_served_numbers_are_the_measured_rows(soaked) -> None:
    """The summary's time to first token is infer_ms, its inter-token latency each request's
    decode / (tokens - 1), its chunk-gap rows each request's own p50 / p95 / max, and its
    output tokens the sum, all over the measured (post-warm-up) frames only."""
    from soakd.analysis.data import load_run_data
    from soakd.report.summary import ITL_ROW, Dist, summarize

    db, res = soaked
    measured = _rows(db, res.run_id, "warmup = 0 AND skipped = 0 AND t_done IS NOT NULL")
    everything = _rows(db, res.run_id, "t_done IS NOT NULL")
    assert 3 <= len(measured) < len(everything)
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        summary = summarize(load_run_data(conn, res.run_id), res.verdict)
    served = summary.served
    expected = {
        "time to first token": [r["infer_ms"] for r in measured],
        ITL_ROW: [r["decode_ms"] / (r["out_tokens"] - 1) for r in measured],
        "chunk gap p50 (per request)": [r["itl_p50"] for r in measured],
        "chunk gap p95 (per request)": [r["itl_p95"] for r in measured],
        "chunk gap max (per request)": [r["itl_max"] for r in measured],
    }
    assert set(served) == set(expected)
    for label, values in expected.items():
        want = Dist.of(np.array(values, dtype=np.float64))
        got = served[label]
        assert got.n == want.n == len(measured), label
        assert got.p50 == pytest.approx(want.p50, rel=1e-5), label  # float32 columns
        assert got.max == pytest.approx(want.max, rel=1e-5), label
    # output tokens over the measured frames only
    assert summary.served_run["output_tokens"] == sum(r["out_tokens"] for r in measured)


def test_a_run_that_does_not_stream_reports_no_time_to_first_token(
    fixture_server, tmp_path
) -> None:
    """stream = false: infer is the whole answer (TTFT + 5 gaps), so the report's served rows
    are empty (no "time to first token"); the streamed run above has them."""
    from soakd.analysis.data import load_run_data
    from soakd.report.summary import summarize

    db = tmp_path / "whole.db"
    res = _soak(fixture_server, db, "workload.stream=false", "run.duration=1.5")
    rows = _rows(db, res.run_id, "error IS NULL AND warmup = 0")
    assert rows and all(r["infer_ms"] >= TTFT_MS + 0.5 * (TOKENS - 1) * ITL_MS for r in rows)
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        assert summarize(load_run_data(conn, res.run_id), res.verdict).served == {}


# --- a scripted SSE server on a real socket: answers shaped byte by byte


def _sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return _sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _usage(n: Any) -> bytes:
    return _sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}})


ROLE = _sse({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
DONE = b"data: [DONE]\n\n"

#: script name -> ("sse", [(seconds to wait, bytes to send)...]) | ("json", body) | ("status", n)
SCRIPTS: dict[str, tuple[str, Any]] = {}


def _script(name: str, kind: str, what: Any) -> str:
    SCRIPTS[name] = (kind, what)
    return name


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # /<script>/v1/models; /version, /info, /props: 404
        if self.path.endswith("/v1/models"):
            self._send(200, b'{"data": [{"id": "scripted"}]}')
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        kind, what = SCRIPTS[self.path.split("/")[1]]
        if kind == "status":
            self._send(what, b'{"error": {"message": "scripted"}}')
            return
        if kind == "json":
            self._send(200, json.dumps(what).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for wait, data in what:
                time.sleep(wait)
                self.wfile.write(data)
                self.wfile.flush()
        except OSError:  # the client gave up (a deadline): the script ends
            pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def scripted() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


class Asked:
    """One request through the real workload's stages: its output or its error, and the
    wall time infer and decode took."""

    def __init__(self, port: int, script: str, *more: str) -> None:
        settings = load_settings(
            overrides=[
                "workload.kind=openai",
                f"workload.base_url='http://127.0.0.1:{port}/{script}/v1'",
                "workload.ready_timeout_s=5",
                *more,
            ]
        ).workload
        wl = OpenAIStaged(settings, WorkloadContext())  # type: ignore[arg-type]
        self.out: StageOutput | None = None
        self.error: RequestFailed | None = None
        self.infer_ms = self.decode_ms = 0.0
        try:
            wl.setup()
            frame = Frame(0, 0, 0, 0, np.zeros((48, 64, 3), np.uint8))
            inputs = wl.preprocess(frame)
            t0 = time.perf_counter()
            try:
                pending = wl.infer(inputs)
                t1 = time.perf_counter()
                self.infer_ms = (t1 - t0) * 1e3
                self.out = wl.decode(pending)
                self.decode_ms = (time.perf_counter() - t1) * 1e3
            except RequestFailed as exc:
                self.error = exc
            self.elapsed_s = time.perf_counter() - t0
        finally:
            wl.close()

    @property
    def kind(self) -> str | None:
        return None if self.error is None else self.error.kind

    @property
    def extra(self) -> dict[str, Any]:
        assert self.out is not None, self.error
        return self.out.extra or {}


def _whole(*parts: bytes) -> list[tuple[float, bytes]]:
    return [(0.0, p) for p in parts]


def test_output_tokens_come_from_usage_over_the_chunks_counted(scripted) -> None:
    """Three content chunks and usage 7: 7 tokens, 3 chunks (a chunk may carry several)."""
    name = _script(
        "usage7", "sse",
        _whole(ROLE, _chunk("a "), _chunk("b c "), _chunk("d e f g"), _chunk(None, "stop"),
               _usage(7), DONE),
    )  # fmt: skip
    got = Asked(scripted, name)
    assert got.out is not None and got.out.tokens == 7
    assert (got.extra["chunks"], got.extra["usage_tokens"]) == (3, 7)
    assert got.out.text == "a b c d e f g"


def test_without_usage_the_content_chunks_are_counted(scripted) -> None:
    """No usage chunk: the tokens are the three content chunks, and no usage_tokens kept."""
    name = _script(
        "nousage", "sse",
        _whole(ROLE, _chunk("a"), _chunk("b"), _chunk("c"), _chunk(None, "stop"), DONE),
    )  # fmt: skip
    got = Asked(scripted, name)
    assert got.out is not None and got.out.tokens == 3
    assert got.extra["chunks"] == 3 and "usage_tokens" not in got.extra


@pytest.mark.parametrize(
    ("tail", "whole"),
    [
        ((_chunk(None, "stop"),), True),  # a finish_reason alone (transformers serve 5.x)
        ((DONE,), True),  # [DONE] alone
        ((_usage(2),), True),  # the usage chunk alone
        ((), False),  # none of them: closed cleanly mid-answer
    ],
    ids=["finish_reason", "done", "usage", "none"],
)
def test_any_end_marker_makes_a_stream_whole_and_none_is_truncated(scripted, tail, whole) -> None:
    """finish_reason, usage or [DONE] each ends an answer; a stream without any is truncated."""
    name = _script(f"end-{len(SCRIPTS)}", "sse", _whole(ROLE, _chunk("a"), _chunk("b"), *tail))
    got = Asked(scripted, name)
    if whole:
        assert got.error is None and got.out is not None and got.out.tokens == 2
    else:
        assert got.kind == "truncated" and got.out is None


@pytest.mark.parametrize(
    ("count", "ok"),
    [(0, True), (1, True), (MAX_TOKENS, True), (MAX_TOKENS + 1, False), (-1, False),
     (True, False), ("5", False)],
    ids=["0", "1", "max", "max+1", "-1", "true", "text"],
)  # fmt: skip
def test_usage_is_a_count_from_0_to_max_tokens_else_malformed(scripted, count, ok) -> None:
    """usage.completion_tokens 0, 1 and MAX_TOKENS are counts; MAX_TOKENS + 1, -1, true and
    "5" make the answer malformed."""
    name = _script(f"count-{len(SCRIPTS)}", "sse", _whole(ROLE, _chunk("a"), _usage(count), DONE))
    got = Asked(scripted, name)
    if ok:
        assert got.out is not None and got.out.tokens == count
    else:
        assert got.kind == "malformed" and "usage.completion_tokens" in str(got.error)


@pytest.mark.parametrize(("usage", "ok"), [(0, False), (1, True)])
def test_a_stream_without_content_is_empty_unless_usage_counts_tokens(scripted, usage, ok) -> None:
    """No content chunk: usage 0 is an empty answer, usage 1 a one-token answer."""
    name = _script(f"nocontent-{usage}", "sse", _whole(ROLE, _chunk(None, "stop"), _usage(usage)))
    got = Asked(scripted, name)
    if ok:
        assert got.out is not None and got.out.tokens == 1 and got.out.text == ""
    else:
        assert got.kind == "empty"


@pytest.mark.parametrize(
    ("content", "usage", "tokens"),
    [("", 0, None), ("", 3, 3), ("hello", None, None), ("hi", 2, 2)],
    ids=["empty", "usage-only", "no-usage", "both"],
)
def test_a_whole_answer_not_streamed_is_empty_only_without_text_and_tokens(
    scripted, content, usage, tokens
) -> None:
    """stream = false: no text and no usage tokens is empty; either alone is an answer, its
    tokens from usage (None without it: nothing counted)."""
    body: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": content}}]}
    if usage is not None:
        body["usage"] = {"completion_tokens": usage}
    name = _script(f"json-{len(SCRIPTS)}", "json", body)
    got = Asked(scripted, name, "workload.stream=false")
    if tokens is None and not content:
        assert got.kind == "empty"
    else:
        assert got.error is None and got.out is not None
        assert (got.out.text, got.out.tokens) == (content, tokens)


def test_an_error_event_in_the_stream_is_an_error_not_an_answer(scripted) -> None:
    """An {"error": ...} event after a token: an 'http' error, however the stream ends."""
    err = _sse({"error": {"message": "overloaded", "code": 503}})
    name = _script("inerror", "sse", _whole(ROLE, _chunk("a"), err, _chunk(None, "stop"), DONE))
    got = Asked(scripted, name)
    assert got.kind == "http" and "overloaded" in str(got.error)


@pytest.mark.parametrize("status", [400, 429, 503])
def test_an_http_status_of_400_or_more_is_an_http_error_with_its_status(scripted, status) -> None:
    """HTTP 400, 429 and 503 each an 'http' error keeping the status."""
    got = Asked(scripted, _script(f"status-{status}", "status", status))
    assert got.kind == "http" and got.error is not None and got.error.status == status


def test_inter_token_gaps_are_each_chunk_s_own_in_ms(scripted) -> None:
    """Gaps of 30, 30, 30, 30 and 450 ms: p50 is a short gap (not the mean, 114), p95
    interpolated toward the long one (at least 0.8 of the max), the max the long one, none
    beyond decode's wall time."""
    gaps = (0.03, 0.03, 0.03, 0.03, 0.45)
    parts = [(0.0, ROLE), (0.0, _chunk("t0"))] + [
        (g, _chunk(f"t{i + 1}")) for i, g in enumerate(gaps)
    ]
    name = _script(
        "gaps", "sse", [*parts, (0.0, _chunk(None, "length")), (0.0, _usage(6)), (0, DONE)]
    )
    got = Asked(scripted, name)
    x = got.extra
    assert x["chunks"] == 6
    assert 5 <= x["itl_p50_ms"] <= 90
    assert x["itl_max_ms"] >= 300
    assert x["itl_p95_ms"] >= 0.8 * x["itl_max_ms"] - 1e-6
    assert x["itl_max_ms"] <= got.decode_ms + 1
    assert x["itl_p50_ms"] <= x["itl_p95_ms"] <= x["itl_max_ms"]


def test_a_request_s_gap_percentiles_are_numpy_s_float_for_float() -> None:
    """The inter-token p50 / p95 / max of a request, worked out without numpy (issue 34),
    are numpy's default (linear) percentiles and max, to the last bit, over 2000 random sets
    of 1 to 60 gaps spanning six orders of magnitude."""
    rng = np.random.default_rng(7)
    for _ in range(2000):
        gaps = list(rng.exponential(1.0, rng.integers(1, 61)) * 10.0 ** rng.integers(-3, 4))
        got = _percentiles(gaps)
        a = np.asarray(gaps)
        want = [float(np.percentile(a, 50)), float(np.percentile(a, 95)), float(a.max())]
        assert [got["itl_p50_ms"], got["itl_p95_ms"], got["itl_max_ms"]] == want, gaps


def _silent_after(first_s: float) -> list[tuple[float, bytes]]:
    return [(first_s, ROLE), (30.0, DONE)]  # then nothing for 30 s


def test_request_timeout_is_one_deadline_from_the_request_sent(scripted) -> None:
    """request_timeout_s = 1: a reply whose role chunk comes at 0.9 s and then nothing ends a
    'timeout' at 1 s from the request (not 1 s from the last byte), naming the setting."""
    name = _script("silent", "sse", _silent_after(0.9))
    box: list[Asked] = []
    t = threading.Thread(
        target=lambda: box.append(Asked(scripted, name, "workload.request_timeout_s=1")),
        daemon=True,
    )
    t.start()
    t.join(8)
    assert box, "the request outlived its deadline"
    got = box[0]
    assert got.kind == "timeout"
    assert "no whole answer within workload.request_timeout_s = 1 s" in str(got.error)
    assert 1.0 <= got.elapsed_s < 1.6


def test_request_timeout_ends_a_reply_whose_bytes_keep_coming(scripted) -> None:
    """A comment every 0.1 s and never a token: a 'timeout' at request_timeout_s = 0.5."""
    name = _script("keepalive", "sse", [(0.0, ROLE)] + [(0.1, b": keepalive\n\n")] * 200)
    box: list[Asked] = []
    t = threading.Thread(
        target=lambda: box.append(Asked(scripted, name, "workload.request_timeout_s=0.5")),
        daemon=True,
    )
    t.start()
    t.join(6)
    assert box, "the request outlived its deadline"
    assert box[0].kind == "timeout" and box[0].elapsed_s >= 0.5


# --- the realtime client's turn timing: server events as the receiver thread takes them

MS_NS = 1_000_000
ASK_NS = 1_000 * MS_NS  # when the question went (the run's clock)


def _turn_of(*timed: tuple[float, dict[str, Any]], rate: int = 24000) -> dict[str, Any]:
    """The measures of one turn asked at ASK_NS whose server events (``(ms after the ask,
    event)``) reach the receiver (``RealtimeSession._event``: parse, then time) in order."""
    from soakd.workloads.realtime.client import RealtimeSession, Turn

    settings = load_settings(
        overrides=["workload.kind=realtime", "workload.url='ws://127.0.0.1:9/v1/realtime'"]
    ).workload
    session = RealtimeSession(settings, WorkloadContext())  # type: ignore[arg-type]
    session._turn = Turn(1, "q", ASK_NS, None, None, rate)
    for at_ms, ev in timed:
        session._event(ASK_NS + round(at_ms * MS_NS), json.dumps(ev))
    _, turns, _ = session.drain()
    assert len(turns) == 1
    return turns[0].measures()


def _text(delta: str) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "delta": delta}


def _audio(ms: int, rate: int = 24000) -> dict[str, Any]:
    import base64

    pcm = bytes(2 * rate * ms // 1000)
    return {"type": "response.output_audio.delta", "delta": base64.b64encode(pcm).decode()}


def _done(tokens: int | None, status: str = "completed") -> dict[str, Any]:
    usage = {"output_tokens": tokens} if tokens is not None else None
    return {"type": "response.done", "response": {"status": status, "usage": usage}}


CREATED = {"type": "response.created"}


def test_a_turn_is_timed_from_its_question_to_the_first_delta_and_to_done() -> None:
    """created at 50 ms, deltas at 200, 230, 300, 310 ms, done at 400 ms with 7 tokens:
    first delta 200 ms and done 400 ms from the question, the deltas' gaps in ms (p95 near
    the largest), per token (310 - 200) / (7 - 1) ms: decode to the last text over tokens - 1."""
    m = _turn_of(
        (50, CREATED), (200, _text("a")), (230, _text("b")), (300, _text("c")),
        (310, _text("d")), (400, _done(7)),
    )  # fmt: skip
    assert (m["ttfd_ms"], m["start_ms"], m["done_ms"]) == (200.0, 50.0, 400.0)
    assert (m["deltas"], m["tokens"]) == (4, 7)
    assert (m["delta_p50_ms"], m["delta_max_ms"]) == (30.0, 70.0)
    assert m["delta_p95_ms"] == pytest.approx(30 + 0.9 * 40)  # gaps 10, 30, 70
    assert m["per_token_ms"] == pytest.approx(110 / 6, abs=1e-3)


@pytest.mark.parametrize(("tokens", "per_token"), [(None, 10.0), (1, None), (2, 20.0)])
def test_per_token_time_uses_usage_else_the_text_deltas_and_needs_two(tokens, per_token) -> None:
    """Deltas at 100, 110, 120 ms: without usage 3 tokens (10 ms each); usage 1: no per-token
    time (one token has no interval); usage 2: 20 ms."""
    m = _turn_of((100, _text("a")), (110, _text("b")), (120, _text("c")), (150, _done(tokens)))
    assert m.get("per_token_ms") == (None if per_token is None else pytest.approx(per_token))


def test_a_done_without_a_delta_or_a_failed_response_is_an_error_turn() -> None:
    """response.done with no delta: an empty answer; status failed: the turn's error."""
    assert _turn_of((100, _done(3)))["error"].startswith("empty answer")
    failed = _turn_of((100, _text("a")), (120, _done(1, "failed")))
    assert failed["error"] == "response failed"


def test_audio_out_plays_from_its_first_chunk_and_counts_each_underrun() -> None:
    """40 ms chunks at 0, 40 (exactly when the buffer ends: no underrun), 100 (after: one),
    130 ms (within the restarted buffer: none); 0.16 s of audio over first chunk -> done."""
    m = _turn_of(
        (0, _audio(40)), (40, _audio(40)), (100, _audio(40)), (130, _audio(40)), (200, _done(4))
    )
    assert m["underruns"] == 1
    assert m["audio_s"] == pytest.approx(0.16)
    assert m["audio_rtf"] == pytest.approx(0.16 / 0.2)
    late = _turn_of((50, _audio(40)), (91, _audio(40)), (150, _done(2)))
    assert late["underruns"] == 1  # 1 ms after the buffer ran dry
    assert late["audio_rtf"] == pytest.approx(0.08 / 0.1)  # from the first chunk, not the ask
