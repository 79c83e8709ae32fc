"""The job manifest (docs/architecture.md, Store layout): a stable hash of what shapes the output, and a refusal
that names every differing setting when a job name is reused with another configuration."""

from __future__ import annotations

import hashlib
import json

import pytest

from fleet.errors import ConfigError, JobConflict, ObjectMissing
from fleet.settings import Settings
from fleet.store.layout import manifest_key
from fleet.store.local import LocalStore
from fleet.store.manifest import (
    Manifest,
    check_compatible,
    config_diff,
    config_hash,
    flatten,
    load_manifest,
    require_manifest,
)

CONFIG = {
    "engine": "sim",
    "chunk_size": 256,
    "seed": 0,
    "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 2048, "n": 1, "stop": None},
    "model": {"name": "sim", "mean_output_tokens": 256.0, "sigma": 0.8},
    "enable_thinking": True,
}


def manifest_for(config: dict, job: str = "j") -> Manifest:
    return Manifest(
        job=job,
        input="in.jsonl",
        chunk_size=256,
        chunks=3,
        records=700,
        samples=700,
        config=config,
        config_hash=config_hash(config),
    )


def reordered(d: dict) -> dict:
    return {k: reordered(v) if isinstance(v, dict) else v for k, v in reversed(list(d.items()))}


def test_config_hash_is_stable_across_key_order():
    # Given the same configuration built in another key order, nested dicts included
    other = reordered(CONFIG)
    assert list(other) != list(CONFIG)
    # Then the hashes are equal and a sha256 hex digest
    assert config_hash(other) == config_hash(CONFIG)
    assert len(config_hash(CONFIG)) == 64 and int(config_hash(CONFIG), 16) >= 0


def test_config_hash_is_sha256_of_canonical_json():
    # A stored manifest must keep matching after a restart: the hash depends on content only
    canonical = '{"a":{"x":null,"y":[1,2]},"b":1}'
    expected = hashlib.sha256(canonical.encode()).hexdigest()
    assert config_hash({"b": 1, "a": {"y": [1, 2], "x": None}}) == expected


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 1},
        {"chunk_size": 512},
        {"sampling": {**CONFIG["sampling"], "temperature": 0.7}},
        {"sampling": {**CONFIG["sampling"], "stop": ["</s>"]}},
        {"model": {**CONFIG["model"], "sigma": 1.0}},
        {"enable_thinking": False},
    ],
)
def test_config_hash_changes_with_any_output_shaping_value(change):
    assert config_hash({**CONFIG, **change}) != config_hash(CONFIG)


def test_config_hash_distinguishes_a_missing_key_from_null():
    assert config_hash({"a": None}) != config_hash({})


def test_flatten_names_nested_keys_with_dots():
    assert flatten({"a": 1, "b": {"c": 2, "d": {"e": 3}}}) == {"a": 1, "b.c": 2, "b.d.e": 3}


def test_config_diff_names_nested_keys():
    # Given a stored config and a new one differing in a nested, a top-level and a new key
    new = json.loads(json.dumps(CONFIG))
    new["sampling"]["temperature"] = 1.0
    new["model"]["sigma"] = 1.2
    new["seed"] = 9
    new["extra"] = {"k": "v"}
    # When diffed
    diff = config_diff(CONFIG, new)
    # Then each difference is one line, named by its dotted path, old -> new, sorted
    assert diff == [
        "extra.k: None -> 'v'",
        "model.sigma: 0.8 -> 1.2",
        "sampling.temperature: 0.6 -> 1.0",
        "seed: 0 -> 9",
    ]


def test_config_diff_of_equal_configs_is_empty():
    assert config_diff(CONFIG, reordered(CONFIG)) == []


def test_check_compatible_accepts_the_same_config_in_any_order():
    check_compatible(manifest_for(CONFIG), reordered(CONFIG))


def test_check_compatible_raises_job_conflict_naming_differences():
    # Given a job created with one configuration
    existing = manifest_for(CONFIG, job="math-v1")
    new = json.loads(json.dumps(CONFIG))
    new["sampling"]["max_tokens"] = 4096
    new["chunk_size"] = 64
    # When the same job name is enqueued with another
    with pytest.raises(JobConflict) as info:
        check_compatible(existing, new)
    # Then the refusal is a ConfigError that names the job and every differing setting
    err = info.value
    assert isinstance(err, ConfigError)
    text = str(err)
    assert "'math-v1'" in text
    assert "sampling.max_tokens: 2048 -> 4096" in text
    assert "chunk_size: 256 -> 64" in text
    assert "seed" not in text


def test_check_compatible_with_real_job_configs():
    # Given job configs from Settings through the engine registry
    from fleet.engines.specs import job_config

    a = job_config(Settings(engine="sim", chunk_size=64))
    b = job_config(Settings(engine="sim", chunk_size=64, sim={"sigma": 1.5, "step_s": 0.9}))
    c = job_config(Settings(engine="sim", chunk_size=64, sim={"step_s": 0.9, "max_running": 3}))
    existing = manifest_for(a)
    # Then the output-shaping sim sigma is refused, the speed-only step_s and slots are not
    with pytest.raises(JobConflict, match="model.sigma"):
        check_compatible(existing, b)
    check_compatible(existing, c)


def test_check_compatible_refuses_other_repetition_stops():
    # Given a job enqueued with the default repetition stop
    from fleet.engines.specs import job_config

    existing = manifest_for(job_config(Settings(engine="sim")))
    # When it is enqueued again with other thresholds, or with the stop off
    with pytest.raises(JobConflict) as thresholds:
        check_compatible(existing, job_config(Settings(engine="sim", repetition={"min_tokens": 1024})))
    with pytest.raises(JobConflict) as off:
        check_compatible(existing, job_config(Settings(engine="sim", repetition={"enabled": False})))
    # Then both are another configuration, named by the setting that differs
    assert "repetition.min_tokens: 512 -> 1024" in str(thresholds.value)
    assert "repetition.enabled: True -> None" in str(off.value)
    # while the same stop joins, and off joins a job made before the stop existed
    check_compatible(existing, job_config(Settings(engine="sim", repetition={"min_tokens": 512})))
    before = {k: v for k, v in existing.config.items() if k != "repetition"}
    check_compatible(manifest_for(before), job_config(Settings(engine="sim", repetition={"enabled": False})))


def test_manifest_round_trip_through_a_store(tmp_path):
    # Given a manifest written to a store
    store = LocalStore(tmp_path)
    m = manifest_for(CONFIG, job="j1")
    store.put(manifest_key("j1"), m.to_bytes())
    # When it is loaded
    loaded = load_manifest(store, "j1")
    # Then it is equal, and its bytes are readable JSON
    assert loaded == m
    assert (
        json.loads((tmp_path / "j1" / "manifest.json").read_text())["config_hash"] == m.config_hash
    )


def test_missing_manifest(tmp_path):
    store = LocalStore(tmp_path)
    assert load_manifest(store, "nope") is None
    with pytest.raises(ObjectMissing, match="fleet enqueue"):
        require_manifest(store, "nope")
