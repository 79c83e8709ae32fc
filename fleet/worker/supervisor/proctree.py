"""A worker's process tree: what a worker and its engine started, found and ended.

vLLM's EngineCore arms no PR_SET_PDEATHSIG of its own (SGLang's processes do); fleet.worker.supervisor.parent
arms one in every Python process below a worker, and this module ends what that misses (a program
a subprocess exec'd, a double fork), which would hold the GPU's memory while the launcher starts a
successor beside it. So the launcher makes itself a child subreaper (orphans of a dead worker
are reparented to it, not to init, and it reaps them), starts each worker in a session of its
own and tags its environment (`TREE_ENV`); every process the worker starts inherits the tag
(multiprocessing's spawn, setsid and double forks keep the environment), which finds them wherever
they were reparented, even when they left the worker's session. A worker that must end its own
engine (a hung one) calls `kill_tree(descendants(os.getpid()))`. Read from Linux /proc, not psutil
(docs/architecture.md, "Worker death", has the figures): elsewhere nothing is found, and a dead
worker's engine may outlive it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
#: set by the launcher in each worker's environment, one value per worker process it starts
TREE_ENV = "FLEET_WORKER_TREE"
#: seconds a SIGTERMed process gets to exit before SIGKILL: vLLM's own process manager's default
#: (vllm.v1.utils.shutdown); an orphaned EngineCore, its client gone, does not exit within it
GRACE_S = 5.0
#: seconds a process that ignores SIGTERM gets to exit once the others are killed
DEAF_WAIT_S = 1.0
#: seconds to wait for SIGKILLed processes (a process in uninterruptible sleep may take long)
KILL_WAIT_S = 10.0
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat fleet reads: who a process is and whether it still runs."""

    pid: int
    state: str
    session: int
    #: clock ticks after boot: a pid reused by another process has another start
    start: int

    @property
    def running(self) -> bool:
        # A zombie has freed its memory, the GPU's too (its files are closed at exit); only its parent's
        # wait is missing.
        return self.state not in ("Z", "X", "x")

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (T) or a tracer (t): it acts on no signal but SIGKILL until continued."""
        return self.state in ("T", "t")


def stat(pid: int) -> Stat | None:
    """None when no such process exists (or this is not Linux)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except (OSError, ValueError):
        return None
    # The command name may hold spaces and parentheses: the fields after it follow the last ')'.
    rest = data[data.rindex(b")") + 2:].split()
    return Stat(pid=pid, state=rest[0].decode(), session=int(rest[3]), start=int(rest[19]))


def running(pid: int) -> bool:
    """pid exists and has not exited (a zombie has)."""
    st = stat(pid)
    return st is not None and st.running


def children(pid: int) -> list[int]:
    """Direct children of pid, zombies included, from the kernel's list of each of its threads (each
    thread forks its own): only pid's own files are read."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """Every process below pid, parents before their children, walked down the kernel's children
    lists (only the subtree is read). A snapshot: what forks meanwhile is missed, so a caller that
    must end a tree looks again after killing it."""
    found: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        for child in children(todo.pop(0)):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def is_worker(cmdline: bytes) -> bool:
    """A worker process by its raw command line: as the launcher starts it (`-m fleet.worker.main`),
    or as Celery retitles it once it runs, where setproctitle is installed (vLLM's venv)."""
    return b"fleet.worker.main" in cmdline or cmdline.startswith(b"[celeryd: ")


def all_pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def tree_tag(pid: int) -> str | None:
    """The value of TREE_ENV that pid was started with; None when unset or unreadable (a zombie's
    environment is gone, another user's is closed)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{TREE_ENV}=".encode()
    for entry in env.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def scope_of(data_dir: Path) -> str:
    """The launchers whose orphans one another end: those of one data directory (a host's fleet). Two
    fleets on one machine (CI's tests side by side) never end each other's processes."""
    return hashlib.sha256(str(data_dir.expanduser().resolve()).encode()).hexdigest()[:12]


def make_tag(launcher: int, seq: int, scope: str) -> str:
    """The TREE_ENV value of the seq-th worker process a launcher of `scope` starts: names the launcher
    by pid and start time, so a tag outliving its launcher is known as such even after pid reuse."""
    st = stat(launcher)
    return f"{launcher}.{st.start if st else 0}.{seq}.{scope}"


def launcher_gone(tag: str, scope: str) -> bool:
    """The tag's launcher, of this scope, is gone."""
    parts = tag.split(".")
    if len(parts) != 4 or parts[3] != scope:
        return False
    try:
        pid, start = int(parts[0]), int(parts[1])
    except ValueError:
        return False
    st = stat(pid)
    return st is None or st.start != start


def orphaned_trees(scope: str) -> list[int]:
    """Running processes whose launcher of this scope is gone. A launcher killed outright takes its
    workers (PR_SET_PDEATHSIG), not what they started: vLLM's EngineCore lives on, holding the GPU, and
    the next launcher of the host's fleet ends it before it starts its own workers."""
    return [pid for pid in all_pids() if pid != os.getpid() and (st := stat(pid)) is not None and st.running
            and (tag := tree_tag(pid)) is not None and launcher_gone(tag, scope)]


def tree_of(tag: str, session: int | None = None) -> list[int]:
    """Running processes started under tag, anywhere (a subreaper other than this process may hold
    them); and this process's descendants in session: one that cleared its environment but stayed
    in its worker's session is still found (a session's id cannot be reused while it has members,
    and among descendants no stranger can have taken it)."""
    mine = set(descendants(os.getpid())) if session is not None else set()
    found = []
    for pid in all_pids():
        st = stat(pid)
        if st is None or not st.running or pid == os.getpid():
            continue
        if tree_tag(pid) == tag or (st.session == session and pid in mine):
            found.append(pid)
    return found


def kill_tree(pids: Iterable[int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM each process, SIGKILL what still runs after grace_s, and wait until none runs.

    Returns the pids that were running. Each is signalled only while it is the process it was
    when called (same start time: a pid freed and reused meanwhile is left alone). Ended means
    exited: a zombie counts, since its memory is freed; reaping it is its parent's business (the
    caller reaps its own children, see `reap_orphans`).
    """
    targets = {st.pid: st.start for pid in pids if (st := stat(pid)) is not None and st.running}

    def live() -> list[int]:
        return [pid for pid, start in targets.items()
                if (st := stat(pid)) is not None and st.start == start and st.running]

    # A stopped process (SIGSTOP, a debugger's stop) runs no handler until it is continued: a SIGTERM
    # would only wait out grace_s, and continuing it could wake a frozen engine. It gets SIGKILL now.
    stopped = [pid for pid in live() if (st := stat(pid)) is not None and st.stopped]
    if stopped:
        log.warning("processes %s are stopped: killing", stopped)
        signal_all(stopped, signal.SIGKILL)
    signal_all([pid for pid in live() if pid not in stopped], signal.SIGTERM)
    left = _wait(live, grace_s)
    if left:
        # Those that ignore SIGTERM go last: one may be waiting for the others to exit, as
        # multiprocessing's resource tracker does before it unlinks the shared memory they leaked
        # (vLLM's queues between its processes); it gets DEAF_WAIT_S once they are gone.
        if stuck := [pid for pid in left if not ignores_sigterm(pid)]:
            log.warning("processes %s did not exit %.1fs after SIGTERM: killing", stuck, grace_s)
            signal_all(stuck, signal.SIGKILL)
        if left := _wait(live, DEAF_WAIT_S):
            log.warning("processes %s ignore SIGTERM: killing", left)
            signal_all(left, signal.SIGKILL)
            if left := _wait(live, KILL_WAIT_S):
                log.error("processes %s still run %.0fs after SIGKILL", left, KILL_WAIT_S)
    return sorted(targets)


def signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    """Send sig to each of pids; one that has ended meanwhile, or is another user's, is passed over."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def ignores_sigterm(pid: int) -> bool:
    """From the SigIgn mask of /proc/<pid>/status."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _wait(live: Callable[[], list[int]], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := live()) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return left


def reap_orphans(keep: Iterable[int]) -> list[int]:
    """Collect the exit status of this process's exited children but those in keep: orphans it
    adopted as a subreaper. A wait for any child (-1) would take a subprocess.Popen's status from
    it; keep names the children whose Popen still waits."""
    keep, reaped = set(keep), []
    for pid in children(os.getpid()):
        st = stat(pid)
        if pid in keep or st is None or st.running:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
            reaped.append(pid)
        except ChildProcessError:
            pass
    return reaped


def prctl(option: int, value: int) -> bool:
    """Linux prctl(2) through libc; False where it is missing or refused."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """PR_SET_CHILD_SUBREAPER: this process adopts its descendants' orphans. Not inherited by
    children (fork clears it), so workers are not reapers themselves."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)
