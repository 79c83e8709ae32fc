"""Helpers that run fleet's real processes in tests: workers, enqueue, export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from fleet.coord.localredis import LocalRedis
from fleet.store import Store, open_store

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


def cmdline(pid: int) -> str:
    """A process's command line, words joined by spaces ('' once it is gone or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes_below(root: int, command: str) -> list[int]:
    """Running descendants of root whose command line contains command."""
    from fleet.worker.proctree import descendants

    return [pid for pid in descendants(root) if command in cmdline(pid)]


def worker_pids(launcher: int) -> list[int]:
    """The worker processes a `fleet worker` launcher runs now (not the orphans it adopted). Celery
    retitles a worker `[celeryd: <name>:MainProcess]` where setproctitle is installed (vLLM's venv)."""
    from fleet.worker.proctree import children

    return [pid for pid in children(launcher) if "fleet.worker.main" in (cmd := cmdline(pid)) or "[celeryd: " in cmd]


def worker_with(workers: Workers, host: str, command: str, ready: str = "ready.",
                timeout: float = 90) -> tuple[subprocess.Popen[bytes], int, int]:
    """A launcher of one worker, started; once a worker logs `ready`: the launcher, the worker's pid,
    and the one process below the worker whose command line contains command."""
    launcher = workers.start(host)
    wait_for(lambda: workers.logs().count(ready) >= 1, timeout, f"the worker of {host} ready")
    [worker] = worker_pids(launcher.pid)
    [pid] = processes_below(worker, command)
    return launcher, worker, pid


def gone_before_successor(launcher: int, worker: int, pid: int, timeout: float = 60) -> float:
    """Seconds from now (just after worker's death) until pid, a process it left, exited (a zombie
    has freed its memory; its parent reaps it); fails if the launcher starts a successor worker while
    pid still runs."""
    from fleet.worker.proctree import stat

    def ended() -> bool:
        st = stat(pid)
        return st is None or not st.running

    began, gone = time.monotonic(), None
    while time.monotonic() - began < timeout:
        if gone is None and ended():
            gone = time.monotonic() - began
        if [p for p in worker_pids(launcher) if p != worker]:
            assert ended(), f"a successor worker started beside pid {pid} of the dead worker"
            assert gone is not None
            return gone
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout}s waiting for pid {pid} to go and a successor to start")


def job_on_two_hosts(env: dict[str, str], prompts: Path, job: str, server: LocalRedis,
                     log_dir: Path) -> tuple[Store, redis.Redis, Workers]:
    """Enqueue the job, then start a worker launcher on host-a and one on host-b."""
    from tests.conftest import run_fleet

    assert run_fleet("enqueue", str(prompts), "--job", job, env=env).returncode == 0
    store, r = open_store(env["FLEET_STORE_URL"]), redis.Redis(port=server.port)
    workers = Workers(env, log_dir)
    workers.start("host-a")
    workers.start("host-b")
    return store, r, workers


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
