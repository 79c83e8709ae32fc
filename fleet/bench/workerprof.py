"""Where a worker process's CPU goes: a sampling profiler weighted by each thread's CPU time.

The worker is a real `fleet worker`'s, profiled from outside the product as py-spy would: the
benchmark puts a folder with a `sitecustomize` (`hook`) first on the workers' PYTHONPATH and names
the report file in FLEET_BENCH_WORKERPROF, and Python's own start-up runs `start_from_env` in
each process: in the worker process (its command line, as the launcher starts it) it starts a
sampler thread beside the worker. Every `INTERVAL_S` the sampler reads
each Python thread's own CPU clock and charges what it used since the last look to that
thread's current stack, so a thread blocked in select() costs nothing while the event loop,
the Celery consumer and the chunk threads are charged for what they ran. cProfile would see
one thread only and slow every call; py-spy is not installed offline. The engine loop's thread,
where every stream delta is read, also runs under cProfile for its functions (a sample
charges a thread's CPU to where it is found, often back in select(), so the sampler says
which thread, cProfile what in the loop). cProfile's clock is wall time: the loop's waiting
is its epoll poll, left out; its per-call cost inflates code made of many tiny calls (the
sim's per-token random draws), so its shares rank places rather than weigh them. It counts only while
the file OUT.on exists (the benchmark creates it once the worker is ready and removes it at
the job's last result), so start-up imports and shutdown stay out. The sampler's own CPU is
reported apart. When the window closes it writes OUT.json: CPU by thread, by function (self and
inclusive), the loop's cProfile, and the process total over the same window.
"""

from __future__ import annotations

import cProfile
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

INTERVAL_S = 0.01
#: names the report file; set, a worker process started with `hook` on its PYTHONPATH profiles itself
OUT_ENV = "FLEET_BENCH_WORKERPROF"
#: how a worker process shows on its command line (the launcher starts each so)
WORKER_COMMAND = b"fleet.worker.main"
LOOP_THREAD = "fleet-engine-loop"
TOP = 60


def where(frame: FrameType) -> str:
    """`package/module.py:function` of a frame."""
    return f"{short(frame.f_code.co_filename)}:{frame.f_code.co_name}"


def short(path: str) -> str:
    """A source path short enough to read: after site-packages or python3.x/, or from fleet/."""
    for marker in ("site-packages/", "/python3.11/", "/python3.12/", "/python3.13/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = "fleet/" + path.split("/fleet/", 1)[1] if "/fleet/" in path else path
    return path


def thread_group(name: str) -> str:
    """Numbered threads of one pool are one group (ThreadPoolExecutor-0_3 -> ThreadPoolExecutor-N_N)."""
    return re.sub(r"\d+", "N", name)


class Sampler:
    def __init__(self, gate: Path, interval_s: float = INTERVAL_S, out: Path | None = None):
        """Counts while `gate` exists; given `out`, writes its report there when the window closes."""
        self.gate, self.interval_s, self.out = gate, interval_s, out
        self.self_s: Counter[str] = Counter()
        self.inclusive_s: Counter[str] = Counter()
        self.threads_s: Counter[str] = Counter()
        self.last: dict[int, float] = {}
        self.samples = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fleet-bench-sampler", daemon=True)
        self.window: list[tuple[float, float, float]] = []  # (process CPU, wall, sampler CPU) at on, off
        self.loop_prof = cProfile.Profile()  # its C clock: a Python timer would cost more than the code
        self.loop: Any = None

    def _mark(self) -> None:
        own = time.clock_gettime(time.pthread_getcpuclockid(self.thread.ident or threading.get_ident()))
        self.window.append((time.process_time(), time.monotonic(), own))

    def _run(self) -> None:
        tick = 0
        while not self.stopped.wait(self.interval_s):
            tick += 1
            if tick % 20 == 0 or not self.window:
                on = self.gate.exists()
                if on and not self.window:
                    self._mark()
                    self._sample(record=False)
                    self.loop = engine_loop()
                    if self.loop is not None:
                        self.loop.call_soon_threadsafe(self.loop_prof.enable)
                elif not on and self.window:
                    self._close()
                    if self.out is not None:
                        tmp = self.out.with_suffix(".tmp")
                        tmp.write_text(json.dumps(self.report(), indent=1))
                        tmp.replace(self.out)  # whole or absent: the benchmark waits for it
                    return
            if self.window:
                self._sample()
        if len(self.window) == 1:  # stopped while counting: the window ends now
            self._close()

    def _close(self) -> None:
        self._mark()
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop_prof.disable)

    def _sample(self, record: bool = True) -> None:
        me = threading.get_ident()
        if record:
            self.samples += 1
        frames = sys._current_frames()
        for t in threading.enumerate():
            if t.ident is None or t.ident == me:
                continue
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):
                continue
            used = cpu - self.last.get(t.ident, cpu)
            self.last[t.ident] = cpu
            frame = frames.get(t.ident)
            if used <= 0 or frame is None or not record:
                continue
            self.threads_s[thread_group(t.name)] += used
            self.self_s[where(frame)] += used
            seen = set()
            while frame is not None:
                seen.add(where(frame))
                frame = frame.f_back
            for name in seen:
                self.inclusive_s[name] += used

    def report(self) -> dict[str, Any]:
        self.stopped.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(1)
        (cpu0, wall0, own0), (cpu1, wall1, own1) = (self.window + [(0.0, 0.0, 0.0)] * 2)[:2]
        return {
            "process_cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "sampler_cpu_s": own1 - own0,
            "attributed_cpu_s": sum(self.threads_s.values()), "samples": self.samples, "interval_s": self.interval_s,
            "threads_s": dict(self.threads_s.most_common()),
            "self_s": dict(self.self_s.most_common(TOP)),
            "inclusive_s": dict(self.inclusive_s.most_common(TOP)),
            "loop_cprofile": loop_stats(self.loop_prof) if self.loop is not None else None,
        }  # fmt: skip


def engine_loop() -> Any:
    """The worker's engine loop, found on its thread's stack (run_forever's `self`)."""
    frames = sys._current_frames()
    for t in threading.enumerate():
        frame = frames.get(t.ident or -1) if t.name == LOOP_THREAD else None
        while frame is not None:
            if frame.f_code.co_name == "run_forever" and "self" in frame.f_locals:
                return frame.f_locals["self"]
            frame = frame.f_back
    return None


def loop_stats(prof: cProfile.Profile) -> dict[str, Any]:
    """The loop thread's functions by own time and by cumulative time (seconds, calls)."""
    import pstats

    time.sleep(0.2)  # the disable callback runs on the loop
    try:
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    except TypeError:  # nothing was recorded
        return {}
    rows = [(f"{short(file)}:{func}", calls, tt, ct) for (file, _, func), (_, calls, tt, ct, _) in stats.items()
            if "epoll" not in func]  # the loop waiting for work  # fmt: skip
    total = sum(r[2] for r in rows)

    def top(key: int) -> dict[str, list[float]]:
        return {name: [round(tt, 4), round(ct, 4), calls]
                for name, calls, tt, ct in sorted(rows, key=lambda r: -r[key])[:TOP]}  # fmt: skip

    files: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    for name, _, tt, _ in rows:
        files[name.rsplit(":", 1)[0] if not name.startswith("~") else "builtins (C calls)"] += tt
        areas[area(name)] += tt
    return {"total_s": total, "by_self_s": top(2), "by_cumulative_s": top(3), "columns": ["self_s", "cum_s", "calls"],
            "by_file_self_s": {k: round(v, 4) for k, v in files.most_common(TOP)},
            "by_area_self_s": {k: round(v, 4) for k, v in areas.most_common()}}  # fmt: skip


#: where a function's own time goes, by the first match on its `path:function` name
AREAS = (
    ("the sim engine (its ids, text, random draws)", ("fleet/engines/sim/", "random.py:", "_random.Random")),
    ("prompt rendering (the chat template; a bare engine renders too)",
     ("fleet/model/rendering.py", "jinja2/", "transformers/utils/chat_template", "tokenization_utils")),
    ("the hf engine (batching, transformers, torch)", ("fleet/engines/hf/", "transformers/", "torch/")),
    ("fleet's worker (stream reading, checkpoints, commit)", ("fleet/",)),
    ("asyncio (the loop, tasks, queues)", ("asyncio/",)),
    ("Celery, kombu, redis-py", ("celery/", "kombu/", "redis/", "billiard/")),
    ("zstd and json", ("zstandard", "json/", "_json")),
)


def area(name: str) -> str:
    for label, marks in AREAS:
        if any(m in name for m in marks):
            return label
    return "builtins (C calls)" if name.startswith("~") else "other (stdlib)"


def start_from_env() -> Sampler | None:
    """In a worker process whose environment names a report file (OUT_ENV), a sampler counting
    while the file's `.on` twin exists; in any other process, nothing."""
    out = os.environ.get(OUT_ENV)
    try:
        cmdline = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return None
    if not out or WORKER_COMMAND not in cmdline:
        return None
    sampler = Sampler(Path(out).with_suffix(".on"), out=Path(out))
    sampler.thread.start()
    return sampler


def hook(folder: Path) -> Path:
    """A folder holding the `sitecustomize` that starts the sampler: first on a worker's
    PYTHONPATH, with OUT_ENV set, it profiles that worker."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        '"""Written by fleet.bench.workerprof: Python runs it at start-up."""\n'
        "import os\n\n"
        f"if os.environ.get({OUT_ENV!r}):\n"
        "    from fleet.bench.workerprof import start_from_env\n\n"
        "    start_from_env()\n"
    )
    return folder
