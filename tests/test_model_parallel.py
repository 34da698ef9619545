"""Model parallelism for real: gloo, 2 worker processes, a tiny GQA decoder. Tensor parallel (with sequence and
loss parallel), expert parallel (model=moe) and context parallel (ring attention) train the same curve as one
process, gradient norms included; their checkpoints resume across layouts. Ring attention alone equals SDPA."""

from __future__ import annotations

import json
import math

import pytest
from test_parallel import assert_same_curve, curve, run_two_workers, single, write_resolved

from conftest import compose_tiny, single_threaded
from currytrain.journal import read_journal
from currytrain.validate import validate

STEPS = 10
RUN = [
    f"trainer.max_steps={STEPS}",
    "trainer.checkpoint_every=5",
    "trainer.keep_last=4",
    "trainer.eval_every=100",
    "logger=[jsonl]",
    "optimizer.schedule.warmup_steps=2",
]
"""The curve tests' run: STEPS steps with checkpoints at 5 and 10 to resume from (test_pipeline_parallel too)."""
CURVE = [*RUN, "model.n_kv_heads=2"]  # TINY's one kv head would not split over tp=2
MOE = ["model=moe", "model.expert_hidden=32"]  # 4 experts, top-2, dropless: 2 experts per ep rank
WIDE_SHARED = ["model.shared_expert=true", "model.mlp_hidden=512"]  # most parameters in the shared expert, which tp replicates


def grad_norms(run_dir) -> dict[int, float]:
    return {event["step"]: event["train/grad_norm"] for event in read_journal(run_dir / "journal.jsonl") if event["type"] == "metrics"}


def final_val(run_dir) -> float:
    return next(event["val_loss"] for event in read_journal(run_dir / "journal.jsonl") if event["type"] == "finish")


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    """One 2-worker launch trains tp@2 from scratch, tp@2 resumed from a one-process checkpoint, ep@2 (model=moe), cp@2,
    tp@2 of model=moe, and 3 steps of tp@2 of model=moe with a wide shared expert (for its memory event);
    one-process runs give the references and then resume from tp@2's and ep@2's checkpoints."""
    compose_cfg = compose_tiny
    root = tmp_path_factory.mktemp("tp")
    with single_threaded():
        single(compose_cfg, root / "single", *CURVE)
        single(compose_cfg, root / "single_moe", *CURVE, *MOE)
        paths = [
            write_resolved(compose_cfg(*CURVE, "parallel=tp"), root / "tp"),
            write_resolved(compose_cfg(*CURVE, "parallel=tp", f"trainer.resume={root / 'single' / 'checkpoints' / 'step_5'}"), root / "tp_from_single"),
            write_resolved(compose_cfg(*CURVE, *MOE, "parallel=ep"), root / "ep"),
            write_resolved(compose_cfg(*CURVE, "parallel=cp"), root / "cp"),
            write_resolved(compose_cfg(*CURVE, *MOE, "parallel=tp"), root / "tp_moe"),
            write_resolved(compose_cfg(*CURVE, *MOE, *WIDE_SHARED, "parallel=tp", "trainer.max_steps=3"), root / "tp_moe_shared"),
        ]
        run_two_workers(paths)
        single(compose_cfg, root / "single_from_tp", *CURVE, f"trainer.resume={root / 'tp' / 'checkpoints' / 'step_5'}")
        single(compose_cfg, root / "single_moe_from_ep", *CURVE, *MOE, f"trainer.resume={root / 'ep' / 'checkpoints' / 'step_5'}")
    return root


@pytest.mark.slow
def test_tp2_loss_curve_and_grad_norms_equal_one_process(tp_runs):
    reference = curve(tp_runs / "single")
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert_same_curve(curve(tp_runs / "tp"), reference, "tp@2")
    # The gradient norm of every step (step 1's is the untrained model's gradient) sums over every shard.
    want = grad_norms(tp_runs / "single")
    for step, norm in grad_norms(tp_runs / "tp").items():
        assert math.isclose(norm, want[step], rel_tol=1e-5), f"tp@2 step {step}: grad norm {norm} != one process {want[step]}"
    # Eval runs under loss parallel too.
    assert math.isclose(final_val(tp_runs / "tp"), final_val(tp_runs / "single"), rel_tol=1e-5)
    # Each rank holds half of every sharded weight: its parameter bytes are well under the whole model's.
    memory = next(e for e in read_journal(tp_runs / "tp" / "journal.jsonl") if e["type"] == "memory")["ranks"]
    whole = next(e for e in read_journal(tp_runs / "single" / "journal.jsonl") if e["type"] == "memory")["ranks"][0]
    assert all(rank["params"] < 0.75 * whole["params"] for rank in memory), (memory, whole)


@pytest.mark.slow
def test_tp2_checkpoints_resume_across_layouts(tp_runs):
    reference = curve(tp_runs / "single")
    for name in ("tp_from_single", "single_from_tp"):
        resumed = curve(tp_runs / name)
        assert sorted(resumed) == list(range(6, STEPS + 1)), f"{name} did not continue from step 5"
        assert_same_curve(resumed, reference, name)


@pytest.mark.slow
def test_ep2_moe_curve_grad_norms_and_expert_load_equal_one_process(tp_runs):
    reference = curve(tp_runs / "single_moe")
    assert_same_curve(curve(tp_runs / "ep"), reference, "ep@2")
    want = grad_norms(tp_runs / "single_moe")
    for step, norm in grad_norms(tp_runs / "ep").items():  # the experts' share summed over both ranks
        assert math.isclose(norm, want[step], rel_tol=1e-5), f"ep@2 step {step}: grad norm {norm} != one process {want[step]}"
    # The expert load (and so the balance loss) counts the tokens of both ranks, not rank 0's half.
    ours, theirs = metrics(tp_runs / "ep"), metrics(tp_runs / "single_moe")
    loads = [key for key in theirs[1] if "/load/" in key]
    assert len(loads) == 4
    for step in theirs:
        for key in loads:
            assert math.isclose(ours[step][key], theirs[step][key], rel_tol=1e-6, abs_tol=1e-7), (step, key)
    # ep@2 saved whole expert tensors (DTensor shards): one process resumes them and continues the curve.
    resumed = curve(tp_runs / "single_moe_from_ep")
    assert sorted(resumed) == list(range(6, STEPS + 1))
    assert_same_curve(resumed, reference, "single_moe_from_ep")
    # Each rank keeps half of the experts.
    memory = next(e for e in read_journal(tp_runs / "ep" / "journal.jsonl") if e["type"] == "memory")["ranks"]
    whole = next(e for e in read_journal(tp_runs / "single_moe" / "journal.jsonl") if e["type"] == "memory")["ranks"][0]
    assert all(rank["params"] < whole["params"] for rank in memory), (memory, whole)


@pytest.mark.slow
def test_tp2_moe_curve_grad_norms_and_expert_load_equal_one_process(tp_runs):
    """model=moe under tp@2: attention, norms, embedding and readout sharded; each MoE layer replicated over the tp
    ranks (the whole sequence routed on both, each keeping its positions)."""
    reference = curve(tp_runs / "single_moe")
    assert_same_curve(curve(tp_runs / "tp_moe"), reference, "tp@2 moe")
    want = grad_norms(tp_runs / "single_moe")
    for step, norm in grad_norms(tp_runs / "tp_moe").items():  # the replicated experts counted once, the shards summed
        assert math.isclose(norm, want[step], rel_tol=1e-5), f"tp@2 moe step {step}: grad norm {norm} != one process {want[step]}"
    assert math.isclose(final_val(tp_runs / "tp_moe"), final_val(tp_runs / "single_moe"), rel_tol=1e-5)
    ours, theirs = metrics(tp_runs / "tp_moe"), metrics(tp_runs / "single_moe")
    for step in theirs:
        for key in (key for key in theirs[step] if key.startswith("moe/")):
            assert math.isclose(ours[step][key], theirs[step][key], rel_tol=1e-5, abs_tol=1e-7), (step, key)


@pytest.mark.slow
def test_cp2_ring_attention_trains_the_one_process_curve(tp_runs):
    """Each rank sees its zig-zag half of every sequence; attention rings between them, RoPE at global positions."""
    assert_same_curve(curve(tp_runs / "cp"), curve(tp_runs / "single"), "cp@2")
    want = grad_norms(tp_runs / "single")
    for step, norm in grad_norms(tp_runs / "cp").items():
        assert math.isclose(norm, want[step], rel_tol=1e-5), f"cp@2 step {step}: grad norm {norm} != one process {want[step]}"
    assert math.isclose(final_val(tp_runs / "cp"), final_val(tp_runs / "single"), rel_tol=1e-5)


def metrics(run_dir) -> dict[int, dict]:
    return {event["step"]: event for event in read_journal(run_dir / "journal.jsonl") if event["type"] == "metrics"}


BAD = [
    # (overrides, text the problems must contain)
    (["parallel=tp", "parallel.nproc=4", "parallel.tp=4"], ["parallel.tp=4 does not divide model.n_heads=2: choose parallel.tp in [2]"]),
    (["parallel=tp"], ["parallel.tp=2 does not divide model.n_kv_heads=1"]),
    (["parallel=tp", "model.n_kv_heads=2", "model.mlp_hidden=63"], ["parallel.tp=2 does not divide model.mlp_hidden=63"]),
    (["parallel=tp", "model.n_kv_heads=2", "data.seq_len=31"], ["parallel.tp=2 does not divide data.seq_len=31", "pass data.seq_len=30"]),
    (["parallel=tp", "model=spiking"], ["has no tensor-parallel plan yet"]),
    (["parallel=hybrid", "model=moe"], ["parallel.tp=2 with model=moe runs without data-parallel ranks for now (2 here", "pass parallel=tp parallel.nproc=2"]),
    (["parallel=tp", "parallel.nproc=3"], ["cannot fill the world", "pass parallel.nproc=2"]),
    (["parallel=ddp", "parallel.nproc=4", "parallel.tp=2", "model.n_kv_heads=2"], ["DDP and ZeRO-1 do not take tensor-parallel", "parallel=hybrid"]),
    (["parallel=tp", "parallel.zero_stage=1", "model.n_kv_heads=2"], ["parallel.tp=2 with parallel.zero_stage=1", "parallel=hybrid"]),
    (
        ["parallel=hybrid", "parallel.pp=2", "model.n_kv_heads=2"],
        ["parallel.pp=2 composes with data parallelism only for now, not parallel.tp=2", "pass parallel=pp"],
    ),
    (
        [
            "parallel=pp",
            "parallel.nproc=4",
            "model.n_layers=2",
            "trainer.grad_accum=2",
            "parallel.zero_stage=3",
            "parallel.dp_shard=-1",
            "parallel.dp_replicate=1",
        ],
        [
            "parallel.pp=2 replicates its stages over the data-parallel ranks (DDP-like, zero_stage=0) for now",
            "pass parallel.zero_stage=0 parallel.dp_shard=1 parallel.dp_replicate=2",
        ],
    ),
    (["parallel=pp", "trainer.grad_accum=2"], ["parallel.pp=2 makes 2 stages, more than model.n_layers=1", "pass model.n_layers=2"]),
    (
        ["parallel=pp", "parallel.pp_schedule=interleaved_1f1b", "model.n_layers=3", "trainer.grad_accum=2"],
        ["makes 4 stages (2 per rank", "parallel.pp in [1]"],
    ),
    (
        ["parallel=pp", "model.n_layers=4", "parallel.pp_split=[1,2]", "trainer.grad_accum=2"],
        ["parallel.pp_split=[1, 2] must give each of the 2 stages at least one layer and sum to model.n_layers=4: pass parallel.pp_split=[2, 2]"],
    ),
    (
        ["parallel=pp", "model.n_layers=2"],
        ["parallel.pp_schedule=1f1b with trainer.grad_accum=1", "pass trainer.grad_accum=2 (or a multiple), or parallel.pp_schedule=gpipe"],
    ),
    (
        ["parallel=pp", "parallel.pp_schedule=interleaved_1f1b", "model.n_layers=4", "trainer.grad_accum=5"],
        ["in 2 equal rounds, which 5 are not: pass trainer.grad_accum=4"],
    ),
    (["parallel=pp", "parallel.pp_schedule=zbv"], ["parallel.pp_schedule=zbv is not one of ['gpipe', '1f1b'"]),
    (["parallel=pp", "model=moe", "model.n_layers=2", "trainer.grad_accum=2"], ["has no pipeline split yet: pass parallel.pp=1"]),
    (["parallel=pp", "model.n_layers=2", "trainer.grad_accum=2", "model.tie_embeddings=true"], ["pass model.tie_embeddings=false"]),
    (["parallel=pp", "model.n_layers=2", "trainer.grad_accum=2", "trainer.precision=fp16"], ["parallel.pp=2 with trainer.precision=fp16 is not supported"]),
    (["parallel=cp", "data.seq_len=30"], ["parallel.cp=2 cuts data.seq_len=30 into 4 equal chunks", "pass data.seq_len=28"]),
    (["parallel=cp", "model.sliding_window=8"], ["pass model.sliding_window=0"]),
    (["parallel=cp", "model=moe"], ["has no context-parallel plan yet"]),
    (["parallel=cp", "parallel.nproc=4", "parallel.tp=2", "model.n_kv_heads=2"], ["parallel.cp=2 composes with DDP (zero_stage=0) only"]),
    (["parallel=ep"], ["parallel.ep=2 shards the experts of a mixture-of-experts model", "pass model=moe"]),
    (["parallel=ep", "model=moe", "model.num_experts=3", "model.top_k=1"], ["parallel.ep=2 does not divide model.num_experts=3: choose parallel.ep in [3]"]),
    (["parallel=ep", "model=moe", "model.capacity_factor=1.25"], ["runs dropless experts only", "pass model.capacity_factor=0"]),
    (["parallel=ep", "model=moe", "parallel.ep=4"], ["parallel.ep=4 splits the data-parallel ranks (2 here", "pass parallel.ep in [1, 2]"]),
    (["parallel=ep", "model=moe", "parallel.zero_stage=3", "parallel.dp_shard=-1", "parallel.dp_replicate=1"], ["runs under DDP (zero_stage=0) for now"]),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_model_parallel_config_names_the_key_and_the_fix(compose_cfg, overrides, expected):
    problems = "\n".join(validate(compose_cfg(*overrides)))
    for text in expected:
        assert text in problems, problems


@pytest.mark.parametrize("cp", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ring_attention_equals_full_sequence_sdpa(cp):
    """Causal ring attention over zig-zag shards of a 512-token sequence: every rank's output and q/k/v gradients
    equal full-sequence SDPA's for its shard within 1e-5."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from tests.cp_worker import ring_vs_sdpa

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=cp, rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, run_id="test-cp")
    errors = elastic_launch(config, ring_vs_sdpa)(512)
    assert len(errors) == cp
    for rank, worst in errors.items():
        assert max(worst.values()) < 1e-5, (rank, worst)


@pytest.mark.slow
def test_advisor_predicts_the_measured_state_bytes_per_rank(tp_runs, compose_cfg):
    """The advisor's parameters + gradients + optimizer state per rank, against what each rank of the runs above held
    (their journaled memory event), within 20%: one process, tp@2, ep@2 and tp@2 of model=moe with a wide shared
    expert (replicated by tp: counted as split, the prediction would be a third low)."""
    from currytrain.advise import Layout, count_split_parameters, predict

    cases = {
        "single": ([], Layout(1, 0)),
        "tp": (["parallel=tp"], Layout(1, 0, tp=2)),
        "ep": ([*MOE, "parallel=ep"], Layout(2, 0, ep=2)),
        "tp_moe_shared": ([*MOE, *WIDE_SHARED, "parallel=tp"], Layout(1, 0, tp=2)),
    }
    for name, (overrides, layout) in cases.items():
        cfg = compose_cfg(*CURVE, *overrides)
        predicted = predict(cfg, layout, *count_split_parameters(cfg.model))
        ranks = next(e for e in read_journal(tp_runs / name / "journal.jsonl") if e["type"] == "memory")["ranks"]
        measured = max(rank["params"] + rank["grads"] + rank["optimizer"] for rank in ranks)
        state = predicted.params + predicted.grads + predicted.optimizer
        assert abs(state - measured) <= 0.2 * measured, f"{name}: predicted {state} bytes of state per rank, measured {measured}"


@pytest.mark.slow
def test_advise_command_prints_a_table_and_json(capsys):
    from currytrain.cli import main

    assert main(["advise", "--gpus", "8", "--gpu-mem", "64MiB", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    by_name = {row["layout"]: row for row in result["layouts"]}
    # The ZeRO ladder shards what it says: optimizer state, then gradients, then parameters.
    assert by_name["dp8 zero1"]["optimizer"] * 8 == pytest.approx(by_name["dp8 ddp"]["optimizer"], rel=1e-6)
    assert by_name["dp8 zero2"]["grads"] < by_name["dp8 zero1"]["grads"] and by_name["dp8 fsdp"]["params"] < by_name["dp8 zero2"]["params"]
    assert by_name["dp4 fsdp x tp2"]["comm_bytes"] > 0 and result["recommended"] in by_name and result["reasons"]
    assert main(["advise", "--gpus", "2"]) == 0
    assert "per-rank memory" in capsys.readouterr().out


ADVISED = {
    # (advise's overrides and ranks): layouts it must offer, layouts validation refuses
    "gqa": (["trainer.grad_accum=2", "--gpus", "4"], {"dp2 fsdp x tp2", "dp2 ddp x pp2", "dp2 ddp x cp2"}, {"tp4", "pp4"}),
    "moe": (["model=moe", "--gpus", "4"], {"dp4 ddp x ep2", "dp4 ddp x ep4"}, {"dp2 fsdp x tp2", "dp2 ddp x pp2", "dp2 ddp x cp2"}),
    "moe at 2": (["model=moe", "model.shared_expert=true", "--gpus", "2"], {"tp2", "dp2 ddp x ep2"}, {"pp2", "cp2"}),
}


@pytest.mark.slow
@pytest.mark.parametrize(("args", "offered", "refused"), ADVISED.values(), ids=list(ADVISED))
def test_advisor_offers_only_layouts_validation_accepts(capsys, args, offered, refused):
    """Every layout `currytrain advise --json` lists composes, with the overrides it prints, into a config validation
    accepts whole; what validation refuses (tp with data-parallel ranks for model=moe, pp and cp for moe, tp not
    dividing the kv heads, 1f1b with fewer microbatches than stages) is listed apart, with validation's reason."""
    from currytrain.cli import main

    assert main(["advise", *args, "--gpu-mem", "80GiB", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    overrides = [arg for arg in args if "=" in arg]
    listed = {row["layout"]: row for row in result["layouts"]}
    assert offered <= set(listed) and not refused & set(listed), sorted(listed)
    assert refused <= set(result["refused"]) and result["recommended"] in listed
    for name, row in listed.items():
        assert validate(compose_tiny(*overrides, *row["overrides"], tiny=False)) == [], name
    for name, problems in result["refused"].items():
        assert problems and all(problem.startswith(("parallel.", "trainer.")) for problem in problems), (name, problems)


def run_workers(nproc: int, paths: list[str]) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from tests.dp_worker import train_each

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, run_id="test-mp")
    elastic_launch(config, train_each)(paths)


@pytest.mark.slow
def test_dp2_x_tp2_at_4_workers_matches_one_process_and_resumes_under_fsdp2_and_single(tp_runs, compose_cfg, one_thread):
    """parallel=hybrid: FSDP2 over dp_shard=2 of a tp=2 model, one 2-D mesh over 4 workers. Its curve and gradient norms
    (step 1's: the untrained model's gradient) equal one process's; its step-5 checkpoint, sharded both ways,
    continues that curve under fsdp@2 and under one process."""
    root = tp_runs
    run_workers(4, [write_resolved(compose_cfg(*CURVE, "parallel=hybrid"), root / "hybrid")])
    checkpoint = root / "hybrid" / "checkpoints" / "step_5"
    run_two_workers([write_resolved(compose_cfg(*CURVE, "parallel=fsdp", f"trainer.resume={checkpoint}"), root / "fsdp_from_hybrid")])
    single(compose_cfg, root / "single_from_hybrid", *CURVE, f"trainer.resume={checkpoint}")
    reference = curve(root / "single")
    assert sorted(curve(root / "hybrid")) == list(range(1, STEPS + 1))
    assert_same_curve(curve(root / "hybrid"), reference, "dp_shard=2 x tp=2")
    want = grad_norms(root / "single")
    for step, norm in grad_norms(root / "hybrid").items():
        assert math.isclose(norm, want[step], rel_tol=1e-5), f"dp2 x tp2 step {step}: grad norm {norm} != one process {want[step]}"
    for name in ("fsdp_from_hybrid", "single_from_hybrid"):
        resumed = curve(root / name)
        assert sorted(resumed) == list(range(6, STEPS + 1)), f"{name} did not continue from step 5"
        assert_same_curve(resumed, reference, name)
