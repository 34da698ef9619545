"""An example ladder stage of your own: the model must fit a parameter budget.

    python launch.py check=sanity +check.stages.param_budget='{_target_:experiments.param_budget.ParamBudget,max_params:2000000}'

A stage subclasses currytrain.check.stage.Stage, takes its thresholds as constructor arguments (the keys of
its config node) and returns a StageResult of Findings from assess(parts, ctx). See docs/ladder.md.
"""

from __future__ import annotations

from currytrain.check.stage import Finding, Stage, StageContext, StageResult, Status
from currytrain.components import Components


class ParamBudget(Stage):
    name = "param_budget"

    def __init__(self, max_params: int = 10_000_000):
        self.max_params = max_params

    def assess(self, parts: Components, ctx: StageContext) -> StageResult:
        count = sum(p.numel() for p in parts.model.parameters())
        if count > self.max_params:
            finding = Finding(
                "parameter budget",
                Status.FAILED,
                f"{count:,} parameters",
                f"<= {self.max_params:,}",
                "the model is larger than the budget",
                "lower model.dim or model.n_layers",
            )
        else:
            finding = Finding("parameter budget", Status.PASSED, f"{count:,} parameters", f"<= {self.max_params:,}")
        return StageResult(self.name, [finding])
