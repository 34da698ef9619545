"""Typed configs of the check group (conf/check/): the ladder's options and the thresholds of each stage.

An option of the group is a ladder: an ordered dict of stages, each a node with the `_target_` of its Stage
class and that stage's thresholds. check=skeleton and check=preflight run one stage, check=sanity the
first three, check=ladder every stage that exists. A user's stage is one more entry of `check.stages`
whose `_target_` lives in experiments/ (see docs/ladder.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import bounded, one_of


@dataclass
class NoCheckConfig:
    """check=none: train directly, no validation-ladder stage."""

    _target_: str | None = None


@dataclass
class SkeletonConfig:
    """Stage skeleton: build everything, one forward pass, shapes, parameter counts, component origins."""

    _target_: str = "currytrain.check.skeleton.Skeleton"
    batch_size: int = bounded(2, ge=1)
    """Sequences in the batch the stage inspects and runs forward."""


@dataclass
class PreflightConfig:
    """Stage preflight: assertions about the training step that take seconds (see docs/ladder.md)."""

    _target_: str = "currytrain.check.preflight.Preflight"
    batch_size: int = bounded(4, ge=1)
    """Sequences per batch in every probe of this stage."""
    allow_frozen: list[str] = field(default_factory=list)
    """Parameter-name prefixes that are frozen on purpose (requires_grad=False); any other frozen parameter fails."""
    grad_tolerance: float = bounded(1e-5, gt=0)
    """Relative difference allowed between the gradients of two identical steps (zero_grad probe)."""
    causal_tolerance: float = bounded(1e-4, gt=0)
    """Largest change of the logits at positions <= t allowed when tokens after t change (relative to their scale)."""
    leak_steps: int = bounded(10, ge=1)
    """Steps trained on uniformly random tokens in the leakage probe."""
    leak_margin: float = bounded(0.25, gt=0)
    """Nats below ln(data vocabulary) the loss on random tokens may reach before the labels count as leaked
    (a model that cannot see the labels stays within noise of ln(V): it cannot memorise fresh random windows)."""
    overlap_windows: int = bounded(64, ge=1)
    """Val windows (of data.seq_len tokens) searched for in the train stream."""
    max_overlap: float = bounded(0.25, ge=0, le=1)
    """Largest share of those val windows allowed to occur verbatim in the train stream (above it fails)."""
    warn_overlap: float = bounded(0.05, ge=0, le=1)
    """Share of val windows found in train above which the probe warns (below it, shared boilerplate is only reported)."""
    slow_group_ratio: float = bounded(30.0, gt=0)
    """Warn when a parameter group's peak lr is more than this factor below the fastest group's (muP's hidden
    matrices excepted): those parameters learn that many times slower."""
    near_distance: float = bounded(0.05, gt=0)
    """Tables (data=digits|table): a val row within this root-mean-square distance of a train row, per feature
    in train standard deviations, is a near duplicate."""
    max_duplicate_share: float = bounded(0.0, ge=0, le=1)
    """Tables: largest share of val (or test) rows allowed an exact or near duplicate in train."""
    target_threshold: float = bounded(0.99, gt=0, le=1)
    """Tables: a feature that alone predicts at least this share of the val classes encodes the target."""
    init_growth: float = bounded(3.0, gt=1)
    """Warn when the residual stream's variance at init, on random token ids, grows by more than this factor from the
    first repeated block's input to the last block's output, in models of 8 or more blocks (writes scaled with depth
    keep it under 2; GPT-2's 12 layers without the scaling reach 3.5-3.8)."""
    balance_response: float = bounded(0.5, gt=0, le=1)
    """Top-k routing: warn when the balancing term grows by less than this share of E/k - 1 as every token is routed to
    one expert (a Switch-style load-balancing loss grows by all of it)."""


@dataclass
class SanityConfig:
    """Stage sanity: init loss vs chance, overfit one batch, per-layer gradient and activation statistics."""

    _target_: str = "currytrain.check.sanity.Sanity"
    init_batches: int = bounded(4, ge=1)
    """Val batches (of batch_size sequences) averaged for the loss at init."""
    batch_size: int = bounded(8, ge=1)
    """Sequences per batch for the init loss and the layer statistics."""
    init_tolerance: float = bounded(0.5, gt=0)
    """Nats the loss at init may differ from ln(vocab_size) (a uniform prediction)."""
    overfit_sequences: int = bounded(3, ge=1)
    """Sequences in the one batch the model must memorise."""
    overfit_steps: int = bounded(600, ge=1)
    """Most optimizer steps allowed to memorise it (stops as soon as the loss is below overfit_loss)."""
    overfit_loss: float = bounded(0.2, gt=0)
    """Loss (nats/token) the batch must go below: the gate."""
    stats_steps: int = bounded(5, ge=1)
    """Training steps over which per-layer gradient and activation statistics are gathered."""
    vanishing_ratio: float = bounded(1e-3, gt=0)
    """Warn when one block's gradient norm is below this fraction of another's (vanishing/exploding with depth)."""
    activation_growth: float = bounded(100.0, gt=0)
    """Warn when the activation std grows by more than this factor from the first block to the last."""
    dead_fraction: float = bounded(0.5, gt=0, le=1)
    """Warn when more than this share of a block's linear-layer inputs is zero on every token (dead units)."""


@dataclass
class ResumeConfig:
    """Stage resume: N steps in one go against N/2, a checkpoint, a resume and N/2 more, bit for bit on one process."""

    _target_: str = "currytrain.check.resume.Resume"
    steps: int = bounded(4, ge=2)
    """Optimizer steps of each run (the checkpoint is written after half of them)."""


@dataclass
class LRRangeConfig:
    """Stage lr_range: exponential lr sweep over fresh batches, smoothed loss, divergence, a suggested lr."""

    _target_: str = "currytrain.check.lr_range.LRRange"
    min_lr: float = bounded(1.0e-5, gt=0)
    """First lr of the sweep (peak lr of the first parameter group; muP groups keep their ratio)."""
    max_lr: float = bounded(10.0, gt=0)
    """Last lr of the sweep, if the loss has not diverged before."""
    steps: int = bounded(100, ge=3)
    """Optimizer steps of the sweep, one per lr, evenly spaced in log(lr)."""
    batch_size: int = bounded(16, ge=1)
    """Sequences per step (a fresh batch every step)."""
    smoothing: float = bounded(0.9, ge=0, lt=1)
    """Coefficient of the loss's exponential moving average (bias-corrected); 0 disables smoothing."""
    diverge_factor: float = bounded(4.0, gt=0)
    """The sweep stops once the smoothed loss exceeds this multiple of its minimum."""
    rule: str = "steepest"
    """steepest: the lr where the smoothed loss falls fastest per decade; min_loss: the lr at the smoothed minimum
    / min_loss_divisor. On the debug model steepest came within 2.3x of a grid's best lr, min_loss 15x above it."""
    min_loss_divisor: float = bounded(10.0, gt=0)
    """Divisor of the min_loss rule."""
    min_drop: float = 0.1
    """Nats the smoothed loss must fall during the sweep (else the model does not learn: the gate)."""
    lr_tolerance: float = bounded(3.0, gt=0)
    """Warn when optimizer.lr is more than this factor away from the suggestion."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = one_of(node, path, "rule", ("steepest", "min_loss"))
        if node.min_lr > 0 and not node.max_lr > node.min_lr:
            problems.append(f"{path}.max_lr={node.max_lr} must be above {path}.min_lr={node.min_lr}: pass {path}.max_lr=10.0")
        return problems


@dataclass
class MupCheckConfig:
    """Stage mup: muP's coordinate check, activation/update/gradient scales per layer type against width."""

    _target_: str = "currytrain.check.mup.MupCheck"
    widths: list[int] = bounded(default_factory=lambda: [64, 128, 256], ge=1)
    """Values of model.dim to build (hidden sizes scale alike; each must divide by model.n_heads)."""
    steps: int = bounded(5, ge=1)
    """Adam steps on one fixed batch at every width."""
    batch_size: int = bounded(8, ge=1)
    """Sequences in that batch."""
    lr: float | None = bounded(None, gt=0, example=0.003)
    """Constant lr of the steps (null: optimizer.lr); muP's per-layer ratios are kept."""
    tolerance: float = bounded(2.0, gt=0)
    """Largest max/min ratio across widths allowed for each activation and update scale (the gate)."""
    standard_fails: bool = True
    """With model.mup=false, a width-dependent model fails the gate; false makes it a warning (check=ladder)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = []
        if len(node.widths) < 2:
            problems.append(f"{path}.widths={list(node.widths)} needs at least two positive widths: pass {path}.widths=[64,128,256]")
        return problems


@dataclass
class SeedsConfig:
    """Stage seeds: k seeds of the config at a small budget; mean, std, 95% CI and detectable effect."""

    _target_: str = "currytrain.check.seeds.Seeds"
    seeds: int = bounded(3, ge=2)
    """Seeds trained (seed, seed+1, ...); at least 2 for a std."""
    max_steps: int | None = bounded(400, ge=1)
    """Steps of each seed run (null: trainer.max_steps); 400 steps of the default 8 sequences."""
    max_std: float | None = bounded(None, gt=0, example=0.05)
    """Warn when the std of the final val loss across seeds exceeds this (nats); null: the relative rule below."""
    max_std_share: float = bounded(0.1, gt=0)
    """With max_std null: warn when the std exceeds this share of the chance loss ln C (C the data's classes; 0.55
    nats for bytes): seeds that far apart mean unstable training, not luck."""
    overrides: list[str] = field(default_factory=list)
    """Extra overrides of every seed run ("trainer.batch_size=16")."""


@dataclass
class AblationConfig:
    """Stage ablation: baseline vs an idea over seeds at a small budget, with a noise-aware verdict."""

    _target_: str = "currytrain.check.ablation.Ablation"
    idea: list[str] = field(default_factory=list)
    """Overrides that make the idea: values ("optimizer.lr=0.01", "model.n_layers=6") or other options of groups
    ("model=moe", "experiment=my_idea"), for which the arm is composed again; empty skips the stage."""
    baseline: list[str] = field(default_factory=list)
    """Overrides of both arms (the baseline is the configured run with these)."""
    seeds: int = bounded(3, ge=2)
    """Seeds per arm (at least 2: the verdict needs each arm's noise)."""
    max_steps: int | None = bounded(400, ge=1)
    """Steps of each run (null: trainer.max_steps)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = []
        bad = [item for item in list(node.idea) + list(node.baseline) if "=" not in str(item)]
        if bad:
            problems.append(f"{path}.idea/baseline hold {bad}, which are not key=value overrides: pass {path}.idea=[optimizer.lr=0.01]")
        return problems + unknown_options(path, [str(item) for item in list(node.idea) + list(node.baseline) if "=" in str(item)])


def unknown_options(path: str, overrides: list[str]) -> list[str]:
    """Problems for overrides that choose an option a config group does not have (idea=[model=nope])."""
    from currytrain.check.subruns import hydra_context

    problems = []
    with hydra_context() as (loader, _):
        for override in overrides:
            group, _, option = override.partition("=")
            options = loader.get_group_options(group) if group.replace("/", "").isidentifier() else []
            if options and option not in options:
                problems.append(f"{path}.idea/baseline hold {override}: {group} has no option {option}; choose one of {options}")
    return problems


@dataclass
class CapacityConfig:
    """Stage capacity: width x depth at the configured model's compute, train loss against parameters."""

    _target_: str = "currytrain.check.capacity.Capacity"
    widths: list[int] = bounded(default_factory=lambda: [64, 128, 192], ge=1)
    """Values of model.dim (hidden sizes scale alike; each must divide by model.n_heads)."""
    depths: list[int] = bounded(default_factory=lambda: [2, 4], ge=1)
    """Values of model.n_layers; every (width, depth) pair trains."""
    budget_steps: int = bounded(200, ge=1)
    """The compute budget: what the configured model spends in this many steps (others get as many steps as spend the same)."""
    min_steps: int = bounded(10, ge=1)
    """Fewest steps any shape trains."""
    min_gain: float = bounded(0.02, gt=0)
    """Nats a larger model must gain over the saturation point to move it."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = []
        if len(node.widths) * len(node.depths) < 2:
            problems.append(f"{path}.widths x {path}.depths must give at least two positive shapes: pass {path}.widths=[64,128,192] {path}.depths=[2,4]")
        return problems


@dataclass
class ScalingConfig:
    """Stage scaling: runs at several widths, L(N) = E + A N^-alpha with bootstrap CIs, a held-out size weighed
    against the seed noise measured in the same run."""

    _target_: str = "currytrain.check.scaling.Scaling"
    widths: list[int] = bounded(default_factory=lambda: [32, 48, 64, 96, 128], ge=1)
    """Values of model.dim (hidden sizes scale alike); the largest is held out and predicted from the others."""
    max_steps: int | None = bounded(400, ge=1)
    """Steps of every size (the same tokens for each; null: trainer.max_steps)."""
    bootstrap: int = bounded(500, ge=1)
    """Residual-bootstrap refits for the intervals."""
    target_params: int = bounded(0, ge=0)
    """Extrapolate the fit to this many parameters (0: no extrapolation)."""
    seed_std: float = bounded(0.0, ge=0)
    """Seed-to-seed std of one run's val loss (nats), taken as known. 0: the std the seeds stage of the same ladder
    measured, else the std of noise_seeds extra seeds of the held-out size, trained by this stage."""
    noise_seeds: int = bounded(2, ge=1)
    """Extra seeds of the held-out size trained when no seed noise is known (at least 1: a std needs two runs)."""
    alpha: float = bounded(0.05, gt=0, lt=1)
    """The held-out size warns when the test of "it follows the fit" gives p below this."""
    fail_alpha: float = bounded(0.001, gt=0, lt=1)
    """...and fails below this: a miss that the fit's spread and the measured seed noise leave no doubt about."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = []
        if len(set(node.widths)) < 5:
            problems.append(f"{path}.widths={list(node.widths)} needs 5 distinct widths (4 to fit, 1 held out): pass {path}.widths=[32,48,64,96,128]")
        if not 0 < node.fail_alpha <= node.alpha < 1:
            problems.append(
                f"{path}.fail_alpha={node.fail_alpha} and alpha={node.alpha} must satisfy 0 < fail_alpha <= alpha < 1: pass {path}.alpha=0.05 {path}.fail_alpha=0.001"
            )
        return problems


@dataclass
class ProbeStageConfig:
    """Stage probe: the configured model trained on synthetic mechanism tasks (data=probe), accuracy vs chance."""

    _target_: str = "currytrain.check.probe_tasks.Probe"
    tasks: list[str] = field(default_factory=lambda: ["copy", "induction"])
    """Tasks of data=probe to train on, one run each: copy, recall, induction, parity, selective_copy."""
    max_steps: int = bounded(1000, ge=1)
    """Steps of each task's run. The debug model copies after about 200 steps of 32 sequences; its induction
    head forms between steps 300 and 500 (docs/ladder.md)."""
    batch_size: int | None = bounded(32, ge=1)
    """Sequences per step of each task's run (null: trainer.batch_size); the budgets above were measured at 32."""
    num_symbols: int = bounded(16, ge=2)
    """Alphabet of the tasks' content."""
    seq_len: int | None = bounded(32, ge=8)
    """Tokens per task sequence, at most data.seq_len (null: data.seq_len). Short sequences train the mechanism
    in fewer, cheaper steps; the debug model solves copy and induction at 32."""
    overrides: list[str] = field(default_factory=list)
    """Extra overrides of every task's run ("optimizer.lr=1e-2", "trainer.batch_size=64")."""
    eval_batches: int = bounded(8, ge=1)
    """Val batches (of trainer.batch_size sequences) the accuracy is measured on."""
    min_accuracy: float = bounded(0.9, gt=0, le=1)
    """Share of answer tokens right needed on every task (the gate)."""
    gate: bool = True
    """false: a task below min_accuracy warns instead of failing (check=ladder: a model may lack a mechanism on purpose)."""
    restarts: int = bounded(1, ge=0)
    """Runs at other seeds of a task that missed the bar: a mechanism is called missing only when every run stays
    near chance (one induction head forms later than another's)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        from currytrain.data.probe import TASKS

        problems = []
        unknown = [task for task in node.tasks if task not in TASKS]
        if unknown or not node.tasks:
            problems.append(f"{path}.tasks={list(node.tasks)} must be a non-empty subset of {list(TASKS)}: pass {path}.tasks=[copy,induction]")
        return problems


@dataclass
class LadderConfig:
    """The stages to climb, in order; the first failed gate stops the ladder (exit code 3)."""

    _target_: str = "currytrain.check.ladder.Ladder"
    stages: dict[str, Any] = field(default_factory=dict)
    """Stage name -> its config (a `_target_` Stage class and its thresholds), run in this order."""
    stop_at_failure: bool = True
    """Stop at the first stage whose gate fails; false runs every stage and fails at the end."""
    budget_seconds: float = bounded(0.0, ge=0)
    """Wall seconds the ladder may take: its cost is planned before it starts from a measured training step, and the
    training stages' steps are cut by one factor (never raised, never below each stage's floor) until it fits. 0: every
    stage at its configured steps (the plan is still printed when a stage trains)."""
    step_seconds: float = bounded(0.0, ge=0)
    """Seconds of one training step of the configured model to plan with; 0: measured at the start (a few steps). A
    fixed value makes the plan, and so the steps, the same on every machine."""
    eval_batches: int = bounded(0, ge=0)
    """Val batches each sub-run of the ladder evaluates its final loss on; 0: trainer.eval_batches."""
    plan_clock: str = "wall"
    """How the plan times its step: wall (the seconds you wait here) or cpu (this process's CPU seconds, every thread's:
    on a machine other jobs keep busy, the step a quiet one would take with one thread; the plan and its steps then do
    not follow the load)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return one_of(node, path, "plan_clock", ("wall", "cpu"))


@dataclass
class SkeletonCheckConfig(LadderConfig):
    """check=skeleton: the skeleton stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"skeleton": SkeletonConfig()})


@dataclass
class PreflightCheckConfig(LadderConfig):
    """check=preflight: the preflight stage alone (seconds)."""

    stages: dict[str, Any] = field(default_factory=lambda: {"preflight": PreflightConfig()})


@dataclass
class SanityCheckConfig(LadderConfig):
    """check=sanity: skeleton, preflight, then sanity."""

    stages: dict[str, Any] = field(default_factory=lambda: {"skeleton": SkeletonConfig(), "preflight": PreflightConfig(), "sanity": SanityConfig()})


@dataclass
class ResumeCheckConfig(LadderConfig):
    """check=resume: the resume stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"resume": ResumeConfig()})


@dataclass
class LRRangeCheckConfig(LadderConfig):
    """check=lr_range: the lr_range stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"lr_range": LRRangeConfig()})


@dataclass
class MupCheckCheckConfig(LadderConfig):
    """check=mup: the mup stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"mup": MupCheckConfig()})


@dataclass
class SeedsCheckConfig(LadderConfig):
    """check=seeds: the seeds stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"seeds": SeedsConfig()})


@dataclass
class AblationCheckConfig(LadderConfig):
    """check=ablation: the ablation stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"ablation": AblationConfig()})


@dataclass
class CapacityCheckConfig(LadderConfig):
    """check=capacity: the capacity stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"capacity": CapacityConfig()})


@dataclass
class ProbeCheckConfig(LadderConfig):
    """check=probe: the probe stage alone, copy and induction at the full budget (check=ladder runs copy only)."""

    stages: dict[str, Any] = field(default_factory=lambda: {"probe": ProbeStageConfig()})


@dataclass
class ScalingCheckConfig(LadderConfig):
    """check=scaling: the scaling stage alone."""

    stages: dict[str, Any] = field(default_factory=lambda: {"scaling": ScalingConfig()})


@dataclass
class FullLadderConfig(LadderConfig):
    """check=ladder: every stage, in order, planned to take at most budget_seconds (4 minutes) on the machine it runs on:
    the step budgets below are the most each training stage runs, cut for a slower model (docs/ladder.md); each stage
    alone (check=seeds, ...) keeps its fuller budget. In the ladder the muP check and the probe tasks warn rather than
    fail (a model may lack muP or a mechanism on purpose), and the ablation runs only when check.stages.ablation.idea
    is given."""

    stages: dict[str, Any] = field(
        default_factory=lambda: {
            "skeleton": SkeletonConfig(),
            "preflight": PreflightConfig(),
            "sanity": SanityConfig(),
            "resume": ResumeConfig(),
            "lr_range": LRRangeConfig(batch_size=8),
            "mup": MupCheckConfig(standard_fails=False),
            "seeds": SeedsConfig(max_steps=200),
            "ablation": AblationConfig(max_steps=200),
            "probe": ProbeStageConfig(tasks=["copy"], max_steps=150, gate=False),
            "capacity": CapacityConfig(widths=[64, 128], budget_steps=60),
            "scaling": ScalingConfig(widths=[32, 40, 48, 64, 96], max_steps=200, bootstrap=200),
        }
    )
    budget_seconds: float = bounded(240.0, ge=0)
    eval_batches: int = bounded(10, ge=0)
