"""Datasets where people keep them (docs/architecture.md, Objects and Exports): a Hub dataset (the
Hub stand-in of tests/hubserver.py, reached through huggingface_hub's own API), a gs:// file
(fake-gcs-server, tests/gcsserver.py) and local dataset folders in; a Hub-ready folder out that
`datasets` loads with the JSONL export's rows, and whose card's figures are `fleet status`'s."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from fleet.errors import JobConflict
from fleet.store import open_store
from tests.conftest import load_folder, run_fleet
from tests.fleetproc import FAST_SIM
from tests.hubserver import HubServer


def parquet_bytes(rows: list[dict], row_group_size: int | None = None) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=row_group_size)
    return buf.getvalue()


def sharegpt(i: int) -> dict:
    return {"uuid": f"u{i:03d}", "conversations": [{"from": "human", "value": f"question {i}"}],
            "source": "hub" if i % 2 else "web"}


def hub_dataset(hub: HubServer, rows: list[dict]) -> str:
    """Two train shards and a test split, as push_to_hub lays them out, with a card naming them."""
    card = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n"
            "  - split: test\n    path: data/test-*\n---\n# prompts\n")
    half = len(rows) // 2
    return hub.commit("org/prompts", {
        "README.md": card.encode(),
        "data/train-00000-of-00002.parquet": parquet_bytes(rows[:half], row_group_size=5),
        "data/train-00001-of-00002.parquet": parquet_bytes(rows[half:]),
        "data/test-00000-of-00001.parquet": parquet_bytes([sharegpt(999)]),
    })


def job_env(tmp: Path, name: str, extra: dict[str, str]) -> dict[str, str]:
    return {**FAST_SIM, **extra, "FLEET_DATA_DIR": str(tmp / name), "FLEET_CHUNK_SIZE": "4"}


def run_ok(*args: str, env: dict[str, str], cwd: Path) -> str:
    done = run_fleet(*args, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.e2e
def test_hub_and_gs_inputs_run_and_export_a_hub_ready_folder(tmp_path, hub, gs_bucket, gcs_env, clean_env):

    # Given a Hub dataset of ShareGPT conversations whose ids are in a `uuid` column, and a gs:// JSONL file
    rows = [sharegpt(i) for i in range(22)]
    sha = hub_dataset(hub, rows)
    gs_lines = [{"id": f"g{i}", "prompt": f"p{i}"} for i in range(9)]
    gs = open_store(f"gs://{gs_bucket}")
    gs.put("in/prompts.jsonl", "".join(json.dumps(x) + "\n" for x in gs_lines).encode())
    env = job_env(tmp_path, "data", {**gcs_env, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1"})
    # When a job runs on each (the Hub one with its column mapping)
    run_ok("run", "hf://datasets/org/prompts", "--job", "hub", "--columns", "id=uuid", "--workers", "1",
           env=env, cwd=tmp_path)
    run_ok("run", f"gs://{gs_bucket}/in/prompts.jsonl", "--job", "gsin", "--workers", "1", env=env, cwd=tmp_path)
    # Then the Hub job read the train split at its commit, and recorded that commit
    manifest = json.loads((tmp_path / "data" / "store" / "hub" / "manifest.json").read_text())
    assert manifest["input"] == f"hf://datasets/org/prompts@{sha}?split=train" and manifest["records"] == 22
    # And the gs:// job's export goes back to gs://, equal to a local export
    run_ok("export", "--job", "gsin", "--out", f"gs://{gs_bucket}/out/gsin.jsonl", "--stable", env=env, cwd=tmp_path)
    run_ok("export", "--job", "gsin", "--out", str(tmp_path / "gsin.jsonl"), "--stable", env=env, cwd=tmp_path)
    assert gs.get("out/gsin.jsonl") == (tmp_path / "gsin.jsonl").read_bytes()
    assert [json.loads(x)["id"] for x in gs.get("out/gsin.jsonl").splitlines()] == [x["id"] for x in gs_lines]
    # When the Hub job is exported as JSONL and as a Hub-ready folder
    run_ok("export", "--job", "hub", "--out", str(tmp_path / "hub.jsonl"), "--stable", env=env, cwd=tmp_path)
    out = tmp_path / "hub-ready"
    run_ok("export", "--job", "hub", "--format", "hf", "--out", str(out), "--stable", env=env, cwd=tmp_path)
    # Then `datasets` loads the folder with the JSONL export's rows and ids, in order
    jsonl = [json.loads(x) for x in (tmp_path / "hub.jsonl").read_text().splitlines()]
    loaded = load_folder(out, tmp_path / "cache")
    assert [r["id"] for r in loaded] == [r["id"] for r in jsonl] == [r["uuid"] for r in rows]
    for got, want in zip(loaded, jsonl, strict=True):
        extra = json.loads(got.pop("extra") or "{}")
        assert extra == {"source": want["source"]}  # passed through; the JSONL export has it inline
        assert {k: got[k] for k in want if k in got} == {k: want[k] for k in want if k in got}
    assert [p.name for p in sorted((out / "data").iterdir())] == ["train-00000-of-00001.parquet"]
    # And the card's figures are `fleet status`'s
    status = json.loads(run_fleet("status", "--job", "hub", "--json", env={**env, "FLEET_BROKER_URL": ""}).stdout)
    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("\n---", 1)[0].removeprefix("---"))
    assert meta["fleet"]["status"] == {k: status[k] for k in meta["fleet"]["status"]}
    assert meta["fleet"]["input"] == manifest["input"] and meta["fleet"]["rows_exported"] == len(jsonl)
    assert f"| cut at max tokens | {status['records_truncated']:,} |" in card
    assert "## Sampling as run" in card and "thinking mode" in card


@pytest.mark.slow
def test_hf_folder_shards_and_row_groups_are_bounded(tmp_path, monkeypatch):

    from fleet.export import writer
    from fleet.export.formats import hf
    from tests.fleetproc import clean_reference

    # Given a finished sim job of 60 records, and shards bounded at 2 KB, row groups at 1 KB
    (tmp_path / "ref").mkdir()
    prompts, _ = clean_reference(tmp_path / "ref", FAST_SIM, "shards", 60)
    store = open_store(str(tmp_path / "ref" / "data" / "store"))
    monkeypatch.setattr(hf, "SHARD_BYTES", 2000)
    monkeypatch.setattr(hf, "ROW_GROUP_BYTES", 1000)
    out = tmp_path / "ready"
    writer.export_job(store, "shards", out, "hf")
    writer.export_job(store, "shards", tmp_path / "all.jsonl", "jsonl")
    # Then the folder holds several shards named as the Hub names them, each of bounded row groups
    shards = sorted((out / "data").iterdir())
    n = len(shards)
    assert n > 2 and [p.name for p in shards] == [f"train-{i:05d}-of-{n:05d}.parquet" for i in range(n)]
    for shard in shards:
        meta = pq.ParquetFile(shard).metadata
        assert meta.num_row_groups >= 1
        assert all(meta.row_group(i).num_rows <= hf.ROW_GROUP_ROWS for i in range(meta.num_row_groups))
    # And they load as the JSONL export's rows, in order, run facts included
    want = [json.loads(x) for x in (tmp_path / "all.jsonl").read_text().splitlines()]
    loaded = load_folder(out, tmp_path / "cache")
    assert [r["id"] for r in loaded] == [r["id"] for r in want]
    assert [(r["latency_s"], r["worker"]) for r in loaded] == [(r["latency_s"], r["worker"]) for r in want]
    # And an export again replaces the folder whole (no shard of the last one left), and loads as
    # itself, not as the export it replaced: --stable has no run facts
    monkeypatch.setattr(hf, "SHARD_BYTES", 10**9)
    writer.export_job(store, "shards", out, "hf", stable=True)
    assert [p.name for p in (out / "data").iterdir()] == ["train-00000-of-00001.parquet"]
    again = load_folder(out, tmp_path / "cache")
    assert [r["id"] for r in again] == [r["id"] for r in want] and "latency_s" not in again[0]


@pytest.mark.e2e
def test_a_resumed_hub_job_reads_its_pinned_commit(tmp_path, hub, clean_env):
    # Given a job enqueued from a Hub dataset's main
    rows = [sharegpt(i) for i in range(10)]
    first = hub_dataset(hub, rows)
    env = job_env(tmp_path, "data", {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1",
                                     "FLEET_BROKER_URL": "", "FLEET_STORE_URL": str(tmp_path / "store")})
    from fleet.coord.localredis import LocalRedis

    with LocalRedis(tmp_path / "redis", persist=False) as redis_server:
        env["FLEET_BROKER_URL"] = redis_server.url
        run_ok("enqueue", "hf://datasets/org/prompts", "--job", "pin", "--columns", "id=uuid", env=env, cwd=tmp_path)
        # When main moves on (rows edited) and the job is enqueued again, naming no revision
        hub.commit("org/prompts", {"data/train-00001-of-00002.parquet": parquet_bytes(
            [{**sharegpt(i), "conversations": [{"from": "human", "value": "changed"}]} for i in range(5, 10)])})
        again = run_ok("enqueue", "hf://datasets/org/prompts", "--job", "pin", "--columns", "id=uuid", env=env,
                       cwd=tmp_path)
        # Then it read the commit it was pinned to: the same job, nothing new
        assert "enqueued 0" in again
        assert f"/resolve/{first}/data/train-00001-of-00002.parquet" in " ".join(hub.requests)
        # And naming main explicitly reads the new rows, which another job's input they are
        moved = run_fleet("enqueue", "hf://datasets/org/prompts", "--revision", "main", "--job", "pin",
                          "--columns", "id=uuid", env=env, cwd=tmp_path)
        assert moved.returncode != 0 and "the records differ" in " ".join(moved.stderr.split())
    # And an unknown dataset or revision is one line naming it
    for url, why in (("hf://datasets/org/nope", "no such dataset"),
                     ("hf://datasets/org/prompts@v9", "no such revision")):
        bad = run_fleet("validate", url, env=env, cwd=tmp_path)
        assert bad.returncode != 0 and why in bad.stderr and "Traceback" not in bad.stderr


def test_a_hub_job_whose_enqueue_died_before_its_manifest_reads_its_claims_commit(tmp_path, hub, clean_env):
    from fleet.producer.claim import claim_job, load_claim
    from fleet.producer.enqueue import job_identity, prepare_job
    from fleet.producer.source import local_input
    from fleet.settings import Settings
    from fleet.store.local import LocalStore

    # Given an enqueue of a Hub dataset's main that died after its claim, before its manifest
    first = hub_dataset(hub, [sharegpt(i) for i in range(10)])
    settings = Settings(chunk_size=4, input={"columns": {"id": "uuid"}})
    store = LocalStore(tmp_path / "store")
    with local_input("hf://datasets/org/prompts", settings.input) as fetched:
        claim_job(store, job_identity(settings, "pin", fetched.pinned, fetched.path))
    held = load_claim(store, "pin")
    assert held is not None and held.input == f"hf://datasets/org/prompts@{first}?split=train"
    # When main moves on (rows edited) and the job is enqueued again, naming no revision
    hub.commit("org/prompts", {"data/train-00001-of-00002.parquet": parquet_bytes(
        [{**sharegpt(i), "conversations": [{"from": "human", "value": "changed"}]} for i in range(5, 10)])})
    seen = len(hub.requests)
    manifest, created = prepare_job(settings, store, "hf://datasets/org/prompts", "pin")
    # Then it finished the job from the commit its claim pinned, not from main
    assert created and manifest.input == held.input and manifest.input_digest == held.input_digest
    assert f"GET /datasets/org/prompts/resolve/{first}/data/train-00001-of-00002.parquet" in hub.requests[seen:]
    # And an explicit --revision main is another input, refused against the claim's job
    moved = settings.model_copy(update={"input": settings.input.model_copy(update={"revision": "main"})})
    with pytest.raises(JobConflict, match="the records differ"):
        prepare_job(moved, LocalStore(tmp_path / "store"), "hf://datasets/org/prompts", "pin")


@pytest.mark.slow
def test_dataset_folders_read_as_their_rows(tmp_path, clean_env):
    import datasets

    # Given the same records saved by `datasets` (a DatasetDict), and as Hub-layout Parquet shards
    rows = [sharegpt(i) for i in range(12)]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list([sharegpt(99)])}).save_to_disk(str(saved))
    layout = tmp_path / "layout"
    (layout / "data").mkdir(parents=True)
    (layout / "data" / "train-00000-of-00002.parquet").write_bytes(parquet_bytes(rows[:7]))
    (layout / "data" / "train-00001-of-00002.parquet").write_bytes(parquet_bytes(rows[7:]))
    (layout / "data" / "test-00000-of-00001.parquet").write_bytes(parquet_bytes([sharegpt(99)]))
    # When each is validated with the column mapping, for its train and test splits
    for folder in (saved, layout):
        got = run_fleet("validate", str(folder), "--columns", "id=uuid", "--json", env=FAST_SIM)
        report = json.loads(got.stdout)
        assert got.returncode == 0 and report["records"] == 12, got.stdout + got.stderr
        test = json.loads(run_fleet("validate", str(folder), "--split", "test", "--columns", "id=uuid",
                                    "--json", env=FAST_SIM).stdout)
        assert test["records"] == 1
    # Then a split it lacks is named with those it has, and a bad row names its file and row
    missing = run_fleet("validate", str(layout), "--split", "dev", env=FAST_SIM)
    assert missing.returncode != 0 and "no data files for split 'dev'" in missing.stderr
    (layout / "data" / "train-00001-of-00002.parquet").write_bytes(parquet_bytes([*rows[7:], {"uuid": "x"}]))
    bad = run_fleet("validate", str(layout), "--columns", "id=uuid", env=FAST_SIM)
    text = " ".join(bad.stdout.split())
    assert bad.returncode == 1 and "data/train-00001-of-00002.parquet row 6: none of messages" in text, text


@pytest.mark.parametrize("tries, reads", [(3, True), (2, False)])
def test_a_hub_input_is_tried_again_as_often_as_the_store_client_setting_says(tmp_path, hub, clean_env, tries, reads):
    # Given a Hub dataset whose info the Hub fails to give twice (busy: 503), then gives
    hub_dataset(hub, [sharegpt(i) for i in range(6)])
    hub.fail("GET", r"/api/datasets/org/prompts(/revision/.*)?", times=2)
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1",
           "FLEET_STORE_CLIENT__MAX_ATTEMPTS": str(tries)}
    # When it is read with the fleet's store-client retry setting (as S3's and GCS's clients take it)
    out = run_fleet("validate", "hf://datasets/org/prompts", "--columns", "id=uuid", env=env, cwd=tmp_path)
    infos = [line for line in hub.requests if line.startswith("GET /api/datasets/org/prompts")]
    if reads:
        # Then 3 tries read it: the two failures were tried again
        assert out.returncode == 0, out.stderr
        assert len(infos) >= 3 and "try 2 of 3" in out.stderr
    else:
        # Then 2 tries meet two failures: one line naming the Hub's answer, no traceback
        assert out.returncode != 0 and len(infos) == 2
        assert "the Hub failed" in out.stderr and "503" in out.stderr and "Traceback" not in out.stderr
