"""A worker dies with its launcher, so a restarted launcher never finds the GPU still held
by an orphan worker (what the worker started, it ends itself: fleet.worker.proctree).

Linux: PR_SET_PDEATHSIG delivers SIGKILL to the worker the moment its launcher dies, by
whatever means (SIGKILL, OOM kill). Elsewhere a thread watches the parent pid instead.
Chunks of the killed worker come back through their leases, as for any lost worker.
The kernel sends it when the launcher *thread* that forked the worker ends, so the
Supervisor spawns from its main thread only.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from fleet.worker.proctree import prctl

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
#: the launcher's pid, set by it in each worker's environment
LAUNCHER_PID_ENV = "FLEET_LAUNCHER_PID"
WATCH_S = 1.0


def die_with_parent(parent_pid: int) -> None:
    if not _pdeathsig():
        threading.Thread(target=_watch, args=(parent_pid,), name="fleet-parent-watch", daemon=True).start()
    # The launcher may have died before the signal was armed: then it will never come.
    if os.getppid() != parent_pid:
        log.critical("launcher %d is gone: worker exits", parent_pid)
        os._exit(1)


def _pdeathsig() -> bool:
    return prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        threading.Event().wait(WATCH_S)
    os.kill(os.getpid(), signal.SIGKILL)


def from_env() -> None:
    """Arm it when a launcher started this worker (not when run by hand)."""
    pid = os.environ.get(LAUNCHER_PID_ENV)
    if pid:
        die_with_parent(int(pid))
