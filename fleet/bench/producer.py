"""The producer: prompts per second and peak memory of `fleet enqueue` at two input sizes.

Each run is a fresh `fleet enqueue` process (validate, chunk, upload, manifest, enqueue)
against its own Redis and an empty store; its peak RSS comes from the kernel's rusage of
that child alone. Comparing two sizes ten times apart shows whether memory follows the
input: a streaming producer pays only a small fixed cost per record (the duplicate-id
check keeps a digest and a line number per id).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.bench.procs import MotoS3, clean_env, patched_environ, run_measured, write_prompts
from fleet.bench.profile import Profile
from fleet.bench.report import Figure, Section
from fleet.coord.localredis import LocalRedis


def enqueue_once(workdir: Path, records: int, chunk_size: int, store_url: str, extra: dict[str, str]) -> dict[str, Any]:
    prompts = write_prompts(workdir / f"prompts-{records}.jsonl", records)
    name = f"producer-{records}-{'s3' if store_url.startswith('s3://') else 'local'}"
    base = workdir / name
    with LocalRedis(base / "redis", persist=False) as redis_server:
        env = clean_env(workdir, {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url,
                                  "FLEET_STORE_URL": store_url, "FLEET_CHUNK_SIZE": str(chunk_size), **extra})
        usage = run_measured(["enqueue", str(prompts), "--job", name], env, workdir, timeout_s=900)
    return {"records": records, "store": "s3" if store_url.startswith("s3://") else "local",
            "input_mb": round(prompts.stat().st_size / 1e6, 1), "prompts_s": round(records / usage["wall_s"], 1),
            **{k: round(v, 2) for k, v in usage.items()}}


def growth_bytes_per_record(small: dict[str, Any], large: dict[str, Any]) -> float:
    extra = large["records"] - small["records"]
    return (large["peak_rss_mb"] - small["peak_rss_mb"]) * 1024 * 1024 / extra if extra else 0.0


def measure_producer(profile: Profile, workdir: Path) -> Section:
    c = profile.producer_chunk_size
    runs = [enqueue_once(workdir, n, c, str(workdir / f"producer-store-{n}"), {}) for n in profile.producer_sizes]
    if profile.producer_s3_sizes:
        with MotoS3() as s3, patched_environ(s3.env()):
            bucket = s3.bucket("fleet-producer")
            runs += [enqueue_once(workdir, n, c, f"s3://{bucket}/p{n}", s3.env()) for n in profile.producer_s3_sizes]
    local = [r for r in runs if r["store"] == "local"]
    small, large = local[0], local[-1]
    figures = [Figure(f"{r['records']:,} records, {r['store']} store", r["prompts_s"], "prompts/s",
                      note=f"peak RSS {r['peak_rss_mb']:.0f} MB, {r['input_mb']:.0f} MB input")
               for r in runs]
    growth = growth_bytes_per_record(small, large)
    figures.append(Figure(f"peak RSS at {large['records']:,} / at {small['records']:,}",
                          round(large["peak_rss_mb"] / small["peak_rss_mb"], 3), "x",
                          note=f"{growth:.0f} bytes per extra record"))
    data = {"chunk_size": c, "runs": runs, "rss_growth_bytes_per_record": growth,
            "largest_prompts_s": large["prompts_s"]}
    return Section("producer", "producer (`fleet enqueue`)", figures, data)
