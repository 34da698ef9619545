"""Aim backend (logger=aim, `pip install 'currytrain[aim]'`, Python 3.10 to 3.12: aim 3.29, its last
release, has no wheels for later ones). An Aim run in a repo beside the run folder (<run>/../.aim: one repo
per day folder or per sweep; a ladder's sub-runs use their ladder's): scalars with their step and a context
(train/loss is `loss` in context subset=train, val/loss the same name in subset=val), texts, histograms as
distributions, the resolved config as `hparams`, the journal header as `journal`, and how the run ended as
`status`.

A run that belongs to a group goes to the experiment named after the group (the sweep's folder, the ladder's
run) instead of the configured one, with its group under `group` (kind, member, stage, role and params, the
sampled values). Aim lists a new run at once (`aim runs ls`); its queries and `aim up` see it once Aim's
index has caught up (`aim up` runs the indexer; `aim storage --repo DIR reindex --yes` rebuilds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from currytrain.logger.base import ENDINGS, journal_header, read_group, stores_dir

CONTEXTS = ("train", "val", "test")
"""A metric's first path part that becomes its Aim context (subset) rather than part of its name."""
RUN_FILE = "aim.run"
"""In the run folder: the Aim run's hash and repo, so that a relaunch into the folder (a resume) continues
the same Aim run; a re-run step's value replaces the earlier one (Aim keeps one value per step)."""


def metric_name(tag: str) -> tuple[str, dict[str, str]]:
    """train/loss -> (loss, {subset: train}); a tag without such a prefix keeps its name and no context."""
    prefix, _, rest = tag.partition("/")
    return (rest, {"subset": prefix}) if prefix in CONTEXTS and rest else (tag, {})


class AimLogger:
    def __init__(self, run_dir: str, repo: str = "", experiment: str = "currytrain", run_name: str = ""):
        from aim import Run  # optional extra, imported only when chosen

        run_dir_path = Path(run_dir)
        group = read_group(run_dir_path)
        self.repo = repo or str(stores_dir(run_dir_path, group))
        options = {"repo": self.repo, "system_tracking_interval": None, "log_system_params": False, "capture_terminal_logs": False}
        earlier = self._earlier_run(run_dir_path)
        if earlier:
            self.run = Run(run_hash=earlier, **options)
        else:
            self.run = Run(experiment=group.name if group else experiment, **options)
            run_dir_path.mkdir(parents=True, exist_ok=True)
            (run_dir_path / RUN_FILE).write_text(f"{self.run.hash} {self.repo}\n")
        self.run.name = run_name or (group.run_name(run_dir_path) if group else run_dir_path.name)
        self.run["run_dir"] = str(run_dir_path.resolve())
        self.run["journal"] = journal_header(run_dir_path)
        if group is not None:
            self.run["group"] = {
                "kind": group.kind,
                "name": group.name,
                "member": group.member,
                "stage": group.stage,
                "role": group.role,
                "params": group.params,
            }

    def _earlier_run(self, run_dir: Path) -> str | None:
        """The hash of the Aim run an earlier launch into this folder started in the same repo, if any."""
        path = run_dir / RUN_FILE
        if not path.is_file():
            return None
        run_hash, _, repo = path.read_text().strip().partition(" ")
        return run_hash if repo == self.repo else None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for tag, value in metrics.items():
            name, context = metric_name(tag)
            self.run.track(float(value), name=name, step=step, context=context)

    def log_config(self, config: Mapping) -> None:
        self.run["hparams"] = dict(config)

    def log_text(self, name: str, text: str, step: int = 0) -> None:
        from aim import Text

        self.run.track(Text(text), name=name, step=step)

    def log_histogram(self, name: str, values: Any, step: int) -> None:
        from aim import Distribution

        self.run.track(Distribution(np.asarray(values, dtype=np.float64)), name=name, step=step)

    def close(self, status: str = "finished") -> None:
        """The status as `status` and, unless finished, as a tag (a relaunch that finishes drops the earlier one)."""
        self.run["status"] = status
        for tag in set(self.run.tags) & set(ENDINGS) - {status}:
            self.run.remove_tag(tag)
        if status != "finished" and status not in self.run.tags:
            self.run.add_tag(status)
        self.run.close()
