"""Engine identity (fleet.engines.identity): what a worker must share with a job to run it, the
differing fields when it does not, checkpoints stamped with it, and the mismatched
workers `fleet status` lists (real redis-server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from fleet.coord.mismatch import clear_mismatch, mismatched_workers, record_mismatch
from fleet.engines.identity import config_mismatch, engine_identity, identity_hash
from fleet.monitor.status import job_status
from fleet.settings import Settings
from fleet.store.checkpoints import checkpoint_hash, decode_checkpoint, encode_checkpoint
from fleet.store.layout import encode_lines, manifest_key
from fleet.store.local import LocalStore
from fleet.store.manifest import Manifest, config_hash
from tests.conftest import run_fleet
from tests.modelkit import tiny_model_fixture  # noqa: F401

ROWS = [{"id": "a", "sample": 0, "output": "x"}, {"id": "b", "sample": 0, "output": "y"}]


def manifest_with(identity: dict | None, job: str = "j") -> Manifest:
    config = {"engine": "sim", "seed": 0}
    return Manifest(
        job=job, input="in.jsonl", chunk_size=4, chunks=1, records=2, samples=2, config=config,
        config_hash=config_hash(config), engine_identity=identity,
        engine_identity_hash=identity_hash(identity) if identity is not None else None,
    )


# -- engine_identity / config_mismatch ---------------------------------------------------


def test_sim_identity_holds_output_shaping_fields_only(clean_env):
    base = engine_identity(Settings(engine="sim"))
    # Speed and fault-test switches do not change tokens: same identity.
    assert engine_identity(Settings(engine="sim", sim={"max_running": 3, "step_s": 0.1})) == base
    assert engine_identity(Settings(engine="sim", sim={"fail_ids": ["x"]})) == base
    # The length distribution does.
    other = engine_identity(Settings(engine="sim", sim={"mean_output_tokens": 300}))
    assert identity_hash(other) != identity_hash(base)


def test_a_matching_worker_has_no_mismatch(clean_env):
    settings = Settings(engine="sim")
    assert config_mismatch(settings, manifest_with(engine_identity(settings))) is None


def test_a_mismatch_names_every_differing_field(clean_env):
    job = manifest_with(engine_identity(Settings(engine="sim", sim={"mean_output_tokens": 20})))
    diff = config_mismatch(Settings(engine="sim", sim={"mean_output_tokens": 300, "sigma": 0.1}), job)
    assert diff == ["sim.mean_output_tokens: 20.0 -> 300.0", "sim.sigma: 0.8 -> 0.1"]


def test_an_identity_dict_is_compared_like_settings(clean_env):
    job = manifest_with(engine_identity(Settings(engine="sim")))
    mine = engine_identity(Settings(engine="sim", sim={"sigma": 0.2}))
    assert config_mismatch(mine, job) == ["sim.sigma: 0.8 -> 0.2"]


def test_an_old_manifest_without_identity_is_not_judged(clean_env):
    assert config_mismatch(Settings(engine="sim", sim={"sigma": 0.1}), manifest_with(None)) is None


@pytest.mark.slow
def test_another_engine_is_a_mismatch(clean_env, tiny_model: Path):
    job = manifest_with(engine_identity(Settings(engine="sim")))
    diff = config_mismatch(Settings(engine="hf", model=str(tiny_model)), job)
    assert diff is not None and "engine: 'sim' -> 'hf'" in diff


def test_hf_identity_is_the_model_revision_not_its_path(clean_env, tiny_model: Path, tmp_path: Path):
    import shutil

    copy = tmp_path / "elsewhere" / "another-name"
    shutil.copytree(tiny_model, copy)
    a = engine_identity(Settings(engine="hf", model=str(tiny_model)))
    b = engine_identity(Settings(engine="hf", model=str(copy)))
    assert a == b and a["model"]["revision"]
    # Another context length changes what the engine can produce.
    c = engine_identity(Settings(engine="hf", model=str(tiny_model), hf={"context_length": 64}))
    assert config_mismatch(c, manifest_with(a)) == ["hf.context_length: None -> 64"]


def test_sglang_identity_keeps_dtype_and_kwargs_but_not_memory_knobs(clean_env, tiny_model: Path):
    base = Settings(engine="sglang", model=str(tiny_model))
    ident = engine_identity(base)
    assert ident["sglang"]["dtype"] == "bfloat16"
    faster = Settings(engine="sglang", model=str(tiny_model),
                      sglang={"mem_fraction_static": 0.5, "max_running_requests": 8,
                              "engine_kwargs": {"cuda_graph_max_bs": 4}})
    assert engine_identity(faster) == ident
    other = Settings(engine="sglang", model=str(tiny_model),
                     sglang={"dtype": "float16", "context_length": 4096,
                             "engine_kwargs": {"attention_backend": "triton"}})
    diff = config_mismatch(other, manifest_with(ident))
    assert diff == [
        "sglang.context_length: None -> 4096",
        "sglang.dtype: 'bfloat16' -> 'float16'",
        "sglang.engine_kwargs.attention_backend: None -> 'triton'",
    ]


# -- checkpoints -------------------------------------------------------------------------


def test_a_checkpoint_is_read_back_under_its_own_hash():
    data = encode_checkpoint(ROWS, "h1")
    assert checkpoint_hash(data, "k") == "h1"
    assert decode_checkpoint(data, "k", "h1") == ROWS


def test_a_checkpoint_of_another_configuration_is_ignored():
    assert decode_checkpoint(encode_checkpoint(ROWS, "h1"), "k", "h2") is None


def test_an_unstamped_checkpoint_is_ignored():
    # Written before checkpoints carried a hash: its configuration is unknown.
    old = encode_lines(ROWS)
    assert checkpoint_hash(old, "k") is None
    assert decode_checkpoint(old, "k", "h1") is None


def test_an_empty_stamped_checkpoint_has_no_rows():
    assert decode_checkpoint(encode_checkpoint([], "h1"), "k", "h1") == []


# -- mismatched workers in Redis and in `fleet status` ------------------------------------


@pytest.fixture
def r(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def test_mismatches_are_listed_per_job_and_cleared(r):
    record_mismatch(r, "gpu1@b", "j", "h-b", ["sim.sigma: 0.8 -> 0.1"])
    record_mismatch(r, "gpu0@a", "other", "h-a", ["engine: 'sim' -> 'hf'"])
    assert [m["worker"] for m in mismatched_workers(r)] == ["gpu0@a", "gpu1@b"]
    (only,) = mismatched_workers(r, "j")
    assert only["differences"] == ["sim.sigma: 0.8 -> 0.1"] and only["identity_hash"] == "h-b"
    clear_mismatch(r, "gpu1@b")
    assert mismatched_workers(r, "j") == []


@pytest.mark.slow
def test_status_lists_mismatched_workers(r, tmp_path: Path, redis_server, clean_env):
    store = LocalStore(tmp_path / "store")
    store.put(manifest_key("j"), manifest_with(engine_identity(Settings(engine="sim"))).to_bytes())
    record_mismatch(r, "gpu1@b", "j", "h-b", ["sim.sigma: 0.8 -> 0.1"])
    st = job_status(store, r, "j")
    assert [m["worker"] for m in st.mismatched_workers] == ["gpu1@b"]
    # And the CLI shows it, in JSON and in the table.
    env = {"FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store")}
    out = run_fleet("status", "--job", "j", "--json", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)["mismatched_workers"]
    assert listed[0]["worker"] == "gpu1@b" and listed[0]["differences"] == ["sim.sigma: 0.8 -> 0.1"]
    table = run_fleet("status", "--job", "j", env={**env, "COLUMNS": "200"}, timeout=120)
    assert table.returncode == 0, table.stderr
    shown = table.stdout + table.stderr  # rich writes the table to stderr
    assert "mismatched gpu1@b" in shown and "sim.sigma: 0.8 -> 0.1" in shown


def test_an_int_default_and_the_same_value_parsed_from_the_environment_are_one_identity():
    # Given the producer's default (an unvalidated int) and a worker's env-parsed float of the same value
    from fleet.engines.identity import identity_hash

    produced = {"engine": "sim", "sim": {"mean_output_tokens": 256, "sigma": 0.8}}
    parsed = {"engine": "sim", "sim": {"mean_output_tokens": 256.0, "sigma": 0.8}}
    # Then they hash alike, and a real difference still differs
    assert identity_hash(produced) == identity_hash(parsed)
    assert identity_hash(produced) != identity_hash({"engine": "sim", "sim": {"mean_output_tokens": 257, "sigma": 0.8}})
