"""kill -9 anywhere, then trainer.resume=auto: the run ends with exactly the weights of a run never killed.

One run is killed three times (inside a checkpoint write, inside an evaluation, right after an optimizer
step; a 2-worker fsdp run the first two times), relaunched with trainer.resume=auto after each kill, and
compared bitwise with an uninterrupted run of the same config: the partial checkpoint is never loaded, and the journal tells each kill (a launch after
no finish) and each resume. The signal tests (test_signals.py) compare against the same uninterrupted run.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from conftest import launch
from currytrain.journal import read_journal
from currytrain.weights import MARKER, checkpoint_problem
from reliability.runs import RUN, same_weights

KILLS = [(4, "checkpoint"), (6, "eval"), (7, "step")]
"""(step, where): with checkpoints every 2 steps and evaluations every 3 (TINY)."""


def killer(at: int, where: str) -> str:
    return f"+logger.fault={{_target_:tests.faulty.Killer,at:{at},where:{where}}}"


LAYOUTS = {
    "single process": ((), KILLS),
    "fsdp, 2 workers": (("parallel=fsdp", "parallel.nproc=2"), KILLS[:2]),
}


@pytest.fixture
def reference(request, uninterrupted, tmp_path) -> Path:
    """The uninterrupted run of a layout (fsdp reduces in another order, so it has its own)."""
    layout = LAYOUTS[request.node.callspec.params["layout"]][0]
    if not layout:
        return uninterrupted
    run_dir = tmp_path / "uninterrupted"
    result = launch(*RUN, *layout, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
@pytest.mark.reliability(fault="kill -9 (SIGKILL)", protection="atomic checkpoints (COMPLETE last) + resume=auto")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_killed_run_resumes_to_the_uninterrupted_weights(layout, reference, tmp_path, record_property):
    overrides, kills = LAYOUTS[layout]
    run_dir = tmp_path / "run"
    for number, (at, where) in enumerate(kills):
        resume = [] if number == 0 else ["trainer.resume=auto"]
        result = launch(*RUN, *overrides, *resume, killer(at, where), f"hydra.run.dir={run_dir}")
        # One process dies of the signal; a launcher of workers reports the killed rank and exits 1.
        assert result.returncode == (1 if overrides else -signal.SIGKILL), result.stderr[-3000:]
        if where == "checkpoint":
            partial = run_dir / "checkpoints" / f"step_{at}"
            assert partial.is_dir() and not (partial / MARKER).exists(), "killed between the shards and the marker"
    final = launch(*RUN, *overrides, "trainer.resume=auto", f"hydra.run.dir={run_dir}")
    assert final.returncode == 0, final.stderr[-3000:]

    assert same_weights(run_dir, reference), "the resumed run's final weights differ from the uninterrupted run's"
    events = read_journal(run_dir / "journal.jsonl")
    kinds = [event["type"] for event in events]
    assert kinds.count("header") == 1 and kinds.count("launch") == len(kills) and kinds.count("finish") == 1
    resumed_from = [int(Path(event["path"]).name[5:]) for event in events if event["type"] == "resume"]
    assert resumed_from == [2, 4, 6][: len(kills)], "step 4's partial save is never loaded; each resume takes the newest complete one"
    # Each kill shows as a launch that follows no finish: the journal never claims a run ended that did not.
    assert all(kinds[index - 1] != "finish" for index, kind in enumerate(kinds) if kind == "launch")
    if overrides:
        assert [event["rank"] for event in events if event["type"] == "worker_failed"] == [0] * len(kills)
    assert all(checkpoint_problem(path) is None for path in (run_dir / "checkpoints").iterdir())
    record_property("data_lost", 0)
