"""The systemd template unit: verified by ``systemd-analyze verify`` and pinned setting by
setting (readiness, watchdog, no restart, clean stop, GPU-tolerant hardening)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_instance_selects_config_and_binary(unit: dict[str, dict[str, list[str]]]) -> None:
    """soakd@NAME runs `soakd run /etc/soakd/NAME.toml` (path overridable by environment)."""
    assert "SOAKD_CONFIG=/etc/soakd/%i.toml" in unit["Service"]["Environment"]
    assert "SOAKD_DB=/var/lib/soakd/%i.db" in unit["Service"]["Environment"]
    assert "-/etc/soakd/%i.env" in unit["Service"]["EnvironmentFile"]
    assert _one(unit, "ExecStart").startswith(f"{INSTALLED_BIN} run ${{SOAKD_CONFIG}} ")


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
