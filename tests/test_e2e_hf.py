"""Real generation end to end on a CPU: `fleet run --engine hf` with the tiny model,
through a local Redis and real worker processes; run-time bad input fails alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.store import open_store
from fleet.store.layout import chunk_key, results_prefix
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, Workers, read_jsonl, wait_for, write_prompts
from tests.modelkit import tiny_model_fixture  # noqa: F401

pytestmark = pytest.mark.e2e


def test_fleet_run_hf_generates_real_tokens(tmp_path: Path, tiny_model: Path, clean_env):
    # Given chat, raw and OpenAI-batch prompts, one asking for two samples
    prompts = tmp_path / "p.jsonl"
    lines = [
        {"id": "chat", "messages": [{"role": "user", "content": "Explain binary search."}]},
        {"id": "raw", "prompt": "def fibonacci(n):"},
        {"custom_id": "batch", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}},
        {"id": "two", "messages": [{"role": "user", "content": "Pick a word."}], "sampling": {"n": 2}},
    ] + [{"id": f"x{i}", "messages": [{"role": "user", "content": f"Say {i}."}]} for i in range(8)]
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = {"FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_RETURN_OUTPUT_IDS": "true"}
    # When it runs with the hf engine
    run = run_fleet("run", str(prompts), "--job", "hf", "--engine", "hf", "--model", str(tiny_model),
                    "--chunk-size", "4", "--max-tokens", "24", env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "o.jsonl"
    assert run_fleet("export", "--job", "hf", "--out", str(out), env=env).returncode == 0
    rows = read_jsonl(out)
    # Then every sample has real token ids within its max_tokens, in input order
    assert [(r["id"], r["sample"]) for r in rows][:5] == [("chat", 0), ("raw", 0), ("batch", 0), ("two", 0), ("two", 1)]
    assert len(rows) == 13
    for r in rows:
        assert r["output_ids"] and r["completion_tokens"] == len(r["output_ids"])
        assert r["completion_tokens"] <= (8 if r["id"] == "batch" else 24)
        assert r["finish_reason"] in ("stop", "length") and r["prompt_tokens"] > 0
    # And the manifest holds the sampling values read from generation_config.json
    manifest = json.loads((tmp_path / "data" / "store" / "hf" / "manifest.json").read_text())
    sampling = manifest["config"]["sampling"]
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (1.0, 20, 0.95)
    assert manifest["config"]["model"]["chat_template_sha256"]


def test_rejected_record_fails_alone_and_corrupt_chunk_is_quarantined(tmp_path, redis_server, clean_env):
    # Given a job where the engine rejects one record and one chunk object is corrupt
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    store_url = str(tmp_path / "store")
    env = {**FAST_SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_CHUNK_SIZE": "4", "FLEET_SIM__FAIL_IDS": '["r00005"]'}
    assert run_fleet("enqueue", str(prompts), "--job", "bad", env=env).returncode == 0
    store = open_store(store_url)
    store.put(chunk_key("bad", 2), b"\x28\xb5\x2f\xfd garbage")
    workers = Workers(env, tmp_path / "logs")
    workers.start("h")
    try:
        # When the workers run it
        wait_for(lambda: len(list(store.list(results_prefix("bad")))) == 3 and store.exists("bad/failed/000002.json"),
                 60, "three results and one quarantined chunk")
    finally:
        workers.stop()
    # Then the corrupt chunk is quarantined at once with a clear error
    failure = json.loads(store.get("bad/failed/000002.json"))
    assert failure["error_type"] == "ChunkCorrupt" and failure["attempts"] == 1
    assert "bad/chunks/000002" in failure["error"]
    # And the rejected record is an error record while the rest of its chunk is generated
    rows = read_jsonl_export(env, tmp_path)
    bad = [r for r in rows if r["id"] == "r00005"][0]
    assert bad["finish_reason"] == "error" and "fail_ids" in bad["error"]
    assert all(r["finish_reason"] != "error" for r in rows if r["id"] != "r00005")
    assert len(rows) == 12


def read_jsonl_export(env: dict[str, str], tmp_path: Path) -> list[dict]:
    out = tmp_path / "partial.jsonl"
    res = run_fleet("export", "--job", "bad", "--out", str(out), "--allow-incomplete", env=env)
    assert res.returncode == 0, res.stderr
    return read_jsonl(out)
