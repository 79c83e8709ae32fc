"""Fleet's own overhead: per chunk with the S3 store (dequeue, lease, read chunk, commit
result, ack), and per token as the worker's CPU seconds (fleet.bench.workercpu).

One worker with one chunk slot runs chunks whose generation takes no time (step 0,
prefill 0, one token per record), so the gap between consecutive chunk starts on that
worker is the whole cycle of fleet's own work for a chunk, the next dequeue included.
The store is moto's S3 server over loopback HTTP: real boto3 calls, conditional puts,
but no network latency, so a real region adds its round trips (~5 requests per chunk).

The commit of a reference-size result (512 records of ~1,818 tokens) is timed apart,
because one-token outputs make the measured commits far smaller than real ones.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from fleet.bench.procs import MotoS3, patched_environ
from fleet.bench.profile import Profile
from fleet.bench.reference import REFERENCE
from fleet.bench.report import Figure, Section
from fleet.bench.simjob import SimJob, SimShape, run_sim_job
from fleet.bench.workercpu import measure_worker_cpu, profile_figures, profile_worker
from fleet.engines.sim.tokenchain import sim_text
from fleet.store import open_store
from fleet.store.results import ChunkStats, encode_result

REF_COMMIT_REPEATS = 5


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: an observed value, never an interpolation."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered) - 1e-9)))
    return ordered[rank - 1]


def chunk_cycles(starts: list[float]) -> list[float]:
    ordered = sorted(starts)
    return [b - a for a, b in zip(ordered, ordered[1:], strict=False)]


def reference_rows(records: int, tokens: int) -> list[dict]:
    """Distinct texts per record: identical ones would compress to nothing and flatter zstd."""
    return [{"id": f"ref{i:06d}", "sample": 0, "pos": i, "output": sim_text(i, tokens), "reasoning": None,
             "prompt_tokens": 200, "completion_tokens": tokens, "finish_reason": "stop", "chunk": 0,
             "worker": "gpu0@ref"} for i in range(records)]


def time_reference_commit(store_url: str) -> float:
    """Median seconds to encode and conditionally put one reference-size result."""
    store = open_store(store_url)
    rows = reference_rows(REFERENCE.chunk_size, round(REFERENCE.output_tokens))
    times = []
    for i in range(REF_COMMIT_REPEATS):
        began = time.perf_counter()
        store.put_if_absent(f"refcommit/results/{i:06d}", encode_result(ChunkStats(chunk=i), rows))
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure_overhead(profile: Profile, workdir: Path) -> Section:
    shape = SimShape(max_running=64, chunk_size=profile.overhead_chunk_size, mean_output_tokens=1,
                     sigma=0.0, step_s=0.0, prefill_s=0.0)
    with MotoS3() as s3, patched_environ(s3.env()):
        store_url = f"s3://{s3.bucket('fleet-bench')}/jobs"
        job = SimJob("overhead", shape, profile.overhead_chunks, workers=1, slots=1,
                     store_url=store_url, extra_env=s3.env())
        run = run_sim_job(job, workdir).run
        ref_commit = time_reference_commit(store_url)
    cycles = chunk_cycles([c.started for c in run.chunks])
    in_task = [c.finished - c.started for c in run.chunks]
    median, p99 = statistics.median(cycles), percentile(cycles, 99)
    gpu_s = REFERENCE.chunk_gpu_s
    frac_median = (median + ref_commit) / gpu_s
    frac_p99 = (p99 + ref_commit) / gpu_s
    figures = [
        Figure("per-chunk cycle, median", median * 1000, "ms", note=f"C={shape.chunk_size}, 1-token outputs"),
        Figure("per-chunk cycle, p99", p99 * 1000, "ms", note=f"{len(cycles)} cycles"),
        Figure("commit of a reference-size result", ref_commit * 1000, "ms",
               note=f"{REFERENCE.chunk_size} x {REFERENCE.output_tokens:,.0f} tokens, encode + put"),
        Figure("(median + that commit) / chunk GPU time", frac_median * 100, "%",
               note=f"chunk GPU time {gpu_s:.0f} s at reference scale"),
        Figure("(p99 + that commit) / chunk GPU time", frac_p99 * 100, "%"),
    ]
    data = {
        "chunk_size": shape.chunk_size, "chunks": job.chunks,
        "cycle_s": {"median": median, "p99": p99, "mean": statistics.fmean(cycles),
                    "max": max(cycles), "n": len(cycles)},
        "in_task_s": {"median": statistics.median(in_task), "p99": percentile(in_task, 99)},
        "reference_commit_s": ref_commit,
        "reference_chunk_gpu_s": gpu_s,
        "fraction_median": frac_median, "fraction_p99": frac_p99,
        "cycles_s": [round(c, 5) for c in cycles],
    }
    cpu_figures, data["worker_cpu"] = measure_worker_cpu(profile, workdir)
    figures += cpu_figures
    if profile.cpu_profile_slots:
        data["worker_profile"] = profile_worker(profile, workdir)
        figures += profile_figures(data["worker_profile"])
    return Section("overhead", "fleet's own overhead (per chunk: S3 store, moto; per token: worker CPU)", figures,
                   data)
