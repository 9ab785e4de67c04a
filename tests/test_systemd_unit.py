"""The systemd template unit: verified by ``systemd-analyze verify`` and pinned setting by
setting (readiness, watchdog, no restart, clean stop, GPU-tolerant hardening)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import SYNTH_CLI, run_cli, soakd_cmd

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "soakd@.service"
INSTALLED_BIN = "/usr/local/bin/soakd"
NVIDIA_CLASSES = (
    "char-nvidia",
    "char-nvidia-frontend",
    "char-nvidia-uvm",
    "char-nvidiactl",
    "char-nvidia-caps",
)

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (apt-get install systemd; .ci/run installs it)",
)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Unit file -> {section: {key: [values in order]}}; comments and blanks ignored."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def _one(unit: dict[str, dict[str, list[str]]], key: str, section: str = "Service") -> str:
    values = unit[section].get(key)
    assert values, f"{key}= missing from [{section}]"
    return values[-1]


def test_service_type_readiness_and_state(unit: dict[str, dict[str, list[str]]]) -> None:
    """Type=notify with the run database under StateDirectory=soakd."""
    assert _one(unit, "Type") == "notify"
    assert _one(unit, "NotifyAccess") == "main"
    assert _one(unit, "StateDirectory") == "soakd"


def test_state_directory_is_readable_by_group_soakd(unit: dict[str, dict[str, list[str]]]) -> None:
    """Static User=/Group=soakd, folder 0750 and files 0640 (UMask=0027): operators in group
    soakd read the databases; no DynamicUser= (it hides them under /var/lib/private, 0700)."""
    assert (_one(unit, "User"), _one(unit, "Group")) == ("soakd", "soakd")
    assert _one(unit, "StateDirectoryMode") == "0750"
    assert _one(unit, "UMask") == "0027"
    assert "DynamicUser" not in unit["Service"]


def test_instance_selects_config_and_binary(unit: dict[str, dict[str, list[str]]]) -> None:
    """soakd@NAME runs `soakd run /etc/soakd/NAME.toml` (path overridable by environment)."""
    assert "SOAKD_CONFIG=/etc/soakd/%i.toml" in unit["Service"]["Environment"]
    assert "SOAKD_DB=/var/lib/soakd/%i.db" in unit["Service"]["Environment"]
    assert "-/etc/soakd/%i.env" in unit["Service"]["EnvironmentFile"]
    assert _one(unit, "ExecStart").startswith(f"{INSTALLED_BIN} run ${{SOAKD_CONFIG}} ")


def test_config_and_environment_files_live_in_install_sh_confdir(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    """SOAKD_CONFIG and both EnvironmentFile= lines name one folder, the CONFDIR default of
    systemd/install.sh (which rewrites that folder when given --confdir)."""
    script = (UNIT.parent / "install.sh").read_text()
    confdir = script.split("CONFDIR=${CONFDIR:-", 1)[1].split("}", 1)[0]
    config = [e for e in unit["Service"]["Environment"] if e.startswith("SOAKD_CONFIG=")]
    paths = [config[0].removeprefix("SOAKD_CONFIG="), *unit["Service"]["EnvironmentFile"]]
    assert {os.path.dirname(p.removeprefix("-")) for p in paths} == {confdir}, paths


def test_watchdog_timeouts_and_no_restart(unit: dict[str, dict[str, list[str]]]) -> None:
    """Watchdog on, long start timeout, runtime cap, no restart, SIGTERM with a stop timeout."""
    assert _one(unit, "WatchdogSec") == "3min"
    assert _one(unit, "TimeoutStartSec") == "10min"
    assert _one(unit, "RuntimeMaxSec") == "2h"
    assert _one(unit, "Restart") == "no"
    assert _one(unit, "KillSignal") == "SIGTERM"
    assert _one(unit, "TimeoutStopSec") == "2min"


def test_gpu_devices_allowed_and_jit_friendly(unit: dict[str, dict[str, list[str]]]) -> None:
    """All five NVIDIA device classes are allowed; nothing that breaks CUDA or PyTorch's JIT."""
    allowed = {v.split()[0]: v.split()[1] for v in unit["Service"]["DeviceAllow"]}
    for cls in NVIDIA_CLASSES:
        assert allowed.get(cls) == "rw", cls
    assert "MemoryDenyWriteExecute" not in unit["Service"]
    assert "PrivateDevices" not in unit["Service"]


def _verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=false", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _instance_copy(tmp_path: Path, text: str) -> Path:
    """The unit as instance ``soakd@ci.service``, its ExecStart pointing at a binary that
    exists here: verify checks that the command is executable, and /usr/local/bin/soakd is
    the install path on a host, not in this checkout. The venv's soakd is used when present
    (else /bin/true); every other line is the shipped unit unchanged."""
    venv_bin = Path(sys.executable).parent / "soakd"
    exe = str(venv_bin) if venv_bin.exists() else "/bin/true"
    out = tmp_path / "soakd@ci.service"
    out.write_text(text.replace(f"ExecStart={INSTALLED_BIN} ", f"ExecStart={exe} ", 1))
    return out


@pytest.mark.systemd
@needs_analyze
def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the unit with no warning at all."""
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED_BIN} " in text
    proc = _verify(_instance_copy(tmp_path, text))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


@pytest.mark.systemd
@needs_analyze
def test_systemd_analyze_verify_reports_a_typo(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is reported on stderr (verify still exits 0)."""
    text = UNIT.read_text().replace("WatchdogSec=", "WatchdgSec=", 1)
    proc = _verify(_instance_copy(tmp_path, text))
    assert "WatchdgSec" in proc.stderr


# --- An operator's `soakd gate` on the unit's state directory. The operator is this process
# without the capabilities that let root ignore file modes (setpriv drops them), so the
# modes below decide, as they do for a non-root user; the files are owned by another uid.
SERVICE_UID, OPERATORS_GID = 65534, 4242
NO_DAC = "--bounding-set=-dac_override,-dac_read_search,-fowner,-chown"
needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to play the service user and an operator",
)


@pytest.fixture(scope="module")
def soak_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run database: one short synthetic soak that passes."""
    db = tmp_path_factory.mktemp("soak") / "demo.db"
    proc = run_cli(
        "run", "--db", str(db), "--duration", "5", "--fps", "20", "--no-live", *SYNTH_CLI
    )
    assert proc.returncode == 0, proc.stderr
    return db


def _state_dir(soak_db: Path, dir_mode: int, file_mode: int) -> Path:
    """/var/lib/soakd as the unit leaves it: owned by the service user, group soakd."""
    state = Path(tempfile.mkdtemp(prefix="soakd-state-", dir="/tmp"))
    os.chmod(state, 0o755)  # mkdtemp makes it 0700
    shutil.copy(soak_db, state / "demo.db")
    for p, mode in ((state / "demo.db", file_mode), (state, dir_mode)):
        os.chown(p, SERVICE_UID, OPERATORS_GID)
        os.chmod(p, mode)
    return state


def _gate_as_operator(db: Path, *groups: int) -> subprocess.CompletedProcess[str]:
    group_flag = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return subprocess.run(
        ["setpriv", NO_DAC, group_flag, *soakd_cmd("gate", "--latest", "--db", str(db))],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )


@needs_setpriv
def test_operator_in_group_soakd_gates_the_unit_database_read_only(soak_db: Path) -> None:
    """StateDirectoryMode=0750 + UMask=0027: an operator in group soakd gets the verdict
    (exit 0) from the 0640 database in the 0750 folder, and writes nothing there."""
    state = _state_dir(soak_db, 0o750, 0o640)
    before = sorted(p.name for p in state.iterdir())
    proc = _gate_as_operator(state / "demo.db", OPERATORS_GID)
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout
    assert sorted(p.name for p in state.iterdir()) == before


@needs_setpriv
def test_gate_reads_a_0444_database_in_a_0555_folder(soak_db: Path) -> None:
    """Nothing writable at all (no -shm can be made): gate still judges, exit 0."""
    state = _state_dir(soak_db, 0o555, 0o444)
    proc = _gate_as_operator(state / "demo.db")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


@needs_setpriv
def test_operator_outside_group_soakd_gets_one_line_naming_path_and_fix(soak_db: Path) -> None:
    """A folder this user may not enter: exit 2, one line with the path and the usermod fix."""
    state = _state_dir(soak_db, 0o750, 0o640)
    proc = _gate_as_operator(state / "demo.db")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(state / "demo.db") in lines[0]
    assert "usermod -aG soakd" in lines[0]


@needs_setpriv
def test_operator_gates_a_soak_still_running_read_only(tmp_path: Path) -> None:
    """While the service writes (live -wal and -shm, 0640, in the 0750 folder), the
    operator's read-only gate sees the run as running: INVALID, exit 3, no traceback."""
    state = Path(tempfile.mkdtemp(prefix="soakd-state-", dir="/tmp"))
    db = state / "demo.db"
    cmd = soakd_cmd("run", "--db", str(db), "--duration", "8", "--fps", "20", "--no-live")
    soak = subprocess.Popen([*cmd, *SYNTH_CLI], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            if db.with_name("demo.db-wal").exists() or soak.poll() is not None:
                break
            time.sleep(0.05)
        for p in (state, *state.iterdir()):
            os.chown(p, SERVICE_UID, OPERATORS_GID)
            os.chmod(p, 0o750 if p == state else 0o640)
        proc = _gate_as_operator(db, OPERATORS_GID)
    finally:
        soak.wait(timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "running" in proc.stdout
    assert "Traceback" not in proc.stderr
