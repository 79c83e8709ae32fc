"""Horizontal scaling: 1, 2, 4, 8 workers on one broker, the same work per worker.

Weak scaling (chunks = workers x a fixed number) keeps each run the same length, so the
ratio compares like with like. Record ids, and so the sim's output lengths, are shared
across runs: the 8-worker job is the 1-worker job plus more. The whole-job throughput
includes the end of the job, where the slowest of N workers sets the finish; the FIFO
model of each run shows how much of any shortfall that alone explains.
"""

from __future__ import annotations

from pathlib import Path

from fleet.bench.jobstats import steady_throughput
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
        res = run_sim_job(job, workdir)
        r = summarize(res)
        r.pop("timeline")
        steady = steady_throughput(res.run)
        r["steady_tok_s"] = round(steady, 1) if steady else None
        runs.append(r)
    base = runs[0]
    for r in runs:
        n = r["workers"] / base["workers"]
        r["efficiency"] = round(r["tok_s"] / (base["tok_s"] * n), 4)
        r["model_efficiency"] = round(r["model_occupancy"] / base["model_occupancy"], 4)
        if r["steady_tok_s"] and base["steady_tok_s"]:
            r["steady_efficiency"] = round(r["steady_tok_s"] / (base["steady_tok_s"] * n), 4)
    top = runs[-1]
    figures = [Figure(f"{r['workers']} worker(s)", r["tok_s"], "tok/s",
                      note=f"occupancy {r['occupancy']:.3f}") for r in runs]
    label = f"{top['workers']} workers / ({top['workers']} x 1 worker)"
    figures.append(at_least(label, top["efficiency"], SCALING_TARGET,
                            note=f"model {top['model_efficiency']:.3f}: the end-of-job tail"))
    if top.get("steady_efficiency") is not None:
        figures.append(Figure(f"{label}, queue non-empty (approx.)", top["steady_efficiency"],
                              note="steady state: no start-up, no tail"))
    data = {"shape": shape.describe(), "chunks_per_worker": profile.scaling_chunks_per_worker, "runs": runs}
    return Section("scaling", f"horizontal scaling (S={shape.max_running}, one broker)", figures, data)
