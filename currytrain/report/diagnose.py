"""`currytrain diagnose RUN`: read a run's journal and config and name what went wrong, with the fix.

Each check looks at the journal only (no torch), returns a Finding or None, and the most severe finding
comes first. `find_first_nan_module` (--anomaly) re-runs the config up to the first non-finite step with
forward hooks and names the first module whose output was not finite.
"""

from __future__ import annotations

import math
import re
import statistics
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from currytrain.cluster import slurm
from currytrain.journal import resume_command
from currytrain.report.runs import Run, load_run

OOM_SIGNS = ("out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory", "DefaultCPUAllocator")
KILL_SIGNS = ("SIGKILL", "Signals.SIGKILL", "exitcode: -9", "ChildFailedError", "killed")


@dataclass
class Finding:
    cause: str
    """A short name: nan, oom, killed, stall, divergence, plateau, crash, config_error, aborted, damaged_journal, ok."""
    summary: str
    fix: str
    step: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _failure_text(run: Run) -> str:
    failure = run.last("failure")
    return "" if failure is None else f"{failure.get('error', '')}: {failure.get('message', '')}\n{failure.get('traceback', '')}"


def _last_step(run: Run) -> int:
    return max((r.get("step", 0) for r in run.records if isinstance(r.get("step"), int)), default=0)


def check_config_error(run: Run) -> Finding | None:
    error = run.last("config_error")
    if error is None:
        return None
    return Finding("config_error", f"the config was rejected while building: {error.get('message')}", "change the config as the message says, then relaunch")


def check_oom(run: Run) -> Finding | None:
    text = _failure_text(run)
    if not any(sign in text for sign in OOM_SIGNS):
        return None
    wanted = re.search(r"(?:allocate|Tried to allocate)\s+([\d.]+\s*\w+)", text)
    frames = re.findall(r'File "[^"]*currytrain/([^"]+)", line \d+, in (\w+)', text)
    where = f" in {frames[-1][0]}:{frames[-1][1]}" if frames else ""
    amount = f" (asked for {wanted.group(1)})" if wanted else ""
    step = _last_step(run)
    return Finding(
        "oom",
        f"out of memory{where} at step {step}{amount}",
        "lower trainer.batch_size and raise trainer.grad_accum (same global batch), turn on model.ac=full, "
        "or shard the state across processes (parallel=zero1/zero2/fsdp); a smaller model/size if it fails while building",
        step,
    )


def check_killed(run: Run) -> Finding | None:
    text = _failure_text(run)
    failure = run.last("failure")
    if failure is not None and any(sign in text for sign in KILL_SIGNS):
        rank = failure.get("rank")
        who = f"worker rank {rank}" if rank is not None else "a worker"
        return Finding("killed", f"{who} was killed: {failure.get('message', '')[:200]}", _resume_fix(run), _last_step(run))
    if run.ending == "unfinished":
        last = run.records[-1] if run.records else {}
        return Finding(
            "killed",
            f"the run stopped without journaling how it ended (last event: {last.get('type')} at step {_last_step(run)}, {last.get('time', '?')}): "
            "the process was killed (SIGKILL, the OOM killer, a pre-emption) or is still running",
            _resume_fix(run),
            _last_step(run),
        )
    return None


def _resume_fix(run: Run) -> str:
    return f"continue from the last complete checkpoint: {resume_command(run.path)}"


def check_nan(run: Run) -> Finding | None:
    bad_steps = [r["step"] for r in run.records if r.get("type") == "metrics" and "step" in r and not math.isfinite(r.get("train/loss", 0.0))]
    bad_steps += [r["step"] for r in run.records if r.get("type") == "skip_step" and "step" in r]
    abort = run.last("abort")
    if abort and (match := re.search(r"non-?finite.*?step (\d+)|step (\d+): abort.non_finite", abort.get("message", ""))):
        bad_steps.append(int(match.group(1) or match.group(2)))
    failure = run.last("failure")
    if not bad_steps and not (failure and "final val loss is" in failure.get("message", "")):
        return None
    step = min(bad_steps, default=_last_step(run))
    precision = run.config.get("trainer.precision", "fp32")
    steps, norms = run.curve("train/grad_norm")
    before = [n for s, n in zip(steps, norms) if s < step and math.isfinite(n)]
    if step == 1:  # the first loss is computed before any update: the weights or the data as built
        likely = f"the loss was not finite from the first steps: the init scale (model.init_std={run.config.get('model.init_std')}) or the data"
        fix = "restore model.init_std=0.02 (or check the data adapter's token ids against model.vocab_size)"
    elif precision == "fp16":
        likely, fix = "fp16 overflow", "use trainer.precision=bf16 (or fp32)"
    else:
        spike = f"; the gradient norm rose to {max(before):.3g} before it" if before else ""
        likely = f"the learning rate (optimizer.lr={run.config.get('optimizer.lr')}) is too high for this model{spike}"
        fix = "lower optimizer.lr (3-10x), lengthen optimizer.schedule.warmup_steps, keep trainer.grad_clip=1.0; abort=strict rolls back automatically"
    return Finding(
        "nan",
        f"the loss first became non-finite at step {step}; likely cause: {likely}",
        fix + " (`currytrain diagnose RUN --anomaly` names the first module)",
        step,
    )


def check_crash(run: Run) -> Finding | None:
    failure = run.last("failure")
    if failure is None or failure.get("error") == "RunFailed":  # a non-finite final loss: check_nan's
        return None
    if any(sign in _failure_text(run) for sign in OOM_SIGNS + KILL_SIGNS):  # check_oom's and check_killed's
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', failure.get("traceback", ""))
    where = f" at {Path(frames[-1][0]).name}:{frames[-1][1]} in {frames[-1][2]}" if frames else ""
    return Finding(
        "crash",
        f"{failure.get('error')}{where}: {failure.get('message', '')[:300]}",
        "the traceback is in the journal's failure event (currytrain journal RUN)",
        _last_step(run),
    )


def check_straggler(run: Run) -> Finding | None:
    """A multi-process run that did not finish, one of whose ranks fell behind the others: the others wait
    for it in a collective, so it is the cause (from the per-rank heartbeats, currytrain/trainer/heartbeat.py)."""
    from currytrain.trainer.heartbeat import PHASE_WORDS, progress, read_heartbeats

    beats = read_heartbeats(run.path)
    if len(beats) < 2 or run.ending == "finish":
        return None
    behind = min(beats, key=lambda rank: progress(beats[rank]))
    ahead = [rank for rank in sorted(beats) if progress(beats[rank]) > progress(beats[behind])]
    if not ahead:
        return None
    slow, other = beats[behind], beats[ahead[0]]
    return Finding(
        "stall",
        f"rank {behind} stopped at step {slow['step']}, {PHASE_WORDS.get(slow['phase'], slow['phase'])}, while rank{'s' if len(ahead) > 1 else ''} "
        f"{', '.join(map(str, ahead))} reached step {other['step']}, {PHASE_WORDS.get(other['phase'], other['phase'])}: they wait for rank {behind}",
        f"look at what rank {behind} (pid {slow.get('pid')}) was doing: its log in workers/rank_{behind}.stderr, `py-spy dump --pid {slow.get('pid')}` "
        "while it hangs; a stuck data read (network filesystem), a fault on its node or device; then resume with trainer.resume=auto",
        slow["step"],
    )


def check_stall(run: Run) -> Finding | None:
    import datetime as dt

    timed = [(r, dt.datetime.fromisoformat(r["time"])) for r in run.records if r.get("type") in ("metrics", "eval", "checkpoint") and "time" in r]
    gaps = [((b - a).total_seconds(), ra) for (ra, a), (_, b) in zip(timed, timed[1:])]
    if len(gaps) < 4:
        return None
    typical = statistics.median(gap for gap, _ in gaps)
    gap, after = max(gaps, key=lambda item: item[0])
    if gap < max(10 * typical, 2.0):
        return None
    return Finding(
        "stall",
        f"the run stalled for {gap:.1f} s after step {after.get('step')} ({gap / max(typical, 1e-9):.0f}x the typical {typical:.2f} s between records)",
        "look for a slow filesystem (checkpoint or data reads), another job on the machine, or a rank waiting in a collective (per-rank logs in the run folder)",
        after.get("step"),
    )


def check_divergence(run: Run) -> Finding | None:
    steps, values = run.evals()
    finite = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
    if len(finite) < 2:
        return None
    best_step, best = min(finite, key=lambda item: item[1])
    last_step, last = finite[-1]
    if last_step == best_step or last < best * 1.1:
        return None
    return Finding(
        "divergence",
        f"val loss rose from its best {best:.4f} (step {best_step}) to {last:.4f} (step {last_step})",
        "lower optimizer.lr, lengthen warmup, keep trainer.grad_clip=1.0; or stop earlier (abort.patience)",
        best_step,
    )


def check_plateau(run: Run) -> Finding | None:
    steps, values = run.evals()
    if len(values) < 4 or not all(math.isfinite(v) for v in values):
        return None
    half = values[len(values) // 2 :]
    if half[0] == 0:  # nothing left to learn, or a loss that is not a loss: no plateau to name
        return None
    change = (half[0] - half[-1]) / abs(half[0])
    if abs(change) >= 0.01:  # still improving, or getting worse (check_divergence's)
        return None
    return Finding(
        "plateau",
        f"val loss moved {change:.2%} over the last {len(half)} evals (steps {steps[len(values) // 2]}-{steps[-1]})",
        "raise optimizer.lr (an LR range test finds it), check that the data is not exhausted or repeating, or grow the model",
        steps[-1],
    )


CHANCE_MARGIN = 0.05
"""Nats below ln C a final val loss must reach to count as learned (currytrain.check.probes.CHANCE_MARGIN)."""


def check_chance(run: Run) -> Finding | None:
    """A run that finished at chance: its final val loss no lower than ln C, C the classes its data declared (the
    journal's start event holds the adapter's description: num_classes, else vocab_size)."""
    start, loss = run.last("start"), run.final_val_loss
    data = (start or {}).get("data") or {}
    classes = data.get("num_classes") or data.get("vocab_size") if isinstance(data, dict) else None
    if not classes or loss is None or not math.isfinite(loss) or loss <= math.log(classes) - CHANCE_MARGIN:
        return None
    return Finding(
        "chance",
        f"the final val loss {loss:.4f} is at chance, ln({classes}) = {math.log(classes):.4f}: the model learned nothing a uniform guess does not know",
        "run check=sanity (the loss at init, overfitting one batch) and check=lr_range on this config; a fine-tune that stays at chance "
        "usually did not load its weights (trainer.init_from) or trains at a tiny lr",
        _last_step(run),
    )


def check_aborted(run: Run) -> Finding | None:
    abort = run.last("abort")
    if abort is None:
        return None
    return Finding(
        "aborted",
        f"an abort condition stopped the run: {abort.get('message')}",
        "see the condition's key in the message (abort.*) and its cause above",
        _last_step(run),
    )


CHECKS = (
    check_config_error,
    check_oom,
    check_straggler,
    check_killed,
    check_nan,
    check_crash,
    check_divergence,
    check_stall,
    check_chance,
    check_plateau,
    check_aborted,
)


def diagnose(path: str | Path) -> list[Finding]:
    """Every finding for the run at `path`, most severe first; one `ok` finding for a healthy run."""
    run = load_run(Path(path))
    findings = [finding for check in CHECKS if (finding := check(run))]
    if run.skipped:
        shown = "; ".join(run.skipped[:5]) + (f"; and {len(run.skipped) - 5} more" if len(run.skipped) > 5 else "")
        findings.append(
            Finding(
                "damaged_journal",
                f"{len(run.skipped)} line(s) of journal.jsonl are not records and were skipped ({shown})",
                "nothing to do for the run (a kill or power cut tears a line; the records around it are read); restore the file if it was edited",
            )
        )
    if not findings:
        findings.append(Finding("ok", f"the run finished normally at step {_last_step(run)} with val loss {run.final_val_loss:.4f}", "nothing to fix"))
    return findings


def checked_run_config(path: Path) -> Any:
    """A run folder's resolved.yaml, validated as a launch validates its config before anything is built from it: a
    run folder is not trusted, so its own build.allow is dropped and every _target_ must be a registered component."""
    from currytrain.errors import ConfigError, format_problems
    from currytrain.validate import typed_run_config, validate
    from currytrain.weights import RESOLVED, read_yaml_mapping

    resolved = path / RESOLVED
    if not resolved.is_file():
        raise ConfigError(f"{path} has no {RESOLVED}: --anomaly re-runs a run's config, pass the run folder that holds it")
    data = read_yaml_mapping(resolved)
    data["build"] = {"allow": []}  # what a run folder allows is not the reader's to trust
    cfg, problems = typed_run_config(data)
    if not problems:
        try:
            problems = validate(cfg)
        except Exception as error:  # a file of the wrong shape trips a check: refused, as is any problem
            problems = [f"it cannot be validated ({type(error).__name__}: {error})"]
    if problems:
        raise ConfigError(f"--anomaly does not re-run {resolved}:\n" + format_problems(problems))
    return cfg


def find_first_nan_module(path: str | Path, max_steps: int) -> tuple[int, str] | None:
    """Re-run the run's config for up to max_steps with forward hooks: (step, module) of the first module
    whose output was not finite, or None if every output stayed finite."""
    import torch

    from currytrain.components import build_components
    from currytrain.parallel.state import ParallelState
    from currytrain.trainer.step import run_accumulated_step

    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")  # skipped steps are the point here
    cfg = checked_run_config(Path(path))
    parts = build_components(cfg, ParallelState())
    found: list[str] = []

    def hook(name: str):
        def check(module, inputs, output):
            if not found and isinstance(output, torch.Tensor) and not torch.isfinite(output).all():
                found.append(name)

        return check

    handles = [module.register_forward_hook(hook(name or "model")) for name, module in parts.model.named_modules()]
    try:
        for step in range(1, max_steps + 1):
            batches = [parts.data.batch("train", step, micro, cfg.trainer.batch_size) for micro in range(cfg.trainer.grad_accum)]
            run_accumulated_step(parts.model, parts.optimizer, batches, grad_clip=cfg.trainer.grad_clip, autocast_dtype=parts.autocast_dtype)
            parts.scheduler.step()
            if found:
                return step, found[0]
    finally:
        for handle in handles:
            handle.remove()
    return None


# ------------------------------------------------------------------------------ a multirun of SLURM jobs


@dataclass
class JobDiagnosis:
    """One SLURM job of a multirun folder: its id, run folder and state, the end of a failed task's stderr,
    and what `diagnose` finds in its run folder."""

    job_id: str
    label: str
    run_folder: str
    state: str
    description: str
    stderr: str | None
    stderr_tail: list[str]
    findings: list[Finding]

    def as_dict(self) -> dict:
        return {**asdict(self), "findings": [finding.as_dict() for finding in self.findings]}

    def lines(self) -> list[str]:
        lines = [f"job {self.job_id} ({self.label}, run folder {Path(self.run_folder).name}): {self.description}"]
        if self.stderr_tail:
            lines.append(f"  the end of {self.stderr}:")
            lines += [f"    {line}" for line in self.stderr_tail]
        lines += [f"  run: {finding.cause}: {finding.summary}" for finding in self.findings]
        return lines


def diagnose_jobs(folder: str | Path) -> list[JobDiagnosis]:
    """The SLURM jobs of a multirun folder (the launcher's slurm_jobs.jsonl), with the controller's current
    state of those it still knows. A job that did not complete shows the end of its failed task's stderr."""
    folder = Path(folder).expanduser()
    records = slurm.read_records(folder)
    live = slurm.job_states(records) or {}
    diagnoses = []
    for job_id, record in records.items():
        state = live.get(job_id)
        known = state is not None and state.state != slurm.GONE
        name, description = (state.state, state.describe()) if known else (record.state, record.description)
        stderr, tail = None, []
        if name != "COMPLETED" and name in slurm.TERMINAL:
            stderr, tail = _failed_task_stderr(record.logs[::2])
        run_dir = folder / str(record.job_num)
        findings = [f for f in diagnose(run_dir) if f.cause != "ok"] if (run_dir / "journal.jsonl").is_file() else []
        diagnoses.append(JobDiagnosis(job_id, record.label, str(run_dir), name, description, stderr, tail, findings))
    return diagnoses


def _failed_task_stderr(stderrs: list[str]) -> tuple[str | None, list[str]]:
    """The stderr of the task that failed (the first whose end holds an error), else the first one not empty."""
    tails = [(path, slurm.stderr_tail(Path(path))) for path in stderrs]
    for path, tail in tails:
        if any(sign in line for line in tail for sign in ("Error", "Traceback", "curryTrain:")):
            return path, tail
    return next(((path, tail) for path, tail in tails if tail), (None, []))
