"""A new host's first token: where a worker process's start goes, read from its own start clock.

`python -m fleet.bench.firsttoken [--engine sim|hf] [--model DIR] [--runs N] [--start-s S]` starts a local
redis-server and store, enqueues a one-chunk job, then N times starts one worker process
(`fleet worker --workers 1`, a launcher as a user starts one) and scrapes its metrics until it has made its first
token: the points of `fleet_worker_start_seconds` (seconds from the process's birth,
fleet.worker.process.startclock) and the run's delivery-to-first-token, each run's figures and
their medians. Each worker is stopped with SIGTERM (its chunk handed back) before the next one
starts, so every run finds the chunk waiting, as a replacement host does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from fleet.bench.procs import WorkerHost, clean_env, run_fleet, wait_until, write_prompts
from fleet.coord.localredis import LocalRedis, free_port

# The worker's start points in the order a start passes them (the `until` labels of
# fleet_worker_start_seconds); read from its metrics, as any user's dashboard would.
POINTS = ("main", "engine_begun", "imported", "runtime", "engine_ready", "consuming", "first_token")

WORKER_HOST = "firsttoken"
FIRST_TOKEN_TIMEOUT_S = 300.0


def scrape(port: int) -> dict[str, float]:
    """A worker's start figures from its metrics endpoint: the points, the engine's start, ready to first
    token, and its runs' first-token count and sum; {} until it serves them."""
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except requests.RequestException:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "fleet_worker_start_seconds":
                out[s.labels["until"]] = s.value
            elif s.name in ("fleet_engine_start_seconds", "fleet_engine_ready_to_first_token_seconds",
                            "fleet_run_first_token_seconds_count", "fleet_run_first_token_seconds_sum"):
                out[s.name] = s.value
    return out


def one_start(env: dict[str, str], work: Path, port: int, n: int) -> dict[str, float]:
    """Start one worker process, wait for its first token, stop it: its start points."""
    host = WorkerHost({**env, "FLEET_MONITOR__METRICS_PORT": str(port)}, 1, work / f"worker{n}.log",
                      host=WORKER_HOST)
    host.start()
    seen: dict[str, float] = {}
    try:
        def first_token() -> bool:
            seen.update(scrape(port))
            return "first_token" in seen and "fleet_run_first_token_seconds_sum" in seen

        wait_until(first_token, FIRST_TOKEN_TIMEOUT_S, f"worker {n}'s first token (log {host.log_path})", 0.05)
    finally:
        host.stop()
    return seen


def measure(engine: str, model: str | None, runs: int, work: Path, start_s: float = 0.0) -> list[dict[str, float]]:
    server = LocalRedis(work / "redis", persist=False).start()
    try:
        extra = {"FLEET_BROKER_URL": server.url, "FLEET_STORE_URL": str(work / "store"), "FLEET_ENGINE": engine,
                 "FLEET_CHUNK_SIZE": "4", "FLEET_SLOTS": "1", "FLEET_ASSIST": "false", "FLEET_GRACE_S": "0",
                 "CUDA_VISIBLE_DEVICES": "", "FLEET_SIM__MEAN_OUTPUT_TOKENS": "100000", "FLEET_SIM__STEP_S": "0.01",
                 "FLEET_SIM__START_S": str(start_s)}
        if model:
            extra["FLEET_MODEL"] = model
            extra["FLEET_SAMPLING__MAX_TOKENS"] = "4096"
        env = clean_env(work, extra)
        prompts = write_prompts(work / "prompts.jsonl", 4)
        run_fleet(["enqueue", str(prompts), "--job", "firsttoken"], env, 300, work)
        return [one_start(env, work, free_port(), n) for n in range(runs)]
    finally:
        server.stop()


def report(results: list[dict[str, float]]) -> dict[str, float]:
    """Medians: each start point, engine start (birth to engine ready), ready to first token, delivery to
    first token."""
    spans = {p: [r[p] for r in results if p in r] for p in POINTS}
    spans["ready_to_first_token"] = [r["first_token"] - r["engine_ready"] for r in results]
    spans["delivery_to_first_token"] = [r["fleet_run_first_token_seconds_sum"] for r in results]
    return {k: round(statistics.median(v), 3) for k, v in spans.items() if v}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.firsttoken")
    parser.add_argument("--engine", default="sim", choices=["sim", "hf"])
    parser.add_argument("--model", help="the hf engine's model directory (`fleet tiny-model DIR` builds one)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--start-s", type=float, default=0.0,
                        help="the sim engine's own start, as a GPU engine loads its weights in its own processes")
    parser.add_argument("--json", dest="as_json", action="store_true", help="every run's points, then the medians")
    args = parser.parse_args(argv)
    if args.engine == "hf" and not args.model:
        parser.error("--engine hf needs --model DIR")
    with tempfile.TemporaryDirectory(prefix="fleet-firsttoken-") as tmp:
        results = measure(args.engine, args.model, args.runs, Path(tmp), args.start_s)
    medians = report(results)
    if args.as_json:
        print(json.dumps({"runs": results, "median": medians}, indent=2))
        return
    print(f"{args.engine} engine, {args.runs} worker starts, median seconds from the process's birth:")
    for point in POINTS:
        print(f"  {point:<24} {medians.get(point, float('nan')):8.3f}")
    print(f"  {'ready -> first token':<24} {medians['ready_to_first_token']:8.3f}")
    print(f"  {'delivery -> first token':<24} {medians['delivery_to_first_token']:8.3f}")


if __name__ == "__main__":
    main()
