"""Settings (docs/architecture.md, Settings): FLEET_ env with nested `__`, fleet.toml or FLEET_CONFIG,
init kwargs on top, K derived from the engine's slots and the chunk size, and a to_env()
that rebuilds the same settings in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, Field, ValidationError

from fleet.coord.leaseclock import LeaseClock
from fleet.settings import IN_FLIGHT_FACTOR, Settings, load_settings

pytestmark = pytest.mark.usefixtures("clean_env")


def write_toml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- sources -----------------------------------------------------------------------------


def test_defaults_without_any_source():
    # Given no FLEET_* variable and no fleet.toml in the cwd
    # When settings are built
    s = Settings()
    # Then the documented defaults apply
    assert (s.engine, s.chunk_size, s.lease.ttl_s, s.broker_url) == ("sim", 256, 60.0, None)
    assert s.resolved_store_url == str(Path("fleet-data") / "store")


def test_env_prefix_sets_top_level_fields(monkeypatch):
    # Given FLEET_ variables for the contract's names
    monkeypatch.setenv("FLEET_CHUNK_SIZE", "64")
    monkeypatch.setenv("FLEET_ENGINE", "hf")
    monkeypatch.setenv("FLEET_BROKER_URL", "redis://:pw@10.0.0.1:6380/2")
    monkeypatch.setenv("FLEET_STORE_URL", "s3://bucket/prefix")
    monkeypatch.setenv("FLEET_SLOTS", "5")
    monkeypatch.setenv("FLEET_LEASE_TTL_S", "7.5")
    monkeypatch.setenv("FLEET_MODEL", "/models/q")
    # When settings are built
    s = Settings()
    # Then each lands in its field with its type
    assert s.chunk_size == 64 and s.engine == "hf" and s.slots == 5 and s.lease.ttl_s == 7.5
    assert s.broker_url == "redis://:pw@10.0.0.1:6380/2"
    assert s.resolved_store_url == "s3://bucket/prefix"
    assert s.model == "/models/q"


def test_sections_are_set_by_their_own_names_and_the_old_flat_ones(monkeypatch, tmp_path):
    # Given a section's own variables, and the flat names of before sections for others
    monkeypatch.setenv("FLEET_FAILURE__MAX_ATTEMPTS", "7")
    monkeypatch.setenv("FLEET_STORE_CLIENT__MAX_ATTEMPTS", "4")
    monkeypatch.setenv("FLEET_LEASE_TTL_S", "8")
    monkeypatch.setenv("FLEET_SPOOL_MAX_MB", "12")
    write_toml(tmp_path / "fleet.toml", "bench_after = 9\n[monitor]\nflower_port = 6000\n")
    # When settings are built (a flat keyword too, as old callers pass them)
    s = Settings(metrics_port=9500)
    # Then each lands in its section
    assert (s.failure.max_attempts, s.store_client.max_attempts, s.lease.ttl_s, s.spool.max_mb) == (7, 4, 8, 12)
    assert (s.failure.bench_after, s.monitor.flower_port, s.monitor.metrics_port) == (9, 6000, 9500)
    # And a section's own variable goes over the old flat one, as the flag over both
    monkeypatch.setenv("FLEET_LEASE__TTL_S", "9")
    assert Settings().lease.ttl_s == 9 and Settings(lease_ttl_s=3).lease.ttl_s == 3
    # And a child process gets the sections' names
    env = Settings().to_env()
    assert env["FLEET_LEASE__TTL_S"] == "9.0" and "FLEET_LEASE_TTL_S" not in env


def test_env_without_prefix_is_ignored(monkeypatch):
    monkeypatch.setenv("CHUNK_SIZE", "3")
    assert Settings().chunk_size == 256


def test_nested_env_with_double_underscore(monkeypatch):
    # Given the sim engine's nested variables
    monkeypatch.setenv("FLEET_SIM__STEP_S", "0.01")
    monkeypatch.setenv("FLEET_SIM__MAX_RUNNING", "16")
    monkeypatch.setenv("FLEET_SIM__PREFILL_S", "0.2")
    monkeypatch.setenv("FLEET_SIM__MEAN_OUTPUT_TOKENS", "200")
    monkeypatch.setenv("FLEET_SIM__SIGMA", "1.0")
    monkeypatch.setenv("FLEET_SIM__FAIL_IDS", '["a", "b"]')
    monkeypatch.setenv("FLEET_SAMPLING__MAX_TOKENS", "99")
    # When settings are built
    s = Settings()
    # Then the nested models carry them, the other nested defaults stay
    assert (s.sim.step_s, s.sim.max_running, s.sim.prefill_s) == (0.01, 16, 0.2)
    assert (s.sim.mean_output_tokens, s.sim.sigma, s.sim.fail_ids) == (200, 1.0, ["a", "b"])
    assert s.sampling.max_tokens == 99 and s.sampling.n == 1
    assert s.sim.fault_chunks == []


def test_fleet_toml_in_cwd(tmp_path):
    # Given a fleet.toml in the working directory (clean_env chdirs to tmp_path)
    write_toml(tmp_path / "fleet.toml", 'chunk_size = 17\nqueue = "q1"\n[sim]\nmax_running = 9\n')
    # When settings are built
    s = Settings()
    # Then its values apply, nested tables included
    assert (s.chunk_size, s.queue, s.sim.max_running) == (17, "q1", 9)


def test_fleet_config_points_at_another_file(tmp_path, monkeypatch):
    # Given a fleet.toml in the cwd and another file named by FLEET_CONFIG
    write_toml(tmp_path / "fleet.toml", "chunk_size = 17\n")
    (tmp_path / "elsewhere").mkdir()
    other = write_toml(tmp_path / "elsewhere" / "prod.toml", "chunk_size = 33\nseed = 5\n")
    monkeypatch.setenv("FLEET_CONFIG", str(other))
    # When settings are built
    s = Settings()
    # Then the named file is read instead of the cwd's
    assert (s.chunk_size, s.seed) == (33, 5)


def test_fleet_config_naming_a_missing_file_means_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_CONFIG", str(tmp_path / "nope.toml"))
    assert Settings().chunk_size == 256


def test_env_overrides_toml_and_nested_sources_merge(tmp_path, monkeypatch):
    # Given a toml with a sim table and env setting another sim field and one toml field
    write_toml(tmp_path / "fleet.toml", "chunk_size = 17\n[sim]\nmax_running = 9\nstep_s = 0.5\n")
    monkeypatch.setenv("FLEET_CHUNK_SIZE", "18")
    monkeypatch.setenv("FLEET_SIM__STEP_S", "0.25")
    # When settings are built
    s = Settings()
    # Then env wins where both speak, and the toml's other nested field survives
    assert s.chunk_size == 18
    assert s.sim.step_s == 0.25
    assert s.sim.max_running == 9


def test_init_kwargs_override_env_and_toml(tmp_path, monkeypatch):
    # Given toml and env both setting chunk_size
    write_toml(tmp_path / "fleet.toml", "chunk_size = 17\n")
    monkeypatch.setenv("FLEET_CHUNK_SIZE", "18")
    monkeypatch.setenv("FLEET_ENGINE", "hf")
    # When a CLI flag (init kwarg) sets it too
    s = Settings(chunk_size=19)
    # Then the flag wins, and env still supplies what the flag did not set
    assert s.chunk_size == 19
    assert s.engine == "hf"


def test_load_settings_drops_unset_flags(monkeypatch):
    # Given env setting chunk_size and a CLI that passes None for flags the user left out
    monkeypatch.setenv("FLEET_CHUNK_SIZE", "18")
    # When load_settings gets None for chunk_size and a value for seed
    s = load_settings(chunk_size=None, seed=7)
    # Then None does not erase the env value
    assert (s.chunk_size, s.seed) == (18, 7)


# -- derived values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_running", "chunk", "max_slots", "expected"),
    [
        (256, 256, 32, 16),  # 16 x 256 / 256
        (256, 512, 32, 8),
        (256, 1024, 32, 4),
        (256, 100, 64, 41),  # ceil(40.96)
        (16, 64, 32, 4),
        (256, 16, 32, 32),  # 256 bounded by max_slots
        (256, 16, 50, 50),
        (4, 10_000, 32, 1),  # ceil(0.0064) -> at least 1
    ],
)
def test_resolved_slots_derivation(max_running, chunk, max_slots, expected):
    # Given the sim engine with S slots, a chunk size C and a bound
    s = Settings(sim={"max_running": max_running}, chunk_size=chunk, max_slots=max_slots)
    # When K is derived
    k = s.resolved_slots()
    # Then K = min(max_slots, ceil(16 S / C)), at least 1
    assert k == expected
    assert IN_FLIGHT_FACTOR == 16


def test_resolved_slots_explicit_and_chunk_argument():
    # Given an explicit K, it is used as is, even above max_slots
    assert Settings(slots=3).resolved_slots() == 3
    assert Settings(slots=40, max_slots=8).resolved_slots() == 40
    # Given no K, a chunk size argument (the manifest's) overrides the settings' one
    s = Settings(sim={"max_running": 256}, chunk_size=256)
    assert s.resolved_slots(chunk_size=1024) == 4
    # And the factor is a setting
    assert Settings(sim={"max_running": 256}, chunk_size=512, in_flight_factor=8).resolved_slots() == 4


@pytest.mark.parametrize(
    ("engine", "kwargs", "expected_s"),
    [
        ("sim", {"sim": {"max_running": 64}}, 64),
        ("hf", {"hf": {"max_batch": 8}}, 8),
        ("sglang", {"sglang": {"max_running_requests": 128}}, 128),
    ],
)
def test_engine_max_running_follows_engine(engine, kwargs, expected_s):
    s = Settings(engine=engine, chunk_size=64, **kwargs)
    assert s.engine_max_running == expected_s
    assert s.resolved_slots() == min(32, -(-16 * expected_s // 64))


def test_heartbeat_is_a_quarter_of_the_ttl_between_a_floor_and_a_ceiling():
    assert LeaseClock.of(Settings(lease_ttl_s=60)).beat_s == 2  # the lease beat dates a lost worker to 2 s
    assert LeaseClock.of(Settings(lease_ttl_s=4)).beat_s == 1
    assert LeaseClock.of(Settings(lease_ttl_s=0.4)).beat_s == 0.2


# -- to_env round trip -------------------------------------------------------------------


CHILD = "from fleet.settings import Settings; print(Settings().model_dump_json())"


def child_settings(env_vars: dict[str, str], cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(env_vars)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_to_env_rebuilds_the_same_settings_in_a_child(tmp_path):
    # Given settings far from the defaults, lists, dicts, bools, paths and floats included
    s = Settings(
        broker_url="redis://:secret@127.0.0.1:6399/3",
        store_url="s3://b/p",
        data_dir=tmp_path / "data",
        engine="hf",
        model="/m/q",
        chunk_size=77,
        slots=3,
        seed=11,
        enable_thinking=False,
        return_output_ids=False,
        queue="jobs-a",
        lease_ttl_s=2.5,
        flower_basic_auth="u:p",
        sampling={
            "temperature": 0.6,
            "top_p": 0.95,
            "max_tokens": 123,
            "n": 2,
            "stop": ["</s>", "x y"],
        },
        sim={"max_running": 7, "step_s": 0.003, "fail_ids": ["r1", "7"], "fault_chunks": [2, 5]},
        hf={"device": "cpu", "context_length": 4096},
        sglang={"mtp": False, "engine_kwargs": {"attention_backend": "fa3", "n": {"k": [1, 2]}}},
    )
    env = s.to_env()
    # Then every variable is a FLEET_ string
    assert all(k.startswith("FLEET_") and isinstance(v, str) for k, v in env.items())
    assert env["FLEET_SIM__STEP_S"] == "0.003"
    # When a fresh process builds Settings() from only those variables
    child = child_settings(env, cwd=tmp_path)
    # Then it equals the parent's settings field for field
    assert child == json.loads(s.model_dump_json())


def test_to_env_of_defaults_round_trips(tmp_path):
    s = Settings()
    assert child_settings(s.to_env(), cwd=tmp_path) == json.loads(s.model_dump_json())


def test_to_env_leaves_out_unset_values():
    env = Settings().to_env()
    assert "FLEET_BROKER_URL" not in env and "FLEET_SLOTS" not in env
    assert "FLEET_SAMPLING__TEMPERATURE" not in env


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "value", "field"),
    [
        ("FLEET_CHUNK_SIZE", "0", "chunk_size"),
        ("FLEET_CHUNK_SIZE", "many", "chunk_size"),
        ("FLEET_ENGINE", "tgi", "engine"),
        ("FLEET_LEASE_TTL_S", "-1", "lease.ttl_s"),
        ("FLEET_LEASE__TTL_S", "-1", "lease.ttl_s"),
        ("FLEET_SIM__STEP_S", "-0.1", "step_s"),
        ("FLEET_SIM__MAX_RUNNING", "0", "max_running"),
        ("FLEET_MULTIPART_THRESHOLD_MB", "4", "store_client.multipart_threshold_mb"),
    ],
)
def test_validation_errors_name_the_field(monkeypatch, var, value, field):
    # Given a bad value in the environment
    monkeypatch.setenv(var, value)
    # When settings are built
    with pytest.raises(ValidationError) as info:
        Settings()
    # Then the error names the field (nested ones with their parent)
    text = str(info.value)
    assert field in text
    if "__" in var:
        assert var.removeprefix("FLEET_").split("__")[0].lower() in text


def test_validation_error_from_toml_names_the_field(tmp_path):
    write_toml(tmp_path / "fleet.toml", "[sampling]\nmax_tokens = 0\n")
    with pytest.raises(ValidationError) as info:
        Settings()
    assert "sampling.max_tokens" in str(info.value)


def undescribed(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field, at any depth, that has no description (a nested model counts, and so do its fields)."""
    missing = []
    for name, info in model.model_fields.items():
        if not (info.description or "").strip():
            missing.append(prefix + name)
        for nested in (info.annotation, *get_args(info.annotation)):
            if isinstance(nested, type) and issubclass(nested, BaseModel):
                missing += undescribed(nested, f"{prefix}{name}.")
    return missing


def test_every_setting_has_a_description():
    assert undescribed(Settings) == []


def test_the_description_check_sees_nested_fields():
    class Inner(BaseModel):
        bare: int = 0

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="a section")

    assert undescribed(Outer) == ["inner.bare"]


def test_the_sim_fault_chunks_are_still_read_under_their_old_name(monkeypatch):
    monkeypatch.setenv("FLEET_SIM__CRASH_CHUNKS", "[4]")
    assert Settings().sim.fault_chunks == [4]
    assert Settings(sim={"fault_chunks": [1]}).sim.fault_chunks == [1]


@pytest.mark.parametrize(("args", "named"), [
    (["--max-tokens", "-5"], "--max-tokens -5: Input should be greater than or equal to 1"),
    (["--max-tokens", "0"], "--max-tokens 0: Input should be greater than or equal to 1"),
    (["--chunk-size", "0"], "--chunk-size 0: Input should be greater than or equal to 1"),
    (["--engine", "nope"], "--engine nope: Input should be"),
])  # fmt: skip
@pytest.mark.slow
def test_a_flag_is_a_setting_validated_before_anything_starts(tmp_path, args, named):
    """`fleet run --max-tokens -5` once started a local Redis and workers that exited 1 and were
    restarted forever: a flag gets its environment variable's validation, one line naming the flag."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | {"FLEET_DATA_DIR": str(tmp_path / "d")}
    out = subprocess.run([sys.executable, "-m", "fleet", "run", str(prompts), "--job", "j", *args], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2
    assert named in " ".join(out.stderr.split()) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "d").exists()  # no Redis, no store, no worker


@pytest.mark.slow
def test_a_bad_environment_value_is_named_by_its_variable(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"id": "a", "prompt": "x"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | {"FLEET_SAMPLING__TOP_P": "7"}
    out = subprocess.run([sys.executable, "-m", "fleet", "run", "x.jsonl", "--job", "j"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "FLEET_SAMPLING__TOP_P: Input should be less than or equal to 1" in out.stderr
