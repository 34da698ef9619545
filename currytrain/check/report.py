"""How the ladder's results read: report.md in the run folder (one section per stage, its figures beside
it) and a rich table on the console."""

from __future__ import annotations

from pathlib import Path

from currytrain.check.stage import StageResult, Status

MARKS = {Status.SKIPPED: "SKIP", Status.PASSED: "PASS", Status.WARNING: "WARN", Status.FAILED: "FAIL"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def stage_section(result: StageResult) -> list[str]:
    lines = [f"## {result.stage}: {result.status.value} ({result.seconds:.1f} s)", "", "| check | status | observed | expected | s |", "|---|---|---|---|---:|"]
    lines += [f"| {f.name} | {MARKS[f.status]} | {_cell(f.observed)} | {_cell(f.expected)} | {f.seconds:.2f} |" for f in result.findings]
    lines.append("")
    alarms = [f for f in result.findings if f.status in (Status.WARNING, Status.FAILED)]
    for finding in sorted(alarms, key=lambda f: bool(f.consequence_of)):  # each cause before its consequences
        under = f" (a consequence of **{finding.consequence_of}**)" if finding.consequence_of else ""
        lines += [f"**{finding.name}** ({finding.status.value}){under}: {finding.cause}.", f"Fix: {finding.fix}.", ""]
    lines += [f"![{Path(figure).stem}]({Path(figure).name})" for figure in result.figures]
    if result.figures:
        lines.append("")
    if result.details:
        lines += [result.details, ""]
    return lines


def _planned(plan: dict[str, float], stage: str) -> str:
    return f"{plan[stage]:.1f}" if stage in plan else ""


def write_report(path: Path, results: list[StageResult], planned: list[str], seconds: dict[str, float] | None = None) -> Path:
    """report.md: the summary table (with each stage's planned seconds when the ladder planned its cost), then a
    section per stage."""
    ran = {result.stage for result in results}
    plan = seconds or {}
    lines = ["# Validation ladder", "", "| stage | status | seconds | planned |", "|---|---|---:|---:|"]
    lines += [f"| {r.stage} | {MARKS[r.status]} | {r.seconds:.1f} | {_planned(plan, r.stage)} |" for r in results]
    lines += [f"| {name} | not run (an earlier gate failed) | | {_planned(plan, name)} |" for name in planned if name not in ran]
    lines.append("")
    for result in results:
        lines += stage_section(result)
    path.write_text("\n".join(lines))
    return path


def print_table(results: list[StageResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    colours = {Status.PASSED: "green", Status.WARNING: "yellow", Status.FAILED: "bold red"}
    colours[Status.SKIPPED] = "dim"
    table = Table(title="validation ladder")
    table.add_column("stage", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("observed", overflow="fold")
    for result in results:
        for index, finding in enumerate(result.findings):
            stage = result.stage if index == 0 else ""
            observed = finding.observed if len(finding.observed) <= OBSERVED_WIDTH else finding.observed[: OBSERVED_WIDTH - 1] + "…"
            table.add_row(stage, finding.name, f"[{colours[finding.status]}]{MARKS[finding.status]}[/]", observed)
    console = Console()
    if not console.is_terminal:  # a log file: a width that reads in an 80-to-120-column terminal
        console = Console(width=TABLE_WIDTH)
    console.print(table)


TABLE_WIDTH = 120
"""Columns of the console table when stdout is not a terminal; report.md keeps every finding whole."""
OBSERVED_WIDTH = 160
"""Characters of a finding's observation on the console (folded over two lines at most); report.md has all of it."""
