"""Experiment files, sweep files and an import folder's experiment are untrusted: a YAML file never widens what may
run. Each crafted file below names code in one subtree of the config (the model, a logger, Hydra's callbacks,
launcher, sweeper, logging handlers and factories, the job's environment, build.allow, a sweep's params); each is
refused when the config is composed or validated (exit 2, naming the key), before Hydra builds anything from it
and before any run folder exists, and the marker its code would have created never appears."""

from __future__ import annotations

import pytest

from conftest import launch

OPEN = "{{_target_: builtins.open, file: '{marker}', mode: w}}"
"""A node that, if built, creates the marker file (builtins.open is on no block list of Hydra 1.3)."""

EXPERIMENTS = {
    # curryTrain's own functions are not components: the journal's git runner and its line appender
    "model subtree: a curryTrain function": ("model:\n  _target_: currytrain.diskio.append_line\n", "model._target_=currytrain.diskio.append_line"),
    "logger subtree: builtins.open": ("logger:\n  evil: " + OPEN + "\n", "logger.evil._target_"),
    "hydra.callbacks: builtins.open": ("hydra:\n  callbacks:\n    evil: " + OPEN + "\n", "hydra.callbacks.evil._target_"),
    "hydra.callbacks: curryTrain's validation switched off": ("hydra:\n  callbacks:\n    validate: null\n", "hydra.callbacks.validate"),
    "hydra.job_logging: a handler factory": (
        "hydra:\n  job_logging:\n    handlers:\n      evil: {{'()': os.mkdir, path: '{marker}'}}\n    root:\n      handlers: [evil]\n",
        "hydra.job_logging.handlers.evil.()",
    ),
    "hydra.job_logging: a log file outside the run": (
        "hydra:\n  job_logging:\n    handlers:\n      file:\n        filename: '{marker}'\n",
        "hydra.job_logging.handlers.file.filename",
    ),
    "hydra.hydra_logging: a handler class": (
        "hydra:\n  hydra_logging:\n    handlers:\n      evil: {{class: logging.handlers.SocketHandler, host: localhost, port: 9}}\n",
        "hydra.hydra_logging.handlers.evil.class",
    ),
    "hydra.hydra_logging: an ext:// object": (
        "hydra:\n  hydra_logging:\n    handlers:\n      console:\n        stream: ext://os.mkdir\n",
        "hydra.hydra_logging.handlers.console.stream",
    ),
    "hydra.launcher: its class": ("hydra:\n  launcher:\n    _target_: builtins.open\n", "hydra.launcher._target_=builtins.open"),
    "hydra.sweeper: its class": ("hydra:\n  sweeper:\n    _target_: builtins.open\n", "hydra.sweeper._target_=builtins.open"),
    "hydra.sweeper: the sampler it builds": (
        "defaults:\n  - override /hydra/sweeper: currytrain\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    sampler: " + OPEN + "\n",
        "hydra.sweeper.sampler._target_=builtins.open",
    ),
    "hydra.job.env_set: LD_PRELOAD": ("hydra:\n  job:\n    env_set:\n      LD_PRELOAD: '{marker}'\n", "hydra.job.env_set.LD_PRELOAD"),
    "hydra.job.env_set: PYTHONPATH": ("hydra:\n  job:\n    env_set:\n      PYTHONPATH: '{marker}'\n", "hydra.job.env_set.PYTHONPATH"),
    "build.allow widened by a file": ("build:\n  allow: [builtins.open]\nlogger:\n  evil: " + OPEN + "\n", "build.allow"),
    "a sweep's params set hydra.*": (
        "defaults:\n  - override /sweep: random\nsweep:\n  params:\n    hydra.job.env_set.LD_PRELOAD: choice('{marker}')\n",
        "sweep.params.hydra.job.env_set.LD_PRELOAD",
    ),
}


def _experiment(folder, text: str) -> list[str]:
    (folder / "experiment").mkdir(parents=True, exist_ok=True)
    (folder / "experiment" / "evil.yaml").write_text("# @package _global_\n" + text)
    return [f"hydra.searchpath=[file://{folder}]", "experiment=evil"]


@pytest.mark.reliability(
    kind="untrusted", artifact="experiment file", refused_by="exact registered targets; the hydra.* subtree checked as the config is composed"
)
@pytest.mark.parametrize("case", list(EXPERIMENTS))
def test_an_experiment_file_that_names_code_is_refused_before_anything_runs(case, tmp_path):
    marker, run_dir = tmp_path / "ran", tmp_path / "run"
    text, key = EXPERIMENTS[case]
    result = launch(*_experiment(tmp_path / "conf", text.format(marker=marker)), f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert key in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not marker.exists(), "the crafted code ran"
    assert not run_dir.exists()


@pytest.mark.reliability(
    kind="untrusted", artifact="import folder's experiment/finetune.yaml", refused_by="the hydra.* subtree checked as the config is composed"
)
def test_an_import_folders_experiment_that_adds_a_callback_is_refused(tmp_path):
    """`currytrain hf import` writes experiment/finetune.yaml, run with hydra.searchpath=[file://<import>]: a shared
    import folder's file is as untrusted as any."""
    marker, run_dir, folder = tmp_path / "ran", tmp_path / "run", tmp_path / "import"
    (folder / "experiment").mkdir(parents=True)
    crafted = "# @package _global_\ntrainer:\n  max_steps: 2\nhydra:\n  callbacks:\n    evil: " + OPEN.format(marker=marker) + "\n"
    (folder / "experiment" / "finetune.yaml").write_text(crafted)
    result = launch(f"hydra.searchpath=[file://{folder}]", "experiment=finetune", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2 and "hydra.callbacks.evil._target_=builtins.open is not a registered component" in result.stderr, result.stderr[-3000:]
    assert not marker.exists() and not run_dir.exists()


def test_the_command_line_is_trusted_for_what_only_it_may_say(tmp_path):
    """The person typing the command may set an environment variable for the job and allow a class by name."""
    run_dir = tmp_path / "run"
    result = launch(
        "+hydra.job.env_set.PYTHONDONTWRITEBYTECODE=1",
        "build.allow=[tests.faulty.SlowLogger]",
        "+logger.slow={_target_:tests.faulty.SlowLogger,seconds:0}",
        "trainer.max_steps=3",
        "logger=[jsonl]",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]


NOTE_CALLBACK = '''from pathlib import Path

from hydra.experimental.callback import Callback


class Note(Callback):
    """A Hydra callback of the project's own: leaves a file where it is told when a run starts."""

    def __init__(self, path: str):
        self.path = path

    def on_run_start(self, config, **kwargs):
        Path(self.path).write_text("started")
'''


@pytest.mark.slow
@pytest.mark.reliability(
    kind="untrusted",
    artifact="a `currytrain init` project's experiment file",
    refused_by="the project's launch.py checks the hydra.* subtree as it composes; a callback the project registers runs",
)
def test_a_projects_experiment_file_names_only_what_the_project_registered(tmp_path):
    import subprocess
    import sys

    from currytrain.project.init import init_project

    project, marker, noted = tmp_path / "proj", tmp_path / "ran", tmp_path / "noted"
    init_project(project)
    (project / "experiments" / "callbacks.py").write_text(NOTE_CALLBACK)
    init = project / "experiments" / "__init__.py"
    init.write_text(init.read_text().replace("TARGETS: list[str] = []", 'TARGETS: list[str] = ["experiments.callbacks.Note"]'))
    experiments = project / "conf" / "experiment"
    (experiments / "shared.yaml").write_text("# @package _global_\nhydra:\n  callbacks:\n    evil: " + OPEN.format(marker=marker) + "\n")
    (experiments / "noted.yaml").write_text(f"# @package _global_\nhydra:\n  callbacks:\n    note: {{_target_: experiments.callbacks.Note, path: '{noted}'}}\n")
    quick = [
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.eval_batches=1",
        "optimizer.schedule.warmup_steps=0",
        "logger=[jsonl]",
        "trainer.progress=false",
    ]

    def launch_project(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "launch.py", *args], cwd=project, capture_output=True, text=True, timeout=600)

    refused = launch_project("experiment=shared", *quick, f"hydra.run.dir={tmp_path / 'refused'}")
    assert refused.returncode == 2 and "hydra.callbacks.evil._target_=builtins.open is not a registered component" in refused.stderr, refused.stderr[-3000:]
    assert not marker.exists() and not (tmp_path / "refused").exists()
    allowed = launch_project("experiment=noted", *quick, f"hydra.run.dir={tmp_path / 'allowed'}")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert noted.read_text() == "started", "the project's registered callback ran"
