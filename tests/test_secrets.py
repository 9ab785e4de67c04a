"""Secrets never leave soakd: an API key that a served model echoes back in its error bodies,
and a password in ``workload.base_url``, soaked through the real CLI against
tests/openai_test_server.py (a test fixture, not a model; ``--echo-auth`` makes its planted
failures say back the credential it was sent, also base64- and URL-encoded). Every artefact
is then grepped for every form of both: the database file, the JSON logs, the journal and
sd_notify datagrams, the Prometheus scrapes, every report format, ``show``, ``gate``,
``export``, ``runs``, a merged database, and the CLI's error line."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from soakd.config import load_settings
from soakd.store import db as store
from tests.conftest import REPO, error_lines, make_run, run_cli, soakd_cmd
from tests.openai_test_server import ServerProcess, start_server

pytestmark = pytest.mark.slow

KEY = "sk-PLANTED+key/4242="  # changes under base64 and URL-encoding
VAR = "SOAKD_PLANTED_KEY_VAR"  # workload.api_key_env: the name is not stored either
USER, PASSWORD = "bob", "pwPLANTED7731"


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


#: every form a secret may take, by what it is
FORMS = {
    "key": KEY,
    "key base64": _b64(KEY).rstrip("="),
    "key url-encoded": quote(KEY, safe=""),
    "key url-encoded (+)": quote_plus(KEY),
    "password": PASSWORD,
    "password base64": _b64(PASSWORD).rstrip("="),
    "user:password base64 (Basic)": _b64(f"{USER}:{PASSWORD}").rstrip("="),
    "api_key_env name": VAR,
}


def leaks(blob: bytes | str) -> list[str]:
    """The secret forms found in ``blob``."""
    data = blob.encode() if isinstance(blob, str) else blob
    return [name for name, form in FORMS.items() if form.encode() in data]


@dataclass
class Sockets:
    """The journal and sd_notify datagram sockets a soak writes to, read as they come."""

    dir: Path
    received: list[bytes] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def env(self) -> dict[str, str]:
        return {"SOAKD_JOURNAL_SOCKET": str(self.dir / "j"), "NOTIFY_SOCKET": str(self.dir / "n")}

    def read(self, sock: socket.socket) -> None:
        sock.settimeout(0.1)
        while not self.done.is_set():
            with contextlib.suppress(TimeoutError):
                self.received.append(sock.recv(65536))


@pytest.fixture
def sockets() -> Iterator[Sockets]:
    s = Sockets(Path(tempfile.mkdtemp(prefix="sk", dir="/tmp")))  # sun_path: 108 bytes
    socks = []
    for name in ("j", "n"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(s.dir / name))
        socks.append(sock)
        threading.Thread(target=s.read, args=(sock,), daemon=True).start()
    yield s
    s.done.set()
    time.sleep(0.2)
    for sock in socks:
        sock.close()
    shutil.rmtree(s.dir, ignore_errors=True)


def soak(db: Path, base_url: str, env: dict[str, str], *args: str) -> tuple[str, list[bytes]]:
    """``soakd run`` (JSON logs, a Prometheus exporter on a free port) for 2 s: its stderr
    and every /metrics page scraped while it ran and lingered."""
    cmd = soakd_cmd(
        "run", "--no-live", "--log-json", "--db", str(db), "--duration", "2", "--fps", "5",
        "--metrics-addr", "127.0.0.1:0", "--set", "service.metrics_linger_s=5",
        "--set", "workload.kind=openai", "--set", f"workload.base_url={base_url!r}",
        "--set", "run.warmup_s=0.2", "--set", "run.log_every=1",
        "--set", "source.width=64", "--set", "source.height=48",
        "--set", "criteria.min_duration_s=1", "--set", "criteria.min_frames=3", *args,
    )  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, b"")))
    reader.start()
    pages: list[bytes] = []
    while proc.poll() is None:
        url = next(
            (m for ln in list(lines) for m in re.findall(rb"http://[\d.:]+/metrics", ln)), None
        )
        if url is not None:
            with contextlib.suppress(OSError):
                pages.append(urllib.request.urlopen(url.decode(), timeout=2).read())
        time.sleep(0.3)
    proc.communicate(timeout=60)
    reader.join(10)
    stderr = b"".join(lines).decode(errors="replace")
    assert proc.returncode in (1, 3), stderr[-3000:]  # judged (the errors FAIL it)
    assert pages, "no /metrics page was scraped"
    return stderr, pages


#: runs soakd's CLI (``soakd.cli.main``) once per argv in one process: [code, out, err] each
DRIVER = """
import contextlib, io, json, sys
from soakd.cli import main
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    done.append([code, out.getvalue(), err.getvalue()])
sys.stdout.write(json.dumps(done))
"""


def run_cli_all(
    commands: list[tuple[str, ...]], db: Path, env: dict[str, str]
) -> list[tuple[int, str, str]]:
    argv = json.dumps([[*c, "--db", str(db)] for c in commands])
    p = subprocess.run(
        [sys.executable, "-c", DRIVER, argv], capture_output=True, text=True, cwd=REPO, env=env,
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return [tuple(d) for d in json.loads(p.stdout)]


@pytest.fixture
def echoing() -> Iterator[ServerProcess]:
    srv = start_server("--fail-every", "2", "--echo-auth")
    yield srv
    srv.stop()


def test_no_secret_reaches_the_database_logs_reports_metrics_or_exports(
    tmp_path: Path, echoing: ServerProcess, sockets: Sockets, subprocess_env: dict[str, str]
) -> None:
    """A key echoed in error bodies and a password in base_url: found in no artefact, in
    none of their forms (raw, base64, URL-encoded, Basic), nor the api_key_env name."""
    db = tmp_path / "s.db"
    env = {**subprocess_env, **sockets.env(), VAR: KEY}
    with_key = f"--set=workload.api_key_env={VAR}"
    userinfo = echoing.base_url.replace("http://", f"http://{USER}:{PASSWORD}@")
    artefacts: dict[str, bytes | str] = {}
    artefacts["logs (key)"], pages = soak(db, echoing.base_url, env, with_key)
    artefacts["logs (password)"], pages2 = soak(db, userinfo, env)
    artefacts |= {f"/metrics {i}": p for i, p in enumerate(pages + pages2)}
    time.sleep(0.3)
    artefacts["journal and sd_notify"] = b"\n".join(sockets.received)
    assert b"SOAKD_RUN_ID" in artefacts["journal and sd_notify"]  # the journal was written
    assert b"STATUS=" in artefacts["journal and sd_notify"]  # so was sd_notify

    with sqlite3.connect(db) as conn:
        run_ids = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY started_unix")]
    assert len(run_ids) == 2
    out = tmp_path / "out"
    out.mkdir()
    commands = [("runs",), ("runs", "-f", "json")]
    for i, run in enumerate(run_ids):
        commands += [
            *[("report", run, "-f", f, "-o", str(out / f"r{i}.{f}")) for f in ("md", "json",
              "junit", "html")],
            ("show", run), ("show", run, "-f", "json"), ("gate", run), ("gate", run, "-f", "json"),
            *[("export", run, "-f", f, "-o", str(out / f"e{i}.{f}")) for f in ("csv", "jsonl",
              "parquet")],
        ]  # fmt: skip
    # every command in one fresh process (one start-up, not thirty): it never saw the key
    driver = run_cli_all(commands, db, subprocess_env)
    merged = tmp_path / "merged.db"
    assert run_cli("merge", str(merged), str(db), env=subprocess_env).returncode == 0
    for cmd, (code, stdout, stderr) in zip(commands, driver, strict=True):
        assert code in (0, 1, 3), (cmd, stderr[-2000:])
        artefacts[" ".join(cmd[:4])] = stdout + stderr
    for f in out.iterdir():
        artefacts[f.name] = f.read_bytes()
    for f in (db, merged):
        for part in tmp_path.glob(f.name + "*"):  # the database and any -wal beside it
            artefacts[part.name] = part.read_bytes()
    assert "config" in json.loads(Path(out / "r0.json").read_text())  # the config is reported

    found = {name: leaks(blob) for name, blob in artefacts.items() if leaks(blob)}
    assert not found, "secrets found in:\n" + "\n".join(f"{k}: {v}" for k, v in found.items())

    # the planted secrets did come back, masked: the fixture echoed them into error rows
    with sqlite3.connect(db) as conn:
        echoed = [r[0] for r in conn.execute("SELECT error FROM frames WHERE error IS NOT NULL")]
    assert sum("you sent Authorization: ***" in e for e in echoed) >= 2, echoed[:3]
    assert any("base64 ***, url-encoded ***" in e for e in echoed), echoed[:3]


def test_a_url_password_never_reaches_the_error_line_of_a_refused_run(
    tmp_path: Path, echoing: ServerProcess, subprocess_env: dict[str, str]
) -> None:
    """A base_url with a password whose API root is wrong: exit 2, one line naming the URL
    with its password masked."""
    bad = echoing.root_url.replace("http://", f"http://{USER}:{PASSWORD}@") + "/nope/v1"
    p = run_cli(
        "run", "--no-live", "--db", str(tmp_path / "x.db"), "--set", "workload.kind=openai",
        "--set", f"workload.base_url={bad!r}", env=subprocess_env,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr[-2000:]
    (line,) = error_lines(p.stderr)
    assert f"http://{USER}:***@127.0.0.1:{echoing.port}/nope/v1/models: HTTP 404" in line
    assert not leaks(p.stderr + p.stdout)


def test_the_key_s_variable_name_is_not_in_the_stored_config(db_path: Path) -> None:
    """runs.config as stored keeps no api_key_env (describe() drops it too) and masks a URL
    password, while the run's config hash is that of the settings."""
    s = load_settings(
        overrides=[
            "workload.kind=openai",
            f"workload.base_url='http://{USER}:{PASSWORD}@127.0.0.1:9/v1'",
            f"workload.api_key_env={VAR!r}",
        ]
    )
    conn = store.connect(db_path)
    run = make_run(conn, config=s)
    (config,) = conn.execute("SELECT config FROM runs WHERE id = ?", (run,)).fetchone()
    conn.close()
    stored = json.loads(config)
    assert "api_key_env" not in stored["workload"]
    assert stored["workload"]["base_url"] == f"http://{USER}:***@127.0.0.1:9/v1"
    assert not leaks(config)


def test_redaction_masks_each_form_once_and_leaves_plain_text_alone() -> None:
    """soakd.redact: a registered key in every form, URL userinfo, secret headers and keys
    and Bearer / Basic credentials masked; a second pass changes nothing; ordinary text
    (token counts, a URL without userinfo, an '@' in a path) stays as it was."""
    from soakd import redact

    redact.add_secret(KEY)
    redact.add_url(f"http://{USER}:{PASSWORD}@h/v1")
    dirty = (
        f"key {KEY} b64 {_b64(KEY)} url {quote(KEY, safe='')} {{'authorization': 'Bearer x1'}} "
        f"http://{USER}:{PASSWORD}@h/v1 https://tok3n@h/x X-Api-Key: k9; Cookie: a=1; b=2\n"
        f"Proxy-Authorization: Basic {_b64('u:p')} api_key=zz&n=1"
    )
    clean = redact.text(dirty)
    assert not leaks(clean)
    for gone in ("x1", "tok3n", "k9", "b=2", _b64("u:p"), "zz"):
        assert gone not in clean
    assert f"http://{USER}:***@h/v1" in clean and "https://***@h/x" in clean and "&n=1" in clean
    assert redact.text(clean) == clean
    plain = "first token 12 ms; max_tokens=16, usage_tokens: 4 http://h:8000/v1 /a@b basic setup"
    assert redact.text(plain) == plain
    stored = redact.data({"w": {"api_key_env": VAR, "api_key": True, "extra": {"token": "t0k"}}})
    assert stored == {"w": {"api_key": True, "extra": {"token": "***"}}}


def test_each_choke_point_masks_what_passes_through_it_on_its_own(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text that never went through the workload's own masking (a plugin's error, an event,
    a log line, a journal entry, a status, an error line) is masked by each choke point
    alone: the store's frame, event and run rows, the logs, the journal, sd_notify, the
    CLI's error line."""
    import io

    import structlog

    from soakd import redact
    from soakd.cli.common import error
    from soakd.observers.journal import Journal
    from soakd.observers.logs import configure_logging
    from soakd.observers.notify import Notifier
    from soakd.records import Event, FrameRecord
    from soakd.store.runs import close_run

    redact.add_secret(KEY)
    said = f"refused key {KEY} at http://{USER}:{PASSWORD}@h/v1"
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05)
    w.start()
    frame = FrameRecord(0, 0.0, 0.0, 0.0, 0.1, 0.0, 1.0, error=said)
    w.put_frames([frame, frame._replace(frame_id=1, extra={"said": said})])
    w.put(Event("error", 0.1, 0.0, said, 1, {"said": said}))
    w.close()
    close_run(conn, "r1", status="aborted", reason=said, ended_unix=1.0, duration_s=1.0,
              summary={"said": said})  # fmt: skip
    conn.commit()
    conn.close()
    assert not leaks(db_path.read_bytes())

    logs, before = io.StringIO(), structlog.get_config()
    configure_logging(json=True, stream=logs)
    try:
        structlog.get_logger("t").warning("error", message=said, data={"url": said})
    finally:
        structlog.configure(**before)
    assert "refused key ***" in logs.getvalue() and not leaks(logs.getvalue())

    sock_dir = Path(tempfile.mkdtemp(prefix="sk", dir="/tmp"))
    try:
        got = []
        for path, send in (
            (sock_dir / "j", lambda p: Journal(str(p)).send(said, 4, SOAKD_REASON=said)),
            (sock_dir / "n", lambda p: Notifier(str(p)).status(said)),
        ):
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.bind(str(path))
                assert send(path)
                got.append(sock.recv(65536))
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert all(b"refused key ***" in g and not leaks(g) for g in got), got

    error(said)
    err = capsys.readouterr().err
    assert "refused key ***" in err and not leaks(err)
