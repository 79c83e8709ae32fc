"""A broker or store that is down: every command says so in one line (redacted URL, what
failed, what to check), exits 3, and `fleet enqueue` writes nothing. Real processes: the CLI
against closed loopback ports, a real redis-server and moto's S3 server."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from fleet.coord.localredis import free_port
from fleet.errors import BrokerUnreachable, StoreError, StoreUnreachable
from fleet.settings import Settings
from fleet.tools.preflight import unreachable
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, write_prompts
from tests.redisproc import RedisProc

PASSWORD = "hunter2-broker"


def one_line_error(res) -> str:
    assert res.returncode == 3, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and PASSWORD not in res.stderr
    return lines[0]


@pytest.mark.slow
def test_enqueue_with_broker_down_writes_nothing(tmp_path: Path, clean_env) -> None:
    # Given a broker URL on a closed port and a local store
    port = free_port()
    env = {
        **FAST_SIM,
        "FLEET_BROKER_URL": f"redis://:{PASSWORD}@127.0.0.1:{port}/0",
        "FLEET_STORE_URL": str(tmp_path / "store"),
    }
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    # When enqueueing
    line = one_line_error(run_fleet("enqueue", str(prompts), "--job", "j", env=env, timeout=120))
    # Then one line names the redacted broker, the failure and what to check; nothing is written
    assert f"cannot reach the broker at redis://:***@127.0.0.1:{port}/0" in line
    assert "Connection refused" in line or "ConnectionError" in line
    assert "check FLEET_BROKER_URL" in line
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*"))
    # status too (the broker is optional for it, but a configured one that is down is said)
    (tmp_path / "store").mkdir(exist_ok=True)
    status = one_line_error(run_fleet("status", "--job", "j", env=env, timeout=120))
    assert "cannot reach the broker" in status


def test_wrong_broker_password_is_one_line(tmp_path: Path, clean_env) -> None:
    # Given a redis-server with another password than the URL's
    with RedisProc(password="the-real-one") as server:
        url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
        env = {**FAST_SIM, "FLEET_BROKER_URL": url, "FLEET_STORE_URL": str(tmp_path / "store")}
        res = run_fleet("enqueue", str(write_prompts(tmp_path / "p.jsonl", 4)), "--job", "j", env=env, timeout=120)
    # Then the line says the login failed, and nothing was written
    line = one_line_error(res)
    assert f"broker redis://:***@127.0.0.1:{server.port}/0 refused the login" in line
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["enqueue", "export", "status"])
def test_store_down_is_one_line(command: str, tmp_path: Path, redis_server, clean_env) -> None:
    # Given S3 on a closed port (a live broker)
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {
        **FAST_SIM,
        "FLEET_BROKER_URL": redis_server.url,
        "FLEET_STORE_URL": "s3://bucket/prefix",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    args = {
        "enqueue": ["enqueue", str(write_prompts(tmp_path / "p.jsonl", 4)), "--job", "j"],
        "export": ["export", "--job", "j", "--out", str(tmp_path / "o.jsonl")],
        "status": ["status", "--job", "j"],
    }[command]
    line = one_line_error(run_fleet(*args, env=env, timeout=180))
    assert f"cannot reach the store at s3://bucket/prefix (endpoint {endpoint})" in line
    assert "check FLEET_STORE_URL, AWS_ENDPOINT_URL" in line
    if command == "enqueue":  # nothing reached the broker either
        assert redis.Redis.from_url(redis_server.url).dbsize() == 0


@pytest.mark.slow
def test_missing_bucket_is_named(tmp_path: Path, redis_server, s3_env, clean_env) -> None:
    env = {**FAST_SIM, **s3_env, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": "s3://no-such-bucket-x/p"}
    line = one_line_error(run_fleet("export", "--job", "j", "--out", str(tmp_path / "o.jsonl"), env=env))
    assert "no such bucket" in line and "s3://no-such-bucket-x/p" in line


def test_errors_lost_mid_run_map_by_class() -> None:
    s = Settings(broker_url=f"redis://:{PASSWORD}@10.0.0.9:6379/0", store_url="s3://b/p")
    broker = unreachable(redis.ConnectionError("Error 111 connecting"), s)
    assert isinstance(broker, BrokerUnreachable)
    assert str(broker).startswith("lost the broker at redis://:***@10.0.0.9:6379/0 (ConnectionError: Error 111")
    from botocore.exceptions import EndpointConnectionError

    store = unreachable(EndpointConnectionError(endpoint_url="http://x:1"), s)
    assert isinstance(store, StoreUnreachable) and isinstance(store, StoreError)
    assert "lost the store s3://b/p" in str(store)


def test_a_gcs_store_lost_mid_run_is_named_with_its_own_hint() -> None:
    # Given a process that opened a gs:// store (its scheme is loaded), with settings naming it
    import requests

    from fleet.store.schemes import scheme_of
    from fleet.tools.preflight import connection_errors

    s = Settings(store_url="gs://b/p")
    scheme = scheme_of("gs://b/p")
    lost = requests.ConnectionError("Max retries exceeded with url: /storage/v1/b/b")
    # When the GCS client's connection error escapes a command
    # Then it is one of the errors the CLI turns into one line, and that line names GCS's settings, not AWS's
    assert isinstance(lost, connection_errors())
    store = unreachable(lost, s)
    assert isinstance(store, StoreUnreachable) and "lost the store gs://b/p" in str(store)
    assert scheme.hint in str(store) and "STORAGE_EMULATOR_HOST" in str(store) and "AWS" not in str(store)


def test_an_export_target_picks_its_format_through_the_object_layer() -> None:
    # Given the layer's schemes, When the export's format is left to the target
    from fleet.store.schemes import default_format

    # Then a Hub dataset gets a Hub-ready folder, a bucket or a path none (its suffix decides)
    assert default_format("hf://datasets/org/name") == "hf"
    assert default_format("s3://b/out.jsonl") is None and default_format("/tmp/out.parquet") is None
