"""Helpers that run fleet's real processes in tests: workers, enqueue, export, a hand-over."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

from fleet.coord.localredis import LocalRedis, free_port
from fleet.store import Store, open_store
from fleet.worker.supervisor.proctree import children, descendants, is_worker, running, signal_all, stat

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

    def start_gpus(self, host: str, gpus: str = "all", *args: str) -> subprocess.Popen[bytes]:
        return self._launch(host, ["--gpus", gpus, *args])

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

    def ready(self, host: str) -> bool:
        """A worker of `host` consumes: Celery logged it ready."""
        return self.logged(host, f"@{host} ready.")

    def logged(self, host: str, text: str) -> bool:
        """`host`'s log holds text."""
        return text in self.log(host)

    def log(self, host: str) -> str:
        """`host`'s log so far ('' before it starts)."""
        path = self.log_dir / f"{host}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def cmdline(pid: int) -> str:
    """A process's command line, words joined by spaces ('' once it is gone or a zombie)."""
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()  # a retitled process pads with NULs
    except psutil.Error:
        return ""


def processes_below(root: int, command: str) -> list[int]:
    """Running descendants of root whose command line contains command."""
    return [pid for pid in descendants(root) if command in cmdline(pid)]


def worker_pids(launcher: int) -> list[int]:
    """The worker processes a `fleet worker` launcher runs now (not the orphans it adopted)."""
    return [pid for pid in children(launcher) if is_worker(cmdline(pid).encode())]


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
    began, gone = time.monotonic(), None
    while time.monotonic() - began < timeout:
        if gone is None and not running(pid):
            gone = time.monotonic() - began
        if [p for p in worker_pids(launcher) if p != worker]:
            assert not running(pid), f"a successor worker started beside pid {pid} of the dead worker"
            assert gone is not None
            return gone
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout}s waiting for pid {pid} to go and a successor to start")


@dataclass
class LauncherKilled:
    """What `kill_launcher` saw: the engine's processes below the worker (pid, command line) before the
    SIGKILL, and seconds from it until the worker and every one of them had ended."""

    engine: list[tuple[int, str]]
    gone_s: float


def kill_launcher(launcher: subprocess.Popen[bytes], worker: int, expected: tuple[str, ...]) -> LauncherKilled:
    """`kill -9` of a `fleet worker` launcher whose one worker's engine is up, as an operator would, and a wait
    until the worker and every process below it have ended (a zombie has ended: its memory, the GPU's too, is
    freed). Checks that the engine's processes named in `expected` were there, and were gone within 30 s."""
    below = [(pid, cmdline(pid)) for pid in processes_below(worker, "")]
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    began = time.monotonic()
    left = [worker, *(pid for pid, _ in below)]
    wait_for(lambda: not any(running(pid) for pid in left), 60,
             f"the worker and its engine's processes to end: {[(p, cmdline(p)) for p in left if running(p)]}",
             interval=0.05)
    killed = LauncherKilled(below, time.monotonic() - began)
    print(f"\nengine processes {killed.engine} ended {killed.gone_s:.2f}s after the launcher's SIGKILL")
    assert all(any(name in line for _, line in killed.engine) for name in expected), killed.engine
    assert killed.gone_s < 30
    return killed


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


def shared_reference(tmp_path_factory, name: str, sim: dict[str, str], job: str,
                     records: int) -> tuple[Path, bytes]:
    """`clean_reference` made once for the whole run (tests/runshared.py): a module's tests on several
    xdist workers read the one export."""
    from tests.runshared import built_once

    tmp = built_once(tmp_path_factory, name, lambda path: clean_reference(path, sim, job, records))
    return tmp / "prompts.jsonl", (tmp / "ref.jsonl").read_bytes()


@dataclass
class Frozen:
    """What `freeze_engine` saw, its times in seconds after the SIGSTOP."""

    pid: int
    declared: float
    killed: float
    done: float
    #: `fleet status --json` just after the stall was declared (a commit clears it from there)
    status: dict
    successors: list[int]
    #: processes left stopped (state T) below the launcher once the job was done
    stopped: list[int]
    #: seconds each of the host's engines took to start, as its worker logged them
    ready_s: list[float]


@contextlib.contextmanager
def on_time() -> Iterator[None]:
    """This thread at a real-time priority (SCHED_FIFO, its children not) while it steps processes: a
    process it sends SIGCONT takes the core at once, and a normal thread waited its turn behind it. The
    test's 20 ms slice of vLLM's EngineCore and Worker then lasted as long as the kernel let them run: 2.2 s
    of run-queue wait after one SIGCONT (`/proc/self/schedstat`), 9,846 of 30,061 tokens made in it. Where
    the kernel refuses the priority (no CAP_SYS_NICE), the thread steps as before."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
    except OSError as e:
        print(f"stepping at the normal priority: {e}", file=sys.stderr)
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


def step_until(pids: list[int], done: Callable[[], bool], timeout: float, what: str, run_s: float = 0.05,
               rest: float = 0.0) -> None:
    """Let processes run only in slices of run_s, look at `done` between them while they are stopped,
    and leave them stopped (SIGSTOP) once done: they cannot run past the point the test waits for,
    however late the test's own looks come on a busy machine (`on_time` keeps the slices short). One that
    ends meanwhile is passed over; on a failure (a timeout, the test's own) they are let go, never left stopped.

    `rest` keeps them stopped after each slice for that many times the slice's measured length: a
    starved test process wakes late from its sleep (beside four CPU hogs a 20 ms slice ran 110 ms on
    average, one 4 s), so only a rest measured against the slice bounds their share of the time and
    leaves the processes they feed (a worker counting an engine's tokens) room to catch up."""
    with on_time():
        began = time.monotonic()
        signal_all(pids, signal.SIGSTOP)
        try:
            while not done():
                if time.monotonic() - began >= timeout:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                signal_all(pids, signal.SIGCONT)
                ran = time.monotonic()
                time.sleep(run_s)
                signal_all(pids, signal.SIGSTOP)
                ran = time.monotonic() - ran
                time.sleep(rest * ran)
        except BaseException:
            signal_all(pids, signal.SIGCONT)
            raise


def freeze_engine(workers: Workers, host: str, command: str, env: dict[str, str], prompts: Path, job: str,
                  chunks: int, made: int, timeout: float = 600) -> Frozen:
    """Enqueue a job, start one `fleet worker` host for it, and SIGSTOP the engine process below its
    worker (`command` in its command line) once its engine has made `made` tokens of the job, i.e.
    mid-generation; then wait for the worker to declare it stalled, the stopped process to end and
    the job's results. The engine process runs only in the slices `step_until` gives it, from the
    moment it exists, so that the job does not end before the test has looked: the tiny model finishes
    it in seconds, and beside a CPU hog the test's looks lagged a 6.7 s vLLM job to its end (one hogged
    try of two with the slices still ran to its end: docs/architecture.md, "Tests"). The count is
    the worker's own (`fleet_tokens_made` on its metrics endpoint, counted as the deltas stream) or the
    broker's, whichever shows it first."""
    from fleet.coord import keys
    from fleet.store import open_store
    from fleet.store.layout import results_prefix
    from tests.conftest import run_fleet

    store, r = open_store(env["FLEET_STORE_URL"]), redis.Redis.from_url(env["FLEET_BROKER_URL"])
    assert run_fleet("enqueue", str(prompts), "--job", job, env=env).returncode == 0
    port = free_port()
    launcher = workers.start(host, extra_env={"FLEET_METRICS_PORT": str(port)})
    wait_for(lambda: len(worker_pids(launcher.pid)) == 1, timeout, f"the worker of {host}")
    [worker] = worker_pids(launcher.pid)
    wait_for(lambda: len(processes_below(worker, command)) == 1, timeout, f"{command} below the worker")
    [pid] = processes_below(worker, command)
    step_until([pid], lambda: tokens_made_by(port) >= made or made_tokens(r, job) >= made, timeout,
               f"{made} tokens made")
    frozen = time.monotonic()
    name = f"cpu0@{host}"
    wait_for(lambda: r.hexists(keys.worker_stalls(), name), timeout, f"{name} declared stalled")
    declared = time.monotonic() - frozen

    wait_for(lambda: not running(pid), 60, f"the stopped {command} killed", interval=0.02)
    killed = time.monotonic() - frozen
    status = json.loads(run_fleet("status", "--job", job, "--json", env=env).stdout)
    wait_for(lambda: len(list(store.list(results_prefix(job)))) == chunks, timeout, f"the {chunks} results")
    done = time.monotonic() - frozen
    successors = [p for p in worker_pids(launcher.pid) if p != worker]
    stopped = [p for p in processes_below(launcher.pid, "") if (st := stat(p)) is not None and st.stopped]
    ready_s = [float(x) for x in re.findall(r"engine ready in ([0-9.]+)s", workers.logs())]
    return Frozen(pid, declared, killed, done, status, successors, stopped, ready_s)


def memory_dir(tmp: Path, name: str) -> Path:
    """A directory in memory (tmpfs) for the store of a test that times a worker's polls: a checkpoint
    flush's fsync on a disk still writing back gigabytes (a CI machine that has just built the engine
    venvs) held both chunk threads 5.3 s. Removed at exit; `tmp / name` where there is no /dev/shm."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return tmp / name
    path = Path(tempfile.mkdtemp(prefix=f"fleet-{name}-", dir=shm))
    atexit.register(shutil.rmtree, path, True)
    return path


def frozen_engine_job(tmp: Path, env: dict[str, str], host: str, command: str, records: list[dict],
                      stall_s: float, lease_s: float, launcher_kill: tuple[str, ...]) -> list[dict]:
    """A greedy job of two chunks on one `fleet worker` host whose engine process (`command`) is frozen
    mid-generation (`freeze_engine`), checked as issue #25 asks: the worker is named stalled once
    stall_s has passed (never sooner; how much later is printed: a busy machine delays it), the
    frozen process is killed (a stopped process ends only by SIGKILL) once the chunks are back,
    nothing stays stopped, the job ends on the restarted engine, no attempt is spent, every record
    comes exactly once, some continued from what the frozen engine made.
    Then, its restarted engine up and idle, the launcher is killed with SIGKILL (`kill_launcher`): the
    engine's processes named in `launcher_kill` die with it. One engine start serves both checks (an
    engine start is most of a real-engine test's time on 2 cores).
    Returns the exported rows, in input order, for the caller to compare with its bare engine."""
    from fleet.coord import keys
    from tests.conftest import run_fleet

    env = {**env, "FLEET_STORE_URL": str(memory_dir(tmp, "s")), "FLEET_STALL_S": str(stall_s),
           "FLEET_LEASE_TTL_S": str(lease_s),
           "FLEET_CHECKPOINT_INTERVAL_S": "1", "FLEET_GRACE_S": "0.5", "FLEET_CHUNK_SIZE": str(-(-len(records) // 2)),
           "FLEET_RETURN_OUTPUT_IDS": "true", "FLEET_ASSIST": "false"}
    # A delta per token: the watchdog's clock ticks on deltas, and 16 steps of SGLang on 2 loaded cores
    # (~1-3 steps/s) would outlast this short stall_s on a healthy engine
    env[f"FLEET_{env['FLEET_ENGINE'].upper()}__STREAM_INTERVAL"] = "1"
    prompts = tmp / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in records))
    workers = Workers(env, tmp / "logs")
    try:
        frozen = freeze_engine(workers, host, command, env, prompts, "fz", chunks=2, made=10 * len(records))
        [launcher] = workers.procs
        [successor] = worker_pids(launcher.pid)
        kill_launcher(launcher, successor, launcher_kill)
    finally:
        workers.stop(timeout=120)
    print(f"\nfrozen {command}: stall declared {frozen.declared:.1f}s after SIGSTOP (stall_s {stall_s}), "
          f"killed at {frozen.killed:.1f}s, the job done at {frozen.done:.1f}s on the restarted engine "
          f"(its start {frozen.ready_s[-1]:.1f}s)")
    assert [w["worker"] for w in frozen.status["stalled_workers"]] == [f"cpu0@{host}"]
    # stall_s after its last token (an engine as slow as SGLang's on 2 loaded cores, ~3 steps/s, made it
    # up to a step before the SIGSTOP), never sooner: how much later (a check of the watchdog, stall_s / 4,
    # and a Redis write on an idle machine) is printed above, not asserted: a busy machine delays it.
    assert frozen.status["stalled_workers"][0]["stalled_s"] >= stall_s and stall_s - 2 <= frozen.declared
    assert "declaring it hung" in workers.logs() and frozen.successors and not frozen.stopped
    assert not running(frozen.pid)
    # killed once declared, and the job done after that on the restarted engine (the waits bound both)
    assert frozen.declared <= frozen.killed <= frozen.done and len(frozen.ready_s) == 2
    assert sum(int(v) for v in redis.Redis.from_url(env["FLEET_BROKER_URL"]).hvals(keys.attempts("fz"))) == 0
    out = tmp / "o.jsonl"
    export = run_fleet("export", "--job", "fz", "--out", str(out), env=env)
    assert export.returncode == 0, export.stderr[-2000:]
    rows = read_jsonl(out)
    assert [row["id"] for row in rows] == [x["id"] for x in records]
    assert any(row["continued_at"] for row in rows), f"no record was running when {command} froze"
    return rows


#: a hand-over of two chunks: tokens made published every 0.1 s (not 1 s), so a test
#: sees them while records run; no grace, which would let a stopped record run on to its end
HANDOVER_ENV = {"FLEET_RETURN_OUTPUT_IDS": "true", "FLEET_CHUNK_SIZE": "2", "FLEET_SLOTS": "2",
                "FLEET_CHECKPOINT_INTERVAL_S": "1", "FLEET_ASSIST": "false", "FLEET_ASSIST_POLL_S": "0.2",
                "FLEET_GRACE_S": "0"}


def made_tokens(r: redis.Redis, job: str) -> int:
    """The job's tokens made as its workers' heartbeats publish them to the broker while they stream."""
    from fleet.coord import keys

    return sum(int(v) for v in r.hvals(keys.made(job)))


def tokens_made_by(port: int) -> float:
    """A worker's `fleet_tokens_made` from its metrics endpoint; 0 until it serves them."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except requests.RequestException:
        return 0.0
    return sum(s.value for family in text_string_to_metric_families(text) if family.name == "fleet_tokens_made"
               for s in family.samples if s.name == "fleet_tokens_made_total")


@dataclass
class HandOver:
    """What `hand_over` saw: the exported rows, seconds from SIGTERM to host A's exit, the tokens
    host A made, and the result headers' tokens made less completion tokens."""

    rows: list[dict]
    exit_s: float
    made_by_a: int
    made_twice: int
    #: samples started again from token 0 (their sampling cannot cross a seam on the engine), and the
    #: checkpointed tokens they made again (from host B's log)
    restarted: int = 0
    restarted_tokens: int = 0


def engine_below(command: str) -> Callable[[subprocess.Popen[bytes]], list[int]]:
    """For `hand_over`: the engine process below a launcher's one worker (`command` in its command
    line), with whatever it runs below itself; none until it exists."""

    def find(launcher: subprocess.Popen[bytes]) -> list[int]:
        workers = worker_pids(launcher.pid)
        return engine_of(workers[0], command) if len(workers) == 1 else []

    return find


def engine_of(root: int, command: str) -> list[int]:
    """The one process below root whose command line holds command, and its own descendants; none
    until it exists."""
    found = processes_below(root, command)
    return [found[0], *descendants(found[0])] if len(found) == 1 else []


def handed_back(logs: str, job: str) -> int:
    """How many of the job's chunks the workers' logs say were handed back."""
    return len(re.findall(rf"chunk {re.escape(job)}/\d+ handed back: ", logs))


def hand_over(tmp: Path, env: dict[str, str], redis_port: int, records: list[dict], job: str = "cont",
              timeout: float = 900, *, engine: Callable[[subprocess.Popen[bytes]], list[int]]) -> HandOver:
    """Records in two chunks: host A starts them, gets SIGTERM once its engine made `4 x 48` tokens,
    and host B finishes the job; checks what every hand-over must show, on any engine. Host A's count is
    read from its own metrics (`fleet_tokens_made`, counted as the deltas stream, scraped every 0.05 s),
    not from the broker, where a heartbeat carries it only every few seconds.

    `engine` finds the processes that make host A's tokens (an embedded engine's, `engine_below`, or a
    server's, `engine_of`): they run only in `step_until`'s slices from the moment they exist until the
    count is reached, and after the SIGTERM as `hand_over`'s last paragraphs say.
    vLLM's CPU build makes 4 x 1,500 tokens in 2 s, and on 2 busy cores a scrape of the worker came 7 s late
    (CI: 12 of 16 records had run to their end, and the one that must restart with them), so a test that only
    looks cannot hold the records.

    The server engine's engine (a server's, which host A's exit does not need) stays stopped until host A has exited:
    host A then hands back exactly what it had when told to stop. Let go at the SIGTERM, the server ran every
    record to its end before host A, in a scheduler group of its own, was let on the CPU to close its streams
    (CI: 0 of 24 records continued, docs/architecture.md, "Tests"). An embedded engine must go on, for its
    worker's shutdown waits on it, but in thin slices until host A logged both chunks handed back.

    Thin slices (a fifth of the time, `rest=4`) from the moment host A's engine is ready: in CI the embedded
    vLLM made all 30,061 tokens before host A stopped (0 of 24 records continued), and beside four CPU hogs the
    test counted 30,061 at its first look after the engine was let run in 50 ms slices with no rest."""
    from fleet.store import open_store
    from fleet.store.layout import results_prefix
    from fleet.store.results import read_result
    from tests.conftest import run_fleet

    assert len(records) % 2 == 0
    prompts = tmp / "handover.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = {**env, **HANDOVER_ENV, "FLEET_CHUNK_SIZE": str(len(records) // 2),
           "FLEET_STORE_URL": str(memory_dir(tmp, "store"))}
    enqueue = run_fleet("enqueue", str(prompts), "--job", job, env=env)
    assert enqueue.returncode == 0, enqueue.stderr[-3000:]
    workers = Workers(env, tmp / "logs")
    store, r = open_store(env["FLEET_STORE_URL"]), redis.Redis(port=redis_port)

    port = free_port()

    counted = [0.0]  # host A's count at the look that let the SIGTERM go

    def generating() -> bool:
        # the engine may run one chunk's records first and queue the other's: any 4 x 48 tokens will do
        counted[0] = tokens_made_by(port)
        return counted[0] >= 4 * 48

    a = workers.start("hostA", extra_env={"FLEET_METRICS_PORT": str(port)})
    try:
        wait_for(lambda: bool(engine(a)), timeout, "host A's engine", interval=0.02)
        stepped = engine(a)
        assert stepped, "host A's engine went away"
        # full slices while the engine starts (a model's load, a KV profile), thin ones once it is ready
        step_until(stepped, lambda: workers.logged("hostA", "admission gate "), timeout, "host A's engine ready")
        stepped = engine(a)  # with what the engine started below itself meanwhile (vLLM's VLLM::Worker)
        step_until(stepped, generating, timeout, "both chunks generating", run_s=0.02, rest=4)
        began = time.monotonic()
        a.send_signal(signal.SIGTERM)
        if env.get("FLEET_ENGINE") != "server":
            step_until(stepped, lambda: a.poll() is not None or handed_back(workers.log("hostA"), job) >= 2, 120,
                       "host A's hand-back", run_s=0.02, rest=4)
            signal_all(stepped, signal.SIGCONT)
        try:
            a.wait(timeout=120)
        finally:
            signal_all(stepped, signal.SIGCONT)
        exit_s = time.monotonic() - began
        made_by_a = made_tokens(r, job)
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
    again = [int(n) for n in re.findall(r"starts again from token 0, not (\d+)", workers.logs())]
    done = HandOver(rows, exit_s, made_by_a, sum(st.tokens_made - st.completion_tokens for st in stats if st),
                    sum(st.samples_restarted for st in stats if st), sum(again))
    continued = [row for row in rows if row.get("continued_at")]
    at = {row["id"]: row["continued_at"] for row in continued}
    print(f"\nSIGTERM at {counted[0]:.0f} tokens counted; to exit of host A: {exit_s:.1f}s; host A made "
          f"{made_by_a} tokens; {len(continued)} of {len(rows)} records continued at {at}; tokens made twice "
          f"{done.made_twice}, of them {done.restarted_tokens} by {done.restarted} sample(s) started again")
    # every record passes the audit against its own ids (none continued past its own end)
    audited = run_fleet("verify", "--job", job, env=env)
    assert audited.returncode == 0, audited.stderr[-3000:]
    # the records say they were continued, where the first run's ids end (at their end: a record whose
    # checkpointed ids had ended it, kept as made)
    assert continued, "no record was stopped mid-generation"
    assert all(0 < at < row["completion_tokens"] or (at == row["completion_tokens"] and row["finish_reason"] in
                                                     ("stop", "length")) for row in continued
               for at in row["continued_at"])  # fmt: skip
    # a SIGTERM flushes before the hand-over: (almost) nothing host A made was made again, but for samples
    # that could not be continued
    assert all(st is not None for st in stats) and sum(st.tokens_continued for st in stats if st) > 0
    assert len(again) == done.restarted and 0 <= done.made_twice - done.restarted_tokens <= 16 * len(rows)
    assert exit_s < 60
    return done


def loop_job_lines() -> list[dict]:
    """A job for the loop model (`fleet tiny-model --loop`): 4 greedy records (they loop) and 4
    sampled ones under the model's own sampling (they do not)."""
    lines = [{"id": f"g{i}", "messages": [{"role": "user", "content": f"Loop {i}?"}], "sampling": {"temperature": 0}}
             for i in range(4)]  # fmt: skip
    return lines + [{"id": f"s{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(4)]


def check_loops_stopped(rows: dict[str, dict], records_repetition: int) -> None:
    """What the repetition stop must show on `loop_job_lines`' export, on any engine: every greedy row
    ended at the first delta past the threshold, marked as a loop of period 3, keeping what the engine
    made; no sampled row was marked; the job counted the loops."""
    from fleet.settings.repetition import MIN_TOKENS

    for i in range(4):
        g = rows[f"g{i}"]
        made = g["completion_tokens"]
        assert (g["finish_reason"], g["repetition_period"]) == ("repetition", 3), (g["finish_reason"], made)
        assert MIN_TOKENS <= made <= MIN_TOKENS + 64 and len(g["output_ids"]) == made
    assert all(rows[f"s{i}"]["finish_reason"] in ("stop", "length") for i in range(4)), rows
    assert records_repetition == 4
