"""A one-node Slurm cluster on localhost for the tests: munge, slurmctld and slurmd, started with
a config written here, stopped by their PID files in reverse order.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them). No systemd: each daemon is
started directly. No accounting database: submitit reads job states from ``sacct``, so the cluster
puts a stand-in ``sacct`` first on ``PATH`` that answers from ``squeue -t all`` (finished jobs stay
visible for ``MinJobAge`` seconds).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
SACCT = """#!/bin/sh
# sacct without slurmdbd: the states of the jobs given with -j, from squeue -t all (arrays expanded)
ids=""
while [ $# -gt 0 ]; do
  case "$1" in -j) ids="$ids $2"; shift 2 ;; *) shift ;; esac
done
echo "JobID|State|NodeList"
squeue -t all -h -r -o "%i|%T|%N" | while IFS='|' read -r id state nodes; do
  for j in $ids; do [ "${id%%_*}" = "$j" ] && echo "$id|$state|$nodes"; done
done
exit 0
"""


PARTITION = "debug"
"""The cluster's one partition (every job runs there)."""


def missing() -> list[str]:
    """The programs a cluster needs that this machine lacks."""
    return [p for p in (*DAEMONS, "sbatch", "squeue", "scancel") if shutil.which(p) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(folder: Path, host: str) -> str:
    """``slurm.conf`` of a one-node cluster on ``host`` with its state, logs and sockets in ``folder``."""
    return "\n".join([
        "ClusterName=plateauscope", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={folder}/munge/munge.socket",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd.log",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "MailProg=/bin/true", "MinJobAge=3600",
        "ReturnToService=2", "SchedulerParameters=sched_interval=1",
        # a cancelled job's processes are killed 1 s after Slurm's SIGTERM, which submitit's jobs ignore (30 s
        # by default: a tiny run would finish and write its result in between)
        "KillWait=1",
        f"NodeName={host} CPUs=2 RealMemory=4000 State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


def start(folder: Path) -> dict[str, str]:
    """Start the cluster with its files in ``folder``; return the environment its clients need
    (``SLURM_CONF``, and ``PATH`` with the stand-in ``sacct`` first)."""
    folder = Path(folder)
    for sub in ("munge", "state", "spool", "bin"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o755)  # munged refuses a socket directory others can write to
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (folder / "bin" / "sacct").write_text(SACCT)
    (folder / "bin" / "sacct").chmod(0o755)
    (folder / "slurm.conf").write_text(config(folder, socket.gethostname()))
    env = {"SLURM_CONF": str(folder / "slurm.conf"), "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    run_env = {**os.environ, **env}
    subprocess.run(["munged", f"--key-file={key}", f"--socket={folder}/munge/munge.socket",
                    f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                    f"--seed-file={folder}/munge.seed", "--force"], check=True, env=run_env)
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([daemon, "-f", str(folder / "slurm.conf")], check=True, env=run_env)
    deadline = time.monotonic() + 60
    while True:  # the node is up when sinfo says idle
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=run_env).stdout.strip()
        if state == "idle":
            return env
        if time.monotonic() > deadline:
            stop(folder)
            raise RuntimeError(f"the test cluster did not come up (sinfo: {state!r}); logs in {folder}")
        time.sleep(0.3)


def _alive(pid: int) -> bool:
    """Running, not a zombie (an exited daemon can linger as one; kill -0 would still succeed)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def stop(folder: Path) -> None:
    """Cancel every job, stop the daemons by their PID files in reverse order of starting and wait
    for each to end, then end what the jobs left (a cancelled task's ``srun`` can outlive its step)."""
    conf = str(Path(folder) / "slurm.conf")
    if (Path(folder) / "slurmctld.pid").exists():
        subprocess.run(["scancel", "-p", PARTITION], capture_output=True, env={**os.environ, "SLURM_CONF": conf},
                       timeout=30)
    for daemon in reversed(DAEMONS):
        pid_file = Path(folder) / f"{daemon}.pid"
        if not pid_file.exists():
            continue
        pid = int(pid_file.read_text().split()[0])
        for signal_number, wait_s in ((15, 10.0), (9, 5.0)):
            if not _alive(pid):
                break
            try:
                os.kill(pid, signal_number)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
    for pid in _processes_with(f"SLURM_CONF={conf}"):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _processes_with(entry: str) -> list[int]:
    """Other processes whose environment holds ``entry`` (``NAME=value``): this cluster's jobs."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in (os.getpid(), os.getppid()):
            continue
        try:
            if entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                out.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return out


def kill_shard_midway(env: dict, analysing: subprocess.Popen, run: Path, index: int) -> bool:
    """SIGKILL every process of shard ``index``'s job of a sharded ``analyze`` (``plateauscope.analysis.shards``) on
    this cluster (``env``: its clients' environment), as the kernel's out-of-memory killer would, once the shard's
    probe pass has written a record; False where the shard ended first."""
    first = run / "analysis" / "shards" / str(index) / "analysis" / "probe_induction.jsonl"
    deadline = time.monotonic() + 300
    while not (first.exists() and first.read_text().count("\n") >= 1):
        if analysing.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    ours = set(_processes_with(f"SLURM_CONF={env['SLURM_CONF']}"))
    pids = ours & set(_processes_with(f"SLURM_ARRAY_TASK_ID={index}")) \
        & set(_processes_with("SLURM_JOB_NAME=plateauscope-analyze"))
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return bool(pids)
