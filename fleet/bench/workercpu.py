"""The worker's own CPU per million output tokens, and where it goes: the figure that carries to
a GPU host, where the engine's work moves to the GPU and its scheduler to processes of its own.

Sim-engine workers at several S (engine slots, so requests running at once) run jobs at one
offered token rate (step = S / rate, so deltas and requests per second stay the same and only
the number of running requests changes). The worker process's own user + system seconds from
ready to the last result (psutil's cpu_times; an engine's child processes would not count, the
in-process sim does) over the tokens made. The sim's own share (ids and text for each token)
is timed apart in this process and taken off, leaving fleet's: Celery, the engine loop, the
stream reading, checkpoints, the commit. A second run at one S goes under
fleet.bench.workerprof for the breakdown.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from fleet.bench.jobstats import JobRun, occupancy
from fleet.bench.procs import FLEET_ROOT, pythonpath_first, wait_until
from fleet.bench.profile import Profile
from fleet.bench.report import Figure
from fleet.bench.simjob import SimJob, SimShape, run_sim_job
from fleet.bench.workerprof import OUT_ENV, hook
from fleet.engines.sim.tokenchain import SimVocab, sim_text_of, sim_tokens

MILLION = 1_000_000
#: chunks in flight per worker as K x C = this x S (the default is 16: fewer, so a short job is
#: mostly steady state; the worker still holds 4 x S requests, most waiting for a slot)
IN_FLIGHT_FACTOR = 4
PROFILE_THREADS = 5


def shape_for(slots: int, rate: float, mean_tokens: float, chunk_size: int) -> SimShape:
    return SimShape(max_running=slots, chunk_size=chunk_size, mean_output_tokens=mean_tokens, sigma=0.5,
                    step_s=slots / rate)


def job_for(name: str, shape: SimShape, records: int) -> SimJob:
    chunks = max(1, math.ceil(records / shape.chunk_size))
    return SimJob(name, shape, chunks, workers=1, extra_env={"FLEET_IN_FLIGHT_FACTOR": str(IN_FLIGHT_FACTOR)})


def sim_cpu_per_token(run: JobRun, samples: int = 400) -> float:
    """CPU seconds the sim spends per output token making ids and text, timed here on the run's lengths."""
    lengths = [n for c in run.chunks for n in c.lengths][:samples]
    began = time.process_time()
    vocab = SimVocab()
    for i, n in enumerate(lengths):
        sim_text_of(vocab, sim_tokens(vocab, i, n, n)[0])
    return (time.process_time() - began) / max(1, sum(lengths))


def cpu_point(slots: int, profile: Profile, workdir: Path) -> dict[str, Any]:
    shape = shape_for(slots, profile.cpu_token_rate, profile.cpu_mean_tokens, profile.cpu_chunk_size)
    records = max(profile.cpu_records, profile.cpu_waves * slots)
    result = run_sim_job(job_for(f"cpu-s{slots}", shape, records), workdir)
    run, cpu = result.run, sum(result.worker_cpu_s)
    sim = sim_cpu_per_token(run) * run.tokens
    return {"S": slots, "records": records, "tokens": run.tokens, "window_s": run.makespan_s,
            "tok_s": run.tokens / run.makespan_s, "offered_tok_s": profile.cpu_token_rate,
            "mean_running": occupancy(run, 1, slots) * slots, "worker_cpu_s": cpu, "sim_cpu_s": sim,
            "cpu_s_per_mtok": cpu / run.tokens * MILLION, "fleet_cpu_s_per_mtok": (cpu - sim) / run.tokens * MILLION,
            "cores": cpu / run.makespan_s, "step_s": shape.step_s}  # fmt: skip


def measure_worker_cpu(profile: Profile, workdir: Path) -> tuple[list[Figure], list[dict[str, Any]]]:
    points = [cpu_point(s, profile, workdir) for s in profile.cpu_slots]
    figures = [
        Figure(f"worker CPU per M output tokens, S={p['S']}", round(p["fleet_cpu_s_per_mtok"], 2), "s",
               note=f"{p['cpu_s_per_mtok']:.2f} s with the sim's own; {p['mean_running']:.0f} running on average, "
                    f"{p['tok_s']:,.0f} tok/s, {p['cores']:.2f} cores")
        for p in points
    ]  # fmt: skip
    return figures, points


def profile_worker(profile: Profile, workdir: Path) -> dict[str, Any]:
    """One sim job at `profile.cpu_profile_slots` with the worker under fleet.bench.workerprof."""
    slots = profile.cpu_profile_slots
    shape = shape_for(slots, profile.cpu_token_rate, profile.cpu_mean_tokens, profile.cpu_chunk_size)
    out = workdir / f"workerprof-s{slots}.json"
    job = job_for(f"prof-s{slots}", shape, max(profile.cpu_records, profile.cpu_waves * slots))
    return profiled(job, workdir, out, job.shape.default_slots(IN_FLIGHT_FACTOR), slots)


def profiled(job: SimJob, workdir: Path, out: Path, concurrency: int, slots: int) -> dict[str, Any]:
    """Run `job` on one `fleet worker` of `concurrency` slots, its worker process under
    fleet.bench.workerprof (counting from the worker's ready to the job's last result); its report,
    with S, the tokens made and the CPU seconds per M tokens."""
    gate = out.with_suffix(".on")
    job.slots = concurrency
    path = pythonpath_first(FLEET_ROOT, os.environ.get("PYTHONPATH", ""))
    job.extra_env |= {OUT_ENV: str(out), "PYTHONPATH": pythonpath_first(hook(workdir / "workerprof-hook"), path)}

    def window_closed() -> None:
        gate.unlink()
        wait_until(out.exists, 60, f"the worker's profile {out}")

    job.on_ready, job.on_done = gate.touch, window_closed
    result = run_sim_job(job, workdir, timeout_s=3600)
    report = json.loads(out.read_text())
    report["S"], report["tokens"] = slots, result.run.tokens
    report["cpu_s_per_mtok"] = report["process_cpu_s"] / result.run.tokens * MILLION
    report["us_per_token"] = (report["process_cpu_s"] - report["sampler_cpu_s"]) / result.run.tokens * 1e6
    return report


def profile_figures(report: dict[str, Any]) -> list[Figure]:
    """The worker's CPU by thread (the sampler's own left out), then the engine loop's functions
    with the most own time under cProfile."""
    own = report["process_cpu_s"] - report["sampler_cpu_s"]
    per_mtok = round(own / report["tokens"] * MILLION, 2)
    note = f"sampler's own {report['sampler_cpu_s']:.2f} s left out; cProfile on the loop"
    figures = [Figure(f"profiled worker (S={report['S']}): CPU per M tokens", per_mtok, "s", note=note)]
    for name, secs in list(report["threads_s"].items())[:PROFILE_THREADS]:
        share = round(100 * secs / max(own, 1e-9), 1)
        figures.append(Figure(f"  thread {name}", share, "%", note="of the worker's CPU"))
    loop = report.get("loop_cprofile") or {}
    for name, self_s in loop.get("by_area_self_s", {}).items():
        figures.append(Figure(f"  loop: {name}", round(100 * self_s / max(loop["total_s"], 1e-9), 1), "%",
                              note="own time, of the loop thread's busy time under cProfile"))
    return figures
