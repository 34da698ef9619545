"""Typed configs of the check group (conf/check/): the ladder's options and the thresholds of each stage.

An option of the group is a ladder: an ordered dict of stages, each a node with the `_target_` of its Stage
class and that stage's thresholds. check=skeleton and check=preflight run one stage, check=sanity the
first three, check=ladder every stage that exists. A user's stage is one more entry of `check.stages`
whose `_target_` lives in experiments/ (see docs/ladder.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from currytrain.rules import at_least, one_of, positive


@dataclass
class NoCheckConfig:
    """check=none: train directly, no validation-ladder stage."""

    _target_: str | None = None


@dataclass
class SkeletonConfig:
    """Stage skeleton: build everything, one forward pass, shapes, parameter counts, component origins."""

    _target_: str = "currytrain.check.skeleton.Skeleton"
    batch_size: int = 2
    """Sequences in the batch the stage inspects and runs forward."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        return at_least(node, path, ("batch_size",))


@dataclass
class PreflightConfig:
    """Stage preflight: assertions about the training step that take seconds (see docs/ladder.md)."""

    _target_: str = "currytrain.check.preflight.Preflight"
    batch_size: int = 4
    """Sequences per batch in every probe of this stage."""
    allow_frozen: list[str] = field(default_factory=list)
    """Parameter-name prefixes that are frozen on purpose (requires_grad=False); any other frozen parameter fails."""
    grad_tolerance: float = 1e-5
    """Relative difference allowed between the gradients of two identical steps (zero_grad probe)."""
    causal_tolerance: float = 1e-4
    """Largest change of the logits at positions <= t allowed when tokens after t change (relative to their scale)."""
    leak_steps: int = 10
    """Steps trained on uniformly random tokens in the leakage probe."""
    leak_margin: float = 0.25
    """Nats below ln(data vocabulary) the loss on random tokens may reach before the labels count as leaked
    (a model that cannot see the labels stays within noise of ln(V): it cannot memorise fresh random windows)."""
    overlap_windows: int = 64
    """Val windows (of data.seq_len tokens) searched for in the train stream."""
    max_overlap: float = 0.25
    """Largest share of those val windows allowed to occur verbatim in the train stream (above it fails)."""
    warn_overlap: float = 0.05
    """Share of val windows found in train above which the probe warns (below it, shared boilerplate is only reported)."""
    slow_group_ratio: float = 30.0
    """Warn when a parameter group's peak lr is more than this factor below the fastest group's (muP's hidden
    matrices excepted): those parameters learn that many times slower."""
    near_distance: float = 0.05
    """Tables (data=digits|table): a val row within this root-mean-square distance of a train row, per feature
    in train standard deviations, is a near duplicate."""
    max_duplicate_share: float = 0.0
    """Tables: largest share of val (or test) rows allowed an exact or near duplicate in train."""
    target_threshold: float = 0.99
    """Tables: a feature that alone predicts at least this share of the val classes encodes the target."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("batch_size", "leak_steps", "overlap_windows"))
        problems += positive(node, path, "grad_tolerance", 1e-5) + positive(node, path, "causal_tolerance", 1e-4)
        problems += positive(node, path, "leak_margin", 0.25)
        if not 0 <= node.max_overlap <= 1:
            problems.append(f"{path}.max_overlap={node.max_overlap} must be in [0, 1]: pass {path}.max_overlap=0.25")
        if not 0 <= node.warn_overlap <= 1:
            problems.append(f"{path}.warn_overlap={node.warn_overlap} must be in [0, 1]: pass {path}.warn_overlap=0.05")
        problems += positive(node, path, "slow_group_ratio", 30.0)
        if not 0 <= node.max_duplicate_share <= 1:
            problems.append(f"{path}.max_duplicate_share={node.max_duplicate_share} must be in [0, 1]: pass {path}.max_duplicate_share=0.0")
        problems += positive(node, path, "near_distance", 0.05) + positive(node, path, "target_threshold", 0.99)
        return problems


@dataclass
class SanityConfig:
    """Stage sanity: init loss vs chance, overfit one batch, per-layer gradient and activation statistics."""

    _target_: str = "currytrain.check.sanity.Sanity"
    init_batches: int = 4
    """Val batches (of batch_size sequences) averaged for the loss at init."""
    batch_size: int = 8
    """Sequences per batch for the init loss and the layer statistics."""
    init_tolerance: float = 0.5
    """Nats the loss at init may differ from ln(vocab_size) (a uniform prediction)."""
    overfit_sequences: int = 3
    """Sequences in the one batch the model must memorise."""
    overfit_steps: int = 600
    """Most optimizer steps allowed to memorise it (stops as soon as the loss is below overfit_loss)."""
    overfit_loss: float = 0.2
    """Loss (nats/token) the batch must go below: the gate."""
    stats_steps: int = 5
    """Training steps over which per-layer gradient and activation statistics are gathered."""
    vanishing_ratio: float = 1e-3
    """Warn when one block's gradient norm is below this fraction of another's (vanishing/exploding with depth)."""
    activation_growth: float = 100.0
    """Warn when the activation std grows by more than this factor from the first block to the last."""
    dead_fraction: float = 0.5
    """Warn when more than this share of a block's linear-layer inputs is zero on every token (dead units)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("init_batches", "batch_size", "overfit_sequences", "overfit_steps", "stats_steps"))
        problems += positive(node, path, "init_tolerance", 0.5) + positive(node, path, "overfit_loss", 0.2)
        problems += positive(node, path, "vanishing_ratio", 1e-3) + positive(node, path, "activation_growth", 100.0)
        if not 0 < node.dead_fraction <= 1:
            problems.append(f"{path}.dead_fraction={node.dead_fraction} must be in (0, 1]: pass {path}.dead_fraction=0.5")
        return problems


@dataclass
class LRRangeConfig:
    """Stage lr_range: exponential lr sweep over fresh batches, smoothed loss, divergence, a suggested lr."""

    _target_: str = "currytrain.check.lr_range.LRRange"
    min_lr: float = 1.0e-5
    """First lr of the sweep (peak lr of the first parameter group; muP groups keep their ratio)."""
    max_lr: float = 10.0
    """Last lr of the sweep, if the loss has not diverged before."""
    steps: int = 100
    """Optimizer steps of the sweep, one per lr, evenly spaced in log(lr)."""
    batch_size: int = 16
    """Sequences per step (a fresh batch every step)."""
    smoothing: float = 0.9
    """Coefficient of the loss's exponential moving average (bias-corrected); 0 disables smoothing."""
    diverge_factor: float = 4.0
    """The sweep stops once the smoothed loss exceeds this multiple of its minimum."""
    rule: str = "steepest"
    """steepest: the lr where the smoothed loss falls fastest per decade; min_loss: the lr at the smoothed minimum
    / min_loss_divisor. On the debug model steepest came within 2.3x of a grid's best lr, min_loss 15x above it."""
    min_loss_divisor: float = 10.0
    """Divisor of the min_loss rule."""
    min_drop: float = 0.1
    """Nats the smoothed loss must fall during the sweep (else the model does not learn: the gate)."""
    lr_tolerance: float = 3.0
    """Warn when optimizer.lr is more than this factor away from the suggestion."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("steps", "batch_size"), minimum=1)
        problems += positive(node, path, "min_lr", 1e-5) + positive(node, path, "min_loss_divisor", 10.0) + positive(node, path, "diverge_factor", 4.0)
        problems += one_of(node, path, "rule", ("steepest", "min_loss"))
        if node.min_lr > 0 and not node.max_lr > node.min_lr:
            problems.append(f"{path}.max_lr={node.max_lr} must be above {path}.min_lr={node.min_lr}: pass {path}.max_lr=10.0")
        if not 0 <= node.smoothing < 1:
            problems.append(f"{path}.smoothing={node.smoothing} must be in [0, 1): pass {path}.smoothing=0.9")
        if node.steps < 3:
            problems.append(f"{path}.steps={node.steps} leaves no curve to read: pass {path}.steps=100")
        return problems


@dataclass
class MupCheckConfig:
    """Stage mup: muP's coordinate check, activation/update/gradient scales per layer type against width."""

    _target_: str = "currytrain.check.mup.MupCheck"
    widths: list[int] = field(default_factory=lambda: [64, 128, 256])
    """Values of model.dim to build (hidden sizes scale alike; each must divide by model.n_heads)."""
    steps: int = 5
    """Adam steps on one fixed batch at every width."""
    batch_size: int = 8
    """Sequences in that batch."""
    lr: float | None = None
    """Constant lr of the steps (null: optimizer.lr); muP's per-layer ratios are kept."""
    tolerance: float = 2.0
    """Largest max/min ratio across widths allowed for each activation and update scale (the gate)."""
    standard_fails: bool = True
    """With model.mup=false, a width-dependent model fails the gate; false makes it a warning (check=ladder)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("steps", "batch_size")) + positive(node, path, "tolerance", 2.0)
        if len(node.widths) < 2 or any(not w >= 1 for w in node.widths):
            problems.append(f"{path}.widths={list(node.widths)} needs at least two positive widths: pass {path}.widths=[64,128,256]")
        return problems


@dataclass
class SeedsConfig:
    """Stage seeds: k seeds of the config at a small budget; mean, std, 95% CI and detectable effect."""

    _target_: str = "currytrain.check.seeds.Seeds"
    seeds: int = 3
    """Seeds trained (seed, seed+1, ...); at least 2 for a std."""
    max_steps: int | None = 400
    """Steps of each seed run (null: trainer.max_steps); 400 steps of the default 8 sequences."""
    max_std: float | None = None
    """Warn when the std of the final val loss across seeds exceeds this (nats); null: the relative rule below."""
    max_std_share: float = 0.1
    """With max_std null: warn when the std exceeds this share of the chance loss ln C (C the data's classes; 0.55
    nats for bytes): seeds that far apart mean unstable training, not luck."""
    overrides: list[str] = field(default_factory=list)
    """Extra overrides of every seed run ("trainer.batch_size=16")."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("seeds",), minimum=2) + positive(node, path, "max_std_share", 0.1)
        problems += positive(node, path, "max_std", 0.05) if node.max_std is not None else []
        return problems + (at_least(node, path, ("max_steps",)) if node.max_steps is not None else [])


@dataclass
class AblationConfig:
    """Stage ablation: baseline vs an idea over seeds at a small budget, with a noise-aware verdict."""

    _target_: str = "currytrain.check.ablation.Ablation"
    idea: list[str] = field(default_factory=list)
    """Overrides that make the idea: values ("optimizer.lr=0.01", "model.n_layers=6") or other options of groups
    ("model=moe", "experiment=my_idea"), for which the arm is composed again; empty skips the stage."""
    baseline: list[str] = field(default_factory=list)
    """Overrides of both arms (the baseline is the configured run with these)."""
    seeds: int = 3
    """Seeds per arm (at least 2: the verdict needs each arm's noise)."""
    max_steps: int | None = 400
    """Steps of each run (null: trainer.max_steps)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("seeds",), minimum=2) + (at_least(node, path, ("max_steps",)) if node.max_steps is not None else [])
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
    widths: list[int] = field(default_factory=lambda: [64, 128, 192])
    """Values of model.dim (hidden sizes scale alike; each must divide by model.n_heads)."""
    depths: list[int] = field(default_factory=lambda: [2, 4])
    """Values of model.n_layers; every (width, depth) pair trains."""
    budget_steps: int = 200
    """The compute budget: what the configured model spends in this many steps (others get as many steps as spend the same)."""
    min_steps: int = 10
    """Fewest steps any shape trains."""
    min_gain: float = 0.02
    """Nats a larger model must gain over the saturation point to move it."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("budget_steps", "min_steps")) + positive(node, path, "min_gain", 0.02)
        if len(node.widths) * len(node.depths) < 2 or any(not v >= 1 for v in [*node.widths, *node.depths]):
            problems.append(f"{path}.widths x {path}.depths must give at least two positive shapes: pass {path}.widths=[64,128,192] {path}.depths=[2,4]")
        return problems


@dataclass
class ScalingConfig:
    """Stage scaling: runs at several widths, L(N) = E + A N^-alpha with bootstrap CIs, a held-out size weighed
    against the seed noise measured in the same run."""

    _target_: str = "currytrain.check.scaling.Scaling"
    widths: list[int] = field(default_factory=lambda: [32, 48, 64, 96, 128])
    """Values of model.dim (hidden sizes scale alike); the largest is held out and predicted from the others."""
    max_steps: int | None = 400
    """Steps of every size (the same tokens for each; null: trainer.max_steps)."""
    bootstrap: int = 500
    """Residual-bootstrap refits for the intervals."""
    target_params: int = 0
    """Extrapolate the fit to this many parameters (0: no extrapolation)."""
    seed_std: float = 0.0
    """Seed-to-seed std of one run's val loss (nats), taken as known. 0: the std the seeds stage of the same ladder
    measured, else the std of noise_seeds extra seeds of the held-out size, trained by this stage."""
    noise_seeds: int = 2
    """Extra seeds of the held-out size trained when no seed noise is known (at least 1: a std needs two runs)."""
    alpha: float = 0.05
    """The held-out size warns when the test of "it follows the fit" gives p below this."""
    fail_alpha: float = 0.001
    """...and fails below this: a miss that the fit's spread and the measured seed noise leave no doubt about."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        problems = at_least(node, path, ("bootstrap", "noise_seeds")) + (at_least(node, path, ("max_steps",)) if node.max_steps is not None else [])
        if len(set(node.widths)) < 5:
            problems.append(f"{path}.widths={list(node.widths)} needs 5 distinct widths (4 to fit, 1 held out): pass {path}.widths=[32,48,64,96,128]")
        if not 0 < node.fail_alpha <= node.alpha < 1:
            problems.append(
                f"{path}.fail_alpha={node.fail_alpha} and alpha={node.alpha} must satisfy 0 < fail_alpha <= alpha < 1: pass {path}.alpha=0.05 {path}.fail_alpha=0.001"
            )
        if not node.seed_std >= 0:
            problems.append(f"{path}.seed_std={node.seed_std} must be >= 0: pass {path}.seed_std=0")
        return problems


@dataclass
class ProbeStageConfig:
    """Stage probe: the configured model trained on synthetic mechanism tasks (data=probe), accuracy vs chance."""

    _target_: str = "currytrain.check.probe_tasks.Probe"
    tasks: list[str] = field(default_factory=lambda: ["copy", "induction"])
    """Tasks of data=probe to train on, one run each: copy, recall, induction, parity, selective_copy."""
    max_steps: int = 1000
    """Steps of each task's run. The debug model copies after about 200 steps of 32 sequences; its induction
    head forms between steps 300 and 500 (docs/ladder.md)."""
    batch_size: int | None = 32
    """Sequences per step of each task's run (null: trainer.batch_size); the budgets above were measured at 32."""
    num_symbols: int = 16
    """Alphabet of the tasks' content."""
    seq_len: int | None = 32
    """Tokens per task sequence, at most data.seq_len (null: data.seq_len). Short sequences train the mechanism
    in fewer, cheaper steps; the debug model solves copy and induction at 32."""
    overrides: list[str] = field(default_factory=list)
    """Extra overrides of every task's run ("optimizer.lr=1e-2", "trainer.batch_size=64")."""
    eval_batches: int = 8
    """Val batches (of trainer.batch_size sequences) the accuracy is measured on."""
    min_accuracy: float = 0.9
    """Share of answer tokens right needed on every task (the gate)."""
    gate: bool = True
    """false: a task below min_accuracy warns instead of failing (check=ladder: a model may lack a mechanism on purpose)."""
    restarts: int = 1
    """Runs at other seeds of a task that missed the bar: a mechanism is called missing only when every run stays
    near chance (one induction head forms later than another's)."""

    @staticmethod
    def check(node: Any, path: str) -> list[str]:
        from currytrain.data.probe import TASKS

        problems = at_least(node, path, ("max_steps", "eval_batches")) + at_least(node, path, ("num_symbols",), minimum=2)
        problems += at_least(node, path, ("restarts",), minimum=0)
        problems += at_least(node, path, ("seq_len",), minimum=8) if node.seq_len is not None else []
        unknown = [task for task in node.tasks if task not in TASKS]
        if unknown or not node.tasks:
            problems.append(f"{path}.tasks={list(node.tasks)} must be a non-empty subset of {list(TASKS)}: pass {path}.tasks=[copy,induction]")
        if not 0 < node.min_accuracy <= 1:
            problems.append(f"{path}.min_accuracy={node.min_accuracy} must be in (0, 1]: pass {path}.min_accuracy=0.9")
        return problems


@dataclass
class LadderConfig:
    """The stages to climb, in order; the first failed gate stops the ladder (exit code 3)."""

    _target_: str = "currytrain.check.ladder.Ladder"
    stages: dict[str, Any] = field(default_factory=dict)
    """Stage name -> its config (a `_target_` Stage class and its thresholds), run in this order."""
    stop_at_failure: bool = True
    """Stop at the first stage whose gate fails; false runs every stage and fails at the end."""


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
    """check=ladder: every stage, in order, at budgets that take a few minutes on 2 shared CPU cores for the
    debug model (docs/ladder.md has the measured times); each stage alone (check=seeds, ...) keeps its fuller
    budget. In the ladder the muP check and the probe tasks warn rather than fail (a model may lack muP or a
    mechanism on purpose), and the ablation runs only when check.stages.ablation.idea is given."""

    stages: dict[str, Any] = field(
        default_factory=lambda: {
            "skeleton": SkeletonConfig(),
            "preflight": PreflightConfig(),
            "sanity": SanityConfig(),
            "lr_range": LRRangeConfig(batch_size=8),
            "mup": MupCheckConfig(standard_fails=False),
            "seeds": SeedsConfig(max_steps=200),
            "ablation": AblationConfig(max_steps=200),
            "probe": ProbeStageConfig(tasks=["copy"], max_steps=150, gate=False),
            "capacity": CapacityConfig(widths=[64, 128], budget_steps=60),
            "scaling": ScalingConfig(widths=[32, 40, 48, 64, 96], max_steps=200),
        }
    )
