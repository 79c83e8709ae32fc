"""A known preemption notice is spent generating, up to the hand-over this host measured
(fleet.worker.process.notice); the end-to-end case is in tests/test_handover.py."""

from __future__ import annotations

import threading
import time

from fleet.worker.process.notice import HANDOVER_FLOOR_S, HANDOVER_FLUSHES, DrainClock, generate_for


def test_the_generation_ends_the_measured_hand_over_before_the_kill():
    # Given a 30 s notice, 0.2 s already gone, a flush of every running chunk measured at 0.3 s
    # When the worker asks how long to generate on
    left = generate_for(30.0, 0.2, 0.3)
    # Then it is what is left of the notice less the hand-over (in flushes as measured, and its floor), and
    # no poll: the stop's bell wakes every chunk at once
    assert left == 30.0 - 0.2 - HANDOVER_FLUSHES * 0.3 - HANDOVER_FLOOR_S
    # And a notice too short for the hand-over, or a flush that did not end in time, hands over at once
    assert generate_for(0.5, 0.0, 0.3) == 0.0
    assert generate_for(120.0, 1.0, None) == 0.0


def test_the_drain_clock_times_every_running_chunks_flush_and_gives_up_after_its_timeout():
    # Given a SIGTERM's drain begun, with two chunks running
    clock = DrainClock()
    clock.begin()
    # When both flush, the second 0.2 s later
    clock.flushed()
    threading.Timer(0.2, clock.flushed).start()
    took = clock.wait(2, timeout_s=5)
    # Then the drain took as long as the slower flush
    assert took is not None and 0.15 <= took < 2
    # And a chunk that never flushes leaves the drain unmeasured once the timeout passes
    clock.begin()
    clock.flushed()
    began = time.monotonic()
    assert clock.wait(2, timeout_s=0.2) is None and time.monotonic() - began >= 0.2
