"""Which group a Hydra job belongs to, for the trackers (currytrain.logger.base.RunGroup): a trial of
curryTrain's sweeper (its study's sampled values, from the study's storage), a confirmation run of such a
sweep (sweep.confirm_top_k: the confirmed trial's values and the fresh seed), or a job of any other multirun
(`-m seed=1,2,3`: the values of the overrides swept there, from the sweep folder's multirun.yaml)."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from currytrain.logger.base import RunGroup, group_name
from currytrain.sweep.confirm import CONFIRM_DIR, SEED_KEY
from currytrain.sweep.study import ENV_SPEC, SPEC_FILE, SweepSpec, open_storage, trial_from_env

log = logging.getLogger(__name__)

MULTIRUN_FILE = "multirun.yaml"
"""What Hydra's own sweeper writes in the sweep folder: the multirun's config, with its command-line overrides."""
CONFIRM_SUBDIR = re.compile(rf"^{CONFIRM_DIR}/trial_(\d+)/seed_(-?\d+)$")
"""hydra.sweep.subdir of a confirmation run (currytrain.sweep.confirm.run_dir_of)."""


def job_group(hydra_cfg: Any, run_dir: Path) -> RunGroup | None:
    """The group of the job Hydra runs (its HydraConfig), or None for a single run."""
    from hydra.types import RunMode

    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    cwd = Path(hydra_cfg.runtime.cwd)
    found = trial_from_env()
    if found is not None:
        spec, number = found
        folder = Path(os.environ[ENV_SPEC]).resolve().parent
        return RunGroup(
            kind="sweep",
            name=group_name(folder, cwd),
            folder=str(folder),
            stores=str(folder),
            member=str(number),
            job_type="trial",
            role="trial",
            params=trial_params(spec, number),
            tags={"study": spec.study_name},
        )
    folder = sweep_folder(Path(run_dir), str(hydra_cfg.sweep.subdir))
    confirming = CONFIRM_SUBDIR.match(Path(str(hydra_cfg.sweep.subdir)).as_posix())
    if confirming is not None and (folder / SPEC_FILE).is_file():
        return confirmation_group(folder, cwd, SweepSpec.load(folder / SPEC_FILE), int(confirming[1]), int(confirming[2]))
    return RunGroup(
        kind="multirun",
        name=group_name(folder, cwd),
        folder=str(folder),
        stores=str(folder),
        member=str(hydra_cfg.job.num),
        job_type="job",
        role="job",
        params=swept_values(folder, list(hydra_cfg.overrides.task)),
    )


def confirmation_group(folder: Path, cwd: Path, spec: SweepSpec, trial: int, seed: int) -> RunGroup:
    """A rerun of trial `trial`'s config at a fresh seed (sweep.confirm_top_k): a member of the sweep's group
    (job_type and role `confirm`), its params the trial's sampled values with the seed it ran at."""
    folder = folder.resolve()
    params = {key: value for key, value in trial_params(spec, trial).items() if key != SEED_KEY}
    return RunGroup(
        kind="sweep",
        name=group_name(folder, cwd),
        folder=str(folder),
        stores=str(folder),
        member=f"{CONFIRM_DIR}/trial_{trial}/seed_{seed}",
        job_type="confirm",
        role="confirm",
        params={**params, SEED_KEY: seed},
        tags={"study": spec.study_name, "confirms_trial": str(trial)},
    )


def sweep_folder(run_dir: Path, subdir: str) -> Path:
    """The multirun's folder: the job's folder less hydra.sweep.subdir (one part, ${hydra.job.num}, by default)."""
    return run_dir.resolve().parents[max(1, len(Path(subdir).parts)) - 1]


def trial_params(spec: SweepSpec, number: int) -> dict[str, Any]:
    """The values the study sampled for trial `number` (custom_search_space's included), by override key."""
    try:
        storage = open_storage(spec.storage)
        trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(spec.study_name), number)
        return dict(storage.get_trial_params(trial_id))
    except Exception as error:  # the trackers lose the params; the trial itself reports through the same storage
        log.warning("could not read trial %d's params from %s: %s", number, spec.storage, error)
        return {}


def swept_values(folder: Path, job_overrides: list[str]) -> dict[str, Any]:
    """This job's values of the overrides the multirun sweeps (seed=1,2,3 -> {seed: 1} for the first job);
    every override of the job when the multirun's own command line is not there to say which were swept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    mine = {o.key_or_group: o.value() for o in parser.parse_overrides(job_overrides) if not o.is_delete()}
    path = folder / MULTIRUN_FILE
    if not path.is_file():
        return mine
    command_line = OmegaConf.select(OmegaConf.load(path), "hydra.overrides.task", default=[]) or []
    swept = {o.key_or_group for o in parser.parse_overrides(list(command_line)) if o.is_sweep_override()}
    return {key: value for key, value in mine.items() if key in swept}
