"""The picture of one run: curves.png beside its journal (train and val loss, learning rate, gradient norm, tokens/s
against the step), written when the run ends and by `currytrain journal RUN --plot`. Drawn from the journal alone, so
any run folder has one whatever loggers it ran; matplotlib's Agg canvas, without pyplot's global state."""

from __future__ import annotations

from pathlib import Path

from currytrain.journal import current, read_journal

FIGURE = "curves.png"
PANELS = (
    ("loss (nats/token)", ("train/loss", "val/loss"), "linear"),
    ("learning rate", ("train/lr",), "linear"),
    ("gradient norm", ("train/grad_norm",), "linear"),
    ("tokens/s", ("train/tokens_per_s",), "linear"),
)
"""(title, series, y scale) of each panel; val/loss comes from the journal's eval events. Linear scales: a log axis's
tick labels cost more to draw than the rest of the figure."""
MIN_POINTS_AT_END = 10
"""Logged steps a run needs for its end to draw the figure: a shorter run's curve says nothing its printed losses do
not, and tests and quick trials (trainer.max_steps=5) skip the cost. `currytrain journal RUN --plot` draws from 2."""


def run_series(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """{metric: (steps, values)} of the journal's current records (those a resume or a rollback did not supersede)."""
    series: dict[str, tuple[list[int], list[float]]] = {}

    def add(name: str, step: int, value) -> None:
        if isinstance(value, int | float):
            steps, values = series.setdefault(name, ([], []))
            steps.append(step)
            values.append(float(value))

    for record in current(records):
        if record.get("type") == "metrics":
            for name in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"):
                add(name, record["step"], record.get(name))
        elif record.get("type") == "eval":
            add("val/loss", record["step"], record.get("val_loss"))
    return series


def plot_run(run_dir: str | Path, min_points: int = 2) -> Path | None:
    """Write <run_dir>/curves.png from its journal; None (nothing written) when it logged fewer than min_points steps."""
    run_dir = Path(run_dir)
    series = run_series(read_journal(run_dir / "journal.jsonl"))
    if len(series.get("train/loss", ([], []))[0]) < max(2, min_points):
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5.5), dpi=80)  # fixed margins: a layout engine costs more than the drawing
    FigureCanvasAgg(figure)
    figure.subplots_adjust(left=0.08, right=0.98, bottom=0.09, top=0.9, wspace=0.22, hspace=0.45)
    for axes, (title, names, scale) in zip(figure.subplots(2, 2).flat, PANELS):
        for name in names:
            if name in series:
                steps, values = series[name]
                axes.plot(steps, values, marker="o" if name == "val/loss" else None, markersize=3, label=name)
        axes.set_title(title)
        axes.set_xlabel("step")
        axes.set_yscale(scale)
        if len(names) > 1:
            axes.legend()
    figure.suptitle(str(run_dir))
    path = run_dir / FIGURE
    figure.savefig(path)
    return path
