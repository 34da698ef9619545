"""The whole config surface fuzzed (hypothesis): override sets drawn from every group's options and every typed
node's fields (right types in and out of range, non-finite and huge numbers, wrong types, empty strings, unknown keys,
interpolations, options that do not exist, combinations across groups). Every case either exits 2 naming one of its
keys, or is valid and runs a few steps; never an exit 1, a traceback, a hang, or a write into an earlier run folder.

Most cases are decided the way launch.py decides them, in this process and without training: run_app's checks
before composition, Hydra's composition (the options' defaults lists, cached per choice of options, then the value
overrides applied by Hydra's own ConfigLoaderImpl._apply_overrides_to_config) and currytrain.validate. Every
CROSS_CHECK_EVERY-th case also goes through launch.py itself (tests.inprocess), which must agree; a few valid cases
run (RUNS_PER_PROFILE), capped to 2 steps.

Profiles (tests/conftest.py): the default runs FUZZ_CASES derandomised cases in `make test`; `--hypothesis-profile=long`
runs 5,000 for a nightly job (`make fuzz-long` writes its row into docs/reliability.md).
"""

from __future__ import annotations

import copy
import dataclasses
import signal
import time
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf

from conftest import CONF, TINY, launch
from currytrain.config import CONF_DIR, broken_yaml_choices, register_configs, unknown_list_choices, unparsable_overrides
from currytrain.rules import Bounds, declared_bounds
from currytrain.validate import schema_of, validate

CROSS_CHECK_EVERY = 40
RUNS_PER_PROFILE = {"ci": 3, "long": 25}
CASE_SECONDS = 180
"""A case still undecided after this long is a hang."""
GROUPS = {
    "model": ["gqa", "moe", "spiking", "mlp", "nope"],
    "model/size": ["debug", "tiny", "nope"],
    "data": ["bytes", "synthetic", "probe", "text", "digits", "tokens", "table", "nope"],
    "parallel": ["single", "ddp", "fsdp", "tp", "pp", "cp", "ep", "zero1", "hybrid", "nope"],
    "optimizer": ["adamw", "sgd", "nope"],
    "logger": ["[jsonl]", "[tensorboard,jsonl]", "[]", "[jsonl,nope]", "nope"],
    "check": ["none", "preflight", "sanity", "ladder", "seeds", "nope"],
    "abort": ["default", "none", "strict", "nope"],
    "sweep": ["none", "tpe", "grid", "nope"],
    "cost": ["h100", "cpu", "nope"],
    "experiment": ["tiny_bytes", "digits", "nope"],
}
"""The option each group's case may choose (the defaults when not drawn); every group's options, and one that does not exist."""
CAPS = ("trainer.max_steps=2", "trainer.eval_every=1", "trainer.eval_batches=1", "trainer.log_every=1", "trainer.progress=false")
STATS: Counter = Counter()


@cache
def base_config(choices: tuple[str, ...], run_dir: str) -> DictConfig | str:
    """The config composed with TINY and these options (Hydra's compose), or Hydra's message when it fails."""
    if not GlobalHydra.instance().is_initialized():  # an in-process launch clears it
        register_configs()
        initialize_config_dir(config_dir=str(CONF), version_base="1.3").__enter__()
    try:
        return compose(config_name="config", overrides=[*TINY, *choices, f"hydra.run.dir={run_dir}"], return_hydra_config=True)
    except Exception as error:  # Hydra's errors: launch.py prints them and exits 2
        return f"{type(error).__name__}: {error}"


def typed_fields(cfg: DictConfig) -> list[tuple[str, dataclasses.Field, Bounds, str]]:
    """(key, field, its Bounds, its declared type) of every field of every typed node outside hydra."""
    found = []

    def walk(node: DictConfig, path: str) -> None:
        schema = schema_of(node)
        if schema is not None:
            for spec in dataclasses.fields(schema):
                if spec.name in node and not isinstance(node._get_node(spec.name), DictConfig):  # sub-nodes are walked
                    found.append((f"{path}.{spec.name}" if path else spec.name, spec, declared_bounds(schema, spec.name), str(spec.type)))
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and key != "hydra":
                walk(child, f"{path}.{key}" if path else str(key))

    walk(cfg, "")
    return found


EMPTY_AND_WRONG = ["''", "null", "abc", "' '", "[1,2]", "{a: 1}", "true"]
INTERPOLATED = ["${nope}", "${trainer.batch_size}", "'${model.dim}'", "${model.zzz}"]
HUGE = ["2147483648", "9223372036854775808", "1000000000000000000000000000000", "-1000000000000000000000000000000", "1e300", "-1e300"]


def values(kind: str, bounds: Bounds, default: object) -> st.SearchStrategy[str]:
    """Override texts for a field, by category (each as likely): its default, in and just out of its declared range,
    non-finite, huge, empty or of a wrong type, interpolated."""
    edges = [b for b in (bounds.ge, bounds.gt, bounds.le, bounds.lt) if b is not None]
    if "float" in kind:
        ranged = [repr(float(e) + d) for e in edges for d in (-1.0, -1e-9, 0.0, 1e-9, 1.0)] + ["0.0", "-0.5", "0.5", "2.0", "1", "1e-300"]
        special = ["inf", "-inf", "nan", "+inf"]
    elif "int" in kind:
        ranged = [str(int(e) + d) for e in edges for d in (-1, 0, 1)] + ["0", "-1", "1", "2", "3", "7", "64"]
        special = ["1.5", "1e3", "inf", "nan", "0x10"]
    elif "bool" in kind:
        ranged, special = ["true", "false"], ["1", "0", "yes", "maybe"]
    elif "list" in kind:
        ranged = ["[]", "[1]", "[1,2]", "[0.9,0.95]", "[-1,64]", "[64,128,256]", "[copy]"]
        special = ["[nan,1]", "[a]", "[inf]", "[[1]]"]
    elif "str" in kind:
        ranged = ["nope", "auto", "none", "cpu", "cuda", "fp16", "bf16", "full", "weights", "../../escape", "/tmp/no/such/path"]
        special = ["''", "' '", "a b"]
    else:
        ranged, special = ["{}", "[]"], ["nope"]
    categories = [ranged, special, HUGE, EMPTY_AND_WRONG, INTERPOLATED]
    if default is not None and not isinstance(default, (dict, list)) and str(default).strip() and "${" not in str(default):
        categories.append([str(default)])
    return st.sampled_from(categories).flatmap(st.sampled_from)


@st.composite
def cases(draw, run_dir: str, sentinel: str) -> list[str]:
    """One user's command line: options of some groups, then values of some fields of the config they compose."""
    choices = []
    for _ in range(draw(st.sampled_from([0] * 55 + [1] * 40 + [2] * 5))):  # few at once: each choice of options composes anew
        group = draw(st.sampled_from(sorted(GROUPS)))
        choices.append(f"{group}={draw(st.sampled_from(GROUPS[group]))}")
    if draw(st.booleans()) and any(c.startswith("model=mlp") for c in choices):
        choices.append("~model/size")
    base = base_config(tuple(choices), run_dir)
    overrides = list(choices)
    if isinstance(base, str):
        return overrides + [f"seed={draw(st.integers(0, 3))}"]
    fields = typed_fields(base)
    for _ in range(draw(st.sampled_from([1] * 6 + [2] * 3 + [3, 4])) - (1 if choices and draw(st.booleans()) else 0)):  # most bugs show alone
        key, spec, bounds, kind = draw(st.sampled_from(fields))
        default = OmegaConf.select(base, key, default=None, throw_on_resolution_failure=False)
        overrides.append(f"{key}={draw(values(kind, bounds, default))}")
    extra = draw(st.integers(0, 19))
    if extra == 0:
        node = draw(st.sampled_from(sorted({key.rsplit(".", 1)[0] for key, *_ in fields if "." in key})))
        overrides.append(f"{draw(st.sampled_from(['', '+']))}{node}.zzz_unknown=1")
    elif extra == 1:
        overrides.append("+zzz_unknown=1")
    elif extra == 2:
        overrides.append(f"hydra.run.dir={sentinel}")
    elif extra == 3:
        overrides.append(f"trainer.resume={draw(st.sampled_from([sentinel, sentinel + '/checkpoints/step_6', '/no/such/run', 'auto', '']))}")
    elif extra == 4:
        overrides.append(f"trainer.init_from={draw(st.sampled_from([sentinel, '/no/such/weights', '']))}")
    return overrides


def is_choice(override: str) -> bool:
    """An override that chooses a group's option (`model=moe`, `~model/size`), not a value."""
    return override.split("=", 1)[0].lstrip("~+") in GROUPS


def keys_of(overrides: list[str]) -> list[str]:
    """What a message must name for a case: each override's key, or its group as `group=`, `group/` or `group.`."""
    names = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        names.append(key)
        top = key.split(".")[0].split("/")[0]
        names += [f"{top}=", f"{top}/", f"{top}.", f"'{top}'"]
    return names


def decide(overrides: list[str], run_dir: str) -> tuple[str, str]:
    """('refused', message) or ('valid', '') as launch.py would decide, without training; ('crash', traceback) else."""
    problems = unparsable_overrides(overrides) or unknown_list_choices(overrides, [CONF_DIR]) + broken_yaml_choices(overrides, [CONF_DIR])
    if problems:
        return "refused", "\n".join(problems)
    choices = tuple(o for o in overrides if is_choice(o))
    base = base_config(choices, run_dir)
    if isinstance(base, str):
        return "refused", base
    cfg = copy.deepcopy(base)
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if o not in choices])
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    except Exception as error:  # Hydra's message for a value it cannot merge: exit 2 in launch.py
        return "refused", f"{type(error).__name__}: {error}"
    # A multirun (a sweep preset sets hydra.mode) is validated without a run folder (ValidateCallback.on_multirun_start).
    multirun = "MULTIRUN" in str(OmegaConf.select(cfg, "hydra.mode"))
    problems = validate(cfg, None if multirun else OmegaConf.select(cfg, "hydra.run.dir"))
    return ("refused", "\n".join(problems)) if problems else ("valid", "")


def runnable(overrides: list[str], run_dir: str) -> list[str] | None:
    """The case capped to 2 steps in a fresh folder, when it is a single CPU process training with no ladder or sweep."""
    cfg = copy.deepcopy(base_config(tuple(o for o in overrides if is_choice(o)), run_dir))
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides([o for o in overrides if not is_choice(o)]), cfg)
    if cfg.parallel.nproc != 1 or cfg.check.get("_target_") or cfg.sweep.get("_target_") is not None or OmegaConf.select(cfg, "hydra.mode") is not None:
        return None
    if any(o.startswith(("hydra.run.dir=", "trainer.resume=")) for o in overrides) or cfg.trainer.device == "cuda":
        return None
    caps = list(CAPS) + (["data.max_bytes=300000"] if "max_bytes" in cfg.data else []) + (["trainer.grad_accum=2"] if cfg.trainer.grad_accum > 2 else [])
    return [*overrides, *caps]


def snapshot(folder: Path) -> dict[str, int]:
    return {str(path): path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory) -> Path:
    """An earlier run's folder (6 TINY steps, finished): no case may write into it."""
    run_dir = tmp_path_factory.mktemp("earlier") / "run"
    assert launch("logger=[jsonl]", "data.max_bytes=300000", f"hydra.run.dir={run_dir}").returncode == 0
    return run_dir


def _hang(signum, frame):
    raise TimeoutError(f"a fuzz case ran for more than {CASE_SECONDS} s: a hang")


@pytest.mark.slow
@pytest.mark.reliability(kind="fuzz")
def test_every_drawn_override_set_exits_2_naming_a_key_or_runs(sentinel, tmp_path, record_property):
    profile = settings.get_current_profile_name()  # ci, or what --hypothesis-profile chose (tests/conftest.py)
    runs_left = [RUNS_PER_PROFILE.get(profile, 3)]
    run_dir = str(tmp_path / "fresh")
    earlier = snapshot(sentinel)
    STATS.clear()
    started = time.perf_counter()

    @given(case=cases(run_dir, str(sentinel)))
    def check(case: list[str]) -> None:
        STATS["cases"] += 1
        previous = signal.signal(signal.SIGALRM, _hang)
        signal.alarm(CASE_SECONDS)
        try:
            verdict, message = decide(case, run_dir)
            if verdict == "refused":
                STATS["refused"] += 1
                assert any(name in message for name in keys_of([*TINY, *case])), f"{case}: the refusal names none of its keys:\n{message}"
                assert "Traceback" not in message, message
            else:
                STATS["valid"] += 1
            if STATS["cases"] % CROSS_CHECK_EVERY == 0 and verdict == "refused":
                STATS["cross_checked"] += 1
                real = (
                    launch(*case, f"hydra.run.dir={tmp_path / 'cross' / str(STATS['cases'])}")
                    if not any(o.startswith("hydra.run.dir=") for o in case)
                    else launch(*case)
                )
                assert real.returncode == 2, f"{case}: launch.py exited {real.returncode}, the fast path refused it:\n{real.stderr[-3000:]}"
                assert "Traceback" not in real.stderr
            if verdict == "valid" and runs_left[0] > 0 and (capped := runnable(case, run_dir)) is not None:
                runs_left[0] -= 1
                STATS["ran"] += 1
                runs = tmp_path / "runs" / str(STATS["cases"])
                result = launch(*capped, f"hydra.run.dir={runs}")
                named = any(name in result.stderr for name in keys_of([*TINY, *capped]))
                journal = runs / "journal.jsonl"
                aborted = result.returncode == 4 and journal.is_file() and '"type": "abort"' in journal.read_text()  # it ran, and stopped by design
                assert result.returncode == 0 or (result.returncode == 2 and named) or aborted, f"{capped}: exit {result.returncode}\n{result.stderr[-3000:]}"
                assert "Traceback" not in result.stderr, result.stderr[-3000:]
            assert snapshot(sentinel) == earlier, f"{case} wrote into an earlier run folder"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    check()
    seconds = time.perf_counter() - started
    record_property("case", f"{profile} profile")
    for key in ("cases", "refused", "valid", "ran", "cross_checked"):
        record_property(key, STATS[key])
    record_property("seconds", round(seconds))
    record_property("nightly", profile == "long")
    assert STATS["cases"] >= settings().max_examples * 0.9, STATS
