"""Served models: the per-request cost of soakd's ``openai`` workload against a bare httpx loop.

Target (issue 21): the harness's cost per request (JPEG encode + base64 + JSON body + the
client and its SSE parsing) is small beside any real model's time to first token: at most
2 ms added to the bare loop's median at 320x240.

Both arms talk to the same server in the same run: tests/openai_test_server.py (a test
fixture, not a model) with no planted delay (``--ttft-ms 0 --itl-ms 0``), 8 tokens a
request, streamed. The baseline is the loop anyone would write: one ``httpx.Client``, a body
encoded once beforehand, ``client.stream("POST", ...)`` read line by line to
``data: [DONE]``, where OpenAI clients stop (reading on to the chunked body's end waits
~40 ms for the server's last empty chunk on loopback: delayed ACK, not the model). soakd's
arm calls the workload's own stages (``preprocess`` -> ``infer`` -> ``decode``) on captured
frames, exactly as the staged driver does. The arms alternate in blocks, so both see the
same machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import BenchResult, Target, bench_main, pct

TOKENS = 8
WIDTH, HEIGHT = 320, 240


def _frames(n: int) -> list:
    from soakd.records import Frame

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (HEIGHT, WIDTH, 3), dtype=np.uint8) for _ in range(4)]
    return [Frame(i, 0, 0, 0, images[i % 4]) for i in range(n)]


def _bare(client, url: str, body: bytes, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with client.stream(
            "POST", url, content=body, headers={"Content-Type": "application/json"}
        ) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":  # the answer is whole (as OpenAI clients stop)
                    break
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _soakd(wl, frames: list) -> tuple[list[float], list[float]]:
    total, encode = [], []
    for f in frames:
        t0 = time.perf_counter()
        inputs = wl.preprocess(f)
        t1 = time.perf_counter()
        out = wl.decode(wl.infer(inputs))
        total.append((time.perf_counter() - t0) * 1e6)
        encode.append((t1 - t0) * 1e6)
        assert out.tokens == TOKENS, out
    return total, encode


def run(quick: bool, workdir: Path) -> BenchResult:
    import httpx

    from soakd.config import load_settings
    from soakd.workloads.base import WorkloadContext
    from soakd.workloads.openai import OpenAIStaged
    from tests.openai_test_server import start_server

    del workdir
    blocks, per = (3, 10) if quick else (10, 100)
    res = BenchResult(
        "openai_client", quick,
        params={"blocks": blocks, "requests_per_block": per, "tokens": TOKENS,
                "frame": f"{WIDTH}x{HEIGHT}", "server": "tests/openai_test_server.py"},
    )  # fmt: skip
    with start_server("--ttft-ms", "0", "--itl-ms", "0") as srv:
        over = ["workload.kind=openai", f"workload.base_url={srv.base_url!r}"]
        s = load_settings(overrides=[*over, f"workload.max_tokens={TOKENS}"])
        wl = OpenAIStaged(s.workload, WorkloadContext())  # type: ignore[arg-type]
        wl.setup()
        frames = _frames(per)
        body = wl.preprocess(frames[0])[1]
        url = f"{srv.base_url}/chat/completions"
        bare: list[float] = []
        soak: list[float] = []
        enc: list[float] = []
        with httpx.Client(timeout=30) as client:
            _bare(client, url, body, 5)  # warm both connections
            _soakd(wl, frames[:5])
            for _ in range(blocks):
                bare += _bare(client, url, body, per)
                t, e = _soakd(wl, frames)
                soak += t
                enc += e
        wl.close()
    b50, s50 = pct(bare, 50), pct(soak, 50)
    res.metrics.update(
        bare_us_p50=b50, bare_us_p95=pct(bare, 95), soakd_us_p50=s50,
        soakd_us_p95=pct(soak, 95), encode_us_p50=pct(enc, 50), added_us_p50=s50 - b50,
        ratio_p50=s50 / b50 if b50 else None,
    )  # fmt: skip
    res.rows = [
        {"arm": "bare httpx", "p50_us": b50, "p95_us": pct(bare, 95), "n": len(bare)},
        {"arm": "soakd openai", "p50_us": s50, "p95_us": pct(soak, 95), "n": len(soak)},
        {"arm": "  of which encode", "p50_us": pct(enc, 50), "p95_us": pct(enc, 95), "n": len(enc)},
    ]
    note = "soakd's stages minus the bare loop, same server, same run"
    res.targets.append(
        Target("added per-request cost (p50)", (s50 - b50) / 1e3, 2.0, "<=", "ms", note)
    )
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
