"""Engine occupancy for K=1 against the default K, a sweep over K x C / S, and the
makespan of a 6-worker job against its ideal (issue 6, first two targets).

Occupancy = busy slot-seconds / (workers x S x makespan), the makespan running from the
job's first chunk start to its last result. Each run is also replayed through the
zero-overhead FIFO model with the run's own output lengths: the gap between the two is
what fleet's machinery costs, the model's own gap to 1 is what the schedule costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.bench.idealmodel import model_occupancy
from fleet.bench.jobstats import ideal_makespan_s, occupancy, throughput, timeline
from fleet.bench.profile import Profile
from fleet.bench.report import Figure, Section, at_least, at_most
from fleet.bench.simjob import SimJob, SimJobResult, run_sim_job

OCCUPANCY_TARGET = 0.97
MAKESPAN_TARGET = 1.05


def summarize(res: SimJobResult) -> dict[str, Any]:
    job, run = res.job, res.run
    s = job.shape.max_running
    return {
        "job": job.name,
        "workers": job.workers,
        "k": job.k,
        "k_derived": job.slots is None,
        "kc_over_s": job.k * job.shape.chunk_size / s,
        "chunks": job.chunks,
        "records": job.records,
        "output_tokens": run.tokens,
        "makespan_s": round(run.makespan_s, 3),
        "ideal_makespan_s": round(ideal_makespan_s(run, job.workers, s), 3),
        "occupancy": round(occupancy(run, job.workers, s), 4),
        "model_occupancy": round(model_occupancy([c.lengths for c in run.chunks], job.workers, s, job.k), 4),
        "model_longest_first": round(model_occupancy([sorted(c.lengths, reverse=True) for c in run.chunks],
                                                     job.workers, s, job.k), 4),
        "tok_s": round(throughput(run), 1),
        "workers_used": len(run.workers),
        "startup_s": round(res.startup_s, 2),
        "timeline": timeline(run, job.workers, s),
    }


def measure_occupancy(profile: Profile, workdir: Path) -> Section:
    shape, workers = profile.occupancy_shape, profile.occupancy_workers
    default_k = shape.default_slots()
    runs = []
    for k in sorted(set(profile.ks) | {1, default_k}):
        # The default run sets no K at all: the workers derive it, as in production.
        job = SimJob(f"occ-k{k}", shape, profile.occupancy_chunks, workers, None if k == default_k else k)
        runs.append(summarize(run_sim_job(job, workdir)))
    one = next(r for r in runs if r["k"] == 1)
    dflt = next(r for r in runs if r["k_derived"])
    figures = [
        Figure("occupancy, K=1", one["occupancy"], note=f"model {one['model_occupancy']:.3f}"),
        at_least(f"occupancy, default K={default_k}", dflt["occupancy"], OCCUPANCY_TARGET,
                 note=f"model {dflt['model_occupancy']:.3f}"),
    ]
    for r in runs:
        if r is not one and r is not dflt:
            figures.append(Figure(f"occupancy, K={r['k']} (K x C / S = {r['kc_over_s']:g})", r["occupancy"],
                                  note=f"model {r['model_occupancy']:.3f}"))
    data = {"shape": shape.describe(), "workers": workers, "default_k": default_k, "runs": runs}
    return Section("occupancy", f"occupancy ({workers} workers, S={shape.max_running}, C={shape.chunk_size})",
                   figures, data)


def measure_makespan(profile: Profile, workdir: Path) -> Section:
    shape, workers = profile.makespan_shape, profile.makespan_workers
    job = SimJob(f"makespan-w{workers}", shape, profile.makespan_chunks, workers)
    r = summarize(run_sim_job(job, workdir))
    ratio = r["makespan_s"] / r["ideal_makespan_s"]
    model_ratio = 1 / r["model_occupancy"] if r["model_occupancy"] else None
    figures = [
        at_most("makespan / ideal", round(ratio, 4), MAKESPAN_TARGET,
                note=f"model {model_ratio:.3f}" if model_ratio else ""),
        Figure("makespan", r["makespan_s"], "s", note=f"ideal {r['ideal_makespan_s']:.2f} s"),
        Figure(f"occupancy, default K={r['k']}", r["occupancy"], note=f"{r['chunks']} chunks"),
    ]
    data = {"shape": shape.describe(), "ratio": ratio, "model_ratio": model_ratio, "run": r}
    return Section("makespan", f"makespan vs ideal ({workers} workers)", figures, data)
