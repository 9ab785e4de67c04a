"""The unit under a real systemd: a minimal Debian (debootstrap, built once and cached)
booted with systemd-nspawn runs systemd/install.sh, `systemctl start --wait soakd@demo`
on a short synthetic soak, then `soakd gate` as an operator in group soakd and as one
outside it. This checkout and its Python are bind-mounted read-only; the booted root is
an overlay (``--volatile=overlay``), so every run starts from the same image."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# where this checkout and its venv appear inside the container: never under /tmp, /home or
# /root, which the unit's sandbox (PrivateTmp, ProtectHome) hides from the service
SRC_IN, VENV_IN = Path("/srv/soakd-src"), Path("/srv/soakd-venv")
PYTHON_IN = VENV_IN / "bin" / Path(sys.executable).name
ROOT = Path(os.environ.get("SOAKD_NSPAWN_ROOT", "/var/tmp/soakd-nspawn-root"))
READY = ROOT / ".soakd-nspawn-ready"
BUILD_LOCK = ROOT.with_name(ROOT.name + ".build-lock")
#: the inside script's last line before poweroff: every result file is written
DONE = "done"
BOOT_DEADLINE_S = 240.0  # boot + every check inside; about 30 s on an idle 2-core machine
# systemd to boot; the shared libraries this project's Python, sqlite3 and torch load
PACKAGES = "systemd,systemd-sysv,dbus,passwd,libsqlite3-0,libncursesw6,libreadline8,libnsl2,libtirpc3,libgssapi-krb5-2"  # noqa: E501
TOOLS = ("systemd-nspawn", "debootstrap", "script")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.systemd,
    pytest.mark.timeout(900),  # the first run builds the image (debootstrap: minutes)
    pytest.mark.skipif(os.geteuid() != 0, reason="systemd-nspawn and debootstrap need root"),
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in TOOLS),
        reason="needs systemd-nspawn, debootstrap and script (bash .ci/setup --test installs them)",
    ),
]

TEST_UNIT = """[Unit]
Description=soakd nspawn test
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/out/inside.sh
[Install]
WantedBy=multi-user.target
"""

DEMO_TOML = """[run]
duration = 3
fps = 20
warmup_s = 0.5
log_every = 0
[source]
width = 64
height = 48
[criteria]
min_duration_s = 1
min_frames = 5
floor_window_s = 0.2
# 3 s cannot judge memory growth (conftest.SYNTH_CLI says why): on a busy machine a soak
# this short read "still settling" (INVALID, exit 3) on soakd's own first hand-on of frames
max_memory_growth_mb_per_min = 1000
horizon = "1h"
[workload]
kind = "synthetic"
"""

RUN_ID_PY = (
    "import sqlite3; db = sqlite3.connect('file:/var/lib/soakd/warn.db?mode=ro', uri=True); "
    "print(db.execute('select id from runs').fetchone()[0])"
)

INSIDE = f"""#!/bin/bash
exec > /out/inside.log 2>&1
set -x
{SRC_IN}/systemd/install.sh --python {PYTHON_IN} --reuse-site-packages; echo $? > /out/install.rc
cat > /etc/soakd/demo.toml <<'EOF'
{DEMO_TOML}EOF
systemctl start --wait soakd@demo; echo $? > /out/start.rc
systemctl show -p Result -p ExecMainStatus soakd@demo > /out/show.txt
stat -c '%a %U %G' /var/lib/soakd /var/lib/soakd/demo.db > /out/modes.txt
useradd -m -G soakd op; useradd -m outsider
runuser -u op -- soakd gate --latest --db /var/lib/soakd/demo.db > /out/gate.txt 2>&1
echo $? > /out/gate.rc
runuser -u outsider -- soakd gate --latest --db /var/lib/soakd/demo.db > /out/outsider.txt 2>&1
echo $? > /out/outsider.rc
sed 's/^duration = 3$/duration = 120/' /etc/soakd/demo.toml > /etc/soakd/long.toml
systemctl start soakd@long; echo $? > /out/long_start.rc
sleep 3
systemctl show -p ActiveState -p StatusText soakd@long > /out/long_status.txt
systemctl stop soakd@long
systemctl show -p Result -p ExecMainStatus soakd@long > /out/long_stop.txt
printf '%s\nerror_every = 10\n' "$(cat /etc/soakd/demo.toml)" > /etc/soakd/warn.toml
systemctl start --wait soakd@warn; echo $? > /out/warn.rc
systemctl show -p Result -p ExecMainStatus soakd@warn > /out/warn_show.txt
journalctl -u soakd@warn -p warning -o cat --no-pager > /out/warn_journal.txt
/opt/soakd/venv/bin/python -c "{RUN_ID_PY}" > /out/warn_run_id.txt
journalctl SOAKD_RUN_ID=$(cat /out/warn_run_id.txt) -o json --no-pager > /out/warn_run.json
sed 's/^duration = 3$/duration = 60/' /etc/soakd/demo.toml > /etc/soakd/stall.toml
printf '%s\nstall_after_s = 2\n' "$(cat /etc/soakd/stall.toml)" > /etc/soakd/stall.toml.new
mv /etc/soakd/stall.toml.new /etc/soakd/stall.toml
mkdir -p /etc/systemd/system/soakd@stall.service.d
printf '[Service]\nWatchdogSec=2s\n' > /etc/systemd/system/soakd@stall.service.d/watchdog.conf
systemctl daemon-reload
systemctl start --wait soakd@stall; echo $? > /out/stall.rc
systemctl show -p Result soakd@stall > /out/stall_show.txt
touch /out/{DONE}
systemctl poweroff
"""


@contextmanager
def _build_lock() -> Iterator[None]:
    """One image build at a time across pytest-xdist workers (and concurrent test runs)."""
    BUILD_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with BUILD_LOCK.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _build_root() -> None:
    """debootstrap minbase bookworm + the test unit, once; needs the Debian mirror."""
    tmp = ROOT.with_name(ROOT.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(tmp)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.skip(f"debootstrap failed (no Debian mirror?): {proc.stderr.strip()[-300:]}")
    (tmp / "root").chmod(0o755)  # the service user runs this project's Python under /root
    unit = tmp / "etc/systemd/system/soakd-nspawn-test.service"
    unit.write_text(TEST_UNIT)
    wants = tmp / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(exist_ok=True)
    (wants / unit.name).symlink_to(f"/etc/systemd/system/{unit.name}")
    shutil.rmtree(ROOT, ignore_errors=True)
    tmp.rename(ROOT)
    READY.touch()


def _binds() -> list[str]:
    """The checkout and its venv at fixed paths, the base Python where the venv expects it."""
    return [
        f"--bind-ro={REPO}:{SRC_IN}",
        f"--bind-ro={Path(sys.prefix).resolve()}:{VENV_IN}",
        f"--bind-ro={Path(sys.base_prefix).resolve()}",
    ]


def _boot(out: Path) -> tuple[str, str]:
    """Boot the image, wait for the inside script's DONE marker (never for the container's
    own shutdown), then end the container's whole process group. Returns (how it ended,
    the console's tail)."""
    nspawn = [
        "systemd-nspawn", "-q", "--register=no", "--keep-unit", "--volatile=overlay",
        "-D", str(ROOT), *_binds(), f"--bind={out}:/out", "-b",
    ]  # fmt: skip
    console = out / "console.log"
    # a pseudo-terminal for the container's console (script): with a pipe it stays silent
    with console.open("wb") as log:
        proc = subprocess.Popen(
            ["script", "-qfec", " ".join(nspawn), "/dev/null"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        ended = _wait_done(proc, out / DONE, BOOT_DEADLINE_S)
        _end_group(proc)
    return ended, console.read_text(errors="replace")[-3000:]


def _wait_done(proc: subprocess.Popen[bytes], done: Path, deadline_s: float) -> str:
    t_end = time.monotonic() + deadline_s
    while time.monotonic() < t_end:
        if done.exists():
            return "done"
        if proc.poll() is not None:
            return "done" if done.exists() else f"container exited early (rc {proc.returncode})"
        time.sleep(0.5)
    return f"no result after {deadline_s:.0f} s"


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM asks nspawn to power the container off; SIGKILL if that takes over 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else f"({path.name}: none)"


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Boot the image once; the test unit inside writes its results to the returned folder."""
    with _build_lock():
        if not READY.exists():
            _build_root()
    out = tmp_path_factory.mktemp("nspawn-out")
    (out / "inside.sh").write_text(INSIDE)
    (out / "inside.sh").chmod(0o755)
    ended, console = _boot(out)
    assert ended == "done", (
        f"{ended}\n--- inside.log\n{_tail(out / 'inside.log')}\n--- console\n{console}"
    )
    return out


def _read(out: Path, name: str) -> str:
    return (out / name).read_text().strip()


def test_install_script_succeeds_under_systemd(booted: Path) -> None:
    """install.sh exits 0 on a booted Debian (venv, link, unit, user soakd)."""
    assert _read(booted, "install.rc") == "0", _read(booted, "inside.log")


def test_unit_runs_a_passing_soak_to_success(booted: Path) -> None:
    """`systemctl start --wait soakd@demo` returns 0: Type=notify, sandbox and exit code 0."""
    assert _read(booted, "start.rc") == "0", _read(booted, "inside.log")
    assert _read(booted, "show.txt").splitlines() == ["Result=success", "ExecMainStatus=0"]


def test_state_directory_is_group_soakd_readable_only(booted: Path) -> None:
    """StateDirectoryMode=0750 and UMask=0027 leave the folder 0750 and the database 0640."""
    assert _read(booted, "modes.txt").splitlines() == ["750 soakd soakd", "640 soakd soakd"]


def test_operator_in_group_soakd_gates_without_sudo(booted: Path) -> None:
    """The documented `soakd gate --latest --db /var/lib/soakd/demo.db` prints PASS, exit 0."""
    assert _read(booted, "gate.rc") == "0", _read(booted, "gate.txt")
    assert _read(booted, "gate.txt").startswith("PASS")


def test_user_outside_group_soakd_gets_the_one_line_fix(booted: Path) -> None:
    """Not in group soakd: exit 2 and one line that names the usermod fix."""
    assert _read(booted, "outsider.rc") == "2"
    assert "usermod -aG soakd" in _read(booted, "outsider.txt")
    assert len(_read(booted, "outsider.txt").splitlines()) == 1


def test_start_returns_after_readiness_and_status_shows_progress(booted: Path) -> None:
    """Type=notify: `systemctl start` returns once READY=1 came (active), STATUS= names fps."""
    assert _read(booted, "long_start.rc") == "0", _read(booted, "inside.log")
    status = _read(booted, "long_status.txt")
    assert "ActiveState=active" in status and "fps" in status, status


def test_systemctl_stop_is_invalid_exit_3_and_a_failed_unit(booted: Path) -> None:
    """SIGTERM from `systemctl stop`: the soak is judged INVALID, exit 3, Result=exit-code."""
    assert _read(booted, "long_stop.txt").splitlines() == ["Result=exit-code", "ExecMainStatus=3"]


def test_a_failing_soak_fails_the_unit_with_exit_1(booted: Path) -> None:
    """Planted frame errors: FAIL, exit 1, the unit left failed (Result=exit-code)."""
    assert _read(booted, "warn.rc") != "0"
    assert _read(booted, "warn_show.txt").splitlines() == ["Result=exit-code", "ExecMainStatus=1"]


def test_warnings_reach_the_journal_at_warning_priority(booted: Path) -> None:
    """`journalctl -p warning -u soakd@warn` shows soakd's warnings (the <4> prefix)."""
    assert "warning" in _read(booted, "warn_journal.txt"), _read(booted, "inside.log")


def test_journal_finds_the_run_by_soakd_run_id(booted: Path) -> None:
    """`journalctl SOAKD_RUN_ID=<id>` returns the run's native entries with its verdict."""
    entries = [json.loads(line) for line in _read(booted, "warn_run.json").splitlines()]
    assert entries, _read(booted, "inside.log")
    assert {e.get("SOAKD_VERDICT") for e in entries} >= {"FAIL"}


def test_watchdog_ends_a_stalled_soak(booted: Path) -> None:
    """A planted stall stops WATCHDOG=1; with WatchdogSec=2s systemd ends it: Result=watchdog."""
    assert _read(booted, "stall.rc") != "0"
    assert _read(booted, "stall_show.txt") == "Result=watchdog", _read(booted, "inside.log")
