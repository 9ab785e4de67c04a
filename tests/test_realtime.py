"""``kind = "realtime"`` over real sockets: tests/realtime_test_server.py (a test server
written from the published wire contracts, answering with the embedded tiny LLaVA's real
streaming generation) soaked through the library and the CLI, one server process for the
module with its faults chosen per session in the URL; the official ``openai`` SDK's realtime
client checks the test server speaks the dialect the SDK parses."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.config import load_settings
from soakd.records import Frame
from soakd.run.runner import run_soak
from soakd.workloads.base import WorkloadContext
from soakd.workloads.realtime.client import RealtimeSession
from tests.conftest import SERVED_SHORT_RUN, error_lines, run_cli
from tests.realtime_test_server import start

pytestmark = pytest.mark.slow

PATHS = {"openai-realtime": "/v1/realtime", "vllm-omni-video": "/v1/video/chat/stream"}


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    s = start()
    yield s
    s.stop()


def url(srv: Any, protocol: str = "openai-realtime", query: str = "") -> str:
    return f"ws://127.0.0.1:{srv.port}{PATHS[protocol]}" + (f"?{query}" if query else "")


def soak(db: Path, ws_url: str, protocol: str = "openai-realtime", *more: str) -> Any:
    base = [
        "workload.kind=realtime",
        f"workload.protocol={protocol!r}",
        f"workload.url={ws_url!r}",
        "workload.question_every_s=0.7",
        "workload.connect_timeout_s=10",
        f"run.db={str(db)!r}",
        "run.duration=5",
        "run.fps=5",
        "run.warmup_s=1",
        *SERVED_SHORT_RUN,
    ]
    return run_soak(load_settings(overrides=[*base, *more]))


def rows(db: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def criteria(db: Path, run_id: str) -> dict[str, str]:
    return dict(rows(db, "SELECT criterion, status FROM verdicts WHERE run_id = ?", run_id))


def events(db: Path, run_id: str, kind: str) -> list[tuple[Any, ...]]:
    return rows(db, "SELECT message, data FROM events WHERE run_id = ? AND kind = ?", run_id, kind)


@pytest.mark.parametrize("protocol", list(PATHS))
def test_a_healthy_session_passes_and_each_answer_is_timed_on_its_frame_s_row(
    db_path, server, protocol
):
    """Both dialects: PASS; each turn rides on a frame row (infer = time to first delta,
    usage tokens, the per-token interval beside the delta gaps) and is a turn event."""
    # 4 s judged: the server's allocator settling (~100 KB) reads as > 1.5 MB/min, and
    # projected over the default week-long horizon it "runs out" of the host's memory; the
    # leak the criterion must catch is ~300 MB/min (the test below), and 4 s speak for an
    # hour at most. Nor can 4 s bound frame age's trend: one window a loaded host held up by
    # 4 ms bounds it at 57 ms/min (seen once under the whole suite; the tolerance is 50)
    result = soak(
        db_path,
        url(server, protocol, "max_tokens=5"),
        protocol,
        "criteria.max_memory_growth_mb_per_min=10",
        "criteria.horizon='1h'",
        "criteria.max_age_slope_ms_per_min=600",
    )
    assert result.status == "completed"
    assert result.verdict.status == "PASS", [
        c for c in result.verdict.criteria if c.status != "pass" and c.status != "n/a"
    ]
    turns = rows(
        db_path,
        "SELECT infer_ms, decode_ms, out_tokens, output_kind, json_extract(extra, "
        "'$.per_token_ms'), json_extract(extra, '$.delta_p50_ms'), json_extract(extra, "
        "'$.frame_age_at_ask_ms'), json_extract(extra, '$.tokens') FROM frames "
        "WHERE run_id = ? AND infer_ms IS NOT NULL",
        result.run_id,
    )
    assert len(turns) >= 4
    for infer, decode, tokens, kind, per_token, gap, age, usage in turns:
        assert infer > 0 and decode > 0 and tokens == usage == 5 and kind == "text"
        assert per_token > 0 and gap > 0 and age >= 0
    assert len(events(db_path, result.run_id, "turn")) == len(turns)
    sent = rows(db_path, "SELECT count(*) FROM frames WHERE run_id = ?", result.run_id)[0][0]
    assert sent >= 20  # every paced frame went out: a row each


def test_the_socket_cut_mid_answer_is_an_error_row_then_a_new_session(db_path, server):
    """A server that drops the socket mid-answer: the turn is an error (FAIL), the close
    and the reconnect (its gap timed) are events, later frames go out on the new socket."""
    result = soak(db_path, url(server, query="drop_after=2"))
    assert criteria(db_path, result.run_id)["errors"] == "fail"
    assert events(db_path, result.run_id, "server_closed")
    ((_, data), *_) = events(db_path, result.run_id, "reconnect")
    assert json.loads(data)["gap_ms"] > 0
    errs = rows(
        db_path, "SELECT error FROM frames WHERE run_id = ? AND error IS NOT NULL", result.run_id
    )
    assert any("server closed the session" in e for (e,) in errs)


def test_a_malformed_event_fails_its_turn_and_is_an_event_with_its_code(db_path, server):
    """Non-JSON from the server mid-answer: the turn is an error row (FAIL), the event
    ``server_error`` has code ``malformed``."""
    result = soak(db_path, url(server, query="malformed_after=1"))
    assert criteria(db_path, result.run_id)["errors"] == "fail"
    codes = [json.loads(d)["code"] for _, d in events(db_path, result.run_id, "server_error")]
    assert "malformed" in codes


def test_a_server_that_slows_down_times_out_its_answers_and_fails(db_path, server):
    """Each answer 400 ms later than the last, answers due within 1 s: turns time out as
    errors (FAIL), questions asked meanwhile are skipped and counted."""
    result = soak(
        db_path,
        url(server, query="slow_ms=400"),
        "openai-realtime",
        "workload.response_timeout_s=1",
    )
    assert criteria(db_path, result.run_id)["errors"] == "fail"
    errs = rows(
        db_path, "SELECT error FROM frames WHERE run_id = ? AND error IS NOT NULL", result.run_id
    )
    assert any("no done event within 1 s" in e for (e,) in errs)


def test_an_expired_session_is_renewed_and_the_renewal_s_cost_is_an_event(db_path, server):
    """The server ends each session after 1.5 s (``error`` code session_expired, a close):
    ``session_expired`` events, a ``reconnect`` each with its gap, and answers after it."""
    result = soak(db_path, url(server, query="expire_s=1.5"))
    assert result.status == "completed"
    assert events(db_path, result.run_id, "session_expired")
    gaps = [json.loads(d)["gap_ms"] for _, d in events(db_path, result.run_id, "reconnect")]
    assert gaps and all(g > 0 for g in gaps)
    (summary,) = rows(db_path, "SELECT summary FROM runs WHERE id = ?", result.run_id)[0]
    rt = json.loads(summary)["realtime"]
    assert rt["expired"] >= 1 and rt["reconnects"] >= 1
    last_turn = max(json.loads(d)["turn"] for _, d in events(db_path, result.run_id, "turn"))
    assert last_turn >= 3  # answers still come on the renewed sessions


class Vanishing:
    """A WebSocket listener in this process that accepts (or refuses with HTTP ``status``)
    and can be shut down: nothing then listens on its port."""

    def __init__(self, status: int | None = None, key: str | None = None) -> None:
        self.status, self.key = status, key
        self.loop = asyncio.new_event_loop()
        self.ready, self.port = threading.Event(), 0
        self.stopped: asyncio.Future[None] | None = None
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),))
        self.thread.start()
        assert self.ready.wait(10)

    async def _main(self) -> None:
        from websockets.asyncio.server import serve
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        def check(conn: Any, request: Any) -> Any:
            if self.status is not None:
                return Response(self.status, "No", Headers(), b"no\n")
            if self.key and request.headers.get("Authorization") != f"Bearer {self.key}":
                return Response(401, "Unauthorized", Headers(), b"no\n")
            return None

        async def handler(ws: Any) -> None:
            async for _ in ws:  # omni dialect: the client speaks first; no question is asked
                pass

        self.stopped = asyncio.get_running_loop().create_future()
        async with serve(handler, "127.0.0.1", 0, process_request=check) as srv:
            self.port = srv.sockets[0].getsockname()[1]
            self.ready.set()
            await self.stopped

    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/video/chat/stream"

    def shut(self) -> None:
        assert self.stopped is not None
        self.loop.call_soon_threadsafe(self.stopped.set_result, None)
        self.thread.join(10)


def test_a_server_that_stays_unreachable_ends_the_run_invalid(db_path):
    """The server goes away at 1.5 s and never comes back: reconnects refused for
    ``unreachable_timeout_s``, then INVALID with a ``server_unreachable`` event."""
    srv = Vanishing()
    threading.Timer(1.5, srv.shut).start()
    result = soak(
        db_path,
        srv.url(),
        "vllm-omni-video",
        "workload.question_every_s=60",
        "workload.unreachable_timeout_s=1",
        "workload.reconnect_backoff_s=0.2",
        "run.duration=15",
    )
    assert result.status == "aborted"
    assert result.verdict.status == "INVALID"
    assert len(events(db_path, result.run_id, "server_unreachable")) == 1
    (reason,) = rows(db_path, "SELECT reason FROM runs WHERE id = ?", result.run_id)[0]
    assert reason.startswith("server unreachable for")


def test_a_refused_key_or_a_wrong_path_is_exit_2_and_a_given_key_is_never_stored(
    tmp_path, subprocess_env
):
    """HTTP 401 or 404 at the handshake: exit 2, one line; with the key the run has no trace
    of it; a non-ws URL is refused naming the key."""
    key = "sk-realtime-secret-7731"
    srv = Vanishing(key=key)
    try:
        args = [
            "run",
            "--no-live",
            "--duration",
            "2",
            "--fps",
            "5",
            "--set",
            "workload.kind=realtime",
            "--set",
            "workload.protocol='vllm-omni-video'",
            "--set",
            f"workload.url={srv.url()!r}",
            "--set",
            "workload.question_every_s=60",
            "--set",
            "criteria.min_duration_s=1",
            "--set",
            "criteria.min_frames=3",
            "--set",
            "run.warmup_s=0.2",
        ]
        out = run_cli(*args, "--db", str(tmp_path / "a.db"), env=subprocess_env)
        assert out.returncode == 2
        (line,) = error_lines(out.stderr)
        assert "refused the API key (HTTP 401)" in line
        env = {**subprocess_env, "SOAKD_RT_KEY": key}
        db = tmp_path / "b.db"
        ok = run_cli(*args, "--db", str(db), "--set", "workload.api_key_env=SOAKD_RT_KEY", env=env)
        assert ok.returncode in (0, 1, 3), ok.stderr[-2000:]  # 3: no answer asked, none timed
        assert rows(db, "SELECT count(*) FROM frames WHERE error IS NULL")[0][0] >= 5
        assert key.encode() not in db.read_bytes()
        assert key not in ok.stderr + ok.stdout
    finally:
        srv.shut()
    nowhere = Vanishing(status=404)
    try:
        out = run_cli(
            "run",
            "--no-live",
            "--db",
            str(tmp_path / "c.db"),
            "--set",
            "workload.kind=realtime",
            "--set",
            f"workload.url={nowhere.url()!r}",
            env=subprocess_env,
        )
        assert out.returncode == 2
        (line,) = error_lines(out.stderr)
        assert "HTTP 404" in line
    finally:
        nowhere.shut()
    out = run_cli(
        "run",
        "--no-live",
        "--db",
        str(tmp_path / "d.db"),
        "--set",
        "workload.kind=realtime",
        "--set",
        "workload.url='http://x/v1/realtime'",
        env=subprocess_env,
    )
    assert out.returncode == 2
    assert "workload.url" in out.stderr and "ws://" in out.stderr


def _frame(i: int) -> Frame:
    img = np.zeros((48, 64, 3), np.uint8)
    return Frame(id=i, t_sched_ns=i, t_capture_ns=i, grab_ns=0, image=img)


def test_a_frame_the_socket_has_not_taken_is_replaced_by_the_newest_and_counted():
    """Latest-frame rule: with the socket busy (not taking), three pushes keep the newest
    frame only; the two it replaced are counted as dropped, none is queued."""
    s = load_settings(overrides=["workload.kind=realtime"]).workload
    session = RealtimeSession(s, WorkloadContext())  # never connected: the socket takes nothing
    assert session.push(_frame(1)) is None
    assert session.push(_frame(2)) == 1
    assert session.push(_frame(3)) == 2
    assert session.dropped == 2
    assert session._slot is not None and session._slot.id == 3


def test_a_frame_is_encoded_on_the_sender_once_taken_and_a_dropped_one_never(server):
    """Encode and send on one thread (issue 34): three frames pushed before the sender
    runs leave the newest in the slot and none encoded (two dropped); once started, the
    sender encodes that frame, on its own thread, and the socket takes it."""
    s = load_settings(
        overrides=["workload.kind=realtime", f"workload.url={url(server)!r}"]
    ).workload
    session = RealtimeSession(s, WorkloadContext())
    encoded: list[tuple[str, int]] = []
    jpeg = session._jpeg

    def counted(img: np.ndarray) -> str:
        encoded.append((threading.current_thread().name, int(img[0, 0, 0])))
        return jpeg(img)

    session._jpeg = counted  # type: ignore[method-assign]
    session.setup()
    try:
        for i in (1, 2, 3):
            frame = _frame(i)
            frame.image[0, 0, 0] = i
            session.push(frame)
        assert session.dropped == 2 and encoded == []
        session.start()
        deadline = time.monotonic() + 10
        sent: list[Any] = []
        while not sent and time.monotonic() < deadline:
            sent += session.drain()[0]
            time.sleep(0.01)
        assert [(x.frame_id, x.error) for x in sent] == [(3, None)]
        assert encoded == [("soakd-rt-send", 3)]
    finally:
        session.close()


def test_the_official_openai_sdk_completes_a_turn_with_an_image_and_audio(server):
    """The ``openai`` package's realtime client: session.update, an image and audio item,
    response.create; it parses the test server's events into its own types to response.done
    with usage."""
    pytest.importorskip("websockets")
    from openai import OpenAI

    client = OpenAI(api_key="sk-unused", websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
    jpeg = base64.b64encode(_jpeg()).decode()
    pcm = base64.b64encode(np.zeros(2400, "<i2").tobytes()).decode()
    seen: list[str] = []
    text: list[str] = []
    with client.realtime.connect(model="tiny-llava") as conn:
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        conn.input_audio_buffer.append(audio=pcm)
        conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": f"data:image/jpeg;base64,{jpeg}"},
                    {"type": "input_audio", "audio": pcm},
                    {"type": "input_text", "text": "What is in the picture?"},
                ],
            }
        )
        conn.response.create()
        deadline = time.monotonic() + 60
        for event in conn:
            seen.append(type(event).__name__)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
            if event.type == "response.done":
                usage = event.response.usage
                break
            assert time.monotonic() < deadline
    assert seen[0] == "SessionCreatedEvent"
    assert {
        "SessionUpdatedEvent",
        "ConversationItemCreatedEvent",
        "ResponseCreatedEvent",
        "ResponseTextDeltaEvent",
        "ResponseDoneEvent",
    } <= set(seen)
    assert usage is not None and usage.output_tokens == len(text) == 6


def _jpeg() -> bytes:
    import cv2

    ok, buf = cv2.imencode(".jpg", np.full((48, 64, 3), 128, np.uint8))
    assert ok
    return buf.tobytes()


def test_a_server_that_keeps_every_frame_fails_its_own_memory_while_soakd_s_passes(db_path, server):
    """The server keeps every frame with 1 MiB more (5 fps: ~300 MB/min): memory_server_rss
    FAIL (the server's process, found listening on the URL's port), memory_rss PASS."""
    result = soak(
        db_path,
        url(server, query="leak_kb=1024"),
        "openai-realtime",
        "run.duration=8",
        "criteria.max_memory_growth_mb_per_min=40",
    )
    got = criteria(db_path, result.run_id)
    assert got["memory_server_rss"] == "fail"
    assert got["memory_rss"] == "pass"
    # the leak is the server's, not soakd's: its RSS grew, soakd's own far less (how many
    # MB depends on how many frames a loaded host pushed in 8 s)
    grown = rows(
        db_path,
        "SELECT max(server_rss_bytes) - min(server_rss_bytes), max(rss_bytes) - min(rss_bytes)"
        " FROM samples WHERE run_id = ?",
        result.run_id,
    )[0]
    server_growth, own_growth = grown
    assert server_growth > 5 << 20 and server_growth > 3 * own_growth, grown


def test_n_streams_are_n_concurrent_sessions_each_asked_and_summed_in_one_summary(db_path, server):
    """run.streams = 2: two sessions at once, each stream's frames sent and its questions
    answered on its own socket; the summary counts both sessions' frames and turns."""
    result = soak(db_path, url(server), "openai-realtime", "run.streams=2")
    assert result.status == "completed", result.reason
    streams = rows(
        db_path,
        "SELECT DISTINCT stream FROM frames WHERE run_id = ? AND error IS"
        " NULL AND json_extract(extra, '$.turn') IS NOT NULL",
        result.run_id,
    )
    assert {s for (s,) in streams} == {0, 1}
    (summary,) = rows(db_path, "SELECT summary FROM runs WHERE id = ?", result.run_id)[0]
    rt = json.loads(summary)["realtime"]
    sent = rows(db_path, "SELECT count(*) FROM frames WHERE run_id = ? AND error IS NULL",
                result.run_id)[0][0]  # fmt: skip
    assert rt["sessions"] == 2 and rt["frames_sent"] == sent, rt
    assert rt["turns"] == len(events(db_path, result.run_id, "turn")) + rt["turns_failed"]


def test_a_profile_asks_about_each_frame_and_recommends_a_question_interval(tmp_path, server):
    """soakd profile (unpaced): each frame pushed, asked about and answered before the next;
    every row after the first has its time to first delta, decode and push -> done, and the
    profile recommends a question interval from the answers, never a frame rate."""
    db = tmp_path / "p.db"
    out = run_cli("profile", "--frames", "6", "-f", "json", "--db", str(db),
                  "--set", "workload.kind=realtime", "--set", f"workload.url={url(server)!r}",
                  "--set", "workload.connect_timeout_s=10")  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    got = rows(db, "SELECT infer_ms, decode_ms, total_ms, (t_done - t_dispatch) * 1e3 FROM"
               " frames WHERE first = 0 AND error IS NULL")  # fmt: skip
    assert len(got) == 5 and doc["measured"] == 5
    for infer, decode, total, span in got:
        assert 0 < infer < total and 0 <= decode < total and total == pytest.approx(span)
    assert doc["recommended_fps"] is None and doc["fps_flag"] is None
    answers = doc["theoretical_fps"]
    assert answers == pytest.approx(1000 / doc["stages"]["total"]["median"])
    assert 1 / (0.6 * answers) <= doc["question_every_s"] <= 1.1 / (0.6 * answers)


def test_the_server_s_voice_activity_detection_opens_turns_timed_from_speech_stopped(
    db_path, server, tmp_path
):
    """turn_detection = server_vad and spoken audio (0.5 s of tone, 0.7 s of quiet, looped):
    the server answers each utterance unasked; each is a turn on its frame's row, timed
    from speech stopped, with a server_turn event, and soakd asked nothing."""
    from scipy.io import wavfile

    rate = 16000
    t = np.arange(int(0.5 * rate)) / rate
    speech = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    wav = tmp_path / "speech.wav"
    wavfile.write(wav, rate, np.concatenate([speech, np.zeros(int(0.7 * rate), "<i2")]))
    result = soak(
        db_path, url(server), "openai-realtime",
        "workload.session={turn_detection = {type = 'server_vad', silence_duration_ms = 300}}",
        "workload.question_every_s=3600", "workload.audio_chunk_ms=40",
        "audio.kind='wav'", f"audio.path={str(wav)!r}", "audio.sample_rate=16000",
        "run.duration=6",
    )  # fmt: skip
    assert result.status == "completed", result.reason
    opened = events(db_path, result.run_id, "server_turn")
    answered = rows(db_path, "SELECT infer_ms, json_extract(extra, '$.turn') FROM frames WHERE"
                    " run_id = ? AND error IS NULL AND json_extract(extra, '$.turn') IS NOT"
                    " NULL", result.run_id)  # fmt: skip
    assert len(opened) >= 2 and len(answered) >= 2, (opened, answered)
    assert all(ms is not None and ms > 0 for ms, _ in answered)
    assert not events(db_path, result.run_id, "question")  # soakd asked nothing


def test_audio_out_is_timed_as_a_listener_hears_it_and_audio_in_goes_in_chunks(db_path, server):
    """Audio out (40 ms of PCM16 a token): each turn has its audio seconds, real-time factor
    and underruns; the [audio] source goes out in audio_chunk_ms chunks, none dropped."""
    result = soak(
        db_path,
        url(server, query="max_tokens=5"),
        "openai-realtime",
        "workload.session={output_modalities = ['text', 'audio']}",
        "workload.audio_chunk_ms=20",
        "audio.kind='tone'",
        "audio.sample_rate=16000",
    )
    turns = [json.loads(d) for _, d in events(db_path, result.run_id, "turn")]
    assert len(turns) >= 3
    for t in turns:
        assert t["audio_s"] == pytest.approx(5 * 0.04)
        assert t["audio_rtf"] > 0 and t["underruns"] >= 0
    (summary,) = rows(db_path, "SELECT summary FROM runs WHERE id = ?", result.run_id)[0]
    rt = json.loads(summary)["realtime"]
    assert rt["audio_chunks_dropped"] == 0 and rt["audio_rtf"]["p50"] > 0
    # about real time: the run's own length of audio in 20 ms chunks (~250 for 5 s), and a
    # second of it at least; 263 (5.26 s) seen in a 5.05 s run, ~0.2 s over its clock and
    # not yet explained (the audio before the first frame, while the session connected?)
    sent = rt["audio_chunks_sent"]
    assert sent >= 50 and sent * 0.020 <= result.duration_s + 0.5, (sent, result.duration_s)


def test_a_player_counts_an_underrun_for_each_chunk_that_comes_after_the_buffer_ran_dry():
    """Three 40 ms chunks at 0, 20 and 100 ms: the second extends the buffer to 80 ms, the
    third comes after it ran dry (one underrun); 0.12 s received over 0.1 s."""
    from soakd.workloads.realtime.client import Turn

    t = Turn(1, "q", 0, None, None, audio_rate=24000)
    chunk = bytes(2 * 960)  # 40 ms at 24 kHz
    for at_ms in (0, 20, 100):
        t.delta(at_ms * 1_000_000, audio=chunk)
    t.done_ns = 100_000_000
    m = t.measures()
    assert m["underruns"] == 1
    assert m["audio_s"] == pytest.approx(0.12)
    assert m["audio_rtf"] == pytest.approx(1.2)
