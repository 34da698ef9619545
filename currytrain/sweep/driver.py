"""The sweep loop behind the Hydra plugin: settings -> checks -> study (created or resumed) -> trials -> report.

Settings come from the `sweep` node (the presets) merged with keys written under `hydra.sweeper` the way
hydra-optuna-sweeper configs write them; `hydra.sweeper` wins key by key and `params` are merged.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from currytrain.errors import ConfigError, RunFailed, format_problems
from currytrain.sweep.checks import as_list, sweep_problems
from currytrain.sweep.config import OptunaSweepConfig
from currytrain.sweep.space import SearchSpace, parse_entry, parse_params

log = logging.getLogger(__name__)

DEFAULT_STUDY = "currytrain"
UNSUPPORTED = {
    "search_space": "hydra.sweeper.search_space is the deprecated form: move each entry to hydra.sweeper.params (e.g. `optimizer.lr: interval(1e-4, 1e-2)`)",
    "custom_search_space": "hydra.sweeper.custom_search_space is not supported: express the space in params (choice/interval/range)",
}


def merge_settings(config: DictConfig, sweeper_keys: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(settings, where each key came from, problems) from the `sweep` node and `hydra.sweeper`."""
    settings = OmegaConf.to_container(OmegaConf.structured(OptunaSweepConfig), resolve=True)
    paths = {key: f"sweep.{key}" for key in settings}
    node = config.get("sweep")
    if node is not None and OmegaConf.get_type(node) is OptunaSweepConfig:
        settings.update(OmegaConf.to_container(node, resolve=True))
    problems = []
    for key, value in sweeper_keys.items():
        if value is None or (key in UNSUPPORTED and not value):
            continue
        if key in UNSUPPORTED:
            problems.append(UNSUPPORTED[key])
        elif key == "params":
            settings["params"] = {**settings["params"], **value}
            paths["params"] = "hydra.sweeper.params"
        elif key == "max_failure_rate":  # hydra-optuna-sweeper's knob: a share of n_trials
            n_trials = sweeper_keys.get("n_trials") or settings["n_trials"]
            settings["max_failures"] = max(1, int(value * n_trials))
            paths["max_failures"] = "hydra.sweeper.max_failure_rate"
        else:
            settings[key] = value
            paths[key] = f"hydra.sweeper.{key}"
    settings.pop("_target_", None)
    return settings, paths, problems


def _key_problem(config: DictConfig, key: str, where: str) -> str | None:
    """A swept or fixed key must name something in the config (or a config group), unless added with +."""
    name = key.lstrip("+~")
    if key != name:
        return None
    choices = OmegaConf.select(config, "hydra.runtime.choices") or {}
    if name in choices or OmegaConf.select(config, name, default="\0missing") != "\0missing":
        return None
    keys = [k for k in _flat_keys(config) if not k.startswith("hydra.")] + list(choices)
    near = difflib.get_close_matches(name, keys, n=1)
    return f"{where}: {name} is not a key of the config{f' (did you mean {near[0]}?)' if near else ''}: fix the name, or write +{name} to add a new key"


def _flat_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, DictConfig):
        return [prefix] if prefix else []
    keys = [prefix] if prefix else []
    for key in node.keys():
        child = node._get_node(key)
        keys += _flat_keys(child, f"{prefix}.{key}" if prefix else str(key))
    return keys


def search_space(settings: Mapping[str, Any], arguments: Sequence[str], config: DictConfig, paths: Mapping[str, str]) -> tuple[SearchSpace, list[str]]:
    """The space from `params` plus sweeps written on the command line; plain command-line values are fixed."""
    space, problems = parse_params(settings["params"], paths["params"])
    for argument in arguments:
        key, equals, text = argument.partition("=")
        if not equals:  # ~key: a deletion, passed to every trial as written
            space.fixed[key] = None
            continue
        try:
            dimension, fixed = parse_entry(key, text)
        except ValueError as error:
            problems.append(f"command line {argument}: {error}")
            continue
        if dimension is None:
            space.fixed[key] = fixed
        else:
            space.dimensions[key] = dimension
    for key in [*space.dimensions, *space.fixed]:
        where = f"{paths['params']}.{key}" if key in settings["params"] else f"command line {key}"
        if problem := _key_problem(config, key, where):
            problems.append(problem)
    if not space.dimensions:
        problems.append(f"{paths['params']} sweeps nothing: add e.g. {paths['params']}.optimizer.lr='tag(log, interval(1e-4, 1e-2))'")
    return space, problems


def check(settings: dict[str, Any], paths: dict[str, str], arguments: Sequence[str], config: DictConfig, merge_problems: list[str]) -> SearchSpace:
    """Every problem at once, before anything is written; raises ConfigError (exit 2)."""
    problems = merge_problems + sweep_problems(settings, paths)
    space, space_problems = search_space(settings, arguments, config, paths)
    problems += [p for p in space_problems if p not in problems]
    sampler = settings.get("sampler") or {}
    if not problems and str(sampler.get("_target_", "")).endswith("GridSampler"):
        intervals = [key for key, dim in space.dimensions.items() if dim.kind != "categorical" and dim.step is None]
        if intervals:
            problems.append(f"{paths['sampler']}: GridSampler needs discrete values, but {intervals} are intervals: use choice(...) or range(...)")
    if problems:
        raise ConfigError(format_problems(problems))
    return space


def fingerprint(space: SearchSpace) -> dict[str, str]:
    """What a resumed study must share with the command that created it: the space and the fixed overrides,
    except the sweep's own settings (a rerun may raise sweep.n_trials)."""
    swept = {key: repr(dim) for key, dim in space.dimensions.items()}
    fixed = {key: value for key, value in space.fixed.items() if key != "sweep" and not key.startswith("sweep.")}
    return dict(sorted({**swept, **fixed}.items()))


def _differences(before: dict[str, str], now: dict[str, str]) -> list[str]:
    return [f"{key}: {before.get(key, '(unset)')} -> {now.get(key, '(unset)')}" for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]


class SweepLoop:
    """Asks the study for trials, launches them as Hydra jobs, records how each ended, until n_trials."""

    def __init__(self, settings: dict[str, Any], space: SearchSpace, launcher: Any, sweep_dir: Path):
        self.settings, self.space, self.launcher, self.sweep_dir = settings, space, launcher, sweep_dir
        self.objectives = [str(o) for o in as_list(settings["objective"])]
        self.directions = [str(d) for d in as_list(settings["direction"])]
        self.n_trials = int(settings["n_trials"])
        self.study: Any = None

    def open_study(self) -> Any:
        """Create or resume the study. Several sweepers may share it (the same command started N times, on one
        storage): they open it, count and ask trials one at a time (study.claiming), so together they run
        exactly n_trials; each reseeds its sampler apart from the others'."""
        import optuna

        from currytrain.sweep.study import SweepSpec, claiming, default_storage, join, open_storage, recover_interrupted

        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        self.uri = uri = self.settings["storage"] or default_storage(self.sweep_dir)
        name = self.settings["study_name"] or DEFAULT_STUDY
        with claiming(uri):
            study = optuna.create_study(study_name=name, storage=open_storage(uri), directions=self.directions, load_if_exists=True)
            self._check_resumable(study, uri)
            study.sampler = self._sampler(len(study.trials), join(study))
            spec = SweepSpec(name, uri, self.directions, self.objectives, self.settings["pruner"] or None)
            self.spec_path = spec.save(self.sweep_dir)
            for note in recover_interrupted(study, self.objectives, self.settings["on_interrupted"]):
                log.warning(note)
        log.info("study %s in %s: %d of %d trials done", name, uri, len(study.trials), self.n_trials)
        self.study = study
        return study

    def _check_resumable(self, study: Any, uri: str) -> None:
        mine, theirs = fingerprint(self.space), study.user_attrs.get("fingerprint")
        if theirs is None:
            study.set_user_attr("fingerprint", mine)
        elif theirs != mine or self._names(study) != self.directions:
            changed = _differences(theirs, mine) or [f"direction: {self._names(study)} -> {self.directions}"]
            raise ConfigError(
                f"the study {study.study_name} in {uri} was created by another sweep ({'; '.join(changed)}): rerun its command to "
                "resume it, or pass sweep.study_name=<new name> or hydra.sweep.dir=<another folder> to start a new study"
            )

    @staticmethod
    def _names(study: Any) -> list[str]:
        return [d.name.lower() for d in study.directions]

    def _sampler(self, trials_done: int, others: int = 0) -> Any:
        """The sampler, reseeded when resuming so that it does not replay its first (random) points, and apart
        from the `others` live sweepers of the same study (each would otherwise propose the same points)."""
        from currytrain.build import build

        node = dict(self.settings["sampler"])
        if node.get("seed") is not None and (trials_done or others):
            node["seed"] = int(node["seed"]) + trials_done + 1_000_003 * others
        runtime = {"search_space": self.space.grid()} if str(node["_target_"]).endswith("GridSampler") else {}
        return build(OmegaConf.create(node), **runtime)

    def target(self) -> int:
        """n_trials, or the grid's size when GridSampler walks a smaller grid."""
        if str(self.settings["sampler"]["_target_"]).endswith("GridSampler"):
            size = 1
            for values in self.space.grid().values():
                size *= len(values)
            return min(self.n_trials, size)
        return self.n_trials

    def ask(self, study: Any) -> tuple[Any, list[str]]:
        """A new trial and the overrides of its job."""
        from currytrain.sweep.space import overrides_of
        from currytrain.sweep.study import job_env, sweeper_identity

        trial = study.ask({key: dim.distribution() for key, dim in self.space.dimensions.items()})
        trial.set_user_attr("run_dir", str((self.sweep_dir / str(trial.number)).resolve()))
        trial.set_user_attr("sweeper", sweeper_identity())
        fixed = [key if value is None else f"{key}={value}" for key, value in self.space.fixed.items()]
        return trial, [*fixed, *overrides_of(trial.params), *job_env(self.spec_path, trial.number)]

    def run(self) -> Any:
        from currytrain.sweep.asynchronous import is_submitit

        study = self.open_study()
        if is_submitit(self.launcher):
            self._run_async(study)
        else:
            self._run_batches(study)
        return study

    def _stop_on_failures(self, study: Any) -> None:
        from currytrain.sweep.study import failures

        if failures(study) >= self.settings["max_failures"]:
            raise RunFailed(
                f"the sweep stopped: {failures(study)} trials failed (sweep.max_failures={self.settings['max_failures']}); "
                f"their reasons are in {self.sweep_dir}/report.md. Fix the cause, or raise sweep.max_failures, and rerun to resume"
            )

    def _record(self, study: Any, number: int, job_return: Any) -> None:
        from currytrain.sweep.study import outcome_of, tell

        outcome = outcome_of(job_return, self.sweep_dir / str(number), self.objectives)
        tell(study, number, outcome)
        log.info("trial %d: %s %s %s", number, outcome.state, outcome.values or "", outcome.reason)

    def _run_batches(self, study: Any) -> None:
        """Hydra's Launcher API: a batch of n_jobs trials, the next batch when all of them ended."""

        target = self.target()
        while batch := self._claim(study, min(self.settings["n_jobs"], target)):
            returns = self.launcher.launch([overrides for _, overrides in batch], initial_job_idx=batch[0][0].number)
            for (trial, _), job_return in zip(batch, returns):
                self._record(study, trial.number, job_return)

    def _claim(self, study: Any, most: int) -> list[tuple[Any, list[str]]]:
        """Up to `most` new trials while the study (all its sweepers together) has fewer than n_trials; none when it
        has them. Trials left by a sweeper that died are recovered first (on_interrupted decides if they count)."""
        from currytrain.sweep.study import claiming, counted, recover_interrupted

        with claiming(self.uri):
            for note in recover_interrupted(study, self.objectives, self.settings["on_interrupted"]):
                log.warning(note)
            left = self.target() - counted(study)
            if left <= 0:
                return []
            self._stop_on_failures(study)
            return [self.ask(study) for _ in range(min(most, left))]

    def _run_async(self, study: Any) -> None:
        """submitit: n_jobs trials in flight; a new one starts as soon as one ends."""
        from currytrain.sweep.asynchronous import InFlight
        from currytrain.sweep.study import counted

        target, running = self.target(), InFlight(self.launcher)
        log.info("asynchronous trials: up to %d in flight (%s launcher)", self.settings["n_jobs"], type(self.launcher).__name__)
        while counted(study) < target or len(running):
            for trial, overrides in self._claim(study, self.settings["n_jobs"] - len(running)) if len(running) < self.settings["n_jobs"] else []:
                running.submit(trial.number, overrides)
            if len(running):
                for number, job_return in running.finished():
                    self._record(study, number, job_return)
            elif counted(study) >= target:
                break
