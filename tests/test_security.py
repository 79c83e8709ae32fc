"""A password- and TLS-protected broker through the URL, and no credential in any output."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import redis

from fleet.coord.localredis import free_port
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, Workers, read_jsonl, wait_for, write_prompts

pytestmark = pytest.mark.e2e
PASSWORD = "s3cret-Broker-pw"


@pytest.fixture
def tls_redis(tmp_path):
    """redis-server with requirepass, plain TCP disabled, TLS on a free loopback port."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                             "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
                             "--requirepass", PASSWORD, "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=PASSWORD, ssl=True, ssl_ca_certs=str(cert))
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)
    yield f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}"
    proc.terminate()
    proc.wait()


def test_job_over_tls_with_password_never_prints_it(tmp_path, tls_redis, clean_env):
    # Given a broker reachable only over TLS with a password in the URL
    prompts = write_prompts(tmp_path / "p.jsonl", 24)
    env = {**FAST_SIM, "FLEET_BROKER_URL": tls_redis, "FLEET_STORE_URL": str(tmp_path / "store"),
           "FLEET_CHUNK_SIZE": "4"}
    outputs = []
    # When the job is enqueued, run, watched and exported
    enq = run_fleet("enqueue", str(prompts), "--job", "tls", env=env)
    outputs.append(enq.stdout + enq.stderr)
    assert enq.returncode == 0, enq.stderr
    workers = Workers(env, tmp_path / "logs")
    workers.start("h")
    try:
        def done() -> bool:
            st = run_fleet("status", "--job", "tls", "--json", env=env)
            outputs.append(st.stdout + st.stderr)
            return st.returncode == 0 and json.loads(st.stdout)["done"]

        wait_for(done, 90, "the job over TLS", interval=1)
    finally:
        workers.stop()
    out = tmp_path / "o.jsonl"
    exp = run_fleet("export", "--job", "tls", "--out", str(out), env=env)
    outputs.append(exp.stdout + exp.stderr)
    bad = run_fleet("enqueue", str(prompts), "--job", "tls",
                    env={**env, "FLEET_BROKER_URL": tls_redis.replace("127.0.0.1", "127.0.0.2")}, timeout=120)
    outputs.append(bad.stdout + bad.stderr)
    # Then every record is there, and the password appears in no output or log
    assert len(read_jsonl(out)) == 24
    text = "\n".join(outputs) + workers.logs()
    assert PASSWORD not in text
