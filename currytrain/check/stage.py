"""What a ladder stage is: a class built from its config node that turns a StageContext into a StageResult.

A stage builds what it probes through build_components (the way a run builds it) and hands the built
Components to `assess`, so tests inject broken models, optimizers or data by passing their own Components.
Each probe of a stage yields a Finding: passed, warning, failed or skipped (the probe does not apply), with what
was observed and expected and, when it did not pass, the likely cause and the fix. A finding that another
finding's bug explains names it in `consequence_of`, and is reported under it. A stage's status is its worst
finding (skipped when every finding is). An exception anywhere in a stage (building, a probe, the assessment)
becomes a failed finding naming where it raised: a stage never crashes the ladder.
"""

from __future__ import annotations

import enum
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from currytrain.components import Components, build_components
from currytrain.errors import ConfigError, Interrupted
from currytrain.journal import Journal
from currytrain.logger.base import MultiLogger
from currytrain.parallel.state import ParallelState

if TYPE_CHECKING:
    from currytrain.check.budget import Costs


class Status(str, enum.Enum):
    SKIPPED = "skipped"
    """The probe or stage does not apply here (no idea to ablate, a classifier on a next-token task, ...)."""
    PASSED = "passed"
    WARNING = "warning"
    FAILED = "failed"
    """A failed gate: the ladder stops here and the job exits 3."""

    @property
    def rank(self) -> int:
        return {"skipped": -1, "passed": 0, "warning": 1, "failed": 2}[self.value]


@dataclass
class Finding:
    """One probe's verdict."""

    name: str
    """What the probe checks ("gradient flow")."""
    status: Status
    observed: str
    """What the probe measured, with its unit."""
    expected: str
    """What a healthy setup gives (the threshold)."""
    cause: str = ""
    """What most likely produced a warning or failure."""
    fix: str = ""
    """What to change (a config key or the code to look at)."""
    seconds: float = 0.0
    """Wall time the probe took."""
    consequence_of: str = ""
    """The probe whose finding explains this one (one bug seen twice), reported under it; "" for a cause of its own."""


@dataclass
class StageResult:
    stage: str
    """The stage's name in check.stages."""
    findings: list[Finding] = field(default_factory=list)
    """One per probe, in the order they ran."""
    figures: list[Path] = field(default_factory=list)
    """PNGs the stage wrote into the run folder (report.md links them)."""
    details: str = ""
    """Extra markdown for the report (tables of parameter counts, component origins, statistics)."""
    seconds: float = 0.0
    """Wall time of the whole stage, building included."""

    @property
    def status(self) -> Status:
        return max((finding.status for finding in self.findings), key=lambda status: status.rank, default=Status.SKIPPED)

    def failures(self) -> list[Finding]:
        """The failed findings, each cause before the findings that are its consequences."""
        failed = [finding for finding in self.findings if finding.status is Status.FAILED]
        return sorted(failed, key=lambda finding: bool(finding.consequence_of))


@dataclass
class StageContext:
    """What every stage receives: the composed config, the open parallel session, the run folder,
    the journal and the loggers (histograms go there)."""

    cfg: DictConfig
    state: ParallelState
    run_dir: Path
    journal: Journal
    loggers: MultiLogger = field(default_factory=lambda: MultiLogger([]))
    datasets: dict[str, Any] = field(default_factory=dict)
    """Data adapters built for sub-runs, by their data config: runs that differ elsewhere share one."""
    overrides: list[str] = field(default_factory=list)
    """The overrides the run was composed with (its journal header's): a sub-run that chooses another option
    of a group (ablation's idea=[model=moe]) is composed again from these plus its own."""
    subrun_overrides: list[str] = field(default_factory=list)
    """Overrides every sub-run of this ladder starts from (the ladder's eval_batches), before the stage's own."""
    measured: dict[str, Any] = field(default_factory=dict)
    """What earlier stages of this ladder measured for later ones: "seed_std" (the seeds stage's std of the final
    val loss, with "seed_count" and "seed_steps"), so that later gates weigh their evidence against the noise
    measured in the same run."""

    def build(self) -> Components:
        """Fresh components, built exactly as a training run builds them."""
        return build_components(self.cfg, self.state)


class Stage:
    """Base of the ladder's stages. Subclasses take their thresholds as constructor arguments (the fields of
    their config dataclass) and implement assess(parts, ctx)."""

    name = "stage"
    needs_components = True
    """False for stages that only start their own training runs: assess() then gets parts=None."""
    scalable = False
    """True for stages whose training steps the ladder's budget may cut (scale())."""

    def cost(self, ctx: StageContext, costs: Costs) -> float:
        """Planned seconds of the stage at its current steps (currytrain.check.budget): by default a build and a few
        steps; stages that train say what their training costs."""
        return costs.build + costs.steps(3)

    def scale(self, factor: float) -> None:
        """Keep `factor` (0-1] of the configured training steps, never below the stage's floor (scalable stages)."""

    def planned_steps(self) -> str | None:
        """The stage's training budget as planned ("200 -> 90 steps"); None for a stage that does not train."""
        return None

    def run(self, ctx: StageContext) -> StageResult:
        """Build and assess; an exception anywhere in it is the stage's failed finding (never a crash)."""
        started = time.perf_counter()
        try:
            result = self.assess(ctx.build() if self.needs_components else None, ctx)
        except (ConfigError, Interrupted):  # bad input (exit 2) and a stop signal are the job's outcomes, not findings
            raise
        except Exception as error:  # the ladder reports it and writes report.md; the gate fails
            result = StageResult(self.name, [crash_finding(f"stage {self.name}", error)])
        result.seconds = time.perf_counter() - started
        return result

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        raise NotImplementedError


def probe(name: str, run: Callable[[], Finding]) -> Finding:
    """Run one probe; a probe that crashes is a failed finding naming the exception (the stage goes on)."""
    started = time.perf_counter()
    try:
        finding = run()
    except Exception as error:  # a crash inside a probe is itself the finding
        finding = crash_finding(name, error)
    finding.seconds = time.perf_counter() - started
    return finding


def crash_finding(name: str, error: BaseException) -> Finding:
    """A failed finding for an exception: where it raised and, when that is inside a library, the last frame of
    the project's or the user's code that led there."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return Finding(name, Status.FAILED, f"{type(error).__name__}: {error}", "the probe runs", f"{name} raised", "see the exception")
    where = frames[-1]
    cause = f"{name} raised at {where.filename}:{where.lineno} ({where.name})"
    own = [frame for frame in frames if "site-packages" not in frame.filename and "/lib/python" not in frame.filename]
    if own and own[-1] is not where:
        cause += f", reached from {own[-1].filename}:{own[-1].lineno} ({own[-1].name})"
    message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return Finding(name, Status.FAILED, f"{type(error).__name__}: {message}", "the probe runs", cause, "fix the code there")


def fmt(value: Any) -> str:
    """A number as the report shows it."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
