"""systemd/install.sh, run for real into temporary folders: the venv, the BINDIR link the
unit's ExecStart names, the unit (reading the CONFDIR it installs into), the example
environment and the soakd user. The venv
reuses this venv's packages (``--reuse-site-packages``: ``pip install --no-deps``, offline)
so that an install takes seconds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_systemd_unit import UNIT, needs_analyze, parse_unit

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "systemd" / "install.sh"


def install(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "--python", sys.executable, "--reuse-site-packages", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def rooted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One install with --root: every default path under a temporary folder."""
    root = tmp_path_factory.mktemp("root")
    proc = install(
        "--root", str(root), *(() if shutil.which("systemd-sysusers") else ("--no-user",))
    )
    assert proc.returncode == 0, proc.stderr
    return root


def test_root_prefixes_every_default_path(rooted: Path) -> None:
    """--root DIR puts the venv, link, unit, environment and sysusers file under DIR."""
    for rel in (
        "opt/soakd/venv/bin/soakd",
        "etc/systemd/system/soakd@.service",
        "etc/soakd/soakd.env",
        "usr/lib/sysusers.d/soakd.conf",
    ):
        assert (rooted / rel).is_file(), rel
    link = rooted / "usr/local/bin/soakd"
    assert link.is_symlink() and link.resolve() == (rooted / "opt/soakd/venv/bin/soakd").resolve()


def test_bindir_link_runs_soakd(rooted: Path) -> None:
    """BINDIR/soakd, the unit's ExecStart, runs the installed soakd."""
    proc = subprocess.run(
        [str(rooted / "usr/local/bin/soakd"), "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("soakd ")


def test_installed_soakd_is_a_copy_not_this_checkout(rooted: Path) -> None:
    """`pip install .` (not -e): the venv holds its own soakd package."""
    venv_py = rooted / "opt/soakd/venv/bin/python"
    out = subprocess.run(
        [str(venv_py), "-c", "import soakd; print(soakd.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout
    assert out.startswith(str(rooted)), out


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers missing")
def test_root_install_creates_the_soakd_user_and_group_inside_root(rooted: Path) -> None:
    """The unit's User=soakd / Group=soakd exist (in DIR/etc/passwd, not the host's)."""
    assert any(
        line.startswith("soakd:") for line in (rooted / "etc/passwd").read_text().splitlines()
    )
    assert any(
        line.startswith("soakd:") for line in (rooted / "etc/group").read_text().splitlines()
    )


@pytest.mark.systemd
@needs_analyze
def test_unit_installed_with_another_bindir_verifies_clean(tmp_path: Path) -> None:
    """Every folder overridden by environment variables: ExecStart follows BINDIR and
    `systemd-analyze verify` accepts the installed unit with no warning."""
    dirs = {k: str(tmp_path / k.lower()) for k in ("PREFIX", "BINDIR", "UNITDIR", "CONFDIR")}
    proc = install("--no-user", env={**dirs, "SYSUSERSDIR": str(tmp_path / "sysusers")})
    assert proc.returncode == 0, proc.stderr
    shipped = Path(dirs["UNITDIR"]) / "soakd@.service"
    assert f"ExecStart={dirs['BINDIR']}/soakd run " in shipped.read_text()
    instance = shutil.copy(shipped, tmp_path / "soakd@ci.service")
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=false", str(instance)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    assert verify.stderr.strip() == "", verify.stderr


def test_keeps_an_existing_environment_file(tmp_path: Path) -> None:
    """A second install never overwrites the operator's CONFDIR/soakd.env."""
    env_file = tmp_path / "etc/soakd/soakd.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text("CUDA_VISIBLE_DEVICES=1\n")
    proc = install("--root", str(tmp_path), "--no-user")
    assert proc.returncode == 0, proc.stderr
    assert env_file.read_text() == "CUDA_VISIBLE_DEVICES=1\n"


def test_unknown_option_is_a_one_line_usage_error() -> None:
    """A misspelt option exits 2 with one line naming it, before anything is installed."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--prefx", "/nonexistent"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "install.sh: error: unknown option --prefx (see --help)"


def test_default_install_is_the_shipped_unit_unchanged(rooted: Path) -> None:
    """With the default BINDIR and CONFDIR the installed unit is systemd/soakd@.service byte
    for byte (--root prefixes where it goes, never what it names)."""
    installed = rooted / "etc/systemd/system/soakd@.service"
    assert installed.read_text() == UNIT.read_text()


def test_installed_unit_reads_the_confdir_install_fills(tmp_path: Path) -> None:
    """--root TMP --confdir X: the env file lands in TMP/X, and the installed unit runs
    X/NAME.toml and reads X/soakd.env and X/NAME.env; /etc/soakd is nowhere in it."""
    confdir = "/srv/soak-conf"
    proc = install("--root", str(tmp_path), "--confdir", f"{confdir}/", "--no-user")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / confdir.lstrip("/") / "soakd.env").is_file()
    text = (tmp_path / "etc/systemd/system/soakd@.service").read_text()
    service = parse_unit(text)["Service"]
    assert f"SOAKD_CONFIG={confdir}/%i.toml" in service["Environment"]
    assert service["EnvironmentFile"] == [f"-{confdir}/soakd.env", f"-{confdir}/%i.env"]
    assert "/etc/soakd" not in text
    assert f"{confdir}/NAME.toml" in proc.stdout


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--confdir", "etc/soakd", "--confdir (CONFDIR) must be an absolute path"),
        ("--confdir", "/etc/soak d", "--confdir (CONFDIR) may not contain whitespace"),
        ("--confdir", "/etc/soakd%i", "--confdir (CONFDIR) may not contain whitespace, %"),
        ("--bindir", "bin", "--bindir (BINDIR) must be an absolute path"),
    ],
)
def test_a_confdir_or_bindir_the_unit_cannot_name_is_a_usage_error(
    tmp_path: Path, option: str, value: str, needle: str
) -> None:
    """A folder systemd cannot take in the unit (relative, with whitespace or a %) exits 2
    with one line naming the option, before anything is installed."""
    proc = install("--root", str(tmp_path), option, value, "--no-user")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"install.sh: error: {needle}"), lines
    assert list(tmp_path.iterdir()) == []
