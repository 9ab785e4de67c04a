"""Issue 35's mutants of what a served model's request times and counts: time to first token
(the ``infer`` stage, request sent -> first content token), ``decode`` (the rest of the
stream), the output tokens (usage, else the content chunks counted), the inter-token gaps
(ms, each chunk's own), the request's deadline, which answers are errors, where the staged
driver and the sink put each time, and the report's served rows. Each name ends
"(#35 served)": ``--only "(#35 served)"`` runs just these."""

from __future__ import annotations

from bench.mutants.base import Mutant

SINK_TESTS = ("tests/test_sink.py",)
# the pins by test (node ids: a mutant runs only the tests that state its rule, so the one
# soak of the fixture server runs only where a soak decides)
_F = "tests/test_pins_served.py::test_"
TTFT = (_F + "time_to_first_token_is_the_infer_stage_and_excludes_preprocess",)
DECODE = (_F + "decode_is_the_rest_of_the_stream_after_the_first_token",)
ROW = (_F + "a_request_s_tokens_and_inter_token_gaps_land_on_its_row_in_ms",)
REPORT = (_F + "the_report_s_served_numbers_are_the_measured_rows",)
WHOLE = (_F + "a_run_that_does_not_stream_reports_no_time_to_first_token",)
ANSWERS = tuple(
    _F + t
    for t in (
        "output_tokens_come_from_usage_over_the_chunks_counted",
        "without_usage_the_content_chunks_are_counted",
        "any_end_marker_makes_a_stream_whole_and_none_is_truncated",
        "usage_is_a_count_from_0_to_max_tokens_else_malformed",
        "a_stream_without_content_is_empty_unless_usage_counts_tokens",
        "a_whole_answer_not_streamed_is_empty_only_without_text_and_tokens",
        "an_error_event_in_the_stream_is_an_error_not_an_answer",
        "an_http_status_of_400_or_more_is_an_http_error_with_its_status",
    )
)
GAPS = (_F + "inter_token_gaps_are_each_chunk_s_own_in_ms",)
DEADLINE = (
    _F + "request_timeout_is_one_deadline_from_the_request_sent",
    _F + "request_timeout_ends_a_reply_whose_bytes_keep_coming",
)
REALTIME = tuple(
    _F + t
    for t in (
        "a_turn_is_timed_from_its_question_to_the_first_delta_and_to_done",
        "per_token_time_uses_usage_else_the_text_deltas_and_needs_two",
        "a_done_without_a_delta_or_a_failed_response_is_an_error_turn",
        "audio_out_plays_from_its_first_chunk_and_counts_each_underrun",
    )
)

OA = "soakd/workloads/openai.py"
STAGED = "soakd/run/drivers/staged.py"
SINK = "soakd/run/sink.py"
SUMMARY = "soakd/report/summary.py"
DATA = "soakd/analysis/data.py"
RT = "soakd/workloads/realtime/client.py"

_STAMP = "pending.t_first, pending.chunks = time.perf_counter(), 1"
_TOKENS = "tokens = p.usage_tokens if p.usage_tokens is not None else p.chunks"
_BOUND = "0 <= value <= MAX_TOKENS"
_PER_TOKEN = "(self.last_text_ns - self.first_ns) / 1e6 / (tokens - 1)"
_PRE = "            inputs = preprocess(frame)\n            end_pre()\n"
_READ = "return bytes(read(max_bytes, left if timeout is None else min(timeout, left)))"

MUTANTS: tuple[Mutant, ...] = (
    # time to first token: from the request sent to the first *content* token
    Mutant("TTFT stamped at the role chunk, not the first content token (#35 served)", OA,
           "            if text:\n                " + _STAMP,
           "            if True:\n                " + _STAMP, TTFT),
    Mutant("the first token's instant never stamped: the first gap from time zero (#35 served)",
           OA, _STAMP, "pending.chunks = 1", GAPS),
    Mutant("TTFT includes preprocess (its clock read before the JPEG) (#35 served)", STAGED,
           _PRE + "            t2 = now()\n", "            t2 = now()\n" + _PRE,
           TTFT),
    Mutant("TTFT stored from dispatch (preprocess in it) (#35 served)", SINK,
           "t2 - t1, t3 - t2, t4 - t3", "t2 - t1, t3 - t1, t4 - t3", SINK_TESTS),
    # decode: from the first token to the end of the stream
    Mutant("the rest of the stream timed in infer, decode empty (#35 served)", STAGED,
           "            t3 = now()\n            out = decode(outputs)\n",
           "            out = decode(outputs)\n            t3 = now()\n", DECODE),
    Mutant("decode stored from preprocess end (TTFT in it) (#35 served)", SINK,
           "t2 - t1, t3 - t2, t4 - t3", "t2 - t1, t3 - t2, t4 - t2", SINK_TESTS),
    # the inter-token gaps
    Mutant("inter-token gaps in seconds (#35 served)", OA,
           "itl.append((now - last) * 1e3)", "itl.append(now - last)", GAPS),
    Mutant("inter-token gaps cumulative from the first token (#35 served)", OA,
           "                    itl.append((now - last) * 1e3)\n                    last = now\n",
           "                    itl.append((now - last) * 1e3)\n", ROW),
    Mutant("a chunk without content is a gap and a chunk (#35 served)", OA,
           "                if text:\n                    now = time.perf_counter()",
           "                if True:\n                    now = time.perf_counter()", ANSWERS),
    Mutant("inter-token p50 is the mean (#35 served)", OA,
           '"itl_p50_ms": _percentile(a, 50),', '"itl_p50_ms": sum(a) / len(a),', GAPS),
    Mutant("inter-token p95 is the median (#35 served)", OA,
           '"itl_p95_ms": _percentile(a, 95),', '"itl_p95_ms": _percentile(a, 50),', GAPS),
    Mutant("inter-token percentiles not interpolated (#34 served)", OA,
           "return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t", "return a", GAPS),
    Mutant("inter-token max is the mean (#35 served)", OA,
           '"itl_max_ms": a[-1],', '"itl_max_ms": sum(a) / len(a),', GAPS),
    Mutant("the first gap from decode's start, not the first token (#35 served)", OA,
           "last = p.t_first", "last = time.perf_counter()", GAPS,
           equivalent="between the first token's stamp (infer's return) and decode's start "
           "only the driver's sync() no-op and one clock read run: microseconds, below any "
           "gap a server plants or a report shows"),
    # output tokens: usage when the server sends it, else the content chunks counted
    Mutant("the first content chunk not counted (#35 served)", OA,
           _STAMP, "pending.t_first, pending.chunks = time.perf_counter(), 0", ANSWERS),
    Mutant("tokens counted from chunks though usage says otherwise (#35 served)", OA,
           _TOKENS, "tokens = p.chunks", ANSWERS),
    Mutant("no usage: no tokens (the chunks not counted) (#35 served)", OA,
           _TOKENS, "tokens = p.usage_tokens", ANSWERS),
    Mutant("usage of MAX_TOKENS refused (#35 served)", OA, _BOUND, "0 <= value < MAX_TOKENS",
           ANSWERS),
    Mutant("usage above MAX_TOKENS taken as a count (#35 served)", OA, _BOUND, "0 <= value",
           ANSWERS),
    Mutant("usage of 0 tokens refused (#35 served)", OA, _BOUND, "0 < value <= MAX_TOKENS",
           ANSWERS),
    Mutant("usage of true read as 1 token (#35 served)", OA,
           "isinstance(value, int) and not isinstance(value, bool) and",
           "isinstance(value, int) and",
           ANSWERS),
    # which answers are whole, empty, errors
    Mutant("a stream cut without an end marker is a short answer (#35 served)", OA,
           "    if not p.finished:\n        raise RequestFailed(\n            \"truncated\",",
           "    if False:\n        raise RequestFailed(\n            \"truncated\",", ANSWERS),
    Mutant("a finish_reason does not end a stream (#35 served)", OA,
           '        if choice.get("finish_reason") is not None:\n            p.finished = True',
           "        if False:\n            p.finished = True", ANSWERS),
    Mutant("[DONE] does not end a stream (#35 served)", OA,
           'if data.strip() == "[DONE]":\n            p.finished = True\n',
           'if data.strip() == "[DONE]":\n', ANSWERS),
    Mutant("the usage chunk does not end a stream (#35 served)", OA,
           "p.usage_tokens, p.finished = count, True", "p.usage_tokens = count", ANSWERS),
    Mutant("a stream with no content and usage 0 is an answer (#35 served)", OA,
           "if not pending.usage_tokens:", "if pending.usage_tokens is None:", ANSWERS),
    Mutant("not streamed: no text and usage 0 is an answer (#35 served)", OA,
           "if not text and not tokens:", "if not text and tokens is None:", ANSWERS),
    Mutant("not streamed: no text is empty though usage counts tokens (#35 served)", OA,
           "if not text and not tokens:", "if not text:", ANSWERS),
    Mutant("an error event in the stream ignored (#35 served)", OA,
           '        if "error" in chunk:\n', "        if False:\n", ANSWERS),
    Mutant("HTTP 400 read as a stream (#35 served)", OA,
           "if r.status_code >= 400:", "if r.status_code > 400:", ANSWERS),
    Mutant("a 4xx status not an http error (#35 served)", OA,
           "if r.status_code >= 400:", "if r.status_code >= 500:", ANSWERS),
    # the deadline: request_timeout_s for the whole answer, from the request sent
    Mutant("no request deadline: each read waits on its own (#35 served)", OA,
           "self._deadline.at = time.monotonic() + self.s.request_timeout_s",
           "self._deadline.at = None", DEADLINE),
    Mutant("a read waits its whole timeout past the request's deadline (#35 served)", OA,
           _READ, "return bytes(read(max_bytes, timeout))", DEADLINE),
    Mutant("a read timing out at the deadline does not name it (#35 served)", OA,
           "            if time.monotonic() >= at:\n                raise late() from None\n",
           "", DEADLINE),
    Mutant("a read timeout recorded as a protocol error (#35 served)", OA,
           "if isinstance(exc, httpx.TimeoutException):",
           "if isinstance(exc, httpx.ConnectTimeout):", DEADLINE),
    # the report's served rows
    Mutant("the report's time to first token reads decode (#35 served)", SUMMARY,
           '("time to first token", "infer_ms"),', '("time to first token", "decode_ms"),',
           REPORT),
    Mutant("the report's chunk gap p95 reads the requests' p50 (#35 served)", SUMMARY,
           '("chunk gap p95 (per request)", "itl_p95_ms"),',
           '("chunk gap p95 (per request)", "itl_p50_ms"),', REPORT),
    Mutant("the report's chunk gaps over warm-up frames too (#35 served)", SUMMARY,
           "Dist.of(data.frame(col)[measured]) for label, col in gaps",
           "Dist.of(data.frame(col)) for label, col in gaps", REPORT),
    Mutant("the report's inter-token latency over every token, not tokens - 1 (#35 served)",
           SUMMARY, 'data.frame("decode_ms") / (tokens - 1)', 'data.frame("decode_ms") / tokens',
           REPORT),
    Mutant("the report's output tokens over every frame, warm-up too (#35 served)", SUMMARY,
           'tokens = data.frame("out_tokens")[measured]', 'tokens = data.frame("out_tokens")',
           REPORT),
    Mutant("a run that did not stream reports its whole answer as TTFT (#35 served)", SUMMARY,
           ' or data.meta.setting("workload", "stream") is False:', ":", WHOLE),
    Mutant("the requests' inter-token max not loaded (#35 served)", DATA,
           '("itl_p50_ms", "itl_p95_ms", "itl_max_ms")', '("itl_p50_ms", "itl_p95_ms")',
           REPORT),
    # the realtime client's turns: from the question to the first delta and to done
    Mutant("realtime: time to first delta from response.created (#35 served)", RT,
           '"ttfd_ms": ms(self.ask_ns, self.first_ns),',
           '"ttfd_ms": ms(self.start_ns, self.first_ns),', REALTIME),
    Mutant("realtime: time to done from the first delta (#35 served)", RT,
           '"done_ms": ms(self.ask_ns, self.done_ns),',
           '"done_ms": ms(self.first_ns, self.done_ns),', REALTIME),
    Mutant("realtime: delta gaps in microseconds (#35 served)", RT,
           "self.gaps_ms.append((t - self.last_delta_ns) / 1e6)",
           "self.gaps_ms.append((t - self.last_delta_ns) / 1e3)", REALTIME),
    Mutant("realtime: delta p95 is the median (#35 served)", RT,
           '"delta_p95_ms": round(float(np.percentile(g, 95)), 3),',
           '"delta_p95_ms": round(float(np.percentile(g, 50)), 3),', REALTIME),
    Mutant("realtime: per-token time over tokens, not tokens - 1 (#35 served)", RT,
           _PER_TOKEN, "(self.last_text_ns - self.first_ns) / 1e6 / tokens", REALTIME),
    Mutant("realtime: per-token time for a one-token answer (#35 served)", RT,
           "if tokens > 1 and self.first_ns", "if tokens > 0 and self.first_ns", REALTIME),
    Mutant("realtime: per-token time to done, not the last text (#35 served)", RT,
           _PER_TOKEN, "(self.done_ns - self.first_ns) / 1e6 / (tokens - 1)", REALTIME),
    Mutant("realtime: per-token tokens from the deltas though usage says (#35 served)", RT,
           "tokens = self.tokens if self.tokens is not None else self.text_deltas",
           "tokens = self.text_deltas", REALTIME),
    Mutant("realtime: a done with no delta is an answer (#35 served)", RT,
           "elif turn.first_ns is None:", "elif False:", REALTIME),
    Mutant("realtime: a failed response is an answer (#35 served)", RT,
           "if p.failed:\n            turn.error", "if False:\n            turn.error",
           REALTIME),
    Mutant("realtime: a chunk just as the buffer ends is an underrun (#35 served)", RT,
           "if t > self.play_end_ns:", "if t >= self.play_end_ns:", REALTIME),
    Mutant("realtime: after an underrun the buffer does not restart at the chunk (#35 served)",
           RT, "            self.play_end_ns = t + dur_ns\n",
           "            self.play_end_ns += dur_ns\n", REALTIME),
    Mutant("realtime: audio seconds from bytes, not 16-bit samples (#35 served)", RT,
           "audio_s = self.audio_bytes / 2 / self.audio_rate",
           "audio_s = self.audio_bytes / self.audio_rate", REALTIME),
    Mutant("realtime: real-time factor over the wall time from the question (#35 served)", RT,
           "first = self.audio_first_ns", "first = self.ask_ns", REALTIME),
    Mutant("realtime: real-time factor to the last delta, not done (#35 served)", RT,
           "end = self.done_ns if self.done_ns is not None else self.last_delta_ns",
           "end = self.last_delta_ns", REALTIME),
)  # fmt: skip
