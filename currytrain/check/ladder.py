"""The ladder: climb the configured stages in order, report each (report.md + PNGs, one journal event, a
console table) and raise GateFailed at the first failed gate. run_worker calls run_ladder when check is
not none, inside the parallel session it opened."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from currytrain.check.budget import Plan, measure_costs, plan_ladder
from currytrain.check.stage import Stage, StageContext, StageResult, Status
from currytrain.check.subruns import ladder_group
from currytrain.errors import GateFailed
from currytrain.journal import Journal
from currytrain.logger.base import ending_status, record_group
from currytrain.parallel.state import ParallelState

log = logging.getLogger(__name__)

REPORT = "report.md"


class Ladder:
    """The stages of `check.stages` (built Stage objects, by name), run in order. LadderConfig's fields."""

    def __init__(
        self,
        stages: dict[str, Any],
        stop_at_failure: bool = True,
        budget_seconds: float = 0.0,
        step_seconds: float = 0.0,
        eval_batches: int = 0,
        plan_clock: str = "wall",
    ):
        self.stages: dict[str, Stage] = dict(stages)
        self.stop_at_failure = stop_at_failure
        self.budget_seconds, self.step_seconds, self.eval_batches, self.plan_clock = budget_seconds, step_seconds, eval_batches, plan_clock

    def plan(self, ctx: StageContext) -> Plan | None:
        """The ladder's cost, planned from a measured step (currytrain.check.budget), the training stages cut to fit the
        budget; None for a ladder without a budget or a stage that trains (its cost is a few builds)."""
        if self.budget_seconds <= 0 and not any(stage.scalable for stage in self.stages.values()):
            return None
        eval_batches = self.eval_batches or int(ctx.cfg.trainer.eval_batches)
        costs = measure_costs(ctx, self.step_seconds, eval_batches, self.plan_clock)
        return plan_ladder(self.stages, ctx, costs, self.budget_seconds, clock=self.plan_clock)

    def climb(self, ctx: StageContext, results: list[StageResult] | None = None) -> list[StageResult]:
        """Every stage's result (appended to `results` as each ends), stopping after the first failed gate
        (stop_at_failure). A stage never raises (Stage.run turns an exception into its failed finding)."""
        results = [] if results is None else results
        for name, stage in self.stages.items():
            log.info("check: stage %s", name)
            result = stage.run(ctx)
            result.stage = name
            results.append(result)
            record(ctx, result)
            remember(ctx, result)
            if result.status is Status.FAILED and self.stop_at_failure:
                break
        return results


def remember(ctx: StageContext, result: StageResult) -> None:
    """Hand a stage's warnings and failures to the later stages (ctx.measured["alarms"], name -> cause), and the
    names of its passed findings (ctx.measured["passed"]): they may explain a later finding (a slow overfit by
    preflight's tiny group lr), or settle it (a flat lr sweep of a model whose overfit passed)."""
    alarms = ctx.measured.setdefault("alarms", {})
    alarms.update({f.name: f.cause for f in result.findings if f.status in (Status.WARNING, Status.FAILED)})
    ctx.measured.setdefault("passed", set()).update(f.name for f in result.findings if f.status is Status.PASSED)


def record(ctx: StageContext, result: StageResult) -> None:
    """One journal event per stage, with every finding."""
    findings = [dataclasses.asdict(finding) | {"status": finding.status.value, "seconds": round(finding.seconds, 3)} for finding in result.findings]
    figures = [str(Path(p).name) for p in result.figures]
    ctx.journal.event("check", stage=result.stage, status=result.status.value, seconds=round(result.seconds, 2), findings=findings, figures=figures)
    text = "\n".join(f"{f.status.value:7s} {f.name}: {f.observed}" for f in result.findings)
    ctx.loggers.log_text(f"check/{result.stage}", text, 0)


def run_ladder(cfg: DictConfig, state: ParallelState, run_dir: Path, journal: Journal) -> list[StageResult]:
    """Build cfg.check's ladder and climb it; write report.md and the console table (main rank).

    Raises GateFailed (exit code 3) naming the first failed gate, its cause and its fix.
    """
    from currytrain.build import allow_targets, build
    from currytrain.trainer.trainer import build_loggers

    allow_targets(cfg.build.allow)  # user stages: the project registers them (TARGETS), or the command line allows them
    ladder = build(cfg.check)
    record_group(journal, ladder_group(run_dir))  # the trackers show the sub-runs under this run
    loggers = build_loggers(cfg.logger, run_dir, enabled=state.is_main)
    ctx = StageContext(cfg, state, Path(run_dir), journal, loggers, overrides=run_overrides(Path(run_dir)))
    if ladder.eval_batches:
        ctx.subrun_overrides = [f"trainer.eval_batches={ladder.eval_batches}"]
    results: list[StageResult] = []
    plan = None
    status = "failed"  # the trackers show how the ladder's own run ended: a failed gate or a crash is failed
    try:
        plan = ladder.plan(ctx)
        if plan is not None:
            journal.event("check_plan", **plan.event())
            if state.is_main:
                print(plan.summary(), flush=True)
        results = ladder.climb(ctx, results)
        status = "failed" if any(result.status is Status.FAILED for result in results) else "finished"
    except BaseException as error:
        status = ending_status(error)
        raise
    finally:
        loggers.close(status)
        if state.is_main:  # report.md is written whatever happened, with every stage that ran
            from currytrain.check.report import print_table, write_report

            path = write_report(Path(run_dir) / REPORT, results, list(ladder.stages), plan.seconds if plan is not None else None)
            print_table(results)
            print(f"check: report in {path}")
    failed = next((result for result in results if result.status is Status.FAILED), None)
    if failed is not None:
        raise GateFailed(gate_message(failed, Path(run_dir) / REPORT))
    return results


def run_overrides(run_dir: Path) -> list[str]:
    """The command-line overrides in the run's journal header (none when the journal has no header)."""
    from currytrain.journal import read_journal

    journal = run_dir / "journal.jsonl"
    records = read_journal(journal) if journal.is_file() else []
    return list(records[0].get("overrides", [])) if records and records[0].get("type") == "header" else []


def gate_message(result: StageResult, report: Path) -> str:
    """The failed findings, each cause with its fix, the findings it explains listed under it."""
    lines = [f"check: stage {result.stage} failed its gate:"]
    failures = result.failures()
    roots = [f for f in failures if not f.consequence_of or f.consequence_of not in {g.name for g in failures}]
    for finding in roots:
        if finding.consequence_of:  # explained by a warning (or an earlier stage's finding): name it first
            lines.append(f"  - {finding.consequence_of} (the cause; see the report)")
        lines.append(f"  - {finding.name}: observed {finding.observed}; expected {finding.expected}")
        lines.append(f"    cause: {finding.cause}")
        lines.append(f"    fix: {finding.fix}")
        for consequence in (f for f in failures if f.consequence_of == finding.name and f is not finding):
            lines.append(f"    also seen, a consequence of it: {consequence.name}: {consequence.observed}")
    lines.append(f"  report: {report}")
    return "\n".join(lines)
