"""Real fleet processes for benchmarks: a broker, `fleet worker`, `fleet enqueue`, moto S3.

The suite drives fleet only through its command line and reads only the store, so a
change inside the worker shows up in the figures without touching the benchmarks. Child
processes get a clean environment: no FLEET_* from the caller's shell (a production
broker URL must never receive benchmark chunks) and no fleet.toml from the cwd.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from fleet.bench.sharedcore import Pen
from fleet.coord import figures
from fleet.coord.localredis import free_port
from fleet.errors import FleetError

READY_TIMEOUT_S = 90.0
#: where this fleet was imported from: the processes a benchmark starts (in their own cwd) import
#: the same code, never an engine venv's installed copy of an older checkout
FLEET_ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 30.0


def is_worker(cmdline: str) -> bool:
    """A worker process, by its command line as `ps` shows it: the launcher starts each worker as
    `python -m fleet.worker.main`, which Celery retitles `[celeryd: ...]` where setproctitle is
    installed (vLLM's venv)."""
    return "fleet.worker.main" in cmdline or cmdline.startswith("[celeryd: ")


def clean_env(workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without FLEET_*, pointed at a config file that does not exist, and
    importing the parent's fleet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_CONFIG"] = str(workdir / "no-fleet.toml")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = pythonpath_first(FLEET_ROOT, env.get("PYTHONPATH", ""))
    env.update(extra or {})
    return env


def pythonpath_first(root: Path, pythonpath: str) -> str:
    """`pythonpath` with `root` first and every entry absolute: a child started in another cwd
    imports the same code (a relative "." would find an engine venv's installed copy)."""
    paths = [str(root), *(os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(paths))


def fleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleet", *args]


def run_fleet(args: list[str], env: dict[str, str], timeout_s: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one `fleet ...` command to completion; FleetError with its stderr when it fails."""
    done = subprocess.run(fleet_argv(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise FleetError(f"`fleet {' '.join(args)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if predicate():
            return time.monotonic() - began
        time.sleep(interval_s)
    raise FleetError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def write_prompts(path: Path, n: int) -> Path:
    """n chat records of similar length; written once and reused by every run of that size."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")  # both sides of a pair may write it
    line = '{"id":"r%07d","messages":[{"role":"user","content":"Question %d: explain one idea in detail."}]}\n'
    with open(tmp, "w") as f:
        for start in range(0, n, 10_000):
            f.write("".join(line % (i, i) for i in range(start, min(n, start + 10_000))))
    tmp.replace(path)
    return path


def write_id_prompts(path: Path, n: int, model: Path | str) -> Path:
    """write_prompts' n records rendered once by fleet's own template code into `input_ids`
    records, the reference job's form (prompts tokenized ahead, in the store): the engine
    benchmarks feed both sides these ids, so neither side's figures hold chat rendering, which is
    the job's cost, not fleet's nor the engine's."""
    if path.exists():
        return path
    from fleet.model.rendering import load_tokenizer, render_ids

    tok = load_tokenizer(str(model))
    chat = write_prompts(path.with_name(f"chat-{path.name}"), n)
    lines = [json.dumps({"id": r.record_id, "input_ids": render_ids(tok, r)}) for r in read_requests(chat, 1)]
    tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def read_requests(path: Path | str, max_tokens: int, enable_thinking: bool = True) -> list[Any]:
    """write_prompts' (or write_id_prompts') records as the greedy GenRequests a worker makes of them,
    for the bare sides."""
    from fleet.records import GenRequest, Message, Sampling, derive_seed

    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    return [GenRequest(record_id=r["id"], chunk=0, sample=0, enable_thinking=enable_thinking,
                       sampling=Sampling(temperature=0.0, max_tokens=max_tokens, seed=derive_seed(0, r["id"], 0)),
                       messages=[Message(**m) for m in r["messages"]] if "messages" in r else None,
                       input_ids=r.get("input_ids"))
            for r in records]  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far, its threads included and its children
    (an engine's scheduler processes) not."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def below(pid: int) -> dict[int, str]:
    """Every process under pid, by pid, with its command line (arguments joined by spaces; a
    process that rewrote its title, as redis-server does, as it titled itself)."""
    found = {}
    for proc in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found[proc.pid] = " ".join(proc.cmdline())
    return found


#: redis-server's process title: its path, then host:port
REDIS_TITLE = re.compile(r"\S*redis-server \S*:(\d+)")


@dataclass
class Watched:
    """What run_fleet_watching_workers sampled, every 0.2 s: (epoch time, value) pairs."""

    #: the worker processes' own CPU seconds (their children, an engine's processes, not counted)
    cpu: list[tuple[float, float]] = field(default_factory=list)
    #: output tokens the job's chunks have made so far, as the workers publish them while they
    #: stream (fleet.coord.figures.made; about once a second per chunk)
    made: list[tuple[float, float]] = field(default_factory=list)


def run_fleet_watching_workers(args: list[str], env: dict[str, str], timeout_s: float, cwd: Path,
                               pen: Pen | None = None, job: str | None = None) -> Watched:  # fmt: skip
    """Run one `fleet run ...` command (as run_fleet) while sampling its worker processes' own
    CPU and, given the job, the tokens its chunks have made (read from the broker the command
    started). With a pen (fleet.bench.sharedcore), each worker and every process under it is
    moved into it at the first look that finds it (every 0.2 s, before an engine is up)."""
    watched = Watched()
    adopted: set[int] = set()
    broker: redis.Redis | None = None
    with open(cwd / "fleet-cmd.err", "w+b") as err:
        proc = subprocess.Popen(fleet_argv(*args), env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        began = time.monotonic()
        while proc.poll() is None:
            if time.monotonic() - began > timeout_s:
                proc.kill()
                proc.wait()
                raise FleetError(f"`fleet {' '.join(args)}` ran past {timeout_s:.0f}s")
            with contextlib.suppress(psutil.Error, redis.RedisError):
                tree = below(proc.pid)
                workers = [p for p, cmdline in tree.items() if is_worker(cmdline)]
                if pen is not None:
                    for p in {*workers, *(c for w in workers for c in below(w))} - adopted:
                        pen.adopt(p)
                        adopted.add(p)
                now = time.time()
                watched.cpu.append((now, sum(cpu_seconds(p) for p in workers)))
                if job is not None:
                    broker = broker or broker_of(tree.values())
                    if broker is not None:
                        watched.made.append((now, sum(figures.made(broker, job).values())))
            time.sleep(0.2)
        if proc.returncode != 0:
            err.seek(0)
            raise FleetError(f"`fleet {' '.join(args)}` exited {proc.returncode}:\n{err.read().decode()[-3000:]}")
    return watched


def broker_of(cmdlines: Iterable[str]) -> redis.Redis | None:
    """A client of the redis-server a `fleet run` started, if it runs yet: found by its port, which
    redis-server puts in its own process title ("redis-server 127.0.0.1:PORT")."""
    for cmdline in cmdlines:
        found = REDIS_TITLE.match(cmdline)
        if found:
            return redis.Redis(host="127.0.0.1", port=int(found[1]), socket_connect_timeout=0.5, socket_timeout=0.5)
    return None


class WorkerHost:
    """One `fleet worker --workers N` launcher (N supervised worker processes), as one host."""

    def __init__(self, env: dict[str, str], workers: int, log_path: Path, host: str = "bench"):
        self.env, self.workers, self.log_path, self.host = env, workers, log_path, host
        self.proc: subprocess.Popen[bytes] | None = None

    def worker_pids(self) -> list[int]:
        """The worker processes (whose children, if any, are their engines)."""
        assert self.proc is not None
        return sorted(p.pid for p in psutil.Process(self.proc.pid).children())

    def start(self) -> WorkerHost:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = fleet_argv("worker", "--workers", str(self.workers), "--host-name", self.host)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=self.log_path.parent,
            )
        return self

    def ready_count(self) -> int:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return len(set(re.findall(rf"(cpu\d+@{re.escape(self.host)}) ready\.", text)))

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Seconds until every worker's consumer is up, so no worker starts the job late."""

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise FleetError(f"worker launcher exited {self.proc.returncode}; see {self.log_path}")
            return self.ready_count() >= self.workers

        return wait_until(ready, timeout_s, f"{self.workers} worker(s) ready (log {self.log_path})", 0.2)

    def stop(self) -> None:
        """SIGTERM the launcher (it stops its workers gracefully); kill the group if stuck."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class MotoS3:
    """moto's S3 server as a child process on loopback, for the S3-store measurements."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> MotoS3:
        import requests

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

        def up() -> bool:
            try:
                requests.get(self.url, timeout=0.5)
                return True
            except requests.RequestException:
                return False

        wait_until(up, 30, "moto S3 server")
        return self

    def bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3", endpoint_url=self.url, aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_measured(args: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> dict[str, float]:
    """Run `fleet ARGS` to completion: its wall seconds, CPU seconds and own peak RSS."""
    report = cwd / f"peakrss-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", "fleet.bench.peakrss", str(report), *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise FleetError(f"`fleet {' '.join(args)}` ran past {timeout_s:.0f}s") from None
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise FleetError(f"`fleet {' '.join(args)}` exited {proc.returncode}:\n{err.decode(errors='replace')[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # cumulative over every reaped child
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    peak = json.loads(report.read_text())["peak_rss_mb"]
    return {"wall_s": wall, "peak_rss_mb": peak, "cpu_s": cpu}


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """Set variables in this process for a while: boto3 here must reach the same moto."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
