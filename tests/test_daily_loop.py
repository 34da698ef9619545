"""A run you can follow and pick up again: progress as lines when the output is a file or a pipe, a warning when a step
is far slower than the ones before it, trainer.resume=latest continuing the newest run of the same experiment, and the
exact command to continue in the message of a stopped run."""

from __future__ import annotations

import re
import shlex

from conftest import TINY, launch
from currytrain.journal import read_journal, resume_command
from currytrain.trainer.progress import SLOW_FACTOR

LINE = re.compile(r"step (\d+)/(\d+) \((\d+)%\) \| loss ([\d.]+) \| ([\d,]+) tok/s \| ETA (\d+:\d\d:\d\d)")


def _events(run_dir, kind):
    return [event for event in read_journal(run_dir / "journal.jsonl") if event["type"] == kind]


def test_progress_is_lines_when_the_output_is_not_a_terminal(tmp_path):
    """Captured output is not a terminal, as under nohup, SLURM or tee: a line per trainer.progress_every seconds
    (here: every step) with the step, loss, tokens/s and ETA, where the rich bar would print only at the end."""
    result = launch("trainer.progress=true", "trainer.progress_every=1e-9", "logger=[jsonl]", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [LINE.search(line) for line in result.stdout.splitlines() if LINE.search(line)]
    assert [int(match.group(1)) for match in lines] == [1, 2, 3, 4, 5, 6], result.stdout[-3000:]
    assert lines[-1].group(3) == "100" and lines[-1].group(6) == "0:00:00" and float(lines[-1].group(4)) > 0


def test_progress_lines_come_every_progress_every_seconds_and_false_shows_none(tmp_path):
    result = launch("trainer.progress=true", "trainer.progress_every=3600", "logger=[jsonl]", f"hydra.run.dir={tmp_path / 'a'}")
    assert [int(m.group(1)) for line in result.stdout.splitlines() if (m := LINE.search(line))] == [1, 6]  # the first and the last
    quiet = launch("trainer.progress=false", "logger=[jsonl]", f"hydra.run.dir={tmp_path / 'b'}")
    assert quiet.returncode == 0 and not LINE.search(quiet.stdout + quiet.stderr)


def test_a_step_far_slower_than_the_running_median_is_flagged_with_its_likely_cause(tmp_path, monkeypatch):
    # Every slow step warned here (not one per WARN_EVERY_SECONDS): on a loaded machine an earlier step may be slow too.
    monkeypatch.setattr("currytrain.trainer.progress.WARN_EVERY_SECONDS", 0.0)
    stall = "+logger.stall={_target_:tests.faulty.StallingLogger,at:8,factor:12}"
    result = launch(
        "build.allow=[tests.faulty.StallingLogger]", stall, "trainer.max_steps=12", "trainer.eval_every=100", "logger=[jsonl]", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (warning,) = [line for line in result.stdout.splitlines() if "of the steps before it" in line and "step 9 took" in line]
    assert re.search(r"step 9 took [\d.]+ s, [\d.]+x the median", warning) and "other processes, or more torch threads than free cores" in warning
    assert float(re.search(r"([\d.]+)x the median", warning).group(1)) > SLOW_FACTOR
    assert "docs/training.md" in warning


def test_resume_latest_continues_the_newest_run_of_the_same_experiment(tmp_path):
    runs = tmp_path / "runs"
    first = launch("logger=[jsonl]", f"hydra.run.dir={runs / 'a'}")
    assert first.returncode == 0, first.stderr[-3000:]
    other = launch("logger=[jsonl]", "optimizer.lr=0.01", f"hydra.run.dir={runs / 'b'}")  # another experiment: newer, not it
    assert other.returncode == 0, other.stderr[-3000:]

    # trainer.resume=auto in a new folder starts fresh, and says which run trainer.resume=latest would continue.
    fresh = launch("logger=[jsonl]", "trainer.resume=auto", f"hydra.run.dir={runs / 'c'}")
    assert fresh.returncode == 0 and not _events(runs / "c", "resume")
    assert f"To continue the newest run of this config ({runs / 'a'}, step 6), pass trainer.resume=latest" in fresh.stdout + fresh.stderr

    # The runs above: c is newest, of the same experiment; it continues that one, into its own new folder, for more steps.
    resumed = launch("logger=[jsonl]", "trainer.resume=latest", "trainer.max_steps=9", f"hydra.run.dir={runs / 'd'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"trainer.resume=latest: continuing {runs / 'c'} from its step 6, in the new run folder {runs / 'd'}" in resumed.stdout + resumed.stderr
    (resume,) = _events(runs / "d", "resume")
    assert resume["step"] == 6 and resume["path"] == str(runs / "c" / "checkpoints" / "step_6")
    assert _events(runs / "d", "finish")[0]["step"] == 9

    nothing = launch("logger=[jsonl]", "trainer.resume=latest", "model.dim=64", f"hydra.run.dir={runs / 'e'}")
    assert nothing.returncode == 0 and not _events(runs / "e", "resume")
    assert "no run folder under" in nothing.stdout + nothing.stderr and "differs in model.dim" in nothing.stdout + nothing.stderr


def test_resume_latest_refuses_a_run_with_nothing_left_to_train(tmp_path):
    assert launch("logger=[jsonl]", f"hydra.run.dir={tmp_path / 'runs' / 'a'}").returncode == 0
    again = launch("logger=[jsonl]", "trainer.resume=latest", f"hydra.run.dir={tmp_path / 'runs' / 'b'}")
    assert again.returncode == 2 and "trainer.max_steps=6 leaves nothing to train: pass trainer.max_steps=<more than 6>" in again.stderr


def test_the_resume_command_is_the_launch_with_the_run_folder_and_auto(tmp_path):
    result = launch(
        "logger=[jsonl]", "+logger.odd={_target_:tests.faulty.SlowLogger,seconds:0}", "build.allow=[tests.faulty.SlowLogger]", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    command = shlex.split(resume_command(tmp_path))
    assert command[:2] == ["python", "launch.py"] and command[-2:] == [f"hydra.run.dir={tmp_path.resolve()}", "trainer.resume=auto"]
    assert "+logger.odd={_target_:tests.faulty.SlowLogger,seconds:0}" in command and all(o in command for o in TINY)


def test_a_run_draws_its_curves_beside_the_journal_and_journal_plot_draws_any(tmp_path, capsys):
    from matplotlib.image import imread

    from currytrain.cli import main as currytrain_main
    from currytrain.report.figure import MIN_POINTS_AT_END, run_series

    long, short = tmp_path / "long", tmp_path / "short"
    assert launch(f"trainer.max_steps={MIN_POINTS_AT_END}", "logger=[jsonl]", f"hydra.run.dir={long}").returncode == 0
    assert imread(long / "curves.png").shape[:2] == (440, 720)  # 2 x 2 panels, 9 x 5.5 inches at 80 dpi
    series = run_series(read_journal(long / "journal.jsonl"))
    assert series["train/loss"][0] == list(range(1, MIN_POINTS_AT_END + 1)) and series["val/loss"][0] == [3, 6, 9, MIN_POINTS_AT_END]
    assert {"train/lr", "train/grad_norm", "train/tokens_per_s"} <= set(series)

    assert launch("logger=[jsonl]", f"hydra.run.dir={short}").returncode == 0  # 6 logged steps: no figure at the end
    assert not (short / "curves.png").exists()
    assert currytrain_main(["journal", str(short), "--plot"]) == 0
    assert f"figure: {short / 'curves.png'}" in capsys.readouterr().out and (short / "curves.png").is_file()
