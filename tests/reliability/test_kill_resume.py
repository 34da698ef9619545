"""kill -9 at random points of one run: one tiny run (checkpoints every 2 steps, evaluations every 3) is
SIGKILLed at 10 seeded random points in turn (inside a checkpoint write, inside an evaluation, or after an
optimizer step), relaunched with trainer.resume=auto after each kill, and compared bitwise with an
uninterrupted run of the same config: a partial checkpoint is never loaded, the journal tells each kill (a
launch after no finish) and each resume, and the steps re-run after a resume appear once in every reader
(the journal's curves, metrics.jsonl), with the uninterrupted run's values. A 2-worker fsdp run is killed
once, inside a checkpoint write. The signal tests (test_signals.py) compare against the same uninterrupted run.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest

from conftest import launch, launch_subprocess
from currytrain.journal import read_journal, timeline
from currytrain.report.runs import load_run
from currytrain.weights import MARKER, checkpoint_problem
from reliability.runs import RUN, same_weights

MAX_STEPS, CHECKPOINT_EVERY, EVAL_EVERY = 8, 2, 3
"""RUN's (and TINY's eval_every)."""
PHASES = {"step": 0, "eval": 1, "checkpoint": 2}
"""Where in a step a Killer strikes, in the order a step does them (the last step saves before its final evaluation)."""


def _order(point: tuple[int, str]) -> tuple[int, int]:
    step, where = point
    return step, (3 if step == MAX_STEPS and where == "eval" else PHASES[where])


POINTS = sorted(
    random.Random(16).sample(
        [(step, "step") for step in range(1, MAX_STEPS + 1)]
        + [(step, "checkpoint") for step in range(CHECKPOINT_EVERY, MAX_STEPS + 1, CHECKPOINT_EVERY)]
        + [(step, "eval") for step in range(EVAL_EVERY, MAX_STEPS, EVAL_EVERY)]
        + [(MAX_STEPS, "eval")],
        10,
    ),
    key=_order,
)
"""10 kill points out of the run's 15, in the order the run reaches them (seeded: the same every session)."""


def killer(at: int, where: str) -> str:
    return f"+logger.fault={{_target_:tests.faulty.Killer,at:{at},where:{where}}}"


def resumed_from(point: tuple[int, str]) -> int | None:
    """The newest complete checkpoint when the run dies at `point` (the checkpoint of that step is complete
    only when the kill came after it: in the final evaluation)."""
    done = [step for step in range(CHECKPOINT_EVERY, MAX_STEPS + 1, CHECKPOINT_EVERY) if _order((step, "checkpoint")) < _order(point)]
    return done[-1] if done else None


def kill_chain(run_dir: Path, points: list[tuple[int, str]], *overrides: str) -> None:
    """Run, kill at the first point, resume=auto, kill at the next, ..., then resume to the end."""
    for number, (at, where) in enumerate(points):
        resume = [] if number == 0 else ["trainer.resume=auto"]
        # The kill is the behaviour under test: each killed run has a process of its own, never the test's.
        result = launch_subprocess(*RUN, *overrides, *resume, killer(at, where), f"hydra.run.dir={run_dir}")
        # One process dies of the signal; a launcher of workers reports the killed rank and exits 1.
        assert result.returncode == (1 if overrides else -signal.SIGKILL), (at, where, result.stderr[-3000:])
        if where == "checkpoint":
            partial = run_dir / "checkpoints" / f"step_{at}"
            assert partial.is_dir() and not (partial / MARKER).exists(), "killed between the shards and the marker"
    final = launch(*RUN, *overrides, "trainer.resume=auto", f"hydra.run.dir={run_dir}")
    assert final.returncode == 0, final.stderr[-3000:]


def check_journal(run_dir: Path, points: list[tuple[int, str]]) -> list[dict]:
    events = read_journal(run_dir / "journal.jsonl")
    kinds = [event["type"] for event in events]
    assert kinds.count("header") == 1 and kinds.count("launch") == len(points) and kinds.count("finish") == 1
    # Each kill shows as a launch that follows no finish: the journal never claims a run ended that did not.
    assert all(kinds[index - 1] != "finish" for index, kind in enumerate(kinds) if kind == "launch")
    resumes = [int(Path(event["path"]).name[5:]) for event in events if event["type"] == "resume"]
    expected = [step for step in map(resumed_from, points) if step is not None]
    assert resumes == expected, "a partial save is never loaded; each resume takes the newest complete checkpoint"
    assert all(checkpoint_problem(path) is None for path in (run_dir / "checkpoints").iterdir())
    return events


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Path:
    """The single-process run, killed at the 10 POINTS in turn and resumed to the end."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    kill_chain(run_dir, POINTS)
    return run_dir


@pytest.mark.slow
@pytest.mark.reliability(fault="kill -9 (SIGKILL)", protection="atomic checkpoints (COMPLETE last) + resume=auto")
def test_a_run_killed_at_ten_random_points_resumes_to_the_uninterrupted_weights(chain, uninterrupted, record_property):
    assert {where for _, where in POINTS} == set(PHASES), "the seed picks kills in checkpoint writes, evaluations and after steps"
    assert same_weights(chain, uninterrupted), "the resumed run's final weights differ from the uninterrupted run's"
    check_journal(chain, POINTS)
    record_property("data_lost", 0)


def _jsonl(run_dir: Path, name: str) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row[name]) for row in rows if name in row]


@pytest.mark.slow
def test_steps_re_run_after_a_resume_appear_once_with_the_re_run_values(chain, uninterrupted):
    raw = [event["step"] for event in read_journal(chain / "journal.jsonl") if event["type"] == "metrics"]
    assert len(raw) > MAX_STEPS, "the kills made the run log some steps twice in its journal"
    ours, theirs = load_run(chain), load_run(uninterrupted)
    for name in ("train/loss", "train/grad_norm"):
        assert ours.curve(name)[0] == list(range(1, MAX_STEPS + 1))
        assert ours.curve(name) == theirs.curve(name), name
    assert ours.evals()[0] == [3, 6, 8] and ours.evals() == theirs.evals()
    # metrics.jsonl: each resume dropped the lines of the steps it re-ran
    for name in ("train/loss", "val/loss"):
        assert _jsonl(chain, name) == _jsonl(uninterrupted, name), name
    # `currytrain journal` keeps the whole history, and says which metrics were re-run
    assert "re-run later" in "\n".join(timeline(read_journal(chain / "journal.jsonl")))


@pytest.mark.slow
@pytest.mark.reliability(fault="kill -9 (SIGKILL)", protection="atomic checkpoints (COMPLETE last) + resume=auto")
def test_a_2_worker_fsdp_run_killed_in_a_checkpoint_write_resumes_to_the_uninterrupted_weights(tmp_path, record_property):
    layout = ("parallel=fsdp", "parallel.nproc=2")
    reference = tmp_path / "uninterrupted"  # fsdp reduces in another order, so it has its own
    result = launch(*RUN, *layout, f"hydra.run.dir={reference}")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir, points = tmp_path / "run", [(4, "checkpoint")]
    kill_chain(run_dir, points, *layout)
    assert same_weights(run_dir, reference)
    events = check_journal(run_dir, points)
    assert [event["rank"] for event in events if event["type"] == "worker_failed"] == [0]
    record_property("data_lost", 0)
