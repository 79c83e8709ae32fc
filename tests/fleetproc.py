"""Helpers that run fleet's real processes in tests: workers, enqueue, export, a hand-over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from fleet.coord.localredis import LocalRedis

FAST_SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.0005",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "24",
    "FLEET_SIM__MAX_RUNNING": "64",
    "FLEET_SIM__SIGMA": "0.8",
}


def write_prompts(path: Path, n: int, prefix: str = "r") -> Path:
    with open(path, "w") as f:
        for i in range(n):
            if i % 3 == 0:
                f.write(json.dumps({"id": f"{prefix}{i:05d}", "prompt": f"prompt number {i}"}) + "\n")
            else:
                msg = [{"role": "user", "content": f"question {i}: tell me something"}]
                f.write(json.dumps({"id": f"{prefix}{i:05d}", "messages": msg}) + "\n")
    return path


class Workers:
    """`fleet worker` launcher processes, each acting as one host."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, host: str, workers: int = 1, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self._launch(host, ["--workers", str(workers)], extra_env)

    def _launch(self, host: str, args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{host}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet", "worker", *args, "--host-name", host],
            env={**self.env, **(extra_env or {})}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start_gpus(self, host: str, gpus: str = "all") -> subprocess.Popen[bytes]:
        return self._launch(host, ["--gpus", gpus])

    def stop(self, timeout: float = 60) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def logs(self) -> str:
        return "\n".join(f.read_text(errors="replace") for f in sorted(self.log_dir.glob("*.log")))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if predicate():
            return time.monotonic() - began
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def flush_redis(server: LocalRedis) -> None:
    redis.Redis(port=server.port).flushall()


def clean_reference(tmp: Path, sim: dict[str, str], job: str, records: int) -> tuple[Path, bytes]:
    """A clean `fleet run` of the job on a fast sim, exported with --stable: the bytes a
    faulted run of the same job must reproduce."""
    from tests.conftest import run_fleet

    prompts = write_prompts(tmp / "prompts.jsonl", records)
    env = {**sim, "FLEET_DATA_DIR": str(tmp / "data"), "FLEET_SIM__STEP_S": "0.0002"}
    for k in list(os.environ):
        if k.startswith("FLEET_"):
            env.setdefault(k, "")
    done = run_fleet("run", str(prompts), "--job", job, "--workers", "2", env=env, cwd=tmp)
    assert done.returncode == 0, done.stderr
    out = tmp / "ref.jsonl"
    exp = run_fleet("export", "--job", job, "--out", str(out), "--stable", env=env, cwd=tmp)
    assert exp.returncode == 0, exp.stderr
    return prompts, out.read_bytes()


#: a hand-over of two chunks of two records: tokens made published every 0.1 s (not 1 s), so a test
#: sees them while records run; no grace, which would let a stopped record run on to its end
HANDOVER_ENV = {"FLEET_RETURN_OUTPUT_IDS": "true", "FLEET_CHUNK_SIZE": "2", "FLEET_SLOTS": "2",
                "FLEET_CHECKPOINT_INTERVAL_S": "1", "FLEET_ASSIST": "false", "FLEET_ASSIST_POLL_S": "0.2",
                "FLEET_GRACE_S": "0"}


@dataclass
class HandOver:
    """What `hand_over` saw: the exported rows, seconds from SIGTERM to host A's exit, the tokens
    host A made, and the result headers' tokens made less completion tokens."""

    rows: list[dict]
    exit_s: float
    made_by_a: int
    made_twice: int


def hand_over(tmp: Path, env: dict[str, str], redis_port: int, records: list[dict], job: str = "cont",
              timeout: float = 900, stop_after_s: float | None = None) -> HandOver:
    """Four records in two chunks: host A starts them, gets SIGTERM once every chunk made `2 x 48`
    tokens (or `stop_after_s` after it took both), and host B finishes the job; checks what every
    hand-over must show, on any engine."""
    from fleet.coord import chunks, keys
    from fleet.store import open_store
    from fleet.store.layout import results_prefix
    from fleet.store.results import read_result
    from tests.conftest import run_fleet

    assert len(records) == 4
    prompts = tmp / "handover.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = {**env, **HANDOVER_ENV}
    enqueue = run_fleet("enqueue", str(prompts), "--job", job, env=env)
    assert enqueue.returncode == 0, enqueue.stderr[-3000:]
    workers = Workers(env, tmp / "logs")
    store, r = open_store(env["FLEET_STORE_URL"]), redis.Redis(port=redis_port)

    def made() -> list[int]:
        return [int(v) for v in r.hvals(keys.made(job))]

    held: list[float] = []

    def generating() -> bool:
        # Tokens made are published on a worker's 0.5 s poll, which vLLM on a free CPU can starve
        # until its records end: `stop_after_s` after both chunks are taken, they are generating too.
        if not held and all(chunks.holder(r, job, i) for i in range(2)):
            held.append(time.monotonic())
        now = made()
        late = stop_after_s is not None and bool(held) and time.monotonic() - held[0] >= stop_after_s
        return (len(now) == 2 and min(now) >= 2 * 48) or late

    a = workers.start("hostA")
    try:
        wait_for(generating, timeout, "both chunks generating", interval=0.05)
        began = time.monotonic()
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=120)
        exit_s = time.monotonic() - began
        made_by_a = sum(made())
        workers.start("hostB")
        wait_for(lambda: len(list(store.list(results_prefix(job)))) == 2, timeout, "both results")
    finally:
        workers.stop()
    out = tmp / "handover-out.jsonl"
    export = run_fleet("export", "--job", job, "--out", str(out), env=env)
    assert export.returncode == 0, export.stderr[-3000:]
    rows = read_jsonl(out)
    assert [row["id"] for row in rows] == [x["id"] for x in records]
    stats = [read_result(store, job, i)[0] for i in range(2)]
    done = HandOver(rows, exit_s, made_by_a, sum(st.tokens_made - st.completion_tokens for st in stats if st))
    continued = [row for row in rows if row.get("continued_at")]
    print(f"\nSIGTERM to exit of host A: {exit_s:.1f}s; host A made {made_by_a} tokens; {len(continued)} of "
          f"{len(rows)} records continued at {[row['continued_at'] for row in continued]}; tokens made twice "
          f"{done.made_twice}")
    # the records say they were continued, where the first run's ids end
    assert continued, "no record was stopped mid-generation"
    assert all(0 < at < row["completion_tokens"] for row in continued for at in row["continued_at"])
    # a SIGTERM flushes before the hand-over: (almost) nothing host A made was made again
    assert all(st is not None for st in stats) and sum(st.tokens_continued for st in stats if st) > 0
    assert 0 <= done.made_twice <= 16 * len(rows)
    assert exit_s < 60
    return done
