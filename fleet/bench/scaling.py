"""Horizontal scaling: 1, 2, 4, 8 workers on one broker, the same work per worker.

Weak scaling (chunks = workers x a fixed number) keeps each run the same length, so the
ratio compares like with like. Record ids, and so the sim's output lengths, are shared
across runs: the 8-worker job is the 1-worker job plus more. The whole-job throughput
includes the end of the job, where the slowest of N workers sets the finish; the FIFO
model of each run shows how much of any shortfall that alone explains.
"""

from __future__ import annotations

from pathlib import Path

from fleet.bench.occupancy import summarize
from fleet.bench.profile import Profile
from fleet.bench.report import Figure, Section, at_least
from fleet.bench.simjob import SimJob, run_sim_job

SCALING_TARGET = 0.95


def measure_scaling(profile: Profile, workdir: Path) -> Section:
    shape = profile.scaling_shape
    runs = []
    for w in profile.scaling_workers:
        job = SimJob(f"scale-w{w}", shape, w * profile.scaling_chunks_per_worker, w)
        r = summarize(run_sim_job(job, workdir))
        r.pop("timeline")
        runs.append(r)
    base = runs[0]
    per_worker = base["tok_s"] / base["workers"]
    for r in runs:
        r["efficiency"] = round(r["tok_s"] / (per_worker * r["workers"]), 4)
        r["model_efficiency"] = round(r["model_occupancy"] / base["model_occupancy"], 4)
    top = runs[-1]
    figures = [Figure(f"{r['workers']} worker(s)", r["tok_s"], "tok/s",
                      note=f"occupancy {r['occupancy']:.3f}") for r in runs]
    figures.append(at_least(f"{top['workers']} workers / ({top['workers']} x 1 worker)", top["efficiency"],
                            SCALING_TARGET, note=f"model {top['model_efficiency']:.3f}"))
    data = {"shape": shape.describe(), "chunks_per_worker": profile.scaling_chunks_per_worker, "runs": runs}
    return Section("scaling", f"horizontal scaling (S={shape.max_running}, one broker)", figures, data)
