"""Both sides of a comparison at once on the same CPU, each held to half of it.

A cloud VM's CPUs change speed under it, each on its own: on the 2-core machine BENCHMARKS.md
was measured on, the bare engine alone moved by a third between runs of the same command a
minute apart, so two runs one after the other see different machines, and so do two runs at
once on CPUs of their own. Two control groups on one CPU, each capped by a CFS quota at half of
it per `PERIOD_US`, take turns on it many times a second and see the same speeds: those cancel
out of their ratio (`fleet bench` prints each pair's tok/s beside its ratio: the tok/s move, the
ratios hold). A quota, not a weight: neither side gains the time the other leaves idle, so a
side that waits (a batch it cannot fill, a poll) is charged for it as it would be alone. An
engine whose processes spin gets weighed pens instead (`capped=False`): vLLM's EngineCore
busy-polls its worker process's shared-memory queue (sched_yield for a second after each read),
and under a quota that spinning spends the pen's time by an amount that depends on where and
when each process runs (three capped pairs: 0.757, 1.223, 0.731); a side that never idles gains
nothing from the other's idle time, so equal weights share the CPU without the throttling. What
one CPU cannot show: a side's threads never run in parallel, so contention for the GIL between
cores, which a worker on a many-core GPU host has, is not charged to fleet here.

`python -m fleet.bench.sharedcore GROUP CPUS -- ARGV...` moves itself into GROUP, pins itself to
CPUS and execs ARGV, so every process ARGV starts (an engine's own processes) is in the group
and on those CPUs: the bare side. Fleet's side is one `fleet run`, whose worker process (and the
engine processes it starts) the benchmark moves into its pen as it appears (`Pen.adopt`): the
command line's progress display and the broker are not the worker's cost, and on a GPU fleet
they run elsewhere; here they stay outside both pens, on the other CPU with the benchmark.
Control groups need root: where none can be made, `open_pens` raises SharedCoreUnavailable with
the reason and the benchmark runs its pairs one after the other (fleet.bench.pairs), and says so.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from fleet.errors import FleetError

#: the CFS period both quotas count in: short, so the two sides take turns many times a second
PERIOD_US = 20_000
#: CPUs the two sides share, each held to half of them: one. On two, each side's busiest process
#: settles on a CPU of its own and sees that CPU's speed, not the other's (three SGLang pairs on
#: two shared CPUs: 0.889, 0.999, 1.332); on one, both take turns on it every period
SHARED_CPUS = 1
CGROUP_ROOT = Path("/sys/fs/cgroup")


class SharedCoreUnavailable(FleetError):
    """No control group can be made here (not root, no cpu controller): pairs run one after the other."""


@dataclass(frozen=True)
class Pen:
    """One control group, and the CPUs its processes are pinned to (its share of them is the
    group's own setting: make_pen)."""

    path: Path
    cpus: tuple[int, ...]

    def prefix(self) -> list[str]:
        """The argv that puts a command in this pen: prepend it to the command's own."""
        return [sys.executable, "-m", "fleet.bench.sharedcore", str(self.path), ",".join(map(str, self.cpus)), "--"]

    def adopt(self, pid: int) -> None:
        """Move a running process (every thread of it) into the pen and onto its CPUs; what it
        starts afterwards is born there. A process that has already exited is skipped."""
        with contextlib.suppress(ProcessLookupError, FileNotFoundError, psutil.NoSuchProcess):
            (self.path / "cgroup.procs").write_text(str(pid))
            for thread in psutil.Process(pid).threads():
                with contextlib.suppress(ProcessLookupError, OSError):
                    os.sched_setaffinity(thread.id, set(self.cpus))


def cpu_hierarchy(root: Path = CGROUP_ROOT) -> tuple[Path, int]:
    """Where cpu control groups are made here, and the cgroup version (1 or 2)."""
    if (root / "cgroup.controllers").is_file():
        if "cpu" not in (root / "cgroup.controllers").read_text().split():
            raise SharedCoreUnavailable(f"the cpu controller is not available in {root}")
        return root, 2
    for name in ("cpu", "cpu,cpuacct"):
        if (root / name / "cpu.cfs_quota_us").is_file():
            return root / name, 1
    raise SharedCoreUnavailable(f"no cpu control group hierarchy under {root}")


def make_pen(name: str, cpus: tuple[int, ...], share: float, root: Path = CGROUP_ROOT, capped: bool = True) -> Pen:
    """A new control group capped at `share` CPUs' worth of time (1.0: one CPU), per PERIOD_US;
    uncapped, it only weighs the same as every other pen (CFS's default weight)."""
    base, version = cpu_hierarchy(root)
    quota = str(max(1000, round(share * PERIOD_US))) if capped else ("max" if version == 2 else "-1")
    path = base / name
    try:
        if version == 2:
            with contextlib.suppress(OSError):  # already on, or set by whoever owns the root
                (base / "cgroup.subtree_control").write_text("+cpu")
            path.mkdir(exist_ok=True)
            (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            path.mkdir(exist_ok=True)
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(quota)
    except OSError as e:
        raise SharedCoreUnavailable(f"cannot make control group {path}: {e}") from e
    return Pen(path, cpus)


def shared_cpus(count: int = SHARED_CPUS) -> tuple[int, ...]:
    """The CPUs both sides share: the last `count` this process may use. The benchmark itself
    moves to the others (when there are any), so its own polling stays off them."""
    return tuple(sorted(os.sched_getaffinity(0))[-count:])


@contextlib.contextmanager
def open_pens(names: tuple[str, ...], capped: bool = True) -> Iterator[list[Pen]]:
    """One pen per name on the shared CPUs, each held to an equal part of them (`capped`; else
    weighed equally); the benchmark's own process off them while they exist (where
    it can be). Removed (when empty) on the way out."""
    cpus = shared_cpus()
    tag = f"fleet-bench-{os.getpid()}"
    pens = [make_pen(f"{tag}-{name}", cpus, len(cpus) / len(names), capped=capped) for name in names]
    mine = os.sched_getaffinity(0)
    rest = mine - set(cpus)
    if rest:
        os.sched_setaffinity(0, rest)
    try:
        yield pens
    finally:
        os.sched_setaffinity(0, mine)
        for pen in pens:
            with contextlib.suppress(OSError):  # a straggler still inside: left for the next boot
                pen.path.rmdir()


def enter(group: Path, cpus: set[int]) -> None:
    """Move this process into `group` and onto `cpus`: what it execs next inherits both."""
    (group / "cgroup.procs").write_text(str(os.getpid()))
    os.sched_setaffinity(0, cpus)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 4 or args[2] != "--":
        sys.exit("usage: python -m fleet.bench.sharedcore GROUP CPUS -- ARGV...")
    enter(Path(args[0]), {int(c) for c in args[1].split(",")})
    os.execvp(args[3], args[3:])


if __name__ == "__main__":
    main()
