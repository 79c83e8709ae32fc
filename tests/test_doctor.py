"""`fleet doctor` against a real redis-server, a real local store and real model files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from fleet.coord.localredis import free_port
from fleet.settings import Settings
from fleet.tools.doctor import Check, check_broker, check_gpus, check_model, run_checks
from tests.cliload import cli_app
from tests.redisproc import RedisProc


@pytest.fixture(autouse=True)
def no_fleet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k in list(os.environ):
        if k.startswith("FLEET_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_all_pass_with_real_redis_and_local_store(tmp_path: Path) -> None:
    # Given a reachable Redis and a writable local store, sim engine
    with RedisProc() as redis:
        settings = Settings(broker_url=redis.url, store_url=str(tmp_path / "store"), engine="sim")
        checks = by_name(run_checks(settings))
        # Then nothing fails; sim needs no GPU, model or engine args
        assert all(c.ok for c in checks.values()), checks
        assert "answers PING" in checks["broker"].detail
        assert "conditional put" in checks["store"].detail
        assert checks["gpus"].skipped and checks["model"].skipped and checks["engine args"].skipped
        # And the probe objects are gone from the store
        assert list((tmp_path / "store").rglob("*")) in ([], [tmp_path / "store" / "_doctor"])
        res = CliRunner().invoke(cli_app(), ["doctor", "--broker-url", redis.url, "--store-url", str(tmp_path / "s2")])
        assert res.exit_code == 0, res.output
        assert "broker" in res.stdout and "ok" in res.stdout


def test_bad_broker_fails_with_redacted_url(tmp_path: Path) -> None:
    # Given a broker URL with a password and nothing listening on its port
    url = f"redis://:topsecretpw@127.0.0.1:{free_port()}/0"
    settings = Settings(broker_url=url, store_url=str(tmp_path / "store"))
    check = check_broker(settings)
    assert not check.ok and not check.skipped
    assert "redis://:***@127.0.0.1:" in check.detail
    assert "topsecretpw" not in check.detail
    assert "ConnectionError" in check.detail
    # And the CLI exits 1 and shows the same, without the password
    res = CliRunner().invoke(cli_app(), ["doctor", "--broker-url", url, "--store-url", str(tmp_path / "s")])
    assert res.exit_code == 1
    assert "FAIL" in res.stdout and "topsecretpw" not in res.output
    res = CliRunner().invoke(cli_app(), ["doctor", "--broker-url", url, "--store-url", str(tmp_path / "s"), "--json"])
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["broker"]["ok"] is False and rows["store"]["ok"] is True


def test_broker_that_evicts_or_lacks_a_password(tmp_path: Path) -> None:
    with RedisProc(extra_args=["--maxmemory-policy", "allkeys-lru"]) as redis:
        check = check_broker(Settings(broker_url=redis.url))
        assert not check.ok and "maxmemory-policy is allkeys-lru" in check.detail
    assert not check_broker(Settings()).ok  # no broker configured
    with RedisProc(password="pw") as redis:
        wrong = check_broker(Settings(broker_url=redis.url.replace(":pw@", ":nope@")))
        assert not wrong.ok and "nope" not in wrong.detail


def test_store_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store directory should be")
    with RedisProc() as redis:
        checks = by_name(run_checks(Settings(broker_url=redis.url, store_url=str(blocker / "store"))))
    assert not checks["store"].ok and str(blocker) in checks["store"].detail


def make_model(root: Path, shards: int = 2) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (root / "tokenizer.json").write_text("{}")
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for n in names:
        (root / n).write_bytes(b"\0" * 1024)
    weight_map = {f"layer{i}.weight": n for i, n in enumerate(names)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def test_sglang_host_gpus_and_model_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an sglang host with two GPUs (a fake nvidia-smi) and a complete model directory
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA B200, 183359 MiB'\necho '1, NVIDIA B200, 183359 MiB'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    model = make_model(tmp_path / "model")
    settings = Settings(engine="sglang", model=str(model))
    gpus = check_gpus(settings)
    assert gpus.ok and "2 x NVIDIA B200 (183359 MiB)" in gpus.detail
    ok = check_model(settings)
    assert ok.ok and "2 weight file(s)" in ok.detail
    # The engine-args check never fails just because a module or sglang is missing.
    engine_args = by_name(run_checks(settings))["engine args"]
    assert engine_args.skipped or "kwargs" in engine_args.detail
    # When a shard is missing and the tokenizer is gone, Then the model check says which.
    (model / "model-00002-of-00002.safetensors").unlink()
    (model / "tokenizer.json").unlink()
    bad = check_model(settings)
    assert not bad.ok
    assert "1 of 2 weight shards missing (model-00002-of-00002.safetensors" in bad.detail
    assert "no tokenizer" in bad.detail
    # And a host without GPUs fails the GPU check for sglang.
    smi.unlink()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    assert not check_gpus(settings).ok
    # A model that is neither a directory nor cached.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    missing = check_model(Settings(engine="hf", model="no-such-org/no-such-model"))
    assert not missing.ok and "not in the local HF cache" in missing.detail


@pytest.mark.slow
def test_store_check_on_s3(s3_bucket: str) -> None:
    # Given an S3 store (moto over HTTP), Then the round trip and the conditional put pass
    check = by_name(run_checks(Settings(store_url=f"s3://{s3_bucket}/fleet")))["store"]
    assert check.ok, check.detail
    assert check.detail.startswith(f"s3://{s3_bucket}/fleet: ")
    assert "Contents" not in boto3.client("s3").list_objects_v2(Bucket=s3_bucket)


def test_broker_without_room_for_the_planned_fleets_connections(tmp_path: Path) -> None:
    # Given a broker whose maxclients is 1,000 (Redis's default is 10,000; ops/redis.conf ships 20,000)
    with RedisProc(extra_args=["--maxclients", "1000"]) as redis:
        settings = Settings(broker_url=redis.url)
        # When doctor checks it for 1,000 GPUs, then for 100
        big, small, unsized = check_broker(settings, 1000), check_broker(settings, 100), check_broker(settings)
        res = CliRunner().invoke(cli_app(), ["doctor", "--broker-url", redis.url, "--store-url",
                                             str(tmp_path / "s"), "--gpus", "1000", "--json"])
    # Then 1,000 GPUs' workers (3 connections each, twice over) do not fit: the check fails, says why
    # and what to set, and doctor exits 1
    assert not big.ok and "maxclients 1000 is below what 1000 GPUs need (6128" in big.detail, big.detail
    assert res.exit_code == 1 and "set maxclients >= 6128" in res.output
    # And 100 GPUs do, and without a planned size it says how many workers fit
    assert small.ok and "room for 100 GPUs" in small.detail
    assert unsized.ok and "room for 145 single-GPU workers" in unsized.detail
