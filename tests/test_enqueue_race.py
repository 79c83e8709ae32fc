"""Two `fleet enqueue` processes started together on one new job (two terminals, or a retry
of a slow upload), with a real redis-server, a local store and moto S3 over HTTP.

With different chunk sizes exactly one wins and the other is refused before writing
anything; with the same configuration both succeed. Real `fleet worker` processes then
run every job and `fleet export` writes every id exactly once, in input order."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest

from fleet.producer.enqueue import prepare_job
from fleet.settings import Settings
from fleet.store import Store, open_store
from fleet.store.layout import chunk_key, claim_key, manifest_key, results_prefix
from fleet.store.local import LocalStore
from fleet.store.manifest import load_manifest
from tests.conftest import fleet_cmd, run_fleet
from tests.fleetproc import FAST_SIM, Workers, read_jsonl, wait_for, write_prompts

pytestmark = pytest.mark.e2e
RECORDS = 40


def enqueue_together(env: dict[str, str], prompts: Path, job: str, sizes: tuple[int, int]) -> list[tuple[int, str]]:
    """(returncode, stderr) of one `fleet enqueue` per chunk size, all started at once."""
    full = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(fleet_cmd("enqueue", str(prompts), "--job", job, "--chunk-size", str(size)),
                         env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for size in sizes
    ]
    return [(p.returncode, err) for p in procs for _out, err in [p.communicate(timeout=300)]]


def chunk_objects(store: Store, job: str) -> dict[str, bytes]:
    return {k: store.get(k) for k in store.list(f"{job}/chunks/")}


def reference_chunks(tmp: Path, prompts: Path, job: str, size: int) -> dict[str, bytes]:
    """The chunks one enqueue alone writes for this input and chunk size."""
    ref = LocalStore(tmp / f"ref-{job}-{size}")
    prepare_job(Settings(engine="sim", chunk_size=size), ref, str(prompts), job)
    return chunk_objects(ref, job)


def assert_one_winner(results: list[tuple[int, str]], sizes: tuple[int, int]) -> int:
    """The winner's chunk size; the loser was refused naming the difference and the way out."""
    won = [size for (rc, _), size in zip(results, sizes, strict=True) if rc == 0]
    lost = [(err, size) for (rc, err), size in zip(results, sizes, strict=True) if rc != 0]
    assert len(won) == 1 and len(lost) == 1, results
    err, size = lost[0]
    assert f"chunk_size: {won[0]} -> {size}" in err and "another --job name" in err, err
    assert "Traceback" not in err, err
    return won[0]


def run_and_export(env: dict[str, str], tmp: Path, store: Store, jobs: dict[str, int]) -> None:
    """Run every job on real workers, then export each: every id once, in input order."""
    workers = Workers(env, tmp / "logs")
    workers.start("hostA", workers=2)
    try:
        for job, chunks in jobs.items():
            wait_for(lambda j=job, c=chunks: len(list(store.list(results_prefix(j)))) == c, 240,
                     f"{chunks} results of {job}")
    finally:
        workers.stop()
    for job in jobs:
        out = tmp / f"{job}.jsonl"
        exported = run_fleet("export", "--job", job, "--out", str(out), env=env)
        assert exported.returncode == 0, exported.stderr
        assert [r["id"] for r in read_jsonl(out)] == [f"r{i:05d}" for i in range(RECORDS)]


def race_rounds(env: dict[str, str], tmp: Path, store: Store, rounds: list[tuple[int, int]]) -> None:
    prompts = write_prompts(tmp / "prompts.jsonl", RECORDS)
    jobs = {}
    for n, sizes in enumerate(rounds):
        job = f"race{n}"
        # When two enqueues of one new job with different chunk sizes start together
        winner = assert_one_winner(enqueue_together(env, prompts, job, sizes), sizes)
        # Then the store holds exactly the winner's chunks, byte for byte: the loser wrote none
        assert chunk_objects(store, job) == reference_chunks(tmp, prompts, job, winner)
        manifest = load_manifest(store, job)
        assert manifest is not None and manifest.chunk_size == winner
        assert manifest.chunks == math.ceil(RECORDS / winner) and store.exists(claim_key(job))
        jobs[job] = manifest.chunks
    # And a same-configuration pair both succeed and share one job
    results = enqueue_together(env, prompts, "same", (6, 6))
    assert [rc for rc, _ in results] == [0, 0], results
    assert chunk_objects(store, "same") == reference_chunks(tmp, prompts, "same", 6)
    jobs["same"] = math.ceil(RECORDS / 6)
    run_and_export(env, tmp, store, jobs)


def test_racing_enqueues_on_a_local_store(tmp_path: Path, redis_server, clean_env):
    store_url = str(tmp_path / "store")
    env = {**FAST_SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url, "FLEET_SLOTS": "4"}
    race_rounds(env, tmp_path, open_store(store_url), [(4, 8), (8, 4), (5, 7), (3, 10), (10, 3)])


def test_racing_enqueues_on_s3(tmp_path: Path, redis_server, s3_bucket: str, s3_env, clean_env):
    store_url = f"s3://{s3_bucket}/jobs"
    env = {**FAST_SIM, **s3_env, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_SLOTS": "4"}
    store = open_store(store_url)
    race_rounds(env, tmp_path, store, [(4, 8)])
    assert store.exists(manifest_key("race0")) and not store.exists(chunk_key("race0", 10))
