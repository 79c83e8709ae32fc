"""What the launcher's process-tree reads cost through fleet's /proc readers and through psutil, side by side.

`python -m tests.proctreecost [--others 0,400,900]` (from the checkout's root): this process plays a
launcher of 8 workers (`sleep`s), while a helper holds `--others` more processes elsewhere on the
machine; for each count it prints the median time of one call of each read both ways, and what the
launcher's reap tick (its children, and a look at each) costs in CPU a second at its two ticks a
second. The figures behind fleet.worker.supervisor.proctree reading /proc itself
(docs/architecture.md, "Worker death"). It times the launcher's own functions, so it lives beside
the tests, not in `fleet bench`, which drives the product only from outside.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import typer

from fleet.worker.supervisor import proctree

WORKERS = 8
TICKS_PER_S = 2  # the launcher's poll: fleet.worker.supervisor.launcher.Launcher.run_forever


def per_call_ms(call: Callable[[], object], calls: int) -> float:
    runs = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - began) / calls * 1e3)
    return statistics.median(runs)


def psutil_look(pid: int) -> tuple[str, float, int]:
    """What proctree.stat gives, through psutil: state, start, session."""
    proc = psutil.Process(pid)
    with proc.oneshot():
        return proc.status(), proc.create_time(), os.getsid(pid)


def psutil_tag(pid: int) -> str | None:
    return psutil.Process(pid).environ().get(proctree.TREE_ENV)


def holder(count: int) -> subprocess.Popen[bytes]:
    """A process holding `count` sleeping children: processes on the machine that are not ours."""
    code = (f"import subprocess, time; ps = [subprocess.Popen(['sleep', '600']) for _ in range({count})]; "
            "time.sleep(600)")
    return subprocess.Popen([sys.executable, "-c", code])


def measure(me: int, pid: int) -> list[tuple[str, float, float]]:
    """Each read: its name, ms a call through proctree, ms through psutil."""
    return [
        ("children(launcher)", per_call_ms(lambda: proctree.children(me), 200),
         per_call_ms(lambda: psutil.Process(me).children(), 50)),
        ("look at one process", per_call_ms(lambda: proctree.stat(pid), 2000),
         per_call_ms(lambda: psutil_look(pid), 2000)),
        ("tree tag of one process", per_call_ms(lambda: proctree.tree_tag(pid), 2000),
         per_call_ms(lambda: psutil_tag(pid), 2000)),
    ]


def end(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proctree.signal_all([*proctree.descendants(proc.pid), proc.pid], signal.SIGKILL)
        proc.wait()


def main(others: str = typer.Option("0,400,900", help="counts of other processes to hold, comma-separated")) -> None:
    me = os.getpid()
    workers = [subprocess.Popen(["sleep", "600"]) for _ in range(WORKERS)]
    held: list[subprocess.Popen[bytes]] = []
    try:
        for count in (int(x) for x in others.split(",")):
            end(held)
            held = [holder(count)] if count else []
            while held and len(proctree.children(held[0].pid)) < count:
                time.sleep(0.1)
            total = len(psutil.pids())
            rows = measure(me, workers[0].pid)
            print(f"{total} processes on the machine")
            for name, ours, theirs in rows:
                print(f"  {name:24s} /proc {ours:8.4f} ms   psutil {theirs:8.4f} ms   ratio {theirs / ours:6.1f}")
            tick = rows[0][1] + WORKERS * rows[1][1], rows[0][2] + WORKERS * rows[1][2]
            print(f"  launcher reap tick: /proc {tick[0] * TICKS_PER_S:.2f} ms of CPU a second, "
                  f"psutil {tick[1] * TICKS_PER_S:.2f}")
    finally:
        end([*workers, *held])


if __name__ == "__main__":
    typer.run(main)
