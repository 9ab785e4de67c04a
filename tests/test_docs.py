"""The README and docs/ cannot drift from the code: every command, option and config key is
in the README, it opens with the two set-up commands and CI runs its test command; its plan
example is configs/plan-example.toml, a valid plan; docs/fleet.md says what the Slurm and
Kubernetes files do; and every shell command in a code block is run here or checked against
what it names, skipped with the reason it cannot run here."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main

from soakd.cli import app
from soakd.config import (
    BUILTIN_WORKLOADS,
    AudioSettings,
    CriteriaSettings,
    RunSettings,
    ServiceSettings,
    SourceSettings,
    load_settings,
)
from soakd.observers.metrics import DEFAULT_PORT
from soakd.run.runner import run_soak
from soakd.store.db import connect
from soakd.store.runs import set_baseline

from .conftest import soakd_cmd
from .test_systemd_unit import parse_unit

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _commands() -> list[tuple[str, Any]]:
    root: Any = typer.main.get_command(app)
    out = []
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            out += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
        else:
            out.append((name, cmd))
    return out


@pytest.mark.parametrize(("name", "cmd"), _commands(), ids=lambda x: str(x))
def test_every_command_and_option_is_in_the_readme(name: str, cmd: Any) -> None:
    """Each command has a README section and each of its options is named there."""
    assert f"`soakd {name}" in README, f"README has no section for soakd {name}"
    for param in cmd.params:
        if param.param_type_name == "option":
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert f"`{opt}" in README or f"{opt} " in README or f"{opt}`" in README, (
                        f"soakd {name} {opt} is not in the README"
                    )


@pytest.mark.parametrize(
    ("section", "model"),
    [
        ("run", RunSettings),
        ("source", SourceSettings),
        ("audio", AudioSettings),
        ("criteria", CriteriaSettings),
        ("service", ServiceSettings),
    ],
)
def test_every_config_key_is_in_the_readme(section: str, model: type) -> None:
    """Each key of the [run], [source], [audio], [criteria] and [service] tables is
    documented in the README's configuration reference."""
    for key in model.model_fields:
        assert f"`{key}`" in README, f"[{section}] {key} is not in the README"


def test_every_workload_kind_is_in_the_readme() -> None:
    """Each built-in workload kind has a row in the README."""
    for kind in BUILTIN_WORKLOADS:
        assert f"| `{kind}` |" in README, kind


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    """The README's first code block is the run command then the test command, and .ci/run
    calls the test command word for word."""
    block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert block is not None and README.index("```sh") < 200
    lines = [ln.split("#")[0].strip() for ln in block.group(1).strip().splitlines()]
    assert len(lines) == 2
    run_cmd, test_cmd = lines
    assert "soakd run" in run_cmd and run_cmd.startswith("bash .ci/setup")
    ci = (REPO / ".ci/run").read_text()
    assert test_cmd in ci


def test_exit_codes_are_documented() -> None:
    """The README's exit code table lists every ExitCode."""
    from soakd.errors import ExitCode

    for code in ExitCode:
        assert f"| {int(code)} |" in README


@pytest.mark.parametrize(
    "argv",
    [["run", "--bogus"], ["nope"], ["run", "--fps", "abc"], ["show"]],
    ids=["unknown-option", "unknown-command", "bad-value", "missing-argument"],
)
def test_usage_errors_exit_2_without_a_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Command-line mistakes are exit code 2 with a message, never a traceback."""
    from soakd.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("Error" in err or "error" in err)


# ---------------------------------------------------------------------------------------
# The README's plan is the real file, and the fleet page's claims are in the files it names

PLAN_EXAMPLE = REPO / "configs" / "plan-example.toml"


def _toml_blocks(text: str) -> list[str]:
    return [m.group(2) for m in _FENCE.finditer(text) if m.group(1) == "toml"]


def test_the_readme_plan_is_configs_plan_example_as_it_is() -> None:
    """The README's plan example is configs/plan-example.toml word for word, and that file
    is a valid plan (`soakd plan show` checks every cell: exit 0, its four cells listed)."""
    assert PLAN_EXAMPLE.read_text(encoding="utf-8") in _toml_blocks(README)
    proc = subprocess.run(
        soakd_cmd("plan", "show", str(PLAN_EXAMPLE), "-f", "json"),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [c["name"] for c in json.loads(proc.stdout)["cells"]] == [
        "fps=10,infer_ms=10", "fps=10,infer_ms=25", "fps=20,infer_ms=10", "fps=20,infer_ms=25",
    ]  # fmt: skip
    assert "`fps=10,infer_ms=25`" in README  # the README's example of a cell name


def test_the_readme_extra_cell_example_adds_a_cell_to_the_plan(tmp_path: Path) -> None:
    """The README's ``[[cell]]`` example, appended to the example plan, is a fifth cell with
    its name and overrides (checked by `soakd plan show`, exit 0)."""
    extra = next(b for b in _toml_blocks(README) if b.startswith("[[cell]]"))
    plan = PLAN_EXAMPLE.read_text(encoding="utf-8").replace(
        'config = "synthetic.toml"', f"config = {str(REPO / 'configs/synthetic.toml')!r}"
    )
    path = tmp_path / "plan.toml"
    path.write_text(plan + "\n" + extra, encoding="utf-8")
    proc = subprocess.run(
        soakd_cmd("plan", "show", str(path), "-f", "json"),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout)["cells"][-1]
    assert (last["index"], last["name"]) == (4, tomllib.loads(extra)["cell"][0]["name"])


FLEET = (REPO / "docs" / "fleet.md").read_text(encoding="utf-8")


def test_every_fleet_file_the_fleet_page_names_exists() -> None:
    """Each docs/fleet/... path (and each script named by its file name) in docs/fleet.md
    is a file of the repository."""
    named = set(re.findall(r"docs/fleet/[\w./-]+\w", FLEET))
    assert named, "docs/fleet.md names no fleet file"
    for rel in sorted(named):
        assert (REPO / rel).exists(), f"docs/fleet.md names {rel}: no such file"
    for name in re.findall(r"`([\w-]+\.(?:sbatch|sh|yaml))`", FLEET):
        assert list((REPO / "docs" / "fleet").rglob(name)), f"docs/fleet.md names {name}"


#: what docs/fleet.md says each engine's files do, and the file that must do it
FLEET_CLAIMS = [
    ("soakd plan run PLAN --cell $SLURM_ARRAY_TASK_ID", "slurm/soakd-array.sbatch",
     'plan run "$plan" --cell "$SLURM_ARRAY_TASK_ID"'),
    ("`--dependency=afterany:<array>`", "slurm/submit.sh", '--dependency="afterany:$array"'),
    ("`SOAKD_ARRAY_PARALLEL=K`", "slurm/submit.sh", "SOAKD_ARRAY_PARALLEL"),
    ('soakd plan run /plan/plan.toml --cell "$JOB_COMPLETION_INDEX"',
     "k8s/soakd-indexed-job.yaml", 'plan run /plan/plan.toml --cell "$JOB_COMPLETION_INDEX"'),
    ("(`nvidia.com/gpu: 1`)", "k8s/soakd-indexed-job.yaml", "nvidia.com/gpu: 1"),
    ("`backoffLimitPerIndex`", "k8s/soakd-indexed-job.yaml", "backoffLimitPerIndex:"),
    ("`podFailurePolicy`", "k8s/soakd-indexed-job.yaml", "podFailurePolicy:"),
    ("`kubectl logs job/soakd-gate`", "k8s/soakd-merge-gate-job.yaml", "name: soakd-gate"),
]  # fmt: skip


@pytest.mark.parametrize(("claim", "rel", "needle"), FLEET_CLAIMS, ids=lambda x: str(x)[:40])
def test_the_fleet_page_says_what_its_slurm_and_k8s_files_do(
    claim: str, rel: str, needle: str
) -> None:
    """Each engine command or setting docs/fleet.md attributes to a Slurm script or a
    Kubernetes manifest is in the page and in that file."""
    assert claim in FLEET, f"docs/fleet.md no longer says {claim}"
    assert needle in (REPO / "docs" / "fleet" / rel).read_text(encoding="utf-8"), rel


# ---------------------------------------------------------------------------------------
# Every shell command shown in the docs is run here, or checked and skipped saying why


DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "shell", "console"}
#: in an untagged block: a soakd command (an example, a synopsis) or a transcript's `$ ` line
_UNTAGGED_COMMAND = re.compile(r"^(?:\$ |(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?soakd\s)")
#: box drawing: an untagged block that is a diagram, whose steps are soakd commands
_DIAGRAM = re.compile(r"[│├└─▶]")
_DIAGRAM_STEP = re.compile(r"soakd [a-z].*?(?=\s{2,}|─|$)")
_SEPARATORS = {"&&", "||", ";"}
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_RUN_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")
#: a command that contains one of these is only checked against the CLI (command and
#: options exist, files exist), not run: why it cannot run here
NOT_RUN = {
    "/models/": "needs a Hugging Face checkpoint on disk (workload.model_path)",
    "workload.device=cuda": "needs a CUDA GPU",
}
#: file names the docs use as placeholders for the reader's own
PLACEHOLDER_FILES = {"config.toml"}
#: the docs' placeholders for the reader's plan, run in their place: the example plan
PLAN_PLACEHOLDERS = {"PLAN", "plan.toml", "matrix.toml"}
PLACEHOLDERS = PLACEHOLDER_FILES | PLAN_PLACEHOLDERS
#: an array task's index: cell 0 here
INDEX_VARS = {"$SLURM_ARRAY_TASK_ID", "$JOB_COMPLETION_INDEX"}
#: the folder of docs/service.md's trial install (a temporary folder here)
TRIAL_ROOT = "/tmp/soakd-trial"
INSTALL_SH = REPO / "systemd" / "install.sh"
UNIT_FILE = REPO / "systemd" / "soakd@.service"


@dataclass(frozen=True)
class DocCommand:
    """One command of a code block: ``kind`` is ``shell`` (a line of a shell block, or a
    ``$`` / soakd line of another), ``synopsis`` (``[optional]`` and ``a|b`` parts) or
    ``diagram`` (a step drawn in a diagram); ``before`` are the block's earlier commands."""

    where: str
    kind: str
    text: str
    words: tuple[str, ...]
    before: tuple[DocCommand, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        """The ``NAME=value`` words before the command."""
        out = {}
        for w in self.words:
            if not _ENV.match(w):
                break
            name, _, value = w.partition("=")
            out[name] = value
        return out

    @property
    def argv(self) -> list[str]:
        """The command without its environment, ``sudo`` kept; ``nice -n N`` dropped."""
        argv = list(self.words[len(self.env) :])
        return argv[3:] if argv[:2] == ["nice", "-n"] else argv


def _complete(line: str) -> bool:
    """Whether the shell would read ``line`` as whole (no open quote, no continuation)."""
    if line.rstrip().endswith("\\"):
        return False
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return False
    return True


def _logical_lines(body: str) -> Iterator[tuple[int, str]]:
    """(offset of its first line, line) with continuations and multi-line quotes joined."""
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        i += 1
        while not _complete(line) and i < len(lines):
            cont = line.rstrip().endswith("\\")
            line = (line.rstrip()[:-1] + " " if cont else line + "\n") + lines[i].strip()
            i += 1
        yield start, line


def _split(where: str, text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """``text`` cut at ``&&``, ``||`` and ``;``: (where, raw text, words) per command."""
    words = shlex.split(text, comments=True)
    raws = re.split(r"\s+(?:&&|\|\||;)\s+", text)
    pieces: list[list[str]] = [[]]
    for w in words:
        if w in _SEPARATORS:
            pieces.append([])
        else:
            pieces[-1].append(w)
    if len(raws) != len(pieces):
        raws = [shlex.join(p) for p in pieces]
    many = len(pieces) > 1
    return [
        (f"{where}#{k + 1}" if many else where, raw.strip(), tuple(p))
        for k, (raw, p) in enumerate(zip(raws, pieces, strict=True))
        if p
    ]


_ALTERNATIVES = re.compile(r"[\w.-]+(?:\|[\w.-]+)+")


def _kind(words: tuple[str, ...]) -> str:
    """``synopsis`` when a word is ``[optional]`` or ``a|b``, else ``shell``."""
    synopsis = any(w.startswith("[") or _ALTERNATIVES.fullmatch(w) for w in words)
    return "synopsis" if synopsis else "shell"


def _block_commands(where_of: Callable[[int], str], lang: str, body: str) -> list[DocCommand]:
    """A block's commands: a shell block's lines, an untagged block's command lines, a
    diagram's soakd steps."""
    out: list[DocCommand] = []
    if lang == "" and _DIAGRAM.search(body):
        for offset, line in enumerate(body.splitlines()):
            for m in _DIAGRAM_STEP.finditer(line):
                words = tuple(shlex.split(m.group(0)))
                out.append(DocCommand(where_of(offset), "diagram", m.group(0), words))
        return out
    for offset, line in _logical_lines(body):
        text = line.strip()
        if lang in SHELL_LANGS or (lang == "" and _UNTAGGED_COMMAND.match(text)):
            for where, raw, words in _split(where_of(offset), text.removeprefix("$ ")):
                out.append(DocCommand(where, _kind(words), raw, words, tuple(out)))
    return out


def _doc_commands() -> list[DocCommand]:
    """Every command of every code block of the README and docs/*.md."""
    out = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            first = text.count("\n", 0, m.start(2)) + 1
            rel = path.relative_to(REPO)
            out += _block_commands(lambda k, r=rel, f=first: f"{r}:{f + k}", m.group(1), m.group(2))
    return out


def _click_command(argv: list[str]) -> tuple[Any, list[str]]:
    """The click command ``argv`` names and the rest of ``argv``."""
    cmd: Any = typer.main.get_command(app)
    rest = list(argv)
    while hasattr(cmd, "commands") and rest and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    return cmd, rest


def _synopsis_words(words: list[str]) -> list[str]:
    """A synopsis's words with its brackets gone and its alternatives apart."""
    return [a for w in words for a in w.strip("[]").split("|") if a]


def _options(argv: list[str]) -> set[str]:
    """The options of the soakd command ``argv`` names."""
    cmd, _ = _click_command(argv)
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


def _check_against_cli(argv: list[str]) -> None:
    """The command exists, each option it uses is one of its options, each file exists (the
    configs of an installed unit, /etc/soakd/, are the unit's: checked with it)."""
    cmd, rest = _click_command(argv)
    assert not hasattr(cmd, "commands"), f"soakd {' '.join(argv)}: no such command"
    known = _options(argv)
    for w in rest:
        if w.startswith("-"):
            assert w.split("=", 1)[0] in known, f"{w} is not an option of soakd {argv[0]}"
        elif w.endswith(".toml") and not w.startswith("/etc/soakd/") and w not in PLACEHOLDERS:
            assert (REPO / w).is_file(), f"{w} does not exist"


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A database with one short synthetic soak, marked as baselines ``release`` and
    ``default``, and a synthetic config file for the docs' placeholder ``config.toml``."""
    tmp = tmp_path_factory.mktemp("docs")
    db = tmp / "soakd.db"
    settings = load_settings(
        overrides=[
            "workload.kind=synthetic", f"run.db={str(db)!r}", "run.duration=2", "run.fps=10",
            "run.warmup_s=0.5", "run.log_every=0", "source.width=32", "source.height=24",
            "criteria.min_duration_s=1", "criteria.min_frames=5",
        ]
    )  # fmt: skip
    run_id = run_soak(settings).run_id
    conn = connect(db)
    try:
        for name in ("release", "default"):
            set_baseline(conn, name, run_id)
    finally:
        conn.close()
    config = tmp / "config.toml"
    config.write_text('[workload]\nkind = "synthetic"\n[run]\nwarmup_s = 0.5\nlog_every = 0\n')
    return {"db": str(db), "run_id": run_id, "config": str(config), "dir": str(tmp)}


def _placeholder(w: str, run: dict[str, str]) -> str:
    """``w`` made runnable here: a run id or ``RUN_ID`` is the test run, ``config.toml``
    the synthetic config, a plan placeholder the example plan, an array index 0, a
    repository path absolute."""
    if w == "RUN_ID" or _RUN_ID.match(w.removeprefix("baseline:")):
        return run["run_id"]
    if w in PLACEHOLDER_FILES:
        return run["config"]
    if w in PLAN_PLACEHOLDERS:
        return str(PLAN_EXAMPLE)
    if w in INDEX_VARS:
        return "0"
    if not w.startswith("-") and (REPO / w).exists():
        return str(REPO / w)
    return w


def _for_here(argv: list[str], run: dict[str, str]) -> list[str]:
    """``argv`` made runnable here: the test database, a 2 s soak, a 4-frame profile, port
    0, placeholders replaced (``_placeholder``)."""
    out, sub = [], argv[0]
    words = iter(argv)
    for w in words:
        if w in ("--db", "--duration", "--metrics-addr"):
            next(words, None)
            continue
        out.append(_placeholder(w, run))
    if "--db" in _options(argv):
        out += ["--db", run["db"]]
    if sub == "profile" and "--frames" not in argv:
        out += ["--frames", "4"]
    if argv[:2] == ["plan", "run"]:
        out += ["--set", "run.duration=2s"]  # each cell: too short to pass, long enough to run
    if sub == "run":
        out += ["--duration", "2s"]
        if "--metrics-addr" in argv:
            out += ["--metrics-addr", "127.0.0.1:0"]
    return out


class Trial:
    """systemd/install.sh run for real, offline (this venv's packages, seconds), each
    distinct set of options once, into a temporary root: the docs' ``--root /tmp/soakd-trial``
    becomes a temporary folder, and an install onto this host (``sudo``) gets one."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.roots: dict[tuple[str, ...], Path] = {}

    def install(self, args: list[str]) -> Path:
        """The root of an install with ``args`` (any ``--root`` is a temporary folder, so
        installs that differ only in it are one)."""
        if "--root" in args:
            k = args.index("--root")
            args = args[:k] + args[k + 2 :]
        if tuple(args) not in self.roots:
            root = self.base / f"root{len(self.roots)}"
            run = ["--root", str(root), *args]
            proc = subprocess.run(
                ["bash", str(INSTALL_SH), "--python", sys.executable, "--reuse-site-packages",
                 *run],
                capture_output=True, text=True, cwd=REPO, timeout=180,
            )  # fmt: skip
            assert proc.returncode == 0, f"install.sh {shlex.join(args)}: {proc.stderr}"
            self.roots[tuple(args)] = root
        return self.roots[tuple(args)]

    def unit(self, root: Path) -> dict[str, dict[str, list[str]]]:
        return parse_unit((root / "etc/systemd/system/soakd@.service").read_text())


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory) -> Trial:
    return Trial(tmp_path_factory.mktemp("trial"))


@dataclass
class Ctx:
    run: dict[str, str]
    trial: Trial
    env: dict[str, str]


#: commands already run (the same command shown twice is run once): argv -> exit code
_RAN: dict[tuple[str, ...], int] = {}


def _soakd(cmd: DocCommand, ctx: Ctx) -> None:
    """Checked against the CLI; then run against the test database unless it is a
    synopsis, a diagram's step, or needs a GPU or a checkpoint (said so)."""
    argv = cmd.argv[1 : cmd.argv.index("|") if "|" in cmd.argv else None]
    _check_against_cli(_synopsis_words(argv) if cmd.kind == "synopsis" else argv)
    if cmd.kind != "shell":
        pytest.skip(f"{cmd.where}: a {cmd.kind}, not a command line: checked against the CLI")
    why = [reason for k, reason in NOT_RUN.items() if k in " ".join(argv)]
    if why:
        pytest.skip(f"{cmd.where}: checked against the CLI only; {'; '.join(why)}")
    here = _for_here(argv, ctx.run)
    env = {**ctx.env, **{k: str(REPO / v) if (REPO / v).exists() else v
                         for k, v in cmd.env.items()}}  # fmt: skip
    if tuple(here) not in _RAN:
        proc = subprocess.run(
            soakd_cmd(*here), capture_output=True, text=True, cwd=ctx.run["dir"], env=env,
            timeout=120,
        )  # fmt: skip
        out = proc.stdout + proc.stderr
        assert "Traceback" not in out, f"{cmd.where}: {out[-3000:]}"
        _RAN[tuple(here)] = proc.returncode
        assert proc.returncode in (0, 1, 3), f"{cmd.where}: exit {proc.returncode}: {out[-3000:]}"
    assert _RAN[tuple(here)] in (0, 1, 3)


def _bash(text: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", text], capture_output=True, text=True, cwd=REPO, timeout=60, **kw
    )


def _builtin(cmd: DocCommand, ctx: Ctx) -> None:
    """``echo ...`` and ``true`` (a gate's ``|| true``, printing an exit code) run."""
    proc = _bash(cmd.text)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def _install(cmd: DocCommand, ctx: Ctx) -> None:
    """install.sh runs with the options shown, into a temporary root (``sudo`` dropped),
    and installs the venv's soakd, the link, the unit and the environment file."""
    root = ctx.trial.install(cmd.argv[cmd.argv.index("systemd/install.sh") + 1 :])
    for rel in ("usr/local/bin/soakd", "etc/systemd/system/soakd@.service", "etc/soakd/soakd.env"):
        assert (root / rel).exists(), rel


def _trial_check(cmd: DocCommand, ctx: Ctx) -> None:
    """A look at the trial install runs on a temporary one, after the block's earlier
    looks (a copy made on the line before), silent on stderr and exit 0."""
    if cmd.argv[0] == "systemd-analyze" and shutil.which("systemd-analyze") is None:
        pytest.skip(f"{cmd.where}: needs systemd-analyze (apt-get install systemd)")
    root = str(ctx.trial.install(["--root", TRIAL_ROOT]))
    for c in (*cmd.before, cmd):
        if TRIAL_ROOT in c.text and "install.sh" not in c.text:
            proc = _bash(c.text.replace(TRIAL_ROOT, root))
            assert proc.returncode == 0 and proc.stderr == "", f"{c.where}: {proc.stderr}"
            assert proc.stdout.strip() or ">" in c.text or "verify" in c.text, c.where


def _installed_config(ctx: Ctx, name: str) -> Path:
    """Where the installed unit of an install onto this host reads soakd@NAME's config."""
    root = ctx.trial.install([])
    env = dict(e.split("=", 1) for e in ctx.trial.unit(root)["Service"]["Environment"])
    return root / env["SOAKD_CONFIG"].replace("%i", name).lstrip("/")


def _copy_config(cmd: DocCommand, ctx: Ctx) -> None:
    """``sudo cp CONFIG /etc/soakd/`` runs into the temporary install, where the installed
    unit's SOAKD_CONFIG for soakd@<config's stem> then finds it."""
    src = REPO / cmd.argv[2]
    config = _installed_config(ctx, src.stem)
    shutil.copy(src, ctx.trial.install([]) / cmd.argv[3].lstrip("/"))
    assert config.is_file(), f"soakd@{src.stem} reads {config}: not where cp put it"


def _unit_names(cmd: DocCommand) -> None:
    """Each ``soakd@NAME`` a systemctl or journalctl line names is the shipped template."""
    for w in cmd.argv:
        if w.startswith("soakd@"):
            assert (REPO / "systemd" / "soakd@.service").is_file()
            assert re.fullmatch(r"soakd@[\w.-]+", w), w


def _systemd_cmd(cmd: DocCommand, ctx: Ctx) -> None:
    """systemctl and journalctl lines: the unit is the template, each journal field one
    soakd writes; they need a booted systemd running soakd@NAME."""
    _unit_names(cmd)
    for w in cmd.argv:
        if w.startswith("SOAKD_") and "=" in w:
            field = w.split("=", 1)[0]
            assert field in (REPO / "soakd/observers/journal.py").read_text(), field
    pytest.skip(
        f"{cmd.where}: needs root and a booted systemd with soakd@ installed (run by "
        "tests/test_nspawn.py; the journal fields by tests/test_journal.py)"
    )


def _usermod(cmd: DocCommand, ctx: Ctx) -> None:
    """The group an operator joins is the one install.sh creates (soakd.sysusers)."""
    group = cmd.argv[cmd.argv.index("-aG") + 1]
    assert re.search(rf"^[ug] {group} ", (REPO / "systemd/soakd.sysusers").read_text(), re.M)
    pytest.skip(f"{cmd.where}: needs root: adds a user to this host's group {group}")


def _systemd_run(cmd: DocCommand, ctx: Ctx) -> None:
    """A transient soak: each ``-p`` property the unit also sets has the unit's value (the
    environment file apart: one instance's), and the soakd command is a real one."""
    unit = parse_unit(UNIT_FILE.read_text())["Service"]
    argv = cmd.argv
    for k, w in enumerate(argv[:-1]):
        if w == "-p":
            key, _, value = argv[k + 1].partition("=")
            if key in unit and key != "EnvironmentFile":
                assert unit[key][-1] == value, f"-p {key}={value}: the unit says {unit[key][-1]}"
    exe = next(k for k, w in enumerate(argv) if w.endswith("/soakd"))
    _check_against_cli(argv[exe + 1 :])
    config = next(e for e in unit["Environment"] if e.startswith("SOAKD_CONFIG="))
    for w in argv[exe + 1 :]:
        if w.endswith(".toml"):  # the config an instance of the unit would run
            assert Path(w).parent == Path(config.split("=", 1)[1]).parent, w
    pytest.skip(f"{cmd.where}: needs root and a booted systemd (the unit: tests/test_nspawn.py)")


def _env_file(cmd: DocCommand, ctx: Ctx) -> None:
    """``echo NAME=VALUE | sudo tee /etc/soakd/X.env``: a file the unit reads for soakd@X,
    a variable it uses (SOAKD_ARGS: real ``soakd run`` options)."""
    name, _, value = cmd.argv[1].partition("=")
    path = cmd.argv[-1]
    unit = parse_unit(UNIT_FILE.read_text())["Service"]
    instance = Path(path).stem
    assert f"-{path}" in [f.replace("%i", instance) for f in unit["EnvironmentFile"]], path
    assert name == "CUDA_VISIBLE_DEVICES" or f"${name}" in unit["ExecStart"][-1], name
    if name == "SOAKD_ARGS":
        _check_against_cli(["run", *shlex.split(value)])
    pytest.skip(f"{cmd.where}: needs root: writes {path}")


def _curl_metrics(cmd: DocCommand, ctx: Ctx) -> None:
    """The scrape's port is the exporter's default, as on the line before."""
    url = next(w for w in cmd.argv if w.endswith("/metrics"))
    assert url.removeprefix("http://").split("/")[0].endswith(f":{DEFAULT_PORT}"), url
    pytest.skip(
        f"{cmd.where}: needs the soak on the line before serving on port {DEFAULT_PORT} "
        "(tests/test_metrics.py and tests/test_dashboard_labels.py scrape live ones)"
    )


def _bench(cmd: DocCommand, ctx: Ctx) -> None:
    """A benchmark or upstream check: the module exists and takes each option shown; it
    runs for minutes, or needs what the skip names."""
    argv = _synopsis_words(cmd.argv) if cmd.kind == "synopsis" else cmd.argv
    module = argv[argv.index("-m") + 1].removeprefix("bench.")
    sources = (REPO / "bench/_common.py").read_text()
    if module != "NAME":  # the README's placeholder for any of them
        sources += (REPO / "bench" / f"{module}.py").read_text()
    for w in argv:
        if w.startswith("--"):
            assert f'"{w}"' in sources, f"bench.{module} has no option {w}"
    needs = [w for w in argv if w.startswith("/") and not Path(w).exists()]
    why = f"needs {', '.join(needs)}" if needs else "a benchmark: minutes, on a quiet machine"
    if "--quick" in argv:
        why = "tests/test_bench_smoke.py runs every benchmark's --quick version"
    if "cuda" in argv:
        why += " and a CUDA GPU"
    pytest.skip(f"{cmd.where}: {why}")


def _network(cmd: DocCommand, ctx: Ctx) -> None:
    pytest.skip(f"{cmd.where}: needs the network (fetches the authors' code or packages)")


def _ci(cmd: DocCommand, ctx: Ctx) -> None:
    """.ci/ scripts: the file exists and takes the options shown; CI runs them."""
    script = REPO / cmd.argv[1]
    for w in cmd.argv[2:]:
        assert w in script.read_text(), f"{script.name} has no option {w}"
    why = "the whole suite, this test included" if script.name == "test" else "pip, the network"
    pytest.skip(f"{cmd.where}: .ci/{script.name} needs {why} (CI runs it)")


def _submit(cmd: DocCommand, ctx: Ctx) -> None:
    """submit.sh is executable and reads SOAKD, here the soakd install.sh installs."""
    script = REPO / cmd.argv[0]
    assert os.access(script, os.X_OK), script
    for name, value in cmd.env.items():
        assert f"${{{name}" in script.read_text(), f"{script.name} does not read {name}"
        if name == "SOAKD":
            assert (ctx.trial.install([]) / value.lstrip("/")).exists(), value
    pytest.skip(f"{cmd.where}: needs a Slurm cluster (tests/test_slurm.py runs submit.sh)")


def _sqlite_utils(cmd: DocCommand, ctx: Ctx) -> None:
    """``sqlite-utils query DB SQL [-p NAME VALUE]``: the query runs on a real run database
    (sqlite3, the same SQL and parameters; a run id is the test run's)."""
    argv = cmd.argv
    params = {argv[k + 1]: _placeholder(argv[k + 2], ctx.run)
              for k, w in enumerate(argv) if w == "-p"}  # fmt: skip
    conn = sqlite3.connect(ctx.run["db"])
    try:
        conn.execute(argv[3], params).fetchall()
    finally:
        conn.close()


#: (pattern on the command's words, handler): the first that matches runs or checks it
RULES: list[tuple[str, Callable[[DocCommand, Ctx], None]]] = [
    (r"^(\.venv/bin/)?soakd ", _soakd),
    (r"^(sudo )?systemd/install\.sh\b", _install),
    (rf"^(\S*soakd --version|(grep|ls|sed|systemd-analyze) .*{TRIAL_ROOT})", _trial_check),
    (r"^echo .*\| sudo tee ", _env_file),
    (r"^(echo|true)\b(?!.*\|)", _builtin),
    (r"^bash \.ci/", _ci),
    (r"^sudo cp \S+ /etc/soakd/$", _copy_config),
    (r"^sudo usermod ", _usermod),
    (r"^sudo systemd-run ", _systemd_run),
    (r"^(sudo )?(systemctl|journalctl) ", _systemd_cmd),
    (r"^curl .*/metrics", _curl_metrics),
    (r"^\S*python3? -m bench\.", _bench),
    (r"^(git clone|pip install) ", _network),
    (r"^docs/fleet/slurm/submit\.sh ", _submit),
    (r"^sqlite-utils query ", _sqlite_utils),
]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", _doc_commands(), ids=lambda c: c.where)
def test_every_documented_shell_command_is_run_or_checked(
    cmd: DocCommand, doc_run: dict[str, str], trial: Trial, subprocess_env: dict[str, str]
) -> None:
    """Each command in a code block of the README and docs/ runs here (soakd against a real
    database, install.sh into a temporary root and the trial's checks, the schema's queries)
    or, where it needs what this machine lacks (root, a booted systemd, a GPU, a checkpoint,
    a cluster, the network), is checked against what it names and skipped saying so."""
    line = " ".join(cmd.argv)
    handler = next((h for pattern, h in RULES if re.search(pattern, line)), None)
    assert handler is not None, f"{cmd.where}: no rule runs or checks `{cmd.text}` (RULES)"
    handler(cmd, Ctx(doc_run, trial, subprocess_env))


def test_the_docs_show_commands_of_every_kind() -> None:
    """The reader above finds the docs' commands: soakd lines, install.sh, the trial's
    checks, synopses and a diagram's steps, in sh, bash and untagged blocks."""
    cmds = _doc_commands()
    assert {c.kind for c in cmds} == {"shell", "synopsis", "diagram"}
    texts = [c.text for c in cmds]
    for needle in ("soakd plan show configs/plan-example.toml", "systemd/install.sh --root",
                   "systemd-analyze verify", "PYTHONPATH=docs/examples soakd run",
                   "sqlite-utils query", "docs/fleet/slurm/submit.sh"):  # fmt: skip
        assert any(needle in t for t in texts), needle
