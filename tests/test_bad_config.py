"""Bad input: one clear message naming the key and the fix, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, launch

BAD_CONFIGS = [
    # (overrides, text every message must contain)
    (["model=nope"], ["model=nope: model has no option 'nope': choose from [", "gqa"]),
    (["optimizer.lr=-1"], ["optimizer.lr=-1.0 must be > 0"]),
    (["optimizer.lrr=0.1"], ["optimizer.lrr is not a field of AdamWConfig: did you mean optimizer.lr? pass optimizer.lr=0.1"]),
    (["optimizer.lr=fast"], ["optimizer.lr=fast must be a number: pass optimizer.lr=<float> (its default: optimizer.lr=0.003)"]),
    (["model.n_kv_heads=3"], ["model.n_kv_heads=3 does not divide model.n_heads=2", "choose model.n_kv_heads in [1, 2]"]),
    (["model.n_heads=3"], ["model.n_heads=3 does not divide model.dim=32"]),
    (["model.n_heads=32"], ["model.dim/model.n_heads=1 is odd, RoPE needs an even head size"]),
    (["data=text"], ["data.paths is empty", "data.paths=["]),
    (["data=text", "data.paths=[/no/such/corpus]"], ["data.paths: /no/such/corpus does not exist"]),
    (["data.seq_len=64"], ["data.seq_len=64 exceeds model.max_seq_len=32"]),
    (["trainer.device=tpu"], ["trainer.device=tpu", "trainer.device=auto"]),
    (["trainer.precision=fp4"], ["trainer.precision=fp4"]),
    (["trainer.attention_precision=bf16"], ["trainer.attention_precision=bf16", "auto"]),
    (["trainer.resume=/no/such/run"], ["trainer.resume=/no/such/run holds no complete checkpoint"]),
    (["trainer.resume=/tmp"], ["trainer.resume=/tmp holds no complete checkpoint"]),
    (["optimizer=sgd", "optimizer.momentum=0"], ["optimizer.nesterov=true needs momentum"]),
    (["optimizer.eps=-1"], ["optimizer.eps=-1.0 must be > 0"]),
    (["model.init_std=-1"], ["model.init_std=-1.0 must be > 0"]),
    (["model.norm_eps=-1"], ["model.norm_eps=-1.0 must be > 0"]),
    (["model.rope_theta=0"], ["model.rope_theta=0.0 must be > 0"]),
    (["data.max_bytes=-1"], ["data.max_bytes=-1 must be >= 0"]),
    (["data=synthetic", "data.num_tokens=10"], ["data.num_tokens=10 must exceed data.seq_len + 1 = 33"]),
    (["trainer.init_from=/no/such/weights"], ["trainer.init_from=/no/such/weights is not an import folder"]),
    (["optimizer.schedule.warmup_steps=50"], ["optimizer.schedule.warmup_steps=50 is not below trainer.max_steps=6"]),
    (["optimizer.schedule.kind=step"], ["optimizer.schedule.kind=step"]),
    (["trainer.batch_size=0"], ["trainer.batch_size=0 must be >= 1"]),
    (["parallel.nproc=2"], ["parallel.nproc=2", "pass parallel.nproc=1"]),
    (["parallel=ddp", "parallel.nproc=0"], ["parallel.nproc=0 must be >= 1"]),
    (["parallel=ddp", "parallel.dp_replicate=3"], ["parallel.dp_replicate=3 x parallel.dp_shard=1 = 3 processes, but the world size is 2 (parallel.nproc=2)"]),
    (["parallel=hsdp", "parallel.nproc=6", "parallel.dp_replicate=4"], ["cannot fill the world", "pass parallel.nproc=4"]),
    (["parallel=ddp", "parallel.dp_shard=2"], ["parallel.zero_stage=0 replicates the model", "parallel.dp_shard=2"]),
    (["parallel=tp"], ["parallel.tp=2 does not divide model.n_kv_heads=1", "choose parallel.tp in [1]"]),
    (["parallel=fsdp", "parallel.runtime=fabric"], ["parallel.runtime=fabric", "pass parallel.runtime=torch"]),
    (["parallel.runtime=fabric", "trainer.precision=fp16"], ["trainer.precision=fp16 with parallel.runtime=fabric", "trainer.precision=bf16"]),
    (["parallel=ddp", "trainer.batch_size=3"], ["trainer.batch_size=3 (the global batch) does not split evenly over 2 data-parallel ranks"]),
    (["trainer.device=cpu", "trainer.precision=fp16"], ["trainer.precision=fp16 needs a CUDA device", "pass trainer.precision=bf16"]),
    (["model.vocab_size=100"], ["model.vocab_size=100 is smaller than the data's vocabulary (256)"]),
    (["optimizer.lr=nan"], ["optimizer.lr=nan must be a finite number > 0"]),
    (["+trainer.max_step=10"], ["trainer.max_step is not a field of TrainerConfig", "did you mean trainer.max_steps?"]),
    (["+optimizer.lrr=0.1"], ["optimizer.lrr is not a field of AdamWConfig", "did you mean optimizer.lr?"]),
    (["+model.dimm=64"], ["model.dimm is not a field of GQAConfig", "did you mean model.dim?"]),
    (["+seeed=1"], ["seeed is not a field of RootConfig", "did you mean seed?"]),
    (["abort.metric=val/acc"], ["abort.metric=val/acc is not one of ['val/loss', 'train/loss']"]),
    (["abort.window=-1"], ["abort.window=-1 must be in [2, 1000000]"]),
    (["abort=strict"], ["abort.action=rollback restores the last good checkpoint", "trainer.checkpoint_every=<steps>"]),
    (["abort.rollback_lr_scale=2"], ["abort.rollback_lr_scale=2.0 must be in (0, 1]"]),
    (["model.dim=1000000"], ["the run needs about", "parameters), more than this machine's available RAM", "lower model.dim"]),
    (["trainer.batch_size=100000000"], ["the run needs about", "activations", "lower trainer.batch_size"]),
    (["check=preflight", "check.stages.preflight.batch_size=0"], ["check.stages.preflight.batch_size=0 must be >= 1"]),
    (["check=nope"], ["check=nope: check has no option 'nope': choose from [", "ladder"]),
    (["sweep=nope"], ["sweep=nope: sweep has no option 'nope'", "tpe"]),
    (["hydra/launcher=nope"], ["hydra/launcher has no option 'nope'", "slurm"]),
    # Hydra's own composition errors, in curryTrain's form (currytrain.compose_errors): the key, did you mean, the fix.
    (["trainer.batchsize=4"], ["trainer.batchsize is not a field of TrainerConfig: did you mean trainer.batch_size? pass trainer.batch_size=4"]),
    (["data=text", "data.paths=corpus"], ["data.paths=corpus must be a list: pass data.paths=[corpus]"]),
    (["trainer.max_steps=abc"], ["trainer.max_steps=abc must be a whole number: pass trainer.max_steps=<int>"]),
    (["trainer.progress=maybe"], ["trainer.progress=maybe must be true or false"]),
    (["logger=[tensorboard,nope]"], ["logger has no option 'nope': choose from ['aim', 'jsonl', 'mlflow', 'tensorboard', 'wandb']"]),
    # Found by the config fuzz (tests/reliability/test_fuzz_config.py): each exited 1 or named no key before.
    (["optimizer.betas=[0.9,0.95"], ["optimizer.betas=[0.9,0.95: the value of optimizer.betas is not valid override syntax"]),
    (["model.dim=${nope}"], ["model.dim=${nope} cannot be read (Interpolation key 'nope' not found)"]),
    (["model.max_seq_len=1000000000"], ["the run needs about", "about 16,000,025,664 parameters), more than"]),
    (["model.n_layers=100000000000"], ["the run needs about", "about 928,000,000,01"]),
    (["model.dim=1000000000000000000000000000000"], ["the run needs about", "lower model.dim"]),
    (["data=synthetic", "data.num_tokens=1000000000000"], ["data 4,097.8", "lower data.num_tokens"]),
    (["data=probe", "data.num_symbols=1000"], ["model.vocab_size=256 is smaller than the probe tasks' vocabulary (3 special tokens + data.num_symbols=1000)"]),
    (["model.init_std=1e300"], ["model.init_std=1e+300 is beyond float32's range"]),
    (["optimizer.lr=1e300"], ["optimizer.lr=1e+300 is beyond float32's range"]),
    # Non-finite values, refused by the schema layer for every float field (rules.schema_problems).
    (["model.init_std=inf"], ["model.init_std=inf must be a finite number > 0: pass model.init_std=0.02"]),
    (["model.init_std=nan"], ["model.init_std=nan must be a finite number > 0"]),
    (["optimizer.lr=inf"], ["optimizer.lr=inf must be a finite number > 0"]),
    (["trainer.grad_clip=-inf"], ["trainer.grad_clip=-inf must be a finite number >= 0"]),
    (["trainer.compile_cache="], ["trainer.compile_cache='' must name a folder: pass trainer.compile_cache=.cache/compile"]),
    (["optimizer.betas=[0.9,nan]"], ["optimizer.betas=[0.9,nan] must be a finite number in [0, 1)"]),
    (["abort.max_seconds=inf"], ["abort.max_seconds=inf must be a finite number >= 0"]),
    (["parallel.hang_timeout=nan"], ["parallel.hang_timeout=nan must be a finite number in [0, 10000000]"]),
    (["seed=-1"], ["seed=-1 must be in [0, 2**63)"]),
    # The fields the HF families added (issue 33) declare their ranges the same way.
    (["model.attn_softcap=inf"], ["model.attn_softcap=inf must be a finite number >= 0: pass model.attn_softcap=0.0"]),
    (["model.rope_dim=-2"], ["model.rope_dim=-2 must be >= 0: pass model.rope_dim=0"]),
    (["model=moe", "model.router_groups=0"], ["model.router_groups=0 must be >= 1: pass model.router_groups=1"]),
    (["model=moe", "model.dense_layers=[-1]"], ["model.dense_layers=[-1] must be each entry >= 0"]),
    (
        ["logger=[jsonl]", "logger.jsonl.filename=../../escaped.jsonl"],
        ["logger.jsonl.filename='../../escaped.jsonl' must name a file or folder inside the run folder"],
    ),
    # Values that passed validation and then hung or crashed (issue 46): each has its range now.
    (["trainer.grad_accum=1000000000000000000"], ["trainer.grad_accum=1000000000000000000 must be in [1, 65536]"]),
    (["trainer.eval_batches=1000000000000000000"], ["trainer.eval_batches=1000000000000000000 must be in [1, 65536]"]),
    (["logger.tensorboard.flush_secs=1000000000000000000"], ["logger.tensorboard.flush_secs=1000000000000000000 must be in [1, 86400]"]),
    (["abort.window=10000000000000000000"], ["abort.window=10000000000000000000 must be in [2, 1000000]"]),
    (["parallel.rendezvous_timeout=1e30"], ["parallel.rendezvous_timeout=1e+30 must be"]),
    (
        ["+logger.mine={_target_:currytrain.logger.jsonl.JsonlLogger,filenme:x.jsonl}"],
        ["logger.mine.filenme is not an argument of currytrain.logger.jsonl.JsonlLogger", "['run_dir', 'filename']"],
    ),
    (["hydra.run.dir=/tmp/run_\udcff_folder"], ["is not UTF-8 text", "pass the value in UTF-8"]),
]


FAST_SAMPLE = 16
"""`make test-fast` runs the first FAST_SAMPLE cases (a model, optimizer, data, trainer and resume error each); `make
test` runs every case."""


@pytest.mark.reliability(kind="bad input")
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [case if index < FAST_SAMPLE else pytest.param(*case, marks=pytest.mark.slow) for index, case in enumerate(BAD_CONFIGS)],
    ids=[" ".join(o) for o, _ in BAD_CONFIGS],
)
def test_bad_config_exits_2_with_one_clear_message(overrides, expected, tmp_path):
    run_dir = tmp_path / "run"
    result = launch(*overrides, f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr
    message = result.stderr + result.stdout
    for text in expected:
        assert text in message, message
    assert "Traceback" not in message and "HYDRA_FULL_ERROR" not in message
    assert not run_dir.exists(), "a rejected config must write nothing"


def test_text_folders_without_usable_files_are_rejected_before_anything_is_written(tmp_path):
    empty = tmp_path / "corpus"
    empty.mkdir()
    (empty / "notes.txt").write_text("")
    (empty / "image.png").write_bytes(b"png")
    run_dir = tmp_path / "run"
    result = launch("data=text", f"data.paths=[{empty}]", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2
    assert f"data.paths: {empty} holds no non-empty file ending in ['.txt', '.md', '.py']" in result.stderr
    assert not run_dir.exists()


def test_a_corpus_too_short_for_one_sequence_is_rejected_before_anything_is_written(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("only a few bytes")
    result = launch("data=text", f"data.paths=[{short}]", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    assert "data.paths hold 14 train / 2 val bytes, too few for data.seq_len=32" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_resuming_into_a_different_model_names_the_overrides(tmp_path):
    first = launch("trainer.max_steps=2", "optimizer.schedule.warmup_steps=1", f"hydra.run.dir={tmp_path / 'a'}")
    assert first.returncode == 0, first.stderr
    other = launch(
        "trainer.max_steps=2", "optimizer.schedule.warmup_steps=1", "model.dim=64", f"trainer.resume={tmp_path / 'a'}", f"hydra.run.dir={tmp_path / 'b'}"
    )
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "holds a model the config does not describe: pass model.dim=32" in other.stderr
    assert not (tmp_path / "b").exists()


def test_a_multirun_never_trains_over_its_earlier_jobs(tmp_path):
    sweep = ["-m", "seed=1,2", "trainer.max_steps=2", "optimizer.schedule.warmup_steps=1", f"hydra.sweep.dir={tmp_path}"]
    assert launch(*sweep).returncode == 0
    marker = tmp_path / "0" / "checkpoints" / "step_2" / "COMPLETE"
    written = marker.read_text(), marker.stat().st_mtime_ns
    again = launch(*sweep)
    assert again.returncode == 2
    assert "already holds checkpoints of an earlier run" in again.stderr
    assert (marker.read_text(), marker.stat().st_mtime_ns) == written


def test_all_problems_are_reported_at_once(tmp_path):
    result = launch("optimizer.lr=-1", "model.n_kv_heads=3", "trainer.device=tpu", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert "the config has 3 problems" in result.stderr
    for key in ("optimizer.lr", "model.n_kv_heads", "trainer.device"):
        assert f"  - {key}=" in result.stderr


@pytest.mark.slow
def test_existing_checkpoints_are_never_trained_over(tmp_path):
    run_dir = tmp_path / "run"
    first = launch("trainer.max_steps=2", "optimizer.schedule.warmup_steps=1", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr
    journal_before = (run_dir / "journal.jsonl").read_text()
    checkpoints_before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    again = launch("trainer.max_steps=2", "optimizer.schedule.warmup_steps=1", f"hydra.run.dir={run_dir}")
    assert again.returncode == 2
    assert "trainer.resume=auto" in again.stderr and "hydra.run.dir" in again.stderr
    assert (run_dir / "journal.jsonl").read_text() == journal_before
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == checkpoints_before


def test_cfg_job_is_fast_path_without_heavy_imports():
    """`launch.py --cfg job` must not import torch, lightning, mlflow or optuna (its speed depends on it)."""
    probe = (
        "import sys, runpy; sys.argv = ['launch.py', '--cfg', 'job']\n"
        "try:\n    runpy.run_path('launch.py', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "import json; heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning', 'mlflow', 'optuna', 'transformers'})\n"
        "print('HEAVY=' + json.dumps(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "_target_: currytrain.model.gqa.GQATransformer" in result.stdout
    heavy = json.loads(result.stdout.split("HEAVY=")[1])
    assert heavy == []


def launch_probe(argv: list[str], modules: set[str]) -> tuple[int, list[str]]:
    """Run launch.py with `argv` in a fresh interpreter: its exit code, and which of `modules` it had loaded."""
    probe = (
        f"import sys, runpy; sys.argv = {['launch.py', *argv]!r}\n"
        "code = 0\n"
        "try:\n    runpy.run_path('launch.py', run_name='__main__')\n"
        "except SystemExit as exit_:\n    code = exit_.code or 0\n"
        f"import json; print('LOADED=' + json.dumps([code, sorted(set({sorted(modules)!r}) & set(sys.modules))]))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "LOADED=" in result.stdout, result.stderr[-2000:]
    code, loaded = json.loads(result.stdout.split("LOADED=")[1])
    return code, loaded


def test_start_up_skips_the_modules_it_does_not_use(tmp_path):
    """Issue 10's start-up: a one-process run does not import torch.distributed.optim (0.4 s; ZeRO only), and a
    config that validation refuses for its size is refused without torch._dynamo (0.7 s; meta-device init drew
    through torch's Python reference kernels, which import it). A run's optimizer imports torch._dynamo anyway."""
    run = tmp_path / "run"
    code, loaded = launch_probe([*TINY, "trainer.max_steps=1", "optimizer.schedule.warmup_steps=null", f"hydra.run.dir={run}"], {"torch.distributed.optim"})
    assert (code, loaded) == (0, [])
    assert (run / "checkpoints" / "step_1").is_dir()  # it checkpointed (DCP) without them
    code, loaded = launch_probe(["model.dim=100000", f"hydra.run.dir={tmp_path / 'big'}"], {"torch", "torch._dynamo"})
    assert (code, loaded) == (2, ["torch"])  # the memory estimate built the model on the meta device


HOSTILE_TARGETS = [
    "torch.hub.load",
    "torch.save",
    "torch.os.system",
    "os.system",
    "builtins.eval",
    "builtins.open",
    "currytrain.run.os.system",
    "currytrain.journal.git_state",  # curryTrain's own functions are not components: only registered ones are built
    "currytrain.diskio.append_line",
]


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_unregistered_targets_are_refused_before_anything_is_written(target, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    run_dir = tmp_path / "run"
    # A top-level key and one nested in a list inside another group: both are walked.
    for override in (f"+parallel.x={{_target_:{target},_args_:[pwned,{victim}]}}", f"+optimizer.schedule.extra=[{{_target_:{target},_args_:[{victim}]}}]"):
        result = launch(override, f"hydra.run.dir={run_dir}")
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"_target_={target} is not a registered component" in result.stderr, result.stderr
        assert victim.read_text() == "precious" and not run_dir.exists()


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_build_refuses_unregistered_targets_nested_ones_included(target):
    from omegaconf import OmegaConf

    from currytrain.build import build
    from currytrain.errors import ConfigError

    with pytest.raises(ConfigError, match="is not a registered component"):
        build(OmegaConf.create({"_target_": target, "_args_": ["x"]}))
    nested = {"_target_": "currytrain.data.corpus.SyntheticTokens", "seq_len": 8, "hooks": [{"inner": {"_target_": target}}]}
    with pytest.raises(ConfigError, match=r"hooks\[0\]\.inner\._target_"):
        build(OmegaConf.create(nested))


def test_build_allow_names_exact_callables_and_only_the_command_line_sets_it(compose_cfg, tmp_path):
    from currytrain.errors import ConfigError
    from currytrain.validate import validate

    crash, slow = "+logger.crash={_target_:tests.faulty.CrashingLogger}", "+logger.slow={_target_:tests.faulty.SlowLogger}"
    assert any("logger.crash._target_=tests.faulty.CrashingLogger is not a registered component" in p for p in validate(compose_cfg(crash)))
    assert validate(compose_cfg("build.allow=[tests.faulty.CrashingLogger]", crash)) == []
    problems = validate(compose_cfg("build.allow=[tests.faulty.CrashingLogger]", crash, slow))
    assert [p for p in problems if "registered" in p] == [p for p in problems if p.startswith("logger.slow._target_=tests.faulty.SlowLogger")], (
        "not module-wide"
    )
    with pytest.raises(ConfigError, match=r"build.allow entry tests is not the dotted name of a class or function"):
        compose_cfg("build.allow=[tests]", crash)
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "widen.yaml").write_text("# @package _global_\nbuild:\n  allow: [tests.faulty.CrashingLogger]\n")
    with pytest.raises(ConfigError, match=r"build.allow=\['tests.faulty.CrashingLogger'\] is set by a config file: only the command line"):
        compose_cfg(f"hydra.searchpath=[file://{tmp_path}]", "experiment=widen", crash)


def test_no_sys_exit_inside_the_package_outside_its_command_line_entries():
    # the `currytrain` command, what every launch.py runs, and the tokenizing worker (python -m currytrain.data.shards)
    entries = ("cli.py", "app.py", "data/shards.py")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in (ROOT / "currytrain").rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "sys.exit(" in line and path.relative_to(ROOT / "currytrain").as_posix() not in entries
    ]
    assert offenders == []


def test_a_run_its_ranks_memory_cannot_hold_is_refused_with_the_layouts_that_fit(compose_cfg):
    """Two ranks on the CPU share its RAM: a model whose state takes 60% of it fits one process, not two replicas.
    The refusal names the per-rank prediction of `currytrain advise` and the layouts of two ranks that fit, each a
    config validation accepts."""
    from currytrain.estimate import device_memory
    from currytrain.validate import validate

    vocab = int(0.6 * device_memory("cpu")[0] / 16 / (2 * 256))  # embedding + readout of width 256, 16 bytes per parameter
    sizes = ["model.dim=256", f"model.vocab_size={vocab}", "trainer.device=cpu"]
    (problem,) = validate(compose_cfg("parallel=ddp", "parallel.nproc=2", *sizes))
    assert problem.startswith("the run needs about") and "GiB per rank (dp2 ddp)" in problem and "which its 2 ranks share" in problem
    assert "layouts of these ranks that fit (currytrain advise): " in problem and "dp2 fsdp (" in problem
    fix = problem.split("dp2 fsdp (", 1)[1].split("pass ", 1)[1].split(",")[0].split(";")[0].split()
    assert fix == ["parallel.dp_replicate=1", "parallel.dp_shard=2", "parallel.zero_stage=3"]
    assert validate(compose_cfg("parallel=ddp", "parallel.nproc=2", *sizes, *fix)) == []
    assert validate(compose_cfg(*sizes)) == []  # one process holds it
