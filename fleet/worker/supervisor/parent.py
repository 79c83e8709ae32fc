"""A worker dies with its launcher, and an engine's processes with the process that started them,
so neither a restarted launcher nor anyone else finds a GPU still held by an orphan.

Linux: PR_SET_PDEATHSIG delivers SIGKILL to the worker the moment its launcher dies, by
whatever means (SIGKILL, OOM kill). Elsewhere a thread watches the parent pid instead.
Chunks of the killed worker come back through their leases, as for any lost worker.
The kernel sends it when the launcher *thread* that forked the worker ends, so the
Supervisor spawns from its main thread only.

An engine's processes are the worker's descendants: vLLM's EngineCore and its worker (forked by
multiprocessing, or spawned where CUDA is initialised first), SGLang's scheduler and detokenizer
(spawned). vLLM arms no parent-death signal, so a worker killed outright, or a launcher killed
with its workers, left them running as orphans of init. The worker therefore arms the same signal
in every Python process started below it, the kernel's own means again (docs/architecture.md,
"Recovery"): an at-fork hook (`os.register_at_fork`, which forked children inherit with the
interpreter) and, for spawned ones, the worker's main module, which multiprocessing's spawn imports
in every child as `__mp_main__` before anything else runs (`fleet.worker.main`). Each child checks
that the process that started it is still its parent once the signal is armed, and exits if not:
a parent that died in between would never send it. Chosen over a PID namespace per worker (the
kernel kills a namespace with its first process, but creating one needs CAP_SYS_ADMIN, which the
containers GPUs are rented in do not give) and over a cgroup's cgroup.kill (someone must write it,
and after a SIGKILL of the launcher no one is left to). Not covered: a program exec'd without
Python's hooks (`subprocess`), or a double fork whose middle process exits on purpose; the next
launcher on the host still ends whatever carries a tag of a launcher that is gone
(fleet.worker.supervisor.proctree).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from fleet.worker.supervisor.proctree import prctl

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
#: the launcher's pid, set by it in each worker's environment
LAUNCHER_PID_ENV = "FLEET_LAUNCHER_PID"
#: the pid of the process whose spawned children a process is: each process below a worker sets its own
PARENT_PID_ENV = "FLEET_PARENT_PID"
WATCH_S = 1.0
#: the pid of the process that last forked (its children compare their parent with it)
_forker = 0


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


def engine_processes_die_with_their_parent() -> None:
    """In the worker (and in every process below it): what this process forks or spawns gets SIGKILL
    when this process dies."""
    os.environ[PARENT_PID_ENV] = str(os.getpid())
    os.register_at_fork(before=_note_forker, after_in_child=_arm_forked)


def _note_forker() -> None:
    global _forker
    _forker = os.getpid()


def _arm_forked() -> None:
    _arm(_forker)
    os.environ[PARENT_PID_ENV] = str(os.getpid())  # for what it spawns in turn


def spawned_below_a_worker() -> None:
    """In a child multiprocessing spawned below a worker (it imports the worker's main module as
    `__mp_main__`): arm the signal against the process that spawned it, and pass it on."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    _arm(int(parent))
    engine_processes_die_with_their_parent()


def _arm(parent: int) -> None:
    if _pdeathsig() and os.getppid() != parent:  # it died before the signal was armed: it never comes
        os._exit(1)
