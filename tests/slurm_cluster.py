"""A real single-node Slurm cluster for one test: ``with slurm_cluster() as cluster: ...``.

It writes ``slurm.conf`` and ``cgroup.conf`` into a fresh directory under /tmp, starts its
own ``munged`` (own key and socket), ``slurmctld`` and ``slurmd`` in the foreground as root
with ``SLURM_CONF`` pointing there, on ports that were free, and waits until ``sinfo`` says
the node is idle. On the way out, normal or not, it cancels every job, stops the daemons in
reverse order and removes the directory; on a failure inside the block it first prints the
daemons' log tails to stderr (pytest shows them with the failure). Nothing global is touched:
no /etc/slurm, no system munged, no fixed port, so clusters can run side by side.

The configuration is container-friendly: processes tracked through /proc
(``proctrack/linuxproc``), no task binding or cgroups (``task/none``), no accounting (so no
``sacct``: jobs are watched with ``scontrol show job``), cores as the consumable resource.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "squeue", "scancel")
#: job states after which a job never runs again
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                 "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED"}  # fmt: skip


def missing_prerequisite() -> str | None:
    """Why a cluster cannot start here (not root, a Slurm or munge binary missing), or None."""
    if os.geteuid() != 0:
        return "a Slurm cluster's daemons run as root (SlurmUser=root); this is not root"
    absent = [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b, path=_sbin_path()) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    return None


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def node_hardware() -> str:
    """This machine as ``slurmd -C`` describes it (CPUs, sockets, cores, threads, memory),
    without its NodeName, so slurmd registers exactly what it finds."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PATH": _sbin_path()}, timeout=30)  # fmt: skip
    line = out.stdout.splitlines()[0]
    return " ".join(w for w in line.split() if not w.startswith("NodeName="))


def slurm_conf(root: Path, node: str, ctld_port: int, slurmd_port: int) -> str:
    """The cluster's slurm.conf: one node, one partition ``soak``, everything under ``root``."""
    return f"""\
ClusterName=soakd{ctld_port}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/run/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
TmpFS={root}/node-tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 {node_hardware()} State=UNKNOWN
PartitionName=soak Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


#: no cgroup is used (task/none, proctrack/linuxproc); the file says which plugin would be
CGROUP_CONF = "CgroupPlugin=autodetect\nConstrainCores=no\nConstrainRAMSpace=no\n"


@dataclass
class SlurmCluster:
    """A running cluster: its directory, config, node name and the client environment."""

    root: Path
    conf: Path
    node: str
    env: dict[str, str]

    @property
    def node_tmp(self) -> Path:
        """The node's local scratch (``TmpFS``), for ``SLURM_TMPDIR``."""
        return self.root / "node-tmp"

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster; raises on a non-zero exit."""
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=True,
                              timeout=timeout)  # fmt: skip

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o JOB`` as fields (JobState, ExitCode, ...) of its first line."""
        line = self.run("scontrol", "show", "job", "-o", job_id).stdout.splitlines()[0]
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """The job's fields once it has ended (completed, failed, cancelled, ...); raises at
        once for a job whose dependency can never be met (it would pend forever)."""
        deadline = time.monotonic() + timeout
        while (fields := self.job(job_id))["JobState"] in ACTIVE_STATES:
            if fields.get("Reason") == "DependencyNeverSatisfied":
                raise RuntimeError(f"job {job_id} will never run: DependencyNeverSatisfied")
            if time.monotonic() > deadline:
                queue = self.run("squeue", "-h", "-o", "%i %T %r").stdout
                raise TimeoutError(f"job {job_id} still {fields['JobState']} after "
                                   f"{timeout:.0f} s; queue:\n{queue}")  # fmt: skip
            time.sleep(0.25)
        return fields

    def wait_for(self, ready: Callable[[], bool], timeout: float, what: str = "it") -> None:
        """Poll ``ready()`` every 0.1 s until it is true; raise naming ``what`` after
        ``timeout`` seconds, with the daemons' log tails."""
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, lines: int = 25) -> str:
        """The last ``lines`` lines of each daemon's log."""
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"== {f.name}\n" + "\n".join(tail))
        return "\n".join(out)


def _client_env(conf: Path) -> dict[str, str]:
    """This process's environment without any Slurm job's variables, plus ``SLURM_CONF``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    return {**env, "SLURM_CONF": str(conf), "PATH": _sbin_path()}


def _start(stack: contextlib.ExitStack, cmd: list[str], log: Path, env: dict[str, str]) -> None:
    """Start a foreground daemon; stop it (TERM, then KILL after 10 s) when ``stack`` closes."""
    out = stack.enter_context(log.open("ab"))
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)  # fmt: skip

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    stack.callback(stop)


def _node_idle(cluster: SlurmCluster) -> bool:
    got = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=cluster.env, text=True,
                         capture_output=True, timeout=10)  # fmt: skip
    return got.returncode == 0 and got.stdout.strip() == "idle"


def _cancel_all(cluster: SlurmCluster) -> None:
    """Cancel every job of this cluster and wait (10 s at most) until the queue is empty, so
    no job step outlives slurmd."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        cluster.run("scancel", "--quiet", "--user=root")  # every job here is root's
        deadline = time.monotonic() + 10
        while cluster.run("squeue", "-h", "-o", "%i").stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the cluster, yield it, and stop and remove everything afterwards."""
    root = Path(tempfile.mkdtemp(prefix="soakd-slurm-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        cluster = _boot(stack, root)
        try:
            yield cluster
        except BaseException:
            sys.stderr.write(f"slurm cluster logs ({root}):\n{cluster.logs()}\n")
            raise


def _boot(stack: contextlib.ExitStack, root: Path) -> SlurmCluster:
    """munged, then slurmctld and slurmd, each stopped by ``stack``; returns once idle."""
    root.chmod(0o711)  # munged requires every directory above its socket to be searchable
    for sub in ("run", "log", "state", "spool", "node-tmp"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.touch(0o600)
    key.write_bytes(os.urandom(1024))
    conf = root / "slurm.conf"
    node = socket.gethostname()  # what soakd stores as the run's host
    conf.write_text(slurm_conf(root, node, *free_ports(2)))
    (root / "cgroup.conf").write_text(CGROUP_CONF)
    cluster = SlurmCluster(root=root, conf=conf, node=node, env=_client_env(conf))
    env, log = cluster.env, root / "log"
    sock = root / "run" / "munge.socket"
    _start(stack, ["munged", "-F", f"--socket={sock}", f"--key-file={key}",
                   f"--pid-file={root}/run/munged.pid", f"--seed-file={root}/run/munged.seed",
                   f"--log-file={log}/munged.log"], log / "munged.out", env)  # fmt: skip
    cluster.wait_for(sock.exists, 10, "munged")
    _start(stack, ["slurmctld", "-D", "-i"], log / "slurmctld.out", env)
    _start(stack, ["slurmd", "-D", "-N", node], log / "slurmd.out", env)
    stack.callback(_cancel_all, cluster)  # runs first on the way out: jobs before daemons
    cluster.wait_for(lambda: _node_idle(cluster), 30, "the Slurm node")
    return cluster
