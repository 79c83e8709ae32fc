"""The test helper that lets an engine run only in slices (tests/fleetproc.py, `step_until`) holds the core it
needs to end each slice: docs/architecture.md, "Tests"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fleetproc import on_time


def test_the_stepping_thread_runs_real_time_and_what_it_starts_does_not(capsys):
    # Given a thread at the normal priority
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    # When it steps processes
    with on_time():
        if "stepping at the normal priority" in capsys.readouterr().err:
            pytest.skip("the kernel gives this thread no real-time priority")
        # Then it runs at a real-time priority, which a process it starts meanwhile does not inherit
        assert os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO
        child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                               capture_output=True, text=True, check=True)
        assert int(child.stdout) == os.SCHED_OTHER
    # And once done it is back where it was
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_the_stepping_thread_steps_at_its_own_priority_where_the_kernel_refuses_another(monkeypatch, capsys):
    # Given a kernel that refuses a real-time priority (no CAP_SYS_NICE)
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    # When a thread steps processes, it still steps them, and says at what priority
    with on_time():
        ran = True
    assert ran
    assert "stepping at the normal priority" in capsys.readouterr().err
