"""Pipeline parallelism for real: gloo, 2 worker processes, a 4-layer tiny GQA decoder cut into stages. Every
schedule trains the one-process curve (losses and gradient norms, read from rank 0, which runs the first stage and
gets the loss from the last); eval runs forward-only through the stages; checkpoints resume across layouts."""

from __future__ import annotations

import math

import pytest
from test_model_parallel import RUN, STEPS, final_val, grad_norms
from test_parallel import assert_same_curve, curve, run_two_workers, single, write_resolved

from conftest import compose_tiny, single_threaded
from currytrain.journal import read_journal

CURVE = [
    *RUN,
    "model.n_layers=4",  # 2 stages of 2 layers, or (two stages per rank) 4 stages of 1
    "trainer.grad_accum=2",  # the microbatches in flight: one per pp rank
]
SCHEDULES = {
    "gpipe": ["parallel.pp_split=[1,3]"],  # an uneven explicit split: rank 0 the embedding and layer 0, rank 1 the rest
    "1f1b": [],
    "interleaved_1f1b": ["model.ac=full"],  # activation checkpointing wraps the kept blocks of each rank
    "interleaved_zero_bubble": [],  # the backward split into input and weight gradients
}


@pytest.fixture(scope="module")
def pp_runs(tmp_path_factory):
    """One 2-worker launch trains pp@2 under each schedule, and resumes pp@2 from a one-process checkpoint; one
    process gives the reference and then resumes from 1f1b's checkpoint."""
    compose_cfg = compose_tiny
    root = tmp_path_factory.mktemp("pp")
    with single_threaded():
        single(compose_cfg, root / "single", *CURVE)
        paths = [write_resolved(compose_cfg(*CURVE, "parallel=pp", f"parallel.pp_schedule={name}", *extra), root / name) for name, extra in SCHEDULES.items()]
        from_single = f"trainer.resume={root / 'single' / 'checkpoints' / 'step_5'}"
        paths.append(write_resolved(compose_cfg(*CURVE, "parallel=pp", from_single), root / "pp_from_single"))
        run_two_workers(paths)
        single(compose_cfg, root / "single_from_pp", *CURVE, f"trainer.resume={root / '1f1b' / 'checkpoints' / 'step_5'}")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_pp2_curve_grad_norms_and_eval_equal_one_process(pp_runs, schedule):
    reference = curve(pp_runs / "single")
    got = curve(pp_runs / schedule)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert_same_curve(got, reference, f"pp@2 {schedule}")
    # Step 1's norm is the untrained model's gradient: every stage's parameters count, whichever rank holds them.
    want = grad_norms(pp_runs / "single")
    for step, norm in grad_norms(pp_runs / schedule).items():
        assert math.isclose(norm, want[step], rel_tol=1e-5), f"pp@2 {schedule} step {step}: grad norm {norm} != one process {want[step]}"
    assert math.isclose(final_val(pp_runs / schedule), final_val(pp_runs / "single"), rel_tol=1e-5)
    # Each rank keeps its stages only: the embedding on one, the readout on the other, half of the blocks each.
    memory = next(e for e in read_journal(pp_runs / schedule / "journal.jsonl") if e["type"] == "memory")["ranks"]
    whole = next(e for e in read_journal(pp_runs / "single" / "journal.jsonl") if e["type"] == "memory")["ranks"][0]
    assert all(rank["params"] < 0.75 * whole["params"] for rank in memory), (memory, whole)
    assert sum(rank["params"] for rank in memory) == whole["params"]


@pytest.mark.slow
def test_pp2_checkpoints_keep_whole_model_names_and_resume_across_layouts(pp_runs):
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(pp_runs / "1f1b" / "checkpoints" / "step_5")).read_metadata().state_dict_metadata
    # Rank 0 saved layers 0-1 and the embedding, rank 1 layers 2-3 and the readout, each under its whole-model name.
    for name in ("tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.3.mlp.w2.weight", "output.weight", "norm.weight"):
        assert f"train.model.{name}" in keys, sorted(keys)
    reference = curve(pp_runs / "single")
    for name in ("single_from_pp", "pp_from_single"):
        resumed = curve(pp_runs / name)
        assert sorted(resumed) == list(range(6, STEPS + 1)), f"{name} did not continue from step 5"
        assert_same_curve(resumed, reference, name)
