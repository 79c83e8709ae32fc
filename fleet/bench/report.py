"""What a benchmark hands back, and how the suite shows it: a rich table, JSON, PNG plots."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass
class Figure:
    """One line of the table: a measured value and, where the issue sets one, its target."""

    name: str
    value: float | None
    unit: str = ""
    #: e.g. ">= 0.97"; None when the figure is informative only
    target: str | None = None
    ok: bool | None = None
    note: str = ""


@dataclass
class Section:
    """One measurement: its figures for the table and the raw data behind them."""

    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


def at_least(name: str, value: float, bound: float, unit: str = "", note: str = "") -> Figure:
    return Figure(name, value, unit, f">= {bound:g}", value >= bound, note)


def at_most(name: str, value: float, bound: float, unit: str = "", note: str = "") -> Figure:
    return Figure(name, value, unit, f"<= {bound:g}", value <= bound, note)


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{value:.3f} %" if abs(value) < 1 else f"{value:.1f} %"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3f}"
    return f"{text} {unit}".strip()


def verdict(f: Figure) -> str:
    if f.ok is None:
        return ""
    return "[green]yes[/]" if f.ok else "[red]no[/]"


def table(sections: list[Section]) -> Table:
    t = Table(title="fleet bench", show_lines=False)
    for col in ("measurement", "figure", "value", "target", "holds", "note"):
        t.add_column(col, overflow="fold")
    for s in sections:
        if s.error:
            t.add_row(s.title, "[red]failed[/]", "-", "", "", s.error.splitlines()[0][:120])
            continue
        for i, f in enumerate(s.figures):
            t.add_row(s.title if i == 0 else "", f.name, fmt(f.value, f.unit), f.target or "", verdict(f), f.note)
        t.add_section()
    return t


def print_table(sections: list[Section], console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal:  # piped or logged: rich would fold the table to 80 columns
        console = Console(width=160, file=console.file)
    console.print(table(sections))


def to_json(sections: list[Section], meta: dict[str, Any]) -> dict[str, Any]:
    return {"meta": meta, "sections": {s.key: asdict(s) for s in sections}}


def write_json(path: Path, sections: list[Section], meta: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(sections, meta), indent=2, sort_keys=False) + "\n")
    return path


def markdown_table(sections: list[Section]) -> str:
    """The same table as GitHub markdown, for BENCHMARKS.md."""
    lines = ["| measurement | figure | value | target | holds |", "|---|---|---|---|---|"]
    for s in sections:
        if s.error:
            lines.append(f"| {s.title} | failed: {s.error.splitlines()[0][:80]} | | | |")
            continue
        for i, f in enumerate(s.figures):
            holds = "" if f.ok is None else ("yes" if f.ok else "**no**")
            title = s.title if i == 0 else ""
            lines.append(f"| {title} | {f.name} | {fmt(f.value, f.unit)} | {f.target or ''} | {holds} |")
    return "\n".join(lines) + "\n"
