"""The store writer, the spool's one owner: what a refusing store costs is a wait, never the work.

A local store behind a switch that refuses every write while it is down, as an endpoint outage
does (StoreError); tests/test_store_outage.py runs the same through real workers and moto."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fleet.errors import StoreError
from fleet.store.local import LocalStore
from fleet.worker.process import storewriter
from fleet.worker.process.spool import Kind, Spool
from fleet.worker.process.storewriter import StoreWriter


class Switched(LocalStore):
    """A local store that refuses every write while `down` is set."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.down = threading.Event()

    def put(self, key: str, data: bytes) -> None:
        if self.down.is_set():
            raise StoreError(f"refused: {key}")
        super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.down.is_set():
            raise StoreError(f"refused: {key}")
        return super().put_if_absent(key, data)


@pytest.fixture
def store(tmp_path: Path) -> Switched:
    return Switched(tmp_path / "store")


@pytest.fixture
def reports() -> list[tuple[float | None, int]]:
    return []


@pytest.fixture
def writer(store: Switched, tmp_path: Path, reports: list[tuple[float | None, int]],
           monkeypatch: pytest.MonkeyPatch) -> StoreWriter:
    monkeypatch.setattr(storewriter, "POLL_S", 0.01)
    monkeypatch.setattr(storewriter, "COMMIT_RETRY_S", 0.02)
    return StoreWriter(store, Spool(tmp_path / "spool", 2**20), lambda since, waiting: reports.append((since, waiting)))


def test_a_refused_flush_raises_but_a_runs_last_flush_is_spooled(writer: StoreWriter, store: Switched) -> None:
    # Given a store that refuses writes
    store.down.set()
    # When a run flushes mid-run, then for the last time
    with pytest.raises(StoreError):
        writer.checkpoint("j/c/1", b"mid", last=False)
    spooled = writer.checkpoint("j/c/2", b"last", last=True)
    # Then only the last flush waits in the spool (the mid-run one is sent with the next flush)
    assert spooled
    assert writer.spool is not None
    assert [(e.kind, e.key) for e in writer.spool.entries()] == [(Kind.CHECKPOINT, "j/c/2")]
    assert writer.unreachable_since is not None


def test_a_refused_result_waits_spooled_and_is_committed_once_the_store_answers(
        writer: StoreWriter, store: Switched, reports: list[tuple[float | None, int]]) -> None:
    # Given a store that refuses writes, and answers again after a few polls
    store.down.set()
    polls = []

    def poll() -> None:
        polls.append(1)
        if len(polls) == 5:
            store.down.clear()

    # When a result is committed
    got = writer.commit("j/results/0", b"rows", poll)
    # Then it was written once the store answered, the spool is empty, and the outage was
    # reported (one result waiting) and then cleared
    assert got is True and store.get("j/results/0") == b"rows"
    assert writer.spool is not None and writer.spool.entries() == []
    assert reports[0][0] is not None and reports[0][1] == 1 and reports[-1] == (None, 0)


def test_a_result_waiting_out_its_back_off_is_committed_as_soon_as_another_write_finds_the_store_back(
        writer: StoreWriter, store: Switched, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a result whose retries have backed off to a long wait (the store refused it a while: the
    # CI run of 2fe8050 saw a result committed 30 s after the store returned, its slot held meanwhile)
    monkeypatch.setattr(storewriter, "COMMIT_RETRY_S", 60.0)
    store.down.set()
    done: list[object] = []
    waiter = threading.Thread(target=lambda: done.append(writer.commit("j/results/5", b"rows", lambda: None)))
    waiter.start()
    deadline = time.monotonic() + 10
    while writer.unreachable_since is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # When the store answers again, and another run's write finds it so
    store.down.clear()
    writer.checkpoint("j/c/6", b"ck", last=False)
    began = time.monotonic()
    waiter.join(10)
    # Then the waiting result is committed at its next poll, not after its 60 s back-off
    assert done == [True] and time.monotonic() - began < 5
    assert store.get("j/results/5") == b"rows" and writer.outages_ended == 1


class Stalled(Switched):
    """A store whose next try of one key hangs until let go, then fails: a put begun in the outage whose
    client's own retries outlast it."""

    def __init__(self, root: Path, key: str):
        super().__init__(root)
        self.key, self.hanging, self.let_go = key, threading.Event(), threading.Event()
        self.hang = False

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key == self.key and self.hang:
            self.hang = False
            self.hanging.set()
            self.let_go.wait(10)
            raise StoreError(f"refused after the client's retries: {key}")
        return super().put_if_absent(key, data)


def test_a_try_that_fails_after_the_store_came_back_does_not_wait_out_the_outages_back_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a result refused for a while, its back-off grown (from 0.05 s, doubling, here: seconds by now)
    # (CI on a16a9fd: a try begun in the outage failed 0.5 s after it ended, and its result then waited
    # the outage's 30 s back-off)
    store = Stalled(tmp_path / "store", "j/results/7")
    writer = StoreWriter(store, Spool(tmp_path / "spool", 2**20))
    monkeypatch.setattr(storewriter, "COMMIT_RETRY_S", 0.05)
    monkeypatch.setattr(storewriter, "COMMIT_RETRY_MAX_S", 60.0)
    monkeypatch.setattr(storewriter, "POLL_S", 0.01)
    store.down.set()
    done: list[object] = []
    waiter = threading.Thread(target=lambda: done.append(writer.commit("j/results/7", b"rows", lambda: None)))
    waiter.start()
    time.sleep(3.5)
    # When its next try begins in the outage and hangs (a client's own retries), the store comes back and
    # answers another write meanwhile, and only then does the hanging try fail
    store.hang = True
    assert store.hanging.wait(20)
    store.down.clear()
    writer.checkpoint("j/c/8", b"ck", last=False)
    store.let_go.set()
    began = time.monotonic()
    waiter.join(30)
    # Then the result is committed at the back-off's first step, not after the outage's grown one (>= 3.2 s)
    assert done == [True] and time.monotonic() - began < 1.5
    assert store.get("j/results/7") == b"rows"


def test_a_run_stopped_while_its_result_waits_leaves_it_spooled(writer: StoreWriter, store: Switched) -> None:
    # Given a store that refuses writes
    store.down.set()
    # When the run must stop while its result waits
    got = writer.commit("j/results/1", b"rows", lambda: "handed back")
    # Then the stop is returned and the result stays in the spool for the next process
    assert got == "handed back"
    assert writer.spool is not None and [e.key for e in writer.spool.entries(Kind.RESULT)] == ["j/results/1"]


def test_the_next_process_drains_results_first_and_drops_a_lost_race(tmp_path: Path, store: Switched) -> None:
    # Given an earlier process's spool: a result another copy won meanwhile, one no one wrote, a checkpoint
    spool = Spool(tmp_path / "spool", 2**20)
    spool.put(Kind.CHECKPOINT, "j/c/9", b"ck")
    spool.put(Kind.RESULT, "j/results/2", b"mine")
    spool.put(Kind.RESULT, "j/results/3", b"mine")
    store.put("j/results/3", b"the winner's")
    # When this worker's next process starts
    writer = StoreWriter(store, spool)
    stop = threading.Event()
    writer.start_drain("gpu0@h", stop)
    # Then everything spooled is committed or dropped, and the winner's result is untouched
    for _ in range(200):
        if not spool.entries():
            break
        stop.wait(0.05)
    stop.set()
    assert spool.entries() == []
    assert store.get("j/results/2") == b"mine" and store.get("j/results/3") == b"the winner's"
    assert store.get("j/c/9") == b"ck"


def test_without_a_spool_a_refused_result_fails_the_run(tmp_path: Path, store: Switched) -> None:
    # Given a worker with no spool (spool_max_mb 0) and a refusing store
    store.down.set()
    # When a result is committed, Then the refusal is the run's (an infra fault: retried, no attempt spent)
    with pytest.raises(StoreError):
        StoreWriter(store).commit("j/results/4", b"rows", lambda: None)
