"""The two sides of a fleet-against-bare pair, each as processes of its own.

Fleet's side is one `fleet run` job, read back from its store (its job window, each chunk's
run) and sampled while it runs: its worker's own CPU, and the tokens its chunks have made as the
worker publishes them while they stream, for the window it shares with the other side. The bare side is a
benchmark module run as `python -m MODULE ... --out FILE` (engines print their own lines to
stdout), which writes one JSON object (fleet.bench.feed's). Beside each other each runs in its
own pen (fleet.bench.sharedcore): the bare command is started in it, fleet's worker is moved
into it as it appears.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from fleet.bench.jobstats import read_job, throughput
from fleet.bench.pairs import Lane
from fleet.bench.procs import run_fleet_watching_workers
from fleet.bench.series import difference
from fleet.errors import FleetError
from fleet.store import open_store

SIDE_TIMEOUT_S = 1800


def fleet_side(workdir: Path, data_dir: Path, job: str, args: list[str], env: dict[str, str], prompts: int,
               chunk_size: int, lane: Lane) -> dict[str, Any]:  # fmt: skip
    """`fleet run ARGS --job JOB` to its end with FLEET_DATA_DIR = data_dir (emptied first)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    env = {**env, "FLEET_DATA_DIR": str(data_dir)}
    watched = run_fleet_watching_workers([*args, "--job", job], env, SIDE_TIMEOUT_S, workdir, lane.pen, job)
    chunks = -(-prompts // chunk_size)
    run = read_job(open_store(str(data_dir / "store")), job, chunks)
    return {"prompts": prompts, "tokens": run.tokens, "seconds": run.makespan_s, "tok_s": throughput(run),
            "chunks": chunks, "cpu_s": difference(watched.cpu, run.first_start, run.last_finish),
            "ramps": [[c.started, c.finished, c.tokens] for c in run.chunks], "cpu_samples": watched.cpu,
            "made_samples": watched.made}  # fmt: skip


def bare_side(workdir: Path, module: str, args: list[str], env: dict[str, str], lane: Lane,
              name: str) -> dict[str, Any]:  # fmt: skip
    """`python -m MODULE ARGS --out FILE [--until STOPFILE]`: its JSON result."""
    out = workdir / f"{name}-bare.json"
    out.unlink(missing_ok=True)
    until = ["--until", str(lane.until)] if lane.until is not None else []
    argv = [*lane.prefix(), sys.executable, "-m", module, *args, *until, "--out", str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=SIDE_TIMEOUT_S, cwd=workdir)
    if done.returncode != 0 or not out.is_file():
        raise FleetError(f"bare {name} side exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())
