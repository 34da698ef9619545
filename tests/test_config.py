"""Every option of every group composes and builds; groups map one to one onto packages; build() guards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from conftest import TINY
from currytrain.benchmark import build_step_setup
from currytrain.build import build
from currytrain.config import SCHEMAS
from currytrain.errors import ConfigError
from currytrain.model import build_model
from currytrain.trainer.hooks import StepHook
from currytrain.validate import validate

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GROUP_PACKAGES = {"experiment": "experiments", "optimizer": "currytrain/optim"}  # else currytrain/<group>


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


# conf/hydra/ configures Hydra itself (launcher presets), not a curryTrain component.
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra" and not p.name.startswith("_")) + ["model/size"]
ALL_OPTIONS = [(group, option) for group in GROUPS for option in _options(group)]


def test_every_group_is_a_package_and_every_schema_has_a_yaml():
    for group_dir in (p for p in CONF.iterdir() if p.is_dir() and p.name != "hydra" and not p.name.startswith("_")):
        package = ROOT / GROUP_PACKAGES.get(group_dir.name, f"currytrain/{group_dir.name}")
        assert (package / "__init__.py").is_file(), f"conf/{group_dir.name} has no package {package}"
    for group, options in SCHEMAS.items():
        assert set(options) == set(_options(group)), f"conf/{group}/*.yaml and SCHEMAS[{group!r}] disagree"
        module_prefix = GROUP_PACKAGES.get(group, f"currytrain/{group}").replace("/", ".") + "."
        for name, schema in options.items():
            target = schema._target_
            assert target is None or target.startswith(module_prefix), f"{group}={name} builds {target}, outside {module_prefix}"


TABLE_OPTIONS = {("model", "mlp"), ("data", "digits"), ("data", "table"), ("experiment", "digits")}
"""Options of tables of features: an MLP classifier on rows, not a decoder on tokens (no model/size, no TINY decoder sizes)."""


def _table_overrides(group: str, option: str, tmp_path: Path) -> list[str]:
    overrides = ["model=mlp", "~model/size", *(o for o in TINY if o.startswith(("trainer.", "optimizer.")))]
    if group == "experiment":
        return [f"experiment={option}", *overrides[2:]]
    if option != "table":
        return [*overrides, "data=digits"]
    table = tmp_path / "rows.csv"
    table.write_text("a,b,label\n" + "".join(f"{i % 7},{i % 5},{i % 3}\n" for i in range(40)))
    return [*overrides, "data=table", f"data.path={table}", "model.in_features=2", "model.num_classes=3"]


def _option_overrides(group: str, option: str, tmp_path: Path) -> list[str]:
    if (group, option) in TABLE_OPTIONS:
        return _table_overrides(group, option, tmp_path)
    if group == "logger":
        return [f"logger=[{option}]"]
    overrides = [f"{group}={option}"]
    if group == "experiment":
        return overrides
    if (group, option) == ("abort", "strict"):  # rollback needs checkpoints to go back to
        overrides.append("trainer.checkpoint_every=2")
    if group == "parallel" and option in ("tp", "hybrid"):  # tensor parallel splits the kv heads too: TINY has one
        overrides.append("model.n_kv_heads=2")
    if (group, option) == ("parallel", "ep"):
        overrides.append("model=moe")
    if (group, option) == ("parallel", "pp"):  # a stage per rank needs a layer each; 1f1b needs a microbatch per stage
        overrides += ["model.n_layers=2", "trainer.grad_accum=2"]
    if (group, option) == ("eval", "local"):  # the user's own evaluators: here a held-out text set
        (tmp_path / "held.txt").write_text("print('held out')\n" * 20)
        overrides.append(f"+eval.texts.held={tmp_path / 'held.txt'}")
    if (group, option) == ("data", "text"):
        text = tmp_path / "corpus"
        text.mkdir()
        for index in range(3):
            (text / f"part{index}.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
        overrides.append(f"data.paths=[{text}]")
    if (group, option) == ("data", "tokens"):
        from tiny_tokenizer import train_tokenizer, write_corpus

        tokenizer = train_tokenizer(tmp_path / "tokenizer")
        overrides += [f"data.tokenizer={tokenizer}", f"data.paths=[{write_corpus(tmp_path / 'corpus')}]", f"data.cache_dir={tmp_path / 'cache'}"]
        overrides.append("model.vocab_size=320")
    return overrides


@pytest.mark.slow
@pytest.mark.parametrize(("group", "option"), ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_compose_and_build_every_option(group, option, compose_cfg, tmp_path):
    tiny = not (group == "model" or group.startswith("model/")) and (group, option) not in TABLE_OPTIONS
    cfg = compose_cfg(*_option_overrides(group, option, tmp_path), tiny=tiny)
    assert validate(cfg) == [], validate(cfg)
    if group == "model/size":  # full sizes: the model alone
        assert build_model(cfg.model).output.out_features == cfg.model.vocab_size
        return
    parts = build_step_setup(cfg)  # data, model, optimizer and schedule, as a run builds them
    assert isinstance(parts.model, torch.nn.Module)
    inputs, targets = parts.data.batch("train", 1, 0, 2)
    if (group, option) in TABLE_OPTIONS:  # rows of features and a class each
        assert inputs.shape == (2, cfg.model.in_features) and targets.shape == (2,) and int(targets.max()) < cfg.model.num_classes
    else:
        assert inputs.shape == targets.shape == (2, cfg.data.seq_len)
        assert int(inputs.max()) < cfg.model.vocab_size
    assert isinstance(parts.optimizer, torch.optim.Optimizer)
    assert build(cfg.parallel).nproc == cfg.parallel.nproc
    for node in cfg.logger.values():
        logger = build(node, run_dir=str(tmp_path / "run"))
        logger.log_metrics({"x": 1.0}, step=1)
        logger.close()
    for none_group in ("check", "sweep"):
        if none_group != group:  # check=<stage> builds its ladder
            assert build(cfg[none_group]) is None
    assert isinstance(build(cfg.abort), StepHook) if cfg.abort._target_ else build(cfg.abort) is None


def test_model_sizes_match_the_issue(compose_cfg):
    tiny = compose_cfg("model/size=tiny", tiny=False).model
    assert (tiny.vocab_size, tiny.dim, tiny.n_layers, tiny.n_heads, tiny.n_kv_heads, tiny.mlp_hidden, tiny.max_seq_len) == (
        1024,
        128,
        2,
        4,
        2,
        384,
        128,
    )
    small = compose_cfg("model/size=small", tiny=False).model
    assert (small.vocab_size, small.dim, small.n_layers, small.n_heads, small.n_kv_heads, small.mlp_hidden, small.max_seq_len) == (
        8192,
        384,
        6,
        6,
        2,
        1024,
        256,
    )
    medium = compose_cfg("model/size=medium", tiny=False).model  # bench/peers.py's ~125M (GPT-2 small) shape
    with torch.device("meta"):
        parameters = sum(p.numel() for p in build_model(medium).parameters())
    assert (medium.dim, medium.n_layers, medium.n_heads, medium.n_kv_heads) == (768, 12, 12, 4) and 100e6 < parameters < 150e6, parameters


def test_default_config_is_valid_and_typed(compose_cfg):
    cfg = compose_cfg(tiny=False)
    assert validate(cfg) == []
    assert cfg.data.seq_len == cfg.model.max_seq_len  # interpolated, not copied
    assert OmegaConf.get_type(cfg.optimizer).__name__ == "AdamWConfig"


def test_experiment_file_overrides_several_groups(compose_cfg):
    cfg = compose_cfg("experiment=tiny_bytes", tiny=False)
    assert cfg.model.vocab_size == 1024 and cfg.trainer.max_steps == 200 and cfg.optimizer.lr == 2e-3


def test_mistyped_key_fails_at_composition(compose_cfg):
    with pytest.raises(ConfigCompositionException):
        compose_cfg("optimizer.lrr=1")
    with pytest.raises(ConfigCompositionException):
        compose_cfg("logger.tensorboard.subdirr=x")


def test_build_rejects_targets_outside_the_allow_list(compose_cfg):
    node = OmegaConf.create({"_target_": "os.system", "command": "echo hi"})
    with pytest.raises(ConfigError, match="_target_=os.system"):
        build(node)
    nested = OmegaConf.create({"_target_": "currytrain.logger.base.MultiLogger", "loggers": [], "x": {"_target_": "subprocess.run"}})
    with pytest.raises(ConfigError, match="x._target_=subprocess.run"):
        build(nested)
    in_list = OmegaConf.create({"_target_": "currytrain.logger.base.MultiLogger", "loggers": [{"_target_": "collections.OrderedDict"}]})
    with pytest.raises(ConfigError, match=r"loggers\[0\]._target_=collections.OrderedDict"):
        build(in_list)


def test_the_registered_components_are_exactly_what_the_schemas_and_conf_name():
    """build's own list of curryTrain's components (for processes that register no schemas) equals the _target_s of
    every stored schema, and every _target_ a YAML file of conf/ names is registered."""
    import re

    from currytrain.build import BUILT_IN_TARGETS, COMPONENTS
    from currytrain.config import SCHEMAS, schema_targets

    named = {target for options in SCHEMAS.values() for schema in options.values() for target in schema_targets(schema)}
    assert {t for t in named if t.startswith("currytrain.")} == set(COMPONENTS)
    in_yaml = {match for path in CONF.rglob("*.yaml") for match in re.findall(r"_target_:\s*([\w.]+)", path.read_text())}
    assert in_yaml and in_yaml <= BUILT_IN_TARGETS, in_yaml - BUILT_IN_TARGETS


def test_build_rejects_runtime_arguments_that_collide_with_config_fields(compose_cfg):
    cfg = compose_cfg()
    with pytest.raises(ConfigError, match="collide"):
        build(cfg.logger.jsonl, filename="other.jsonl", run_dir="/tmp")


def test_the_memory_estimate_counts_parameters_exactly_without_allocating(compose_cfg):
    from currytrain.estimate import estimate_memory

    cfg = compose_cfg()
    estimate = estimate_memory(cfg)
    model = build_step_setup(cfg).model
    assert estimate.num_params == sum(p.numel() for p in model.parameters())
    assert (estimate.weights, estimate.gradients, estimate.optimizer) == (4 * estimate.num_params, 4 * estimate.num_params, 16 * estimate.num_params // 2)
    assert estimate_memory(compose_cfg("model.ac=full")).activations < estimate.activations
