"""Model-parallel axes composed with data parallelism on a 4-worker mesh (gloo, real processes): cp2 x dp2,
pp2 x dp2 and ep2 over 4 data-parallel ranks each train the one-process curve, gradient norms included.
(dp2 x tp2 is in test_model_parallel.py.) One 4-worker launch trains every layout; one process gives the references."""

from __future__ import annotations

import math

import pytest
from test_model_parallel import MOE, RUN, STEPS, final_val, grad_norms, metrics, run_workers
from test_parallel import assert_same_curve, curve, single, write_resolved

from conftest import compose_tiny, single_threaded
from currytrain.journal import read_journal

CURVE = [*RUN, "model.n_layers=2", "trainer.grad_accum=2"]  # 2 stages of one layer; 2 microbatches in flight (1f1b)
LAYOUTS = {
    # name: (overrides on top of CURVE, the one-process reference it must equal)
    "cp2_dp2": (["parallel=cp", "parallel.nproc=4"], "single"),
    "pp2_dp2": (["parallel=pp", "parallel.nproc=4"], "single"),
    "ep2_dp4": ([*MOE, "parallel=ep", "parallel.nproc=4"], "single_moe"),
}


@pytest.fixture(scope="module")
def hybrid_runs(tmp_path_factory):
    """One 4-worker launch trains every layout of LAYOUTS; one process gives the references, then resumes from
    pp2 x dp2's step-5 checkpoint (saved by 4 ranks, 2 of which hold each stage)."""
    root = tmp_path_factory.mktemp("hybrid")
    with single_threaded():
        single(compose_tiny, root / "single", *CURVE)
        single(compose_tiny, root / "single_moe", *CURVE, *MOE)
        run_workers(4, [write_resolved(compose_tiny(*CURVE, *overrides), root / name) for name, (overrides, _) in LAYOUTS.items()])
        single(compose_tiny, root / "single_from_pp2_dp2", *CURVE, f"trainer.resume={root / 'pp2_dp2' / 'checkpoints' / 'step_5'}")
    return root


def memory_ranks(run_dir) -> list[dict]:
    return next(event for event in read_journal(run_dir / "journal.jsonl") if event["type"] == "memory")["ranks"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_4_worker_layout_trains_the_one_process_curve(hybrid_runs, layout):
    reference = LAYOUTS[layout][1]
    want = curve(hybrid_runs / reference)
    got = curve(hybrid_runs / layout)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert_same_curve(got, want, layout)
    # Step 1's norm is the untrained model's gradient: every rank's share of the batch, sequence, stages or experts counts.
    norms = grad_norms(hybrid_runs / reference)
    for step, norm in grad_norms(hybrid_runs / layout).items():
        assert math.isclose(norm, norms[step], rel_tol=1e-5), f"{layout} step {step}: grad norm {norm} != one process {norms[step]}"
    assert math.isclose(final_val(hybrid_runs / layout), final_val(hybrid_runs / reference), rel_tol=1e-5)
    assert len(memory_ranks(hybrid_runs / layout)) == 4


@pytest.mark.slow
def test_pp2_x_dp2_each_pipeline_holds_half_the_model_and_its_checkpoint_resumes_in_one_process(hybrid_runs):
    whole = memory_ranks(hybrid_runs / "single")[0]["params"]
    ranks = memory_ranks(hybrid_runs / "pp2_dp2")
    # Mesh (pp, dp): ranks 0-1 run stage 0, ranks 2-3 stage 1; each pipeline replica holds the model once.
    assert all(rank["params"] < 0.75 * whole for rank in ranks), (ranks, whole)
    assert ranks[0]["params"] == ranks[1]["params"] and ranks[0]["params"] + ranks[2]["params"] == whole, (ranks, whole)
    resumed = curve(hybrid_runs / "single_from_pp2_dp2")
    assert sorted(resumed) == list(range(6, STEPS + 1))
    assert_same_curve(resumed, curve(hybrid_runs / "single"), "single_from_pp2_dp2")


@pytest.mark.slow
def test_ep2_over_4_data_parallel_ranks_counts_every_rank_s_tokens_and_keeps_half_the_experts(hybrid_runs):
    """ep=2 < dp=4: 2 copies of each half of the experts; the expert load (and so the balance loss) is the global batch's."""
    ours, theirs = metrics(hybrid_runs / "ep2_dp4"), metrics(hybrid_runs / "single_moe")
    loads = [key for key in theirs[1] if "/load/" in key]
    assert loads
    for step in theirs:
        for key in loads:
            assert math.isclose(ours[step][key], theirs[step][key], rel_tol=1e-6, abs_tol=1e-7), (step, key)
    whole = memory_ranks(hybrid_runs / "single_moe")[0]["params"]
    assert all(rank["params"] < whole for rank in memory_ranks(hybrid_runs / "ep2_dp4"))
