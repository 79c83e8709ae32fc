"""End to end with real processes: redis-server, moto S3 over HTTP, `fleet enqueue`, two
`fleet worker` launchers, `fleet export`."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.store import open_store
from fleet.store.layout import results_prefix
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, Workers, read_jsonl, wait_for, write_prompts

pytestmark = pytest.mark.e2e
RECORDS, CHUNK = 208, 4  # 52 chunks


def result_versions(store_url: str, job: str) -> dict[str, str]:
    store = open_store(store_url)
    return {k: store.version(k) for k in store.list(results_prefix(job))}


@pytest.fixture(params=["local", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/jobs"


def test_job_through_enqueue_two_workers_and_export(tmp_path, redis_server, store_url, clean_env):
    # Given a 52-chunk job, a real broker and store, and two worker hosts
    prompts = write_prompts(tmp_path / "prompts.jsonl", RECORDS)
    env = {**FAST_SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_CHUNK_SIZE": str(CHUNK), "FLEET_SLOTS": "4"}
    import os

    env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    workers = Workers(env, tmp_path / "logs")
    workers.start("hostA")
    workers.start("hostB")
    try:
        # Both hosts up before the job arrives: on a loaded machine one host could otherwise
        # finish the whole job before the other has booted.
        wait_for(lambda: workers.logs().count("engine ready") >= 2, 120, "both hosts ready")
        done = run_fleet("enqueue", str(prompts), "--job", "e2e", env=env)
        assert done.returncode == 0, done.stderr
        assert "enqueued 52" in done.stderr
        assert "max_tokens 2048 (fallback (no model files))" in " ".join(done.stderr.split())
        # When they run the job
        store = open_store(store_url)
        wait_for(lambda: len(list(store.list(results_prefix("e2e")))) == 52, 120, "52 results")
    finally:
        workers.stop()
    # Then the export has one record per prompt, in input order, from both hosts
    out = tmp_path / "out.jsonl"
    exported = run_fleet("export", "--job", "e2e", "--out", str(out), env=env)
    assert exported.returncode == 0, exported.stderr
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == [f"r{i:05d}" for i in range(RECORDS)]
    assert all(r["finish_reason"] in ("stop", "length") and r["completion_tokens"] > 0 for r in rows)
    hosts = {r["worker"].split("@")[1] for r in rows}
    assert hosts == {"hostA", "hostB"}, workers.logs()

    # And rerunning enqueue on the finished job enqueues nothing and rewrites no result
    before = result_versions(store_url, "e2e")
    again = run_fleet("enqueue", str(prompts), "--job", "e2e", env=env)
    assert again.returncode == 0, again.stderr
    assert "enqueued 0" in again.stderr and "done 52" in again.stderr
    assert result_versions(store_url, "e2e") == before

    # And a second configuration under the same job name is refused, naming the setting
    other = run_fleet("enqueue", str(prompts), "--job", "e2e", "--chunk-size", "8", env=env)
    assert other.returncode != 0
    assert "chunk_size: 4 -> 8" in other.stderr

    # And status reports the finished job
    status = run_fleet("status", "--job", "e2e", "--json", env=env)
    import json

    st = json.loads(status.stdout)
    assert st["done"] and st["chunks_done"] == st["chunks_total"] == 52
    assert st["records_done"] == RECORDS and st["completion_tokens"] == sum(r["completion_tokens"] for r in rows)


def test_fleet_run_is_idempotent(tmp_path, clean_env):
    # Given a finished `fleet run` with its own local Redis and local store
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    env = {**FAST_SIM, "FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_CHUNK_SIZE": "5"}
    first = run_fleet("run", str(prompts), "--job", "idem", "--workers", "2", env=env)
    assert first.returncode == 0, first.stderr
    store_url = str(tmp_path / "data" / "store")
    before = result_versions(store_url, "idem")
    assert len(before) == 8
    # When it runs again
    second = run_fleet("run", str(prompts), "--job", "idem", env=env)
    # Then nothing is regenerated
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stderr
    assert result_versions(store_url, "idem") == before
    # And export gives the records in order
    out = tmp_path / "o.parquet"
    assert run_fleet("export", "--job", "idem", "--out", str(out), env=env).returncode == 0
    import pyarrow.parquet as pq

    assert pq.read_table(out).column("id").to_pylist() == [f"r{i:05d}" for i in range(40)]
