"""`fleet flower`: a real Flower process on fleet's app, behind basic auth."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.coord.localredis import free_port
from fleet.errors import ConfigError
from fleet.monitor.flower import flower_app, flower_argv, is_loopback, redact_argv, redact_url
from fleet.settings import Settings
from tests.cliload import SUBPROCESS_CODE, cli_app
from tests.redisproc import RedisProc

ROOT = Path(__file__).resolve().parents[1]
REDIS_PASSWORD = "s3cret-redis-pw"
FLOWER_AUTH = "admin:flower-pw"


def get(url: str, auth: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"flower exited {proc.returncode}: {proc.communicate()[0]}")
        try:
            if get(url + "/healthcheck")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError("flower did not answer /healthcheck")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "FLOWER_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@pytest.mark.slow
def test_flower_process_health_and_auth(tmp_path: Path) -> None:
    # Given a password-protected Redis and fleet flower started with basic auth
    with RedisProc(password=REDIS_PASSWORD) as redis:
        port = free_port()
        env = clean_env(
            FLEET_BROKER_URL=redis.url,
            FLEET_FLOWER_PORT=str(port),
            FLEET_FLOWER_BASIC_AUTH=FLOWER_AUTH,
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", SUBPROCESS_CODE, "flower"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(base, proc)
            # Then the health check is open, the API refuses without credentials...
            assert get(base + "/healthcheck") == (200, b"OK")
            status, _ = get(base + "/api/workers")
            assert status == 401
            assert get(base + "/api/workers", auth="admin:wrong")[0] == 401
            # ...and answers with them (an inspect over the password-protected broker).
            status, body = get(base + "/api/workers", auth=FLOWER_AUTH)
            assert status == 200
            assert isinstance(json.loads(body), dict)
            assert get(base + "/", auth=None)[0] == 401
        finally:
            proc.terminate()
            output, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, output
        # And nothing it printed holds either password.
        assert REDIS_PASSWORD not in output
        assert "flower-pw" not in output
        assert f"redis://:***@127.0.0.1:{redis.port}/0" in output


def test_refuses_public_bind_without_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("FLEET_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("FLEET_BROKER_URL", "redis://127.0.0.1:1/0")
    res = CliRunner().invoke(cli_app(), ["flower", "--address", "0.0.0.0"])
    assert res.exit_code == 2
    assert "refusing to start Flower on 0.0.0.0 without authentication" in res.output
    with pytest.raises(ConfigError, match="every interface"):
        flower_argv(Settings(broker_url="redis://x:1/0", flower_address=""))
    with pytest.raises(ConfigError, match="user:password"):
        flower_argv(Settings(broker_url="redis://x:1/0", flower_basic_auth="nopassword"))


def test_argv_and_app_share_the_workers_settings() -> None:
    s = Settings(
        broker_url="redis://:pw@10.0.0.5:6379/0", flower_address="0.0.0.0", flower_port=5600,
        flower_basic_auth="u:p", visibility_timeout_s=99_000,
    )  # fmt: skip
    argv = flower_argv(s)
    assert argv[0] == "flower" and "--address=0.0.0.0" in argv and "--port=5600" in argv
    assert "--basic_auth=u:p" in argv and "--basic_auth=***" in redact_argv(argv)
    app = flower_app(s)
    assert app.conf.broker_transport_options["visibility_timeout"] == 99_000
    assert app.conf.accept_content == ["json"]
    # Loopback needs no auth.
    assert flower_argv(Settings(broker_url="redis://x:1/0", flower_address="127.0.0.1"))[1] == ("--address=127.0.0.1")


def test_redact_url_and_loopback() -> None:
    assert redact_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("rediss://user:pw@h:1/2") == "rediss://user:***@h:1/2"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert redact_url("redis://h:1/0?password=pw&db=1") == "redis://h:1/0?password=***&db=1"
    assert redact_url("s3://bucket/prefix") == "s3://bucket/prefix"
    assert "p@ss" not in redact_url("redis://:p@ss@host:1/0")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("10.1.2.3")
    assert not is_loopback("head.example.com")
