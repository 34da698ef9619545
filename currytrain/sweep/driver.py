"""The sweep loop behind the Hydra plugin: settings -> checks -> study (created or resumed) -> trials -> report.

Settings come from the `sweep` node (the presets) merged with keys written under `hydra.sweeper` the way
hydra-optuna-sweeper configs write them; `hydra.sweeper` wins key by key and `params` are merged. The jobs are
curryTrain runs (objectives read from their journals) or a plain Hydra app's (objectives are its return values).
"""

from __future__ import annotations

import difflib
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from omegaconf import DictConfig, ListConfig, OmegaConf

from currytrain.errors import ConfigError, RunFailed, format_problems
from currytrain.sweep.checks import IGNORED_ARGS, as_list, no_pruner, sweep_problems
from currytrain.sweep.config import NoSweepConfig, OptunaSweepConfig
from currytrain.sweep.space import SearchSpace, parse_entry, parse_params, parse_search_space
from currytrain.sweep.study import Outcome

log = logging.getLogger(__name__)

DEFAULT_STUDY = "currytrain"
SWEEPER_ONLY = ("max_failure_rate", "search_space", "custom_search_space")
"""hydra-optuna-sweeper's keys that exist under hydra.sweeper only (the sweep node has no such field)."""
CUSTOM_SPACE_FIX = "write the dotted path of a function (cfg, trial) -> None that the app's folder can import, e.g. my_module.configure"


def plain_task(config: DictConfig) -> bool:
    """True when the jobs are a plain Hydra app's, which return their objective values; False for curryTrain
    runs (their config has curryTrain's typed `sweep` node), whose objectives are read from their journals."""
    try:
        node = config._get_node("sweep") if "sweep" in config else None
    except Exception:  # a missing or odd node: not curryTrain's
        return True
    return node is None or OmegaConf.get_type(node) not in (OptunaSweepConfig, NoSweepConfig)


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def merge_settings(config: DictConfig, sweeper_keys: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(settings, where each key came from, problems) from the `sweep` node and `hydra.sweeper`."""
    settings = OmegaConf.to_container(OmegaConf.structured(OptunaSweepConfig), resolve=True)
    settings.update(dict.fromkeys(SWEEPER_ONLY))
    paths = {key: f"sweep.{key}" for key in settings} | {key: f"hydra.sweeper.{key}" for key in SWEEPER_ONLY}
    node = config.get("sweep")
    if node is not None and OmegaConf.get_type(node) is OptunaSweepConfig:
        settings.update(OmegaConf.to_container(node, resolve=True))
    for key, value in sweeper_keys.items():
        if value is None or key == "_target_":
            continue
        value = _plain(value)
        if key == "params":
            settings["params"] = {**settings["params"], **value}
        else:
            settings[key] = value
        paths[key] = f"hydra.sweeper.{key}"
    if settings["max_failure_rate"] is not None and sweeper_keys.get("max_failures") is None:
        settings["max_failures"] = None  # hydra-optuna-sweeper's rule per batch replaces the count
    plain = plain_task(config)
    settings["plain_task"] = plain
    if plain and not paths["objective"].startswith("hydra.sweeper"):  # the values a plain app returns, labelled
        count = len(as_list(settings["direction"]))
        settings["objective"] = "value" if count == 1 else [f"values[{index}]" for index in range(count)]
    settings.pop("_target_", None)
    return settings, paths, []


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


def _legacy_space(settings: Mapping[str, Any], paths: Mapping[str, str], space: SearchSpace) -> list[str]:
    """hydra-optuna-sweeper's deprecated `search_space`: converted with a warning, or ignored with one when
    `params` is set too (as that plugin does)."""
    entries = settings.get("search_space")
    if entries is None:
        return []
    if paths["params"] == "hydra.sweeper.params" or settings["params"]:
        warnings.warn(
            "hydra.sweeper.search_space is ignored because hydra.sweeper.params is set too: the search space comes from params. "
            "Remove search_space (https://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/)",
            UserWarning,
            stacklevel=2,
        )
        return []
    warnings.warn(
        "hydra.sweeper.search_space is deprecated (hydra-optuna-sweeper 1.2): write the space as hydra.sweeper.params, e.g. "
        "x: interval(-5.5, 5.5) (https://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/)",
        UserWarning,
        stacklevel=2,
    )
    dimensions, problems = parse_search_space(entries, paths["search_space"])
    for key, dimension in dimensions.items():
        space.set(key, dimension, None)
    return problems


def custom_space(path: Any, where: str) -> tuple[Callable[..., Any] | None, str | None]:
    """The `custom_search_space` function, imported as hydra-optuna-sweeper does, or the problem."""
    from hydra.utils import get_method

    if not isinstance(path, str) or not path:
        return None, f"{where}={path}: {CUSTOM_SPACE_FIX}"
    try:
        return get_method(path), None
    except Exception as error:  # Hydra wraps the ImportError or AttributeError
        cause = error.__cause__ or error
        reason = " ".join(f"{type(cause).__name__}: {cause}".split())[:300]
        return None, f"{where}={path} cannot be imported ({reason}): {CUSTOM_SPACE_FIX}"


def search_space(settings: Mapping[str, Any], arguments: Sequence[str], config: DictConfig, paths: Mapping[str, str]) -> tuple[SearchSpace, list[str]]:
    """The space from `params` (or the deprecated `search_space`), then the command line, whose entries win
    key by key (a plain `y=0` fixes y even where params sweeps it, as with hydra-optuna-sweeper)."""
    space, problems = parse_params(settings["params"], paths["params"])
    problems += _legacy_space(settings, paths, space)
    for argument in arguments:
        key, equals, text = argument.partition("=")
        if not equals:  # ~key: a deletion, passed to every trial as written
            space.set(key, None, None)
            continue
        try:
            dimension, fixed = parse_entry(key, text)
        except ValueError as error:
            problems.append(f"command line {argument}: {error}")
            continue
        space.set(key, dimension, fixed)
    from_command_line = {argument.partition("=")[0] for argument in arguments}
    for key in [*space.dimensions, *space.fixed]:
        where = f"{paths['params']}.{key}" if key in settings["params"] and key not in from_command_line else f"command line {key}"
        if problem := _key_problem(config, key, where):
            problems.append(problem)
    if settings.get("custom_search_space"):
        space.custom = str(settings["custom_search_space"])
        problems += _custom_space_problems(settings, paths["custom_search_space"], config)
    return space, problems


def _custom_space_problems(settings: Mapping[str, Any], where: str, config: DictConfig) -> list[str]:
    """A plain app's function may live anywhere it can import (as with hydra-optuna-sweeper); a curryTrain
    run's config calls only registered functions (currytrain.build: the project's TARGETS, or build.allow)."""
    from currytrain.build import target_problem

    path = settings["custom_search_space"]
    if not settings.get("plain_task") and isinstance(path, str) and path:
        allowed = OmegaConf.select(config, "build.allow", default=None) or []
        if problem := target_problem(path, extra=[str(name) for name in allowed]):
            return [f"{where}={problem}"]
    _, problem = custom_space(path, where)
    return [problem] if problem else []


def check(settings: dict[str, Any], paths: dict[str, str], arguments: Sequence[str], config: DictConfig, merge_problems: list[str]) -> SearchSpace:
    """Every problem at once, before anything is written; raises ConfigError (exit 2)."""
    problems = merge_problems + sweep_problems(settings, paths, plain_task=bool(settings.get("plain_task")))
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
    custom = {"custom_search_space": space.custom} if space.custom else {}
    return dict(sorted({**swept, **fixed, **custom}.items()))


def _differences(before: dict[str, str], now: dict[str, str]) -> list[str]:
    return [f"{key}: {before.get(key, '(unset)')} -> {now.get(key, '(unset)')}" for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]


class FailureRate:
    """hydra-optuna-sweeper's max_failure_rate: the sweep stops after a batch of n_jobs trials whose failed
    share exceeds the rate, re-raising the first failed job's exception (Hydra prints it to stderr)."""

    def __init__(self, rate: float | None, size: int):
        self.rate, self.size = rate, size
        self.batch: list[tuple[int, Outcome, Any]] = []

    def add(self, number: int, outcome: Outcome, job_return: Any) -> None:
        if self.rate is not None:
            self.batch.append((number, outcome, job_return))

    def check(self, last: bool = False) -> None:
        """At the end of each batch (a full one, or what is left when the sweep ends)."""
        if not self.batch or (len(self.batch) < self.size and not last):
            return
        batch, self.batch = self.batch, []
        failed = [(number, outcome, job_return) for number, outcome, job_return in batch if outcome.state == "FAIL"]
        if not failed or len(failed) / len(batch) <= self.rate:
            return
        log.error("%d of %d trials of the batch failed, more than max_failure_rate=%s: the sweep stops", len(failed), len(batch), self.rate)
        for _, _, job_return in failed:
            if isinstance(job_return, BaseException):  # the job's process died
                raise job_return
            if getattr(job_return, "status", None) == JobStatus.FAILED:
                job_return.return_value  # noqa: B018 - Hydra's JobReturn raises the job's own exception, after naming its overrides
        reasons = "; ".join(f"trial {number}: {outcome.reason}" for number, outcome, _ in failed)
        raise RunFailed(f"the sweep stopped: {len(failed)} of {len(batch)} trials of the batch failed (max_failure_rate={self.rate}): {reasons}")


class SweepLoop:
    """Asks the study for trials, launches them as Hydra jobs, records how each ended, until n_trials."""

    def __init__(self, settings: dict[str, Any], space: SearchSpace, launcher: Any, sweep_dir: Path, config: DictConfig | None = None):
        self.settings, self.space, self.launcher, self.sweep_dir, self.config = settings, space, launcher, sweep_dir, config
        self.objectives = [str(o) for o in as_list(settings["objective"])]
        self.directions = [str(d) for d in as_list(settings["direction"])]
        self.n_trials = int(settings["n_trials"])
        self.plain_task = bool(settings.get("plain_task"))
        self.custom = custom_space(space.custom, "custom_search_space")[0] if space.custom else None
        self.failure_rate = FailureRate(settings.get("max_failure_rate"), int(settings["n_jobs"]))
        self.study: Any = None

    def open_study(self) -> Any:
        """Create or resume the study. Several sweepers may share it (the same command started N times, on one
        storage): they open it, count and ask trials one at a time (study.claiming), so together they run
        exactly n_trials; each reseeds its sampler apart from the others'."""
        import optuna

        from currytrain.sweep.study import SweepSpec, claiming, default_storage, join, open_storage, recover_interrupted, sampler_state_problem

        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        self.uri = uri = self.settings["storage"] or default_storage(self.sweep_dir)
        name = self.settings["study_name"] or DEFAULT_STUDY
        with claiming(uri):
            study = optuna.create_study(study_name=name, storage=open_storage(uri), directions=self.directions, load_if_exists=True)
            self._check_resumable(study, uri)
            if problem := sampler_state_problem(study):
                raise ConfigError(
                    f"the study {name} in {uri} holds sampler state curryTrain does not unpickle: {problem}. A study's storage can be "
                    "written by anyone who shares it: pass sweep.study_name=<new name> or hydra.sweep.dir=<another folder> to start a new study"
                )
            study.sampler = self._sampler(len(study.trials), join(study))
            pruner = None if no_pruner(self.settings["pruner"]) else self.settings["pruner"]
            spec = SweepSpec(name, uri, self.directions, self.objectives, pruner)
            self.spec_path = spec.save(self.sweep_dir)
            for note in recover_interrupted(study, self.objectives, self.settings["on_interrupted"]):
                log.warning(note)
        log.info("study %s in %s: %d of %d trials done", name, uri, len(study.trials), self.n_trials)
        if not self.space.dimensions and not self.custom:
            log.warning("the search space is empty: every trial runs the same config (add params, e.g. hydra.sweeper.params.x='interval(0, 1)')")
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

        node = {key: value for key, value in dict(self.settings["sampler"]).items() if key not in IGNORED_ARGS}
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
        """A new trial and the overrides of its job (custom_search_space may suggest more parameters)."""
        from currytrain.sweep.space import overrides_of
        from currytrain.sweep.study import Outcome, job_env, sweeper_identity, tell

        trial = study.ask({key: dim.distribution() for key, dim in self.space.dimensions.items()})
        trial.set_user_attr("run_dir", str((self.sweep_dir / str(trial.number)).resolve()))
        trial.set_user_attr("sweeper", sweeper_identity())
        if self.custom is not None:
            try:
                self.custom(self.config, trial)
            except BaseException as error:
                tell(study, trial.number, Outcome("FAIL", reason=f"custom_search_space {self.space.custom} raised {type(error).__name__}: {error}"))
                raise
        return trial, [*self.fixed_overrides(), *overrides_of(trial.params), *job_env(self.spec_path, trial.number)]

    def fixed_overrides(self) -> list[str]:
        """The command line's and params' fixed values, passed to every job as written."""
        return [key if value is None else f"{key}={value}" for key, value in self.space.fixed.items()]

    def run(self) -> Any:
        from currytrain.sweep.asynchronous import is_submitit

        study = self.open_study()
        if is_submitit(self.launcher):
            self._run_async(study)
        else:
            self._run_batches(study)
        self.failure_rate.check(last=True)
        if not any(t.state.name in ("COMPLETE", "PRUNED") for t in study.get_trials(deepcopy=False)):
            raise RunFailed(f"no trial of the study {study.study_name} completed: their reasons are in {self.sweep_dir}/report.md")
        return study

    def confirm(self) -> Any:
        """sweep.confirm_top_k: the best configs rerun at fresh seeds before a winner is named (sweep.confirm)."""
        from currytrain.sweep.confirm import confirm
        from currytrain.sweep.study import outcome_from_journal, outcome_of

        def launch(jobs: list[list[str]], first: int) -> Any:
            return self.launcher.launch(jobs, initial_job_idx=first)

        def finished(run_dir: Path) -> Any:
            return outcome_from_journal(run_dir, self.objectives) if (run_dir / "journal.jsonl").is_file() else None

        def outcome(job_return: Any, run_dir: Path) -> Any:
            return outcome_of(job_return, run_dir, self.objectives)

        return confirm(self.study, self.settings, self.config, self.sweep_dir, self.fixed_overrides(), launch, outcome, finished)

    def _stop_on_failures(self, study: Any) -> None:
        from currytrain.sweep.study import failures

        limit = self.settings["max_failures"]
        if limit is not None and failures(study) >= limit:
            raise RunFailed(
                f"the sweep stopped: {failures(study)} trials failed (sweep.max_failures={limit}); "
                f"their reasons are in {self.sweep_dir}/report.md. Fix the cause, or raise sweep.max_failures, and rerun to resume"
            )

    def _record(self, study: Any, number: int, job_return: Any) -> Outcome:
        from currytrain.sweep.study import outcome_of, tell

        run_dir = self.sweep_dir / str(number)
        outcome = outcome_of(job_return, run_dir, self.objectives, from_journal=not self.plain_task, direction_key=self._direction_key())
        tell(study, number, outcome)
        log.info("trial %d: %s %s %s", number, outcome.state, outcome.values or "", outcome.reason)
        self.failure_rate.add(number, outcome, job_return)
        return outcome

    def _direction_key(self) -> str:
        return "hydra.sweeper.direction" if self.plain_task else "sweep.direction"

    @staticmethod
    def _stop_on_config_error(outcomes: Sequence[Outcome]) -> None:
        """A task that returns another number of values than there are directions: the sweep's config is wrong."""
        for outcome in outcomes:
            if outcome.config_error:
                raise ConfigError(outcome.config_error)

    def _run_batches(self, study: Any) -> None:
        """Hydra's Launcher API: a batch of n_jobs trials, the next batch when all of them ended."""

        target = self.target()
        while batch := self._claim(study, min(self.settings["n_jobs"], target)):
            returns = self.launcher.launch([overrides for _, overrides in batch], initial_job_idx=batch[0][0].number)
            outcomes = [self._record(study, trial.number, job_return) for (trial, _), job_return in zip(batch, returns)]
            self._stop_on_config_error(outcomes)
            self.failure_rate.check()

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
        from currytrain.sweep.study import counted, tell

        target, running = self.target(), InFlight(self.launcher)
        log.info("asynchronous trials: up to %d in flight (%s launcher)", self.settings["n_jobs"], type(self.launcher).__name__)
        while counted(study) < target or len(running):
            for trial, overrides in self._claim(study, self.settings["n_jobs"] - len(running)) if len(running) < self.settings["n_jobs"] else []:
                try:
                    running.submit(trial.number, overrides)
                except ConfigError as refused:  # sbatch refused the job: the trial never ran
                    tell(study, trial.number, Outcome("FAIL", reason=str(refused)))
                    raise
            if len(running):
                for number, job_return in running.finished():
                    self._stop_on_config_error([self._record(study, number, job_return)])
                    self.failure_rate.check()
            elif counted(study) >= target:
                break
