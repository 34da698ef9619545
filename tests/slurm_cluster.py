"""A real SLURM cluster on this machine, for the tests: munged, slurmctld and one slurmd per node, each a
process of ours (foreground, stopped by pid), with their own key, config, state, spool, pid and log files in
one temporary folder and free ports. Node names (n1, n2, ...) do not resolve: each node's address is
127.0.0.1, as `NodeAddr` says, which is what a cluster whose DNS does not know its node names looks like.

    python tests/slurm_cluster.py /tmp/cluster      # start one, print its SLURM_CONF, stop it on Ctrl-C

`make slurm` installs the binaries (Debian's slurmctld, slurmd, slurm-client and munge; apt-get as root).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel")
PARTITION = "debug"


def missing_binaries() -> list[str]:
    """The SLURM and munge programs this machine lacks (the daemons are in /usr/sbin, often off a user's PATH)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=path) is None]


def _binary(name: str) -> str:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])) or name


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SlurmCluster:
    """`nodes` nodes of `cpus` CPUs each, all on this host, in one partition (debug, the default)."""

    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2):
        self.root, self.nodes, self.cpus = Path(root), [f"n{i + 1}" for i in range(nodes)], cpus
        self.processes: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, and launch.py through submitit) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf), "PATH": os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])}

    def start(self, timeout: float = 60) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)  # munged refuses a key or socket folder others may write to
        for folder in ("state", "spool", "munge"):
            (self.root / folder).mkdir(exist_ok=True)
            (self.root / folder).chmod(0o700)
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            for node in self.nodes:
                self._spawn(f"slurmd.{node}", [_binary("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge = self.root / "munge"
        self._spawn(
            "munged",
            [
                _binary("munged"),
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={munge / 'munge.socket'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        deadline = time.monotonic() + 20
        while not (munge / "munge.socket").exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not open its socket: see {munge / 'munged.log'}")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        ctld_port, *node_ports = free_ports(1 + len(self.nodes))
        host = socket.gethostname()
        nodes = [
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} RealMemory=2000 State=UNKNOWN"
            for node, port in zip(self.nodes, node_ports)
        ]
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=currytrain-test",
                    f"SlurmctldHost={host}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={r / 'munge' / 'munge.socket'},cred_expire=5",  # a requeued job may start again after 6 s (120 s by default)
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}/%n",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.%n.pid'}",
                    f"SlurmctldLogFile={r / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'slurmd.%n.log'}",
                    "SlurmdParameters=config_overrides",  # two nodes of 2 CPUs on a 2-core host
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",  # no CPU binding: two nodes on one host would both bind to CPU 0
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_interval=1",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "ReturnToService=2",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=60",
                    "KillWait=10",
                    "MinJobAge=600",
                    "JobRequeue=1",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    *nodes,
                    f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.console", "wb")  # noqa: SIM115 (the daemon holds it)
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                console = (self.root / f"{name}.console").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {process.returncode}: {console}")

    def command(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        return subprocess.run([_binary(argv[0]), *argv[1:]], env={**os.environ, **self.env}, capture_output=True, text=True, check=check, timeout=timeout)

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            result = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
            if result.returncode == 0 and all(states.get(node) == "idle" for node in self.nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes are not idle after {timeout} s: {states or result.stderr} (logs in {self.root})")
            time.sleep(0.3)

    def logs(self) -> str:
        """The daemons' log tails, for a failed test's message."""
        parts = []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every daemon we started, by its pid: slurmd first, munged last."""
        for name in sorted(self.processes, key=lambda n: ("slurmd" in n, "slurmctld" in n, "munged" in n), reverse=True):
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()


if __name__ == "__main__":
    if missing := missing_binaries():
        sys.exit(f"missing {', '.join(missing)}: run `make slurm` (apt-get, as root)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill <pid>` stops the daemons too
    cluster = SlurmCluster(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/currytrain-slurm")).start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
