"""hydra/launcher=slurm against a real SLURM controller started on this machine (tests/slurm_cluster.py: munged,
slurmctld and two slurmd, nodes n1 and n2 whose names do not resolve). Each test submits with sbatch as a user
would and asserts on what the controller, the journals and the task logs say. `make slurm` installs SLURM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, missing_binaries

from conftest import ROOT, TINY, launch_subprocess
from currytrain.journal import current, read_journal

pytestmark = pytest.mark.slow

SMALL_DATA = "data.max_bytes=300000"
SAME = (SMALL_DATA, "parallel=ddp", "trainer.max_steps=24", "trainer.eval_every=12")
"""The runs whose losses must equal the local run's: same seed, data, world size 2 (ddp), steps."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if missing := missing_binaries():
        pytest.skip(f"SLURM is not installed here (no {', '.join(missing)}): `make slurm` installs it (apt-get, as root)")
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs slurmctld and slurmd as root (as CI does)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same training run started locally (launch.py's own 2 workers): the losses every SLURM layout must give."""
    run_dir = tmp_path_factory.mktemp("local") / "run"
    result = launch_subprocess(*SAME, "parallel.nproc=2", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return losses(run_dir)


def submit(cluster: SlurmCluster, *overrides: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python launch.py -m hydra/launcher=slurm ...` against the test cluster."""
    return launch_subprocess("-m", "hydra/launcher=slurm", *overrides, timeout=timeout, env={**cluster.env, **(env or {})})


def start(cluster: SlurmCluster, output: Path, *overrides: str) -> subprocess.Popen:
    """The same, left running (the test signals or requeues its job meanwhile); its console goes to `output`."""
    args = [sys.executable, str(ROOT / "launch.py"), "-m", "hydra/launcher=slurm", *TINY, *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **cluster.env}
    with open(output, "w") as console:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=console, stderr=subprocess.STDOUT)


def submitted(sweep_dir: Path) -> list[str]:
    """The ids of the jobs the launcher submitted so far (its record in the multirun folder)."""
    from currytrain.cluster.slurm import read_records

    return list(read_records(sweep_dir))


def losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["train/loss"] for e in current(read_journal(run_dir / "journal.jsonl")) if e["type"] == "metrics"}


def job_ids(output: str) -> list[str]:
    return re.findall(r"SLURM job (\d+) submitted", output)


def job_info(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """`scontrol show job` as key=value pairs: what the controller recorded about the job."""
    text = cluster.command("scontrol", "show", "job", "-o", job_id).stdout
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def task_logs(sweep_dir: Path, job_id: str) -> list[str]:
    folder = sweep_dir / ".submitit" / job_id
    return [
        (folder / f"{job_id}_{task}_log.out").read_text() + (folder / f"{job_id}_{task}_log.err").read_text()
        for task in range(len(list(folder.glob("*_log.out"))))
    ]


def wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "journal.jsonl"
    return read_journal(path) if path.exists() else []


# ------------------------------------------------------------------------------------------- training


def interrupted_at_the_first_checkpoint(cluster, tmp_path, sweep_dir, overrides: list[str], *command: str) -> tuple[str, str]:
    """Launch job 0 of `sweep_dir`, run `command JOB_ID` on the controller once its first checkpoint is written,
    wait for the launcher to end (exit 0): its console output and the job id."""
    run_dir = sweep_dir / "0"
    launcher = start(cluster, tmp_path / "console", *SAME, *overrides, f"hydra.sweep.dir={sweep_dir}")
    try:
        wait_for(lambda: any(e["type"] == "checkpoint" for e in events(run_dir)) or launcher.poll() is not None, "the first checkpoint")
        (job_id,) = submitted(sweep_dir)
        cluster.command(*command, job_id)
        launcher.wait(timeout=240)
    finally:
        launcher.kill()
    output = (tmp_path / "console").read_text()
    assert launcher.returncode == 0, output[-3000:]
    return output, job_id


def test_two_tasks_on_one_node_survive_scontrol_requeue_and_train_as_the_local_run(cluster, reference, tmp_path):
    """`scontrol requeue` of the running job: SLURM sends its tasks SIGTERM, they agree on a step and checkpoint,
    and SLURM's second start resumes there; the losses are still the uninterrupted local run's."""
    sweep_dir, run_dir = tmp_path / "multirun", tmp_path / "multirun" / "0"
    output, job_id = interrupted_at_the_first_checkpoint(
        cluster, tmp_path, sweep_dir, ["parallel.nproc=2", "trainer.checkpoint_every=4"], "scontrol", "requeue"
    )
    info = job_info(cluster, job_id)
    assert info["JobState"] == "COMPLETED" and info["NumNodes"] == "1" and info["NumTasks"] == "2" and info["Restarts"] == "1", info
    # What the launcher showed: the job id, where the logs are, and each state as it changed; no sacct noise.
    assert f"{sweep_dir}/.submitit/{job_id}/{job_id}_<task>_log.out" in output
    assert f"SLURM job {job_id} (#0): RUNNING on n1" in output and f"SLURM job {job_id} (#0): COMPLETED, requeued 1x" in output
    assert "sacct" not in output
    for rank, log in enumerate(task_logs(sweep_dir, job_id)):  # ranks, world size and master address came from SLURM
        assert f"rank {rank} of 2 (node 0 of 1" in log and "master 127.0.0.1:" in log, log[-2000:]
    journal = read_journal(run_dir / "journal.jsonl")
    kinds = [e["type"] for e in journal]
    assert kinds.count("header") == 1 and kinds.count("launch") == 1, kinds  # one run, two segments
    interrupted, resume = (next(e for e in journal if e["type"] == kind) for kind in ("interrupted", "resume"))
    assert interrupted["signal"] == "SIGTERM" and resume["step"] == interrupted["step"]  # SLURM's SIGTERM: a checkpoint, then the requeue
    first = [e["step"] for e in journal[: kinds.index("launch")] if e["type"] == "metrics"]
    assert max(first) - resume["step"] <= 4 and journal[-1]["type"] == "finish" and journal[-1]["step"] == 24
    assert losses(run_dir) == pytest.approx(reference, rel=1e-5)


def test_one_task_on_each_of_two_nodes_survives_a_requeue_and_trains_as_the_local_run(cluster, reference, tmp_path):
    """SLURM's warning signal (scancel --signal=USR1) mid-run: the ranks checkpoint, rank 0 requeues the job, and
    SLURM's second start resumes from that checkpoint; the losses are still the uninterrupted local run's."""
    sweep_dir, run_dir = tmp_path / "multirun", tmp_path / "multirun" / "0"
    two_nodes = ("parallel.nproc=1", "parallel.dp_replicate=-1", "hydra.launcher.nodes=2", "trainer.checkpoint_every=4")
    output, job_id = interrupted_at_the_first_checkpoint(cluster, tmp_path, sweep_dir, list(two_nodes), "scancel", "--signal=USR1")
    assert f"SLURM job {job_id} (#0): RUNNING on n[1-2]" in output and f"SLURM job {job_id} (#0): COMPLETED, requeued 1x" in output
    assert job_info(cluster, job_id)["Restarts"] == "1"
    journal = read_journal(run_dir / "journal.jsonl")
    kinds = [e["type"] for e in journal]
    assert kinds.count("header") == 1 and kinds.count("launch") == 1, kinds  # one run, two segments
    interrupted, requeued, resume = (next(e for e in journal if e["type"] == kind) for kind in ("interrupted", "requeued", "resume"))
    assert interrupted["signal"] == "SIGUSR1" and requeued["job"] == job_id and requeued["restart"] == 1
    assert kinds.index("interrupted") < kinds.index("requeued") < kinds.index("launch") < kinds.index("resume")
    first = [e["step"] for e in journal[: kinds.index("launch")] if e["type"] == "metrics"]
    assert resume["step"] == interrupted["step"] and max(first) - resume["step"] <= 4  # trained twice: at most checkpoint_every
    assert journal[-1]["type"] == "finish" and journal[-1]["step"] == 24
    logs = task_logs(sweep_dir, job_id)
    assert "rank 1 of 2 (node 1 of 2" in logs[1] and "the node name n1 does not resolve here; using its NodeAddr 127.0.0.1" in logs[1]
    assert losses(run_dir) == pytest.approx(reference, rel=1e-5)


# ----------------------------------------------------------------------------------- sweeps and ladders


def test_a_sweep_keeps_n_jobs_in_flight_and_a_pruned_trial_frees_its_slot(cluster, tmp_path):
    """Three trials, two in flight; lr=1e-7 stays above the threshold at its first eval and is pruned. squeue,
    polled meanwhile, shows at most two of the sweep's jobs at once, and the job of the next trial starting
    while the pruned trial's partner still runs."""
    sweep_dir = tmp_path / "sweep"
    overrides = (
        "sweep=grid",
        "optimizer.lr=choice(1e-2, 3e-3, 1e-7)",
        "sweep.pruner._target_=optuna.pruners.ThresholdPruner",
        "sweep.pruner.upper=5.45",
        "sweep.n_trials=3",
        "sweep.n_jobs=2",
        SMALL_DATA,
        # The other trials train well past the pruned one's step 3, whatever their start-up skew, and long enough for the
        # sweeper to see the prune and submit the next trial under load (40, then 150 steps were not, beside a busy
        # pytest worker: the sweeper's poll, sbatch and the queue took longer than the partner's remaining steps).
        "trainer.max_steps=500",
        f"hydra.sweep.dir={sweep_dir}",
    )
    sweeper = start(cluster, tmp_path / "console", *overrides)
    snapshots: list[set[str]] = []  # the jobs squeue lists as pending or running, every 0.1 s
    try:
        while sweeper.poll() is None:
            listed = cluster.command("squeue", "-h", "-o", "%i %T", check=False).stdout.splitlines()
            snapshots.append({line.split()[0] for line in listed if line.split()[1:2] and line.split()[1] in ("PENDING", "RUNNING", "CONFIGURING")})
            time.sleep(0.1)
    finally:
        sweeper.kill()
    output = (tmp_path / "console").read_text()
    assert sweeper.returncode == 0, output[-3000:]
    import optuna
    from optuna.trial import TrialState

    trials = optuna.load_study(study_name="grid", storage=f"sqlite:///{sweep_dir / 'optuna.db'}").trials
    assert [t.state for t in trials].count(TrialState.PRUNED) == 1 and len(trials) == 3, [(t.params, t.state) for t in trials]
    pruned = next(t.number for t in trials if t.state == TrialState.PRUNED)
    ids = {int(number): job for job, number in re.findall(r"SLURM job (\d+) submitted \(trial (\d+)", output)}
    assert max(len(s) for s in snapshots) == 2 and any(len(s) == 2 for s in snapshots), "two trials in flight, never more"
    assert pruned < 2, f"the grid's order put the pruned trial last ({[(t.number, t.params) for t in trials]}): choose other values"
    partner = ids[1 - pruned]
    # The pruned job leaves the queue while its partner runs, and trial 2's job is in the queue before the partner ends.
    changes = [s for i, s in enumerate(snapshots) if i == 0 or s != snapshots[i - 1]]
    freed = next((i for i, s in enumerate(snapshots) if ids[pruned] not in s and partner in s and i > 0 and ids[pruned] in snapshots[i - 1]), None)
    assert freed is not None, f"the pruned trial's job {ids[pruned]} never left the queue before job {partner}: {changes}"
    assert any(ids[2] in s and partner in s for s in snapshots[freed:]), f"the freed slot was not refilled while the other trial ran: {changes}"


def test_a_ladder_runs_as_a_job_and_its_failed_gate_exits_3(cluster, tmp_path):
    sweep_dir = tmp_path / "multirun"
    result = submit(cluster, "check=ladder", SMALL_DATA, "optimizer.lr=3000", "logger=[jsonl]", f"hydra.sweep.dir={sweep_dir}")
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-3000:]
    (job_id,) = job_ids(output)
    assert job_info(cluster, job_id)["JobState"] == "FAILED" and f"SLURM job {job_id} (#0): FAILED (exit code 3)" in output
    report = (sweep_dir / "0" / "report.md").read_text()
    assert "preflight" in report and "failed" in report
    assert [e["stage"] for e in read_journal(sweep_dir / "0" / "journal.jsonl") if e["type"] == "check"][:1] == ["skeleton"]


# --------------------------------------------------------------------------------- failing fast, saying why


def test_an_unresolvable_master_address_exits_2_naming_it(cluster, tmp_path):
    started = time.monotonic()
    result = submit(
        cluster,
        SMALL_DATA,
        "parallel=ddp",
        "parallel.nproc=2",
        f"hydra.sweep.dir={tmp_path}",
        'hydra.launcher.setup=["export CURRYTRAIN_MASTER_ADDR=nowhere.invalid"]',
    )
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert "CURRYTRAIN_MASTER_ADDR=nowhere.invalid does not resolve" in result.stderr
    assert time.monotonic() - started < 90


def test_a_rank_that_never_starts_fails_the_job_within_the_rendezvous_timeout(cluster, tmp_path):
    """Rank 1's interpreter hangs before it runs anything (a sitecustomize on its PYTHONPATH): rank 0 gives up
    after parallel.rendezvous_timeout, names what it saw, and SLURM ends the job (rank 1 included)."""
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text("import os, time\nif os.environ.get('SLURM_PROCID') == '1':\n    time.sleep(3600)\n")
    sweep_dir = tmp_path / "multirun"
    setup = f'hydra.launcher.setup=["export PYTHONPATH={hang}"]'
    started = time.monotonic()
    result = submit(cluster, SMALL_DATA, "parallel=ddp", "parallel.nproc=2", "parallel.rendezvous_timeout=4", f"hydra.sweep.dir={sweep_dir}", setup)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert re.search(
        r"the rendezvous at 127\.0\.0\.1:\d+ did not form within parallel\.rendezvous_timeout=4 s: ranks seen 0 \(\S+\); missing \[1\] of 2", result.stderr
    ), output[-3000:]
    (job_id,) = job_ids(output)
    assert job_info(cluster, job_id)["JobState"] == "FAILED" and elapsed < 90
    # currytrain diagnose on the multirun folder: the job, its state and the end of the failed task's stderr.
    diagnosis = subprocess.run(
        [str(Path(sys.executable).parent / "currytrain"), "diagnose", str(sweep_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **cluster.env},
    )
    assert diagnosis.returncode == 0, diagnosis.stderr
    assert f"job {job_id} (#0, run folder 0): FAILED" in diagnosis.stdout
    assert "did not form within parallel.rendezvous_timeout=4 s" in diagnosis.stdout


def test_a_partition_sbatch_refuses_exits_2_with_its_message_before_anything_runs(cluster, tmp_path):
    before = cluster.command("squeue", "-h", "--states=all", "-o", "%i").stdout.split()
    result = submit(cluster, "hydra.launcher.partition=nope", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert "sbatch refused the job" in result.stderr and "invalid partition" in result.stderr.lower()
    assert cluster.command("squeue", "-h", "--states=all", "-o", "%i").stdout.split() == before, "a job was submitted"
    assert not (tmp_path / "0").exists()


def test_hydra_launcher_slurm_without_sbatch_exits_2_naming_slurm_local(tmp_path):
    """No cluster needed: a PATH without SLURM's commands, as on a laptop."""
    result = launch_subprocess("-m", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}", env={"PATH": str(Path(sys.executable).parent)})
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert "sbatch" in result.stderr and "hydra/launcher=slurm_local" in result.stderr
    assert not (tmp_path / "0").exists()
