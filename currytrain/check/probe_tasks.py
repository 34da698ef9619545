"""Stage probe: train the configured model on synthetic tasks that each need one mechanism (data=probe),
and score its answers on held-out sequences against chance.

A model that claims a mechanism (attention that can copy, an induction head, state that tracks parity)
should solve the task that needs it; one that stays near chance does not have it, whatever its loss on text
says. Each task is a run folder <run>/probe/<task>/ (the configured model and optimizer, data=probe with
that task, `max_steps` steps). Gate: accuracy >= `min_accuracy` on every task.

A task below the bar is run again at other seeds (`restarts`): a mechanism is called missing only when every
run stays near chance; one run that reaches the bar shows the model has it (induction heads form at a
different step in every seed), and runs that learn but stay below the bar say the budget is short, not that
the mechanism is absent. Models that do not predict the next token (a classifier) skip the stage.
"""

from __future__ import annotations

import math

from currytrain.check.budget import scaled, steps_text
from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.check.subruns import SubRun, budget_overrides, seed_overrides, shared_data, train_subrun
from currytrain.components import Components
from currytrain.data.probe import IGNORE, ProbeTasks, accuracy


def probe_node(ctx: StageContext, task: str, num_symbols: int, seq_len: int | None = None) -> dict:
    """data=probe's node for `task`: sequences of `seq_len` tokens (at most data.seq_len; null: data.seq_len)."""
    data_len = int(shared_data(ctx, ctx.cfg).seq_len)  # the adapter's own sequence length
    seq_len = min(seq_len or data_len, data_len)
    return {"_target_": "currytrain.data.probe.ProbeTasks", "task": task, "seq_len": seq_len, "num_symbols": num_symbols, "seed": int(ctx.cfg.seed)}


MECHANISMS = {
    "copy": "attention to a fixed distance back, which needs position information (a position encoding that reaches the attention)",
    "recall": "an associative lookup of the value stored after a key",
    "induction": "an induction head (a previous-token head, then a head matching the current token's earlier occurrence)",
    "parity": "state carried across the whole sequence",
    "selective_copy": "content-based selection of the data tokens among the noise",
}
"""What each task needs, named in the cause when a model stays at chance on it."""


def near_chance(score: float, chance: float, answers: int) -> bool:
    """Whether an accuracy measured on `answers` answer tokens is within noise of chance: no more than 3 binomial
    standard errors above it (a model at 12% on a 6% task, over thousands of answers, learns; it is not at chance)."""
    se = math.sqrt(chance * (1 - chance) / max(1, answers))
    return score <= chance + 3 * se + 0.01


def task_finding(task: str, runs: list[SubRun], chance: float, min_accuracy: float, gate: bool = True) -> Finding:
    """The verdict on one task from its runs (the first, then its restarts at other seeds). A mechanism is called
    missing only when every run stays within noise of chance; runs that learn but miss the bar warn that the budget
    is short, unless the stage does not gate (check=ladder's short budget), where they pass with that note."""
    expected = f"accuracy >= {min_accuracy:.0%} (chance {chance:.0%}) in some run"
    done = [run for run in runs if run.finished]
    if not done:
        return Finding(f"probe {task}", Status.FAILED, f"the run did not finish: {runs[0].message[:200]}", expected, "training diverged", "lower optimizer.lr")
    scores = [float(run.measured["accuracy"]) for run in done]
    steps = done[0].measured["steps"]
    listed = ", ".join(f"{score:.1%}" for score in scores)
    observed = f"accuracy {listed} vs chance {chance:.0%} after {steps} steps" + (f" ({len(scores)} seeds)" if len(scores) > 1 else "")
    best = max((score for score in scores if math.isfinite(score)), default=math.nan)
    if best >= min_accuracy:
        return Finding(f"probe {task}", Status.PASSED, observed, expected)
    if all(near_chance(score, chance, int(run.measured.get("answers", 0))) or not math.isfinite(score) for score, run in zip(scores, done)):
        cause = f"the model stays at chance on {task} in every one of {len(scores)} seeds: it lacks the mechanism the task needs: {MECHANISMS.get(task, task)}"
        return Finding(
            f"probe {task}",
            Status.FAILED if gate else Status.WARNING,
            observed,
            expected,
            cause,
            "check the component the task needs; or raise check.stages.probe.max_steps",
        )
    note = f"the model learns {task} (above chance beyond noise) but reaches no more than {best:.0%} within the budget: the mechanism forms, slowly"
    if not gate:
        return Finding(f"probe {task}", Status.PASSED, f"{observed}; {note} (check=probe trains it longer)", expected)
    return Finding(f"probe {task}", Status.WARNING, observed, expected, note, "raise check.stages.probe.max_steps (or the lr) to see it reach the bar")


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
        restarts: int = 1,
    ):
        self.tasks, self.max_steps, self.num_symbols, self.seq_len = list(tasks), max_steps, num_symbols, seq_len
        self.overrides = ([f"trainer.batch_size={batch_size}"] if batch_size else []) + list(overrides)
        self.eval_batches, self.min_accuracy, self.gate, self.restarts = eval_batches, min_accuracy, gate, restarts
        self.configured_steps, self.batch_size = max_steps, batch_size
        self.runs: dict[str, list[SubRun]] = {}

    scalable = True
    FLOOR = 50
    """Fewest steps a budget leaves each task (the debug model copies after 40-70)."""

    def cost(self, ctx: StageContext, costs) -> float:
        """Each task's run, and half of its restarts (a restart runs only when the first run misses the bar)."""
        seq_len = min(self.seq_len or costs.seq_len, costs.seq_len)
        return len(self.tasks) * (1 + 0.5 * self.restarts) * costs.subrun(self.max_steps, sequences=self.batch_size, seq_len=seq_len)

    def scale(self, factor: float) -> None:
        self.max_steps = scaled(self.configured_steps, factor, self.FLOOR)

    def planned_steps(self) -> str | None:
        return steps_text(self.configured_steps, self.max_steps)

    def assess(self, parts: Components | None, ctx: StageContext) -> StageResult:
        result = StageResult(self.name)
        data = shared_data(ctx, ctx.cfg)
        if hasattr(data, "expected_shapes"):
            inputs, targets = data.expected_shapes(2)
            if tuple(inputs) != tuple(targets):
                shapes = f"targets {tuple(targets)} for inputs {tuple(inputs)}"
                result.findings.append(Finding("probe", Status.SKIPPED, f"not a next-token model ({shapes})", "next-token targets", "", ""))
                return result
        for task in self.tasks:
            node = probe_node(ctx, task, self.num_symbols, self.seq_len)
            task_data = ProbeTasks(**{k: v for k, v in node.items() if k != "_target_"})

            def measure(trainer, task_data=task_data) -> dict:
                batch_size = int(trainer.cfg.batch_size)  # the trainer's own node
                score = accuracy(trainer.model, task_data, self.eval_batches, batch_size, trainer.state.device)
                answers = sum(int((task_data.batch("val", i, 0, batch_size)[1] != IGNORE).sum()) for i in range(self.eval_batches))
                return {"accuracy": score, "answers": answers, "steps": trainer.step}

            runs = []
            base = int(ctx.cfg.seed)
            for attempt in range(1 + self.restarts):
                seeds = seed_overrides(ctx, base + attempt) if attempt else []
                name = task if not attempt else f"{task}_seed_{base + attempt}"
                seeded_node = dict(node, seed=base + attempt)
                run = train_subrun(
                    ctx, self.name, name, budget_overrides(self.max_steps, self.overrides) + seeds, replace={"data": seeded_node}, measure=measure
                )
                runs.append(run)
                if run.finished and run.measured["accuracy"] >= self.min_accuracy:
                    break
            self.runs[task] = runs
            result.findings.append(task_finding(task, runs, task_data.chance, self.min_accuracy, self.gate))
        rows = [
            f"| {run.name} | {run.measured.get('accuracy', float('nan')):.1%} | {run.val_loss:.4f} | {run.seconds:.0f} |"
            for runs in self.runs.values()
            for run in runs
        ]
        result.details = "\n".join(["| run | accuracy | val loss on answers | seconds |", "|---|---:|---:|---:|", *rows])
        return result
