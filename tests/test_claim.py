"""The job claim (fleet.producer.claim): one job name is one input and one configuration.

In process on a local store: the same identity joins, another is refused before writing
anything, a claimer that died before its manifest is completed by the next enqueue with
byte-identical chunks. Through `fleet enqueue` processes with a real redis-server: a
changed input is refused, and a lone surrogate is refused with its line, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.errors import InputError, JobConflict
from fleet.producer.claim import claim_job
from fleet.producer.digest import InputDigest
from fleet.producer.enqueue import job_identity, prepare_job
from fleet.producer.inputs import validate
from fleet.settings import Settings
from fleet.store.layout import chunk_key, claim_key, manifest_key
from fleet.store.local import LocalStore
from fleet.store.manifest import load_manifest
from tests.conftest import run_fleet
from tests.fleetproc import write_prompts

JOB = "job"


def objects(store: LocalStore) -> dict[str, bytes]:
    return {k: store.get(k) for k in store.list("")}


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    return write_prompts(tmp_path / "in.jsonl", 10)


def test_the_digest_covers_records_not_formatting(tmp_path: Path):
    def digest(text: str) -> str:
        path = tmp_path / "d.jsonl"
        path.write_text(text)
        d = InputDigest()
        validate(path, on_record=d.update)
        return d.hexdigest()

    base = digest('{"id": "a", "prompt": "hi"}\n')
    assert digest('{"prompt":"hi","id":"a"}\n') == base
    assert digest('{"id": "a", "prompt": "hi!"}\n') != base
    assert base.startswith("blake2b-256:")


def test_same_identity_joins_and_another_is_refused(tmp_path: Path, prompts: Path, clean_env):
    store = LocalStore(tmp_path / "store")
    mine = job_identity(Settings(chunk_size=4), JOB, str(prompts), prompts)
    assert claim_job(store, mine) is True
    assert claim_job(store, mine.model_copy(update={"input": "copy.jsonl"})) is False
    other = job_identity(Settings(chunk_size=3), JOB, str(prompts), prompts)
    with pytest.raises(JobConflict) as e:
        claim_job(store, other)
    assert "chunk_size: 4 -> 3" in str(e.value) and "another --job name" in str(e.value)
    assert list(store.list("")) == [claim_key(JOB)]


def test_a_claim_of_another_identity_refuses_before_any_chunk(tmp_path: Path, prompts: Path, clean_env):
    # Given a claimer of chunk size 4 that has not written its manifest (running or dead)
    store = LocalStore(tmp_path / "store")
    claim_job(store, job_identity(Settings(chunk_size=4), JOB, str(prompts), prompts))
    before = objects(store)
    # When an enqueue with chunk size 3 comes
    with pytest.raises(JobConflict, match="no manifest yet"):
        prepare_job(Settings(chunk_size=3), store, str(prompts), JOB)
    # Then it wrote nothing
    assert objects(store) == before


def test_a_dead_claimers_job_is_finished_by_the_next_enqueue(tmp_path: Path, prompts: Path, clean_env):
    settings = Settings(chunk_size=4)
    reference = LocalStore(tmp_path / "reference")
    prepare_job(settings, reference, str(prompts), JOB)
    # Given a claimer that died after the claim and one chunk, before the manifest
    store = LocalStore(tmp_path / "store")
    claim_job(store, job_identity(settings, JOB, str(prompts), prompts))
    store.put(chunk_key(JOB, 0), reference.get(chunk_key(JOB, 0)))
    # When the same job is enqueued again
    manifest, created = prepare_job(settings, store, str(prompts), JOB)
    # Then it completes the job: same chunks byte for byte, the manifest last
    assert created and manifest.chunks == 3 and manifest.records == 10
    for i in range(3):
        assert store.get(chunk_key(JOB, i)) == reference.get(chunk_key(JOB, i))
    assert manifest.input_digest == load_manifest(reference, JOB).input_digest


def test_the_manifest_records_input_digest_and_engine_identity(tmp_path: Path, prompts: Path, clean_env):
    store = LocalStore(tmp_path / "store")
    manifest, _ = prepare_job(Settings(chunk_size=4), store, str(prompts), JOB)
    stored = json.loads(store.get(manifest_key(JOB)))
    assert stored["input_digest"] == manifest.input_digest and manifest.input_digest.startswith("blake2b")
    assert stored["engine_identity"] == {"engine": "sim", "sim": {"mean_output_tokens": 256.0, "sigma": 0.8,
                                                                  "vocab_size": 151_936, "tokens": 2}}
    assert stored["engine_identity_hash"]


def test_a_changed_input_is_refused_in_process(tmp_path: Path, prompts: Path, clean_env):
    store = LocalStore(tmp_path / "store")
    prepare_job(Settings(chunk_size=4), store, str(prompts), JOB)
    before = objects(store)
    write_prompts(prompts, 11)
    with pytest.raises(JobConflict, match="the records differ"):
        prepare_job(Settings(chunk_size=4), store, str(prompts), JOB)
    assert objects(store) == before


def test_a_surrogate_is_refused_before_any_write_in_process(tmp_path: Path, clean_env):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "prompt": "ok"}\n{"id": "b", "prompt": "bad \\ud800 here"}\n')
    store = LocalStore(tmp_path / "store")
    with pytest.raises(InputError, match=r"line 2: prompt: lone surrogate \\ud800"):
        prepare_job(Settings(chunk_size=1), store, str(path), JOB)
    assert list(store.list("")) == []


# -- through `fleet enqueue` processes ---------------------------------------------------


def enqueue_env(redis_server, store: Path) -> dict[str, str]:
    return {"FLEET_ENGINE": "sim", "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(store),
            "FLEET_CHUNK_SIZE": "4"}


@pytest.mark.slow
def test_fleet_enqueue_refuses_a_changed_input(tmp_path: Path, prompts: Path, redis_server, clean_env):
    env = enqueue_env(redis_server, tmp_path / "store")
    first = run_fleet("enqueue", str(prompts), "--job", JOB, env=env)
    assert first.returncode == 0, first.stderr
    store = LocalStore(tmp_path / "store")
    before = objects(store)
    # Given the same file with one more record
    write_prompts(prompts, 11)
    again = run_fleet("enqueue", str(prompts), "--job", JOB, env=env)
    # Then the enqueue fails, says why and how to start a new job, and changed nothing
    assert again.returncode != 0
    assert "the records differ" in again.stderr and "another --job name" in again.stderr
    assert "Traceback" not in again.stderr
    assert objects(store) == before


@pytest.mark.slow
def test_fleet_enqueue_refuses_a_surrogate_with_its_line(tmp_path: Path, redis_server, clean_env):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"id": f"r{i}", "prompt": f"p{i}"}) for i in range(6)]
    lines[4] = '{"id": "r4", "messages": [{"role": "user", "content": "x\\udc80y"}]}'
    path.write_text("\n".join(lines) + "\n")
    env = {**enqueue_env(redis_server, tmp_path / "store"), "FLEET_CHUNK_SIZE": "1"}
    out = run_fleet("enqueue", str(path), "--job", JOB, env=env)
    assert out.returncode != 0
    assert "line 5: messages[0].content: lone surrogate \\udc80" in out.stderr
    assert "Traceback" not in out.stderr
    assert list(LocalStore(tmp_path / "store").list("")) == []


def test_an_unreadable_claim_is_refused_without_a_traceback(tmp_path: Path, prompts: Path, clean_env):
    store = LocalStore(tmp_path / "store")
    store.put(claim_key(JOB), b'{"job": "job", "from": "a future fleet"}')
    with pytest.raises(JobConflict, match="cannot read"):
        prepare_job(Settings(chunk_size=4), store, str(prompts), JOB)
    assert list(store.list("")) == [claim_key(JOB)]


def test_an_input_edited_while_it_is_enqueued_writes_no_manifest(tmp_path: Path, prompts: Path, clean_env,
                                                                  monkeypatch: pytest.MonkeyPatch):
    import fleet.producer.enqueue as enqueue

    # Given an input rewritten right after it was validated (the file is read twice)
    def validate_then_edit(path: Path, **kw):
        n = validate(path, **kw)
        write_prompts(path, 10, prefix="edited")
        return n

    monkeypatch.setattr(enqueue, "validate", validate_then_edit)
    store = LocalStore(tmp_path / "store")
    # When it is enqueued, Then it is refused, and no manifest says the job exists
    with pytest.raises(InputError, match="changed while it was enqueued"):
        prepare_job(Settings(chunk_size=4), store, str(prompts), JOB)
    assert load_manifest(store, JOB) is None
