"""Stage probe: train the configured model on synthetic tasks that each need one mechanism (data=probe),
and score its answers on held-out sequences against chance.

A model that claims a mechanism (attention that can copy, an induction head, state that tracks parity)
should solve the task that needs it; one that stays near chance does not have it, whatever its loss on text
says. Each task is a run folder <run>/probe/<task>/ (the configured model and optimizer, data=probe with
that task, `max_steps` steps). Gate: accuracy >= `min_accuracy` on every task.
"""

from __future__ import annotations

from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.check.subruns import SubRun, budget_overrides, train_subrun
from currytrain.components import Components
from currytrain.data.probe import ProbeTasks, accuracy


def probe_node(ctx: StageContext, task: str, num_symbols: int, seq_len: int | None = None) -> dict:
    """data=probe's node for `task`: sequences of `seq_len` tokens (at most data.seq_len; null: data.seq_len)."""
    seq_len = min(seq_len or int(ctx.cfg.data.seq_len), int(ctx.cfg.data.seq_len))
    return {"_target_": "currytrain.data.probe.ProbeTasks", "task": task, "seq_len": seq_len, "num_symbols": num_symbols, "seed": int(ctx.cfg.seed)}


def task_finding(task: str, run: SubRun, chance: float, min_accuracy: float, gate: bool = True) -> Finding:
    expected = f"accuracy >= {min_accuracy:.0%} (chance {chance:.0%})"
    if not run.finished:
        return Finding(f"probe {task}", Status.FAILED, f"the run did not finish: {run.message[:200]}", expected, "training diverged", "lower optimizer.lr")
    score = run.measured["accuracy"]
    observed = f"accuracy {score:.1%} vs chance {chance:.0%} after {run.measured['steps']} steps"
    if score >= min_accuracy:
        return Finding(f"probe {task}", Status.PASSED, observed, expected)
    near = score < chance + 0.5 * (min_accuracy - chance)
    cause = (
        f"the model stays near chance on {task}: it lacks the mechanism the task needs"
        if near
        else f"the model learns {task} but not to the bar within the budget"
    )
    status = Status.FAILED if gate else Status.WARNING
    return Finding(f"probe {task}", status, observed, expected, cause, "check the component the task needs; or raise check.stages.probe.max_steps")


class Probe(Stage):
    """Accuracy on synthetic mechanism tasks against chance. Thresholds: ProbeStageConfig's fields."""

    name = "probe"
    needs_components = False

    def __init__(
        self,
        tasks: list[str] = ("copy", "induction"),
        max_steps: int = 1000,
        num_symbols: int = 16,
        seq_len: int | None = None,
        batch_size: int | None = None,
        overrides: list[str] = (),
        eval_batches: int = 8,
        min_accuracy: float = 0.9,
        gate: bool = True,
    ):
        self.tasks, self.max_steps, self.num_symbols, self.seq_len = list(tasks), max_steps, num_symbols, seq_len
        self.overrides = ([f"trainer.batch_size={batch_size}"] if batch_size else []) + list(overrides)
        self.eval_batches, self.min_accuracy, self.gate = eval_batches, min_accuracy, gate
        self.runs: dict[str, SubRun] = {}

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        for task in self.tasks:
            node = probe_node(ctx, task, self.num_symbols, self.seq_len)
            data = ProbeTasks(**{k: v for k, v in node.items() if k != "_target_"})

            def measure(trainer, data=data) -> dict:
                batch_size = int(trainer.cfg.batch_size)  # the trainer's own node
                return {"accuracy": accuracy(trainer.model, data, self.eval_batches, batch_size, trainer.state.device), "steps": trainer.step}

            run = train_subrun(ctx, self.name, task, budget_overrides(self.max_steps, self.overrides), replace={"data": node}, measure=measure)
            self.runs[task] = run
            result.findings.append(task_finding(task, run, data.chance, self.min_accuracy, self.gate))
        rows = [f"| {task} | {run.measured.get('accuracy', float('nan')):.1%} | {run.val_loss:.4f} | {run.seconds:.0f} |" for task, run in self.runs.items()]
        result.details = "\n".join(["| task | accuracy | val loss on answers | seconds |", "|---|---:|---:|---:|", *rows])
        return result
