"""Run a set of measurements in order, then write the table, the JSON and the plots.

A measurement that fails becomes a failed row (with its error in the JSON), the others
still run: one broken piece should not hide the rest of the figures.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from fleet.bench import MEASUREMENTS
from fleet.bench.hfcompare import measure_hf
from fleet.bench.occupancy import measure_makespan, measure_occupancy
from fleet.bench.overhead import measure_overhead
from fleet.bench.producer import measure_producer
from fleet.bench.profile import Profile
from fleet.bench.projection import measure_projection
from fleet.bench.reference import implications
from fleet.bench.report import Section, markdown_table, print_table, to_json, write_json
from fleet.bench.scaling import measure_scaling

Measure = Callable[[Profile, Path], Section]
MEASURES: dict[str, Measure] = {
    "occupancy": measure_occupancy,
    "makespan": measure_makespan,
    "projection": measure_projection,
    "scaling": measure_scaling,
    "overhead": measure_overhead,
    "producer": measure_producer,
    "hf": measure_hf,
}


def run_one(name: str, profile: Profile, workdir: Path, console: Console) -> Section:
    what, measure = MEASUREMENTS[name], MEASURES[name]
    console.print(f"[bold]bench {name}[/]: {what} ...")
    began = time.monotonic()
    try:
        section = measure(profile, workdir)
    except Exception as e:  # reported as a failed row; the suite goes on
        section = Section(name, what, error=f"{type(e).__name__}: {e}")
        section.data["traceback"] = traceback.format_exc()
    section.seconds = round(time.monotonic() - began, 1)
    failed = f" [red]FAILED[/]: {section.error}" if section.error else ""
    console.print(f"  {name} done in {section.seconds:.0f}s{failed}")
    return section


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
            "loadavg": [round(x, 2) for x in load] if load else None}


def run_suite(names: list[str], profile: Profile, out: Path, keep: bool = False,
              console: Console | None = None, command: str | None = None) -> list[Section]:
    console = console or Console(stderr=True)
    workdir = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    began, started_machine = time.monotonic(), machine()
    try:
        sections = [run_one(n, profile, workdir, console) for n in names]
    finally:
        if keep:
            console.print(f"kept the work directory {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    command = command or "fleet " + " ".join(sys.argv[1:])
    write_outputs(sections, out, profile, command, began, started_machine, console)
    return sections


def write_outputs(sections: list[Section], out: Path, profile: Profile, command: str, began: float,
                  started_machine: dict[str, Any], console: Console) -> None:
    from fleet.bench.plots import write_plots

    meta: dict[str, Any] = {
        "command": command,
        "profile": asdict(profile),
        "machine_at_start": started_machine,
        "machine_at_end": machine(),
        "seconds": round(time.monotonic() - began, 1),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    meta["reference"] = implications(to_json(sections, meta)["sections"])
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "bench.json", sections, meta)
    (out / "table.md").write_text(markdown_table(sections))
    plots = write_plots(to_json(sections, meta)["sections"], out)
    print_table(sections, Console())
    console.print(f"wrote {out / 'bench.json'}, {out / 'table.md'}"
                  + "".join(f", {p.name}" for p in plots) + f" in {meta['seconds']:.0f}s")
