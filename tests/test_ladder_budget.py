"""The ladder's cost and its chance line: the plan measured from a step and cut to the budget before the ladder climbs,
said on the console and in the journal; and every stage whose evidence sits at chance says so instead of passing."""

from __future__ import annotations

from pathlib import Path

import pytest

from currytrain.build import build
from currytrain.check.budget import Costs, plan_ladder, scaled
from currytrain.check.capacity import Shape, capacity_finding
from currytrain.check.ladder import run_ladder
from currytrain.check.lr_range import Sweep, range_finding
from currytrain.check.scaling import Noise, scaling_findings
from currytrain.check.seeds import seeds_finding
from currytrain.check.stage import StageContext, Status
from currytrain.check.subruns import SubRun
from currytrain.journal import Journal, read_journal
from currytrain.parallel.state import ParallelState

CHANCE = 5.545  # ln 256


def _run(name: str, loss: float) -> SubRun:
    return SubRun(name, Path("."), loss, loss, 1000, 1.0, "finish")


def test_the_plan_cuts_the_training_stages_by_one_factor_to_fit_the_budget_and_keeps_their_floors(compose_cfg, tmp_path):
    cfg = compose_cfg("check=ladder", "model.n_layers=2")
    ladder = build(cfg.check)
    ctx = StageContext(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
    costs = Costs(step=0.1, build=0.5, sequences=4, seq_len=32, params=100_000, eval_batches=10, fit=0.01)
    generous = plan_ladder(ladder.stages, ctx, costs, budget=10_000)
    assert generous.factor == 1 and generous.steps["seeds"] == "200 steps" and generous.steps["scaling"] == "200 steps"
    floor = plan_ladder(build(cfg.check).stages, ctx, costs, budget=1)
    assert floor.factor == 0 and floor.steps["probe"] == "150 -> 50 steps" and floor.steps["lr_range"] == "100 -> 50 steps"
    assert f"budget 1 s: the training stages at their floors cost {floor.total:.0f} s, over it" in floor.summary(), floor.summary()
    assert "raise check.budget_seconds" in floor.summary() and "keep 0%" not in floor.summary(), "floors over the budget are no share kept"
    budget = (generous.total + floor.total) / 2
    tight = plan_ladder(build(cfg.check).stages, ctx, costs, budget=budget)
    assert 0 < tight.factor < 1 and budget * 0.97 < tight.total <= budget, tight.event()
    seeds, scaling = (int(tight.steps[name].split(" -> ")[1].split()[0]) for name in ("seeds", "scaling"))
    assert seeds == scaling == scaled(200, tight.factor, 40), "the scaling runs keep the steps whose noise the seeds measure"
    assert tight.seconds["sanity"] == generous.seconds["sanity"], "the overfit gate is never cut"


def test_a_ladder_says_what_it_will_cost_before_it_climbs_and_journals_the_plan(compose_cfg, tmp_path, one_thread, capsys):
    overrides = ("check=seeds", "data.max_bytes=300000", "logger=[jsonl]", "check.stages.seeds.max_steps=8", "check.stages.seeds.seeds=2")
    cfg = compose_cfg(*overrides, "check.budget_seconds=60", "check.step_seconds=0.5", "check.eval_batches=1")
    run_ladder(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
    printed = capsys.readouterr().out
    assert printed.index("check: plan: seeds") < printed.index("validation ladder"), "the plan comes before the climb"
    assert "one training step of the configured model takes 0.5 s here" in printed, "a given step time is planned with, not measured"
    events = read_journal(tmp_path / "journal.jsonl")
    (plan,) = [e for e in events if e["type"] == "check_plan"]
    assert plan["step_seconds"] == 0.5 and plan["budget_seconds"] == 60 and plan["factor"] == 1 and plan["steps"] == {"seeds": "8 steps"}
    assert 2 * 8 * 0.5 < plan["total_seconds"] < 60, "two seed runs of 8 steps at 0.5 s, a build and an eval each"
    report = (tmp_path / "report.md").read_text()
    assert "| stage | status | seconds | planned |" in report and f"| {plan['planned_seconds']['seeds']:.1f} |" in report
    seeds = [e for e in events if e["type"] == "subrun"]
    assert len(seeds) == 2 and all(Path(e["path"]).name.startswith("seed_") for e in seeds)


def test_a_plan_on_the_cpu_clock_says_so_and_a_clock_that_is_none_is_a_config_error(compose_cfg, tmp_path, one_thread):
    from currytrain.validate import validate

    cfg = compose_cfg("check=seeds", "data.max_bytes=300000", "check.plan_clock=cpu", "check.stages.seeds.max_steps=4")
    ctx = StageContext(cfg, ParallelState(), tmp_path, Journal(tmp_path / "journal.jsonl"))
    plan = build(cfg.check).plan(ctx)
    assert plan.costs.step > 0 and " s of CPU here" in plan.summary() and plan.event()["clock"] == "cpu"
    problems = validate(compose_cfg("check=ladder", "check.plan_clock=sundial"))
    assert any(p.startswith("check.plan_clock=sundial") and "wall" in p for p in problems), problems


def test_a_flat_sweep_never_passes_and_one_that_stays_at_chance_warns():
    flat = Sweep([1e-4, 1e-3, 1e-2, 1e-1], [5.55, 5.54, 5.56, 5.55], [5.55, 5.545, 5.55, 5.55], 1.0)
    finding = range_finding(flat, "steepest", 10.0, 0.1, learns=True, chance=CHANCE)
    assert finding.status is Status.WARNING and "needs more steps than the sweep" in finding.cause
    fallen = Sweep([1e-4, 1e-3, 1e-2, 1e-1, 1.0], [7.5, 6.5, 5.6, 5.55, 9.0], [7.5, 6.9, 6.2, 5.56, 9.0], 1.0)
    at_chance = range_finding(fallen, "steepest", 10.0, 0.1, chance=CHANCE)
    assert at_chance.status is Status.WARNING and "never takes the loss below chance" in at_chance.cause, at_chance
    assert range_finding(fallen, "steepest", 10.0, 0.1, chance=None).status is Status.PASSED, "without chance, the drop alone"


@pytest.mark.parametrize("losses", [[5.53, 5.54, 5.52], [2.1, 2.05, 2.2]])
def test_seeds_capacity_and_scaling_warn_when_their_evidence_sits_at_chance(losses):
    learnt = losses[0] < 5
    runs = [_run(f"s{i}", loss) for i, loss in enumerate(losses)]
    seeds = seeds_finding(runs, None, CHANCE)
    assert (seeds.status is Status.WARNING and "end at chance" in seeds.cause) is not learnt, seeds
    shapes = [Shape(64 * (i + 1), 2, 1000 * (i + 1), 10) for i in range(3)]
    capacity = capacity_finding(shapes, runs, 0.02, CHANCE)
    assert (capacity.status is Status.WARNING and "no shape leaves chance" in capacity.cause) is not learnt, capacity
    fitted = [loss + 0.01 * i for i, loss in enumerate([*losses, losses[-1]])]
    findings, _ = scaling_findings([1e4, 2e4, 4e4, 8e4], fitted, "dim_96", 160_000, [fitted[-1]], Noise(0.05, 2, "test"), bootstrap=5, chance=CHANCE)
    assert (findings[0].status is Status.WARNING and "ends at chance" in findings[0].cause) is not learnt, findings[0]
