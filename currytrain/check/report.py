"""How the ladder's results read: report.md in the run folder (one section per stage, its figures beside
it) and a rich table on the console."""

from __future__ import annotations

from pathlib import Path

from currytrain.check.stage import StageResult, Status

MARKS = {Status.PASSED: "PASS", Status.WARNING: "WARN", Status.FAILED: "FAIL"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def stage_section(result: StageResult) -> list[str]:
    lines = [f"## {result.stage}: {result.status.value} ({result.seconds:.1f} s)", "", "| check | status | observed | expected | s |", "|---|---|---|---|---:|"]
    lines += [f"| {f.name} | {MARKS[f.status]} | {_cell(f.observed)} | {_cell(f.expected)} | {f.seconds:.2f} |" for f in result.findings]
    lines.append("")
    for finding in result.findings:
        if finding.status is not Status.PASSED:
            lines += [f"**{finding.name}** ({finding.status.value}): {finding.cause}.", f"Fix: {finding.fix}.", ""]
    lines += [f"![{Path(figure).stem}]({Path(figure).name})" for figure in result.figures]
    if result.figures:
        lines.append("")
    if result.details:
        lines += [result.details, ""]
    return lines


def write_report(path: Path, results: list[StageResult], planned: list[str]) -> Path:
    ran = {result.stage for result in results}
    lines = ["# Validation ladder", "", "| stage | status | seconds |", "|---|---|---:|"]
    lines += [f"| {r.stage} | {MARKS[r.status]} | {r.seconds:.1f} |" for r in results]
    lines += [f"| {name} | not run (an earlier gate failed) | |" for name in planned if name not in ran]
    lines.append("")
    for result in results:
        lines += stage_section(result)
    path.write_text("\n".join(lines))
    return path


def print_table(results: list[StageResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    colours = {Status.PASSED: "green", Status.WARNING: "yellow", Status.FAILED: "bold red"}
    table = Table(title="validation ladder")
    for column in ("stage", "check", "status", "observed", "expected"):
        table.add_column(column, overflow="fold")
    for result in results:
        for index, finding in enumerate(result.findings):
            stage = result.stage if index == 0 else ""
            table.add_row(stage, finding.name, f"[{colours[finding.status]}]{MARKS[finding.status]}[/]", finding.observed, finding.expected)
    console = Console()
    if not console.is_terminal:  # a log file is not 80 columns wide
        console = Console(width=200)
    console.print(table)
