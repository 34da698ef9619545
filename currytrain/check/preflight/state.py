"""Preflight probes. The model's state and parameters as training will find them: does a forward or an eval pass
change what the next train-mode forward computes, are tied weights still tied after a step, which parameters are
decayed, and does the residual stream keep its scale with depth at init."""

import contextlib
import copy
import math
from collections.abc import Iterator

import torch
from torch import nn

from currytrain.check.preflight.wiring import _names
from currytrain.check.probes import StepFn, eval_mode, input_vocab, loss_of, scratch, seeded
from currytrain.check.stage import Finding, Status
from currytrain.components import Components
from currytrain.model.protocol import find_blocks
from currytrain.trainer.step import Batch

PLAIN = (bool, int, float, str, type(None))
"""Attribute types a module's behaviour may hang on (a dropout probability, a flag, a counter)."""


def snapshot(model: nn.Module) -> dict[str, object]:
    """Every parameter and buffer (cloned; non-persistent buffers too), and every plain attribute of every module
    (the training flags excepted)."""
    state: dict[str, object] = {name: tensor.detach().clone() for name, tensor in model.named_parameters()}
    state.update({name: tensor.detach().clone() for name, tensor in model.named_buffers()})
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if key != "training" and not key.startswith("_") and isinstance(value, PLAIN):
                state[f"{name}.{key}" if name else key] = value
    return state


def changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The entries of two snapshots that differ (with their values when they are plain)."""
    names = []
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
            if old.shape != new.shape or not torch.equal(old, new):
                names.append(key)
        elif old != new:
            names.append(f"{key} {old!r} -> {new!r}")
    return sorted(set(names))


@contextlib.contextmanager
def restored(model: nn.Module) -> Iterator[None]:
    """The block may change the model's weights, buffers (non-persistent ones too) and plain attributes: all are put
    back after it."""
    weights = copy.deepcopy(model.state_dict())
    modules = list(model.modules())
    buffers = [(module, key, value.detach().clone()) for module in modules for key, value in module._buffers.items() if value is not None]
    attributes = [(module, {k: v for k, v in vars(module).items() if not k.startswith("_") and isinstance(v, PLAIN)}) for module in modules]
    try:
        yield
    finally:
        model.load_state_dict(weights)
        with torch.no_grad():
            for module, key, value in buffers:
                current = module._buffers.get(key)
                if current is not None and current.shape == value.shape:
                    current.copy_(value)  # in place: whatever holds the buffer keeps holding it
                else:
                    module._buffers[key] = value
        for module, values in attributes:
            vars(module).update(values)
        model.zero_grad(set_to_none=True)


@torch.no_grad()
def _train_forward(parts: Components, inputs: torch.Tensor, seed: int = 1) -> torch.Tensor:
    with seeded(parts, seed):
        return parts.model(inputs).float()


REPEATS = 8
"""Train-mode forwards on one seed compared by forward_state: randomness drawn outside torch's RNG shows in some pair."""


def norm_statistics(model: nn.Module) -> set[str]:
    """The running statistics of normalisation layers (BatchNorm's): buffers a train-mode forward updates by design,
    without changing what the train-mode forward computes."""
    return {
        f"{name}.{key}" if name else key
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._NormBase)
        for key in module._buffers
    }


def forward_state(parts: Components, batch: Batch) -> tuple[Finding, Finding]:
    """(state across forwards, train mode after eval).

    With weights that do not move, a train-mode forward on a seeded RNG computes the same thing every time: again and
    again, after a forward and backward without an optimizer step (a microbatch of gradient accumulation), and after
    an eval pass (model.eval(), a forward, model.train(), as the trainer evaluates). When it does not, what changed
    tells the cause: a buffer or attribute the forwards update (state that moves with every microbatch, not with each
    optimizer step), one an eval pass sets (a dropout probability set to 0 in the eval branch stays 0), or nothing,
    which leaves randomness drawn outside torch's RNG (Python's random, numpy), which no seed nor checkpoint controls.
    Buffers that forwards update without changing the output (counts for a once-per-step update, BatchNorm's
    running statistics) are reported only. Three forwards follow the eval pass: forwards that no eval separates must
    agree among themselves before an eval pass is blamed for a difference."""
    model, inputs = parts.model, batch[0]
    across, after_eval = "state across forwards", "train mode after eval"
    expected = "the same train-mode output, on the same seed, every time"
    modes = {module: module.training for module in model.modules()}
    try:
        with restored(model):
            model.train()
            _train_forward(parts, inputs, seed=0)  # lazy tables and caches are built on the first forward
            before = snapshot(model)
            outputs = [_train_forward(parts, inputs) for _ in range(REPEATS)]
            with seeded(parts, 2):
                loss_of(parts, batch).backward()  # a microbatch: forward and backward, no optimizer step
            model.zero_grad(set_to_none=True)
            outputs.append(_train_forward(parts, inputs))
            moved = [name for name in changed(before, snapshot(model)) if name.split(" ")[0] not in norm_statistics(model)]
            state = snapshot(model)
            model.eval()
            with torch.no_grad(), seeded(parts, 3):
                model(inputs)
            model.train()
            set_by_eval = changed(state, snapshot(model))
            after = [_train_forward(parts, inputs) for _ in range(3)]
    finally:
        for module, training in modes.items():
            module.training = training
    # Forwards that no eval pass separates must agree among themselves; only then can an eval pass be blamed.
    varies = any(not torch.equal(group[0], other) for group in (outputs, after) for other in group[1:])
    if not varies:
        note = f"; forwards update {_names(moved)} without changing the output (statistics)" if moved else ""
        stable = Finding(across, Status.PASSED, f"{len(outputs)} train-mode forwards on one seed agree, one after a backward{note}", expected)
    elif moved:
        stable = Finding(
            across,
            Status.FAILED,
            f"train-mode forwards on one seed differ; the forwards changed {_names(moved)}",
            expected,
            f"a forward pass changes the model ({_names(moved)}): state updated in forward moves with every microbatch (grad_accum "
            "times per step) and every eval, not once per optimizer step",
            "update such state once per optimizer step (an optimizer step hook), from statistics the forwards only accumulate",
        )
    else:
        stable = Finding(
            across,
            Status.FAILED,
            "train-mode forwards on one seed differ, and no buffer or attribute changed between them",
            expected,
            "randomness drawn outside torch's RNG (Python's random, numpy): no seed controls it and no checkpoint restores it, so "
            "runs do not reproduce and a resumed run diverges from the uninterrupted one",
            "draw every random number from torch (torch.rand, torch.bernoulli, F.dropout), whose state the checkpoints keep",
        )
    if stable.status is Status.FAILED:
        return stable, Finding(after_eval, Status.SKIPPED, "see state across forwards", expected)
    if torch.equal(outputs[-1], after[0]):
        return stable, Finding(after_eval, Status.PASSED, "an eval pass leaves the train-mode forward unchanged", expected)
    what = _names(set_by_eval) if set_by_eval else "something no buffer or plain attribute holds (a tensor attribute, a cache)"
    return stable, Finding(
        after_eval,
        Status.FAILED,
        "the train-mode forward differs after an eval pass" + (f"; the eval pass changed {_names(set_by_eval)}" if set_by_eval else ""),
        expected,
        f"an eval pass changed {what}: what the forward sets when not training (a dropout probability set to 0, a cache switched "
        "on) stays set when training resumes, so every evaluation changes the rest of the run",
        "keep eval-only choices local to the forward (p = self.p if self.training else 0.0), never assign them to the module",
    )


def tied_weights(parts: Components, step: StepFn, batch: Batch) -> Finding:
    """Weights that are tied stay tied through a step. Two distinct parameters whose random initial values are equal
    were tied by copying, and a step moves them apart (each has its own gradient); two parameters that share one
    storage are each stepped by the optimizer with a state of its own. One Parameter reached by two modules is the tie."""
    name, expected = "tied weights", "tied weights share one Parameter; no two parameters start equal and drift apart"
    named = list(parts.model.named_parameters(remove_duplicate=False))
    shared = len(named) - len({id(p) for _, p in named})
    params = list(parts.model.named_parameters())
    random_ones = [(n, p) for n, p in params if p.numel() > 1 and float(p.detach().float().std()) > 0]
    pairs, views = [], []
    for i, (first_name, first) in enumerate(random_ones):
        for second_name, second in random_ones[i + 1 :]:
            if first.shape != second.shape:
                continue
            if first.data_ptr() == second.data_ptr():
                views.append(f"{first_name} and {second_name}")
            elif torch.equal(first.detach(), second.detach()):
                pairs.append((first_name, second_name))
    observed = f"{shared} tied by a shared Parameter"
    if views:
        return Finding(
            name,
            Status.WARNING,
            f"{observed}; {_names(views)} are two parameters over one storage",
            expected,
            f"{_names(views)} are tied through their storage (.data), not as one Parameter: each gets its own gradient and optimizer "
            "state, and the shared weights take both updates",
            "tie by assigning the Parameter itself (lm_head.weight = wte.weight)",
        )
    if not pairs:
        return Finding(name, Status.PASSED, observed + "; no two parameters start equal", expected)
    with scratch(parts, lr="peak"):
        with seeded(parts, 0):
            step(parts, batch)
        values = dict(parts.model.named_parameters())
        apart = [f"{a} and {b}" for a, b in pairs if not torch.equal(values[a].detach(), values[b].detach())]
    listed = ", ".join(f"{a} and {b}" for a, b in pairs)
    if not apart:
        return Finding(name, Status.PASSED, f"{observed}; {listed} start equal and stay equal through a step", expected)
    return Finding(
        name,
        Status.FAILED,
        f"{observed}; {_names(apart)} start equal and differ after one step",
        expected,
        f"{_names(apart)} were tied by copying the values: two parameters that start equal drift apart, each trained by its own gradient",
        "tie by assigning the Parameter itself (lm_head.weight = wte.weight), not a copy of its values",
    )


def decayed_parameters(parts: Components) -> Finding:
    """Which parameters the optimizer decays. Weight decay pulls every weight toward 0: right for matrices, wrong for a
    norm's gain (initialised to 1) and for biases, so a 1-D parameter in a group with weight_decay > 0 warns. Decayed
    embeddings are only reported (nanoGPT decays them on purpose)."""
    name = "weight decay"
    expected = "no 1-D parameter (norm gain, bias) under weight decay"
    names = {id(p): n for n, p in parts.model.named_parameters()}
    embeddings = {id(m.weight) for m in parts.model.modules() if isinstance(m, nn.Embedding)}
    decayed = [p for group in parts.optimizer.param_groups if group.get("weight_decay", 0) > 0 for p in group["params"] if p.requires_grad]
    if not decayed:
        return Finding(name, Status.PASSED, "no parameter under weight decay", expected)
    flat = [names.get(id(p), "?") for p in decayed if p.dim() < 2]
    tables = [names.get(id(p), "?") for p in decayed if id(p) in embeddings]
    observed = f"{len(decayed)} parameters decayed, {len(flat)} of them 1-D" + (f", embeddings: {_names(tables)}" if tables else "")
    if not flat:
        return Finding(name, Status.PASSED, observed, expected)
    return Finding(
        name,
        Status.WARNING,
        f"{observed}: {_names(flat)}",
        expected,
        f"norm gains or biases are under weight decay ({_names(flat)}): decay pulls a gain toward 0, not toward its init of 1; "
        "a no-decay rule by type or by name missed them (a hand-written norm, norms named ln_1/ln_f)",
        "decay only the matrices: put parameters with p.dim() < 2 in a group with weight_decay 0 (the default groups do)",
    )


MIN_DEPTH = 8
"""Repeated blocks below which the init probe does not judge: over a few blocks, unscaled writes grow the stream no more
than a deliberate design does (a depth-scaled debug model of 4 blocks grows it 1.8x, an unscaled one 1.8x too)."""


@torch.no_grad()
def residual_growth(parts: Components, batch: Batch, limit: float) -> Finding:
    """The residual stream's variance at init from the first repeated block's input to the last block's output, on
    uniformly random token ids (every embedding row is as likely). Writes scaled with depth (GPT-2's std / sqrt(2
    n_layers), curryTrain's init) add a bounded variance whatever the depth (1.1-1.9x at 4 to 16 blocks); unscaled
    ones add about as much per block as the embedding holds, so the stream grows with depth (3x at 8 blocks, 3.6x at
    12, 4.6x at 16). A first block that rescales the stream itself (spikes, an embedding scale) makes the stream no
    sum of small writes: then there is nothing to read."""
    name = "init scale with depth"
    expected = f"the stream's variance at init grows less than {limit:g}x through {MIN_DEPTH} or more blocks"
    blocks = find_blocks(parts.model)
    if len(blocks) < MIN_DEPTH:
        return Finding(name, Status.SKIPPED, f"{len(blocks)} repeated blocks: too shallow for the depth scaling of the init to show", expected)
    vocab = input_vocab(parts, batch[0])
    tokens = torch.randint(vocab, batch[0].shape, generator=torch.Generator().manual_seed(0)).to(batch[0].device) if vocab else batch[0]
    inputs, outputs = [], []

    def stream(value) -> torch.Tensor | None:
        value = value[0] if isinstance(value, (tuple, list)) and value else value
        return value.detach().float() if isinstance(value, torch.Tensor) and value.is_floating_point() else None

    handles = [blocks[0][1].register_forward_pre_hook(lambda module, args: inputs.append(stream(args)))]
    handles += [block.register_forward_hook(lambda module, args, out: outputs.append(stream(out))) for _, block in blocks]
    try:
        with eval_mode(parts.model), seeded(parts):
            parts.model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    if not inputs or inputs[0] is None or len(outputs) != len(blocks) or any(o is None or o.shape != inputs[0].shape for o in outputs):
        return Finding(name, Status.SKIPPED, "the blocks do not pass one stream of the same shape along", expected)
    variances = [float(inputs[0].var())] + [float(o.var()) for o in outputs]
    if not all(math.isfinite(v) for v in variances) or variances[0] <= 0:
        return Finding(name, Status.SKIPPED, "the stream's variance is not finite or zero at the first block", expected)
    ratios = [v / variances[0] for v in variances]
    observed = f"variance x{ratios[-1]:.2f} over {len(blocks)} blocks (" + ", ".join(f"{r:.2f}" for r in ratios[1:]) + ")"
    if ratios[1] > 4:
        return Finding(name, Status.SKIPPED, observed + ": the first block rescales the stream itself, so it is no sum of small writes", expected)
    if ratios[-1] < limit:
        return Finding(name, Status.PASSED, observed, expected)
    return Finding(
        name,
        Status.WARNING,
        observed,
        expected,
        f"the residual stream grows with depth at init (its variance x{ratios[-1]:.1f} over {len(blocks)} blocks): each block writes as much "
        "as the embedding holds, as when the depth scaling of the residual projections (GPT-2's std / sqrt(2 n_layers)) is skipped",
        "scale the init of the projections that write into the residual stream by 1/sqrt(2 n_layers), and check the code that applies it runs",
    )
