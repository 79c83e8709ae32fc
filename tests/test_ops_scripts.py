"""The ops deliverables, run for real: shellcheck, redis.conf in a real redis-server, the
head script starting Redis and Flower, the GPU-host script's pre-flight gate, the image
entrypoint's dispatch, the upload script against an S3 endpoint, the compose files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest
import redis
import yaml

from fleet.coord.localredis import free_port
from tests.cliload import SUBPROCESS_CODE
from tests.redisproc import RedisProc

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("ops/*.sh"), *ROOT.glob("docker/*.sh")])
EXAMPLE_ENV = ROOT / "ops" / "fleet.env.example"


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return path


def base_env(tmp_path: Path, bin_dir: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "REDIS_", "FLOWER_"))}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def settings_file(tmp_path: Path, **values: str) -> Path:
    """ops/fleet.env.example with some values replaced, as a user would edit it."""
    lines = []
    for line in EXAMPLE_ENV.read_text().splitlines():
        key = line.split("=", 1)[0]
        lines.append(f"{key}={values.pop(key)}" if key in values and "=" in line else line)
    lines += [f"{k}={v}" for k, v in values.items()]
    path = tmp_path / "fleet.env"
    path.write_text("\n".join(lines) + "\n")
    return path


# -- static checks ---------------------------------------------------------------------------


@pytest.mark.slow
def test_scripts_pass_shellcheck() -> None:
    assert SCRIPTS, "no shell scripts found"
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
    res = subprocess.run(
        ["shellcheck", "-x", *[str(p.relative_to(ROOT)) for p in SCRIPTS]],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_scripts_are_executable_bash() -> None:
    for name in ("ops/start-head.sh", "ops/start-gpu-host.sh", "ops/upload-prompts.sh", "docker/entrypoint.sh"):
        script = ROOT / name
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert script.read_text().startswith("#!/usr/bin/env bash\n")


def test_dockerfile_pins_its_base_images() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23" in text
    assert "ARG SGLANG_VERSION=0.5.23" in text
    assert ":latest" not in text
    assert 'ENTRYPOINT ["fleet-entrypoint"]' in text


def test_compose_files_parse_and_carry_the_redis_rules() -> None:
    head = yaml.safe_load((ROOT / "docker" / "compose.head.yml").read_text())
    gpu = yaml.safe_load((ROOT / "docker" / "compose.gpu.yml").read_text())
    redis_svc = head["services"]["redis"]
    assert "REDIS_PASSWORD" in redis_svc["environment"]
    assert redis_svc["ports"] == ["${REDIS_BIND:-127.0.0.1}:${REDIS_PORT:-6379}:6379"]
    assert "../ops/redis.conf:/usr/local/etc/redis/redis.conf:ro" in redis_svc["volumes"]
    flower = head["services"]["flower"]
    assert flower["command"] == ["flower"] and "FLEET_FLOWER_BASIC_AUTH" in flower["environment"]
    worker = gpu["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert any(v.endswith(":/models/model:ro") for v in worker["volumes"])
    # the workers' data directory (their spools) is a host path, not the container's writable layer
    data_dir = worker["environment"]["FLEET_DATA_DIR"]
    assert f"${{DATA_DIR:-/mnt/nvme/fleet-data}}:{data_dir}" in worker["volumes"]


def compose_client() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    v1 = shutil.which("docker-compose")
    return [v1] if v1 else None


@pytest.mark.parametrize("name", ["compose.head.yml", "compose.gpu.yml"])
def test_compose_config_where_a_client_exists(name: str, tmp_path: Path) -> None:
    client = compose_client()
    if client is None:
        pytest.skip("no docker compose client (plugin or docker-compose) installed")
    env_file = settings_file(tmp_path, REDIS_PASSWORD="abc123")
    source = ROOT / "docker" / name
    target = source
    if client[-1].endswith("docker-compose"):
        # Compose v1 predates the top-level `name:`; check everything else with it.
        target = ROOT / "docker" / f".v1check-{os.getpid()}-{name}"
        target.write_text("".join(x for x in source.read_text().splitlines(True) if not x.startswith("name:")))
    try:
        res = subprocess.run(
            [*client, "--env-file", str(env_file), "-f", str(target), "config"],
            env=base_env(tmp_path, FLEET_ENV_FILE=str(env_file), MODEL_DIR=str(tmp_path)),
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
    finally:
        if target != source:
            target.unlink()
    assert res.returncode == 0, res.stderr
    config = yaml.safe_load(res.stdout)
    if name == "compose.head.yml":
        assert config["services"]["flower"]["environment"]["FLEET_BROKER_URL"] == "redis://:abc123@redis:6379/0"
    else:
        assert config["services"]["worker"]["environment"]["FLEET_MODEL"] == "/models/model"


# -- redis.conf and the head ----------------------------------------------------------------


def test_redis_conf_in_a_real_server() -> None:
    # Given ops/redis.conf in a real redis-server, Then the docs/architecture.md rules are in force.
    with RedisProc(conf=ROOT / "ops" / "redis.conf", password="pw") as server:
        client = server.client()
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("save")["save"] == ""
    assert "requirepass" not in (ROOT / "ops" / "redis.conf").read_text().replace("`requirepass", "")


def fleet_shim(bin_dir: Path) -> Path:
    """`fleet` on PATH running this checkout's CLI (the console script may not be installed)."""
    bin_dir.mkdir(exist_ok=True)
    code = SUBPROCESS_CODE.replace("'", "'\\''")
    return write_exe(
        bin_dir / "fleet",
        f"#!/usr/bin/env bash\nexport PYTHONPATH='{ROOT}'\nexec '{sys.executable}' -c '{code}' \"$@\"\n",
    )


@pytest.mark.slow
def test_start_head_native_runs_redis_and_flower(tmp_path: Path) -> None:
    # Given a settings file for a pod: Redis and Flower on free loopback ports
    redis_port, flower_port = free_port(), free_port()
    env_file = settings_file(
        tmp_path, REDIS_PASSWORD="deadbeef42", REDIS_PORT=str(redis_port),
        FLEET_BROKER_URL=f"redis://:deadbeef42@127.0.0.1:{redis_port}/0",
        FLEET_FLOWER_PORT=str(flower_port), FLEET_FLOWER_BASIC_AUTH="admin:flowerpw",
        LOG_DIR=str(tmp_path / "logs"), REDIS_DIR=str(tmp_path / "redis"),
    )  # fmt: skip
    fleet_shim(tmp_path / "bin")
    env = base_env(tmp_path, tmp_path / "bin", FLEET_ENV_FILE=str(env_file))
    script = str(ROOT / "ops" / "start-head.sh")
    try:
        # When started natively
        # (monitoring has its own test: tests/test_monitoring.py)
        res = subprocess.run(
            [script, "--native", "--no-monitoring"], env=env, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, res.stderr
        # Then Redis wants the password and runs with the ops rules
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=redis_port).ping()
        client = redis.Redis(port=redis_port, password="deadbeef42")
        assert client.ping()
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert (tmp_path / "redis" / "auth.conf").stat().st_mode & 0o077 == 0
        # And Flower answers its health check
        deadline = time.monotonic() + 300  # Flower's start on a busy machine
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{flower_port}/healthcheck", timeout=30) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "logs" / "flower.log").read_text()
                time.sleep(0.3)
        assert "deadbeef42" not in (tmp_path / "logs" / "flower.log").read_text()
    finally:
        # When stopped, Then both are gone
        stop = subprocess.run([script, "--native", "--stop"], env=env, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=redis_port, password="deadbeef42", socket_connect_timeout=1).ping()
    assert not (tmp_path / "logs" / "flower.pid").exists()


def test_init_writes_fresh_secrets(tmp_path: Path) -> None:
    env_file = tmp_path / "fleet.env"
    env = base_env(tmp_path, FLEET_ENV_FILE=str(env_file))
    res = subprocess.run([str(ROOT / "ops" / "start-head.sh"), "--init"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line and line[0] != "#")
    assert len(values["REDIS_PASSWORD"]) == 48 and values["REDIS_PASSWORD"] != "change-me"
    assert (
        values["FLEET_FLOWER_BASIC_AUTH"].startswith("admin:") and "change-me" not in values["FLEET_FLOWER_BASIC_AUTH"]
    )
    assert env_file.stat().st_mode & 0o077 == 0
    # A second --init leaves it alone; starting with the example's placeholder is refused.
    before = env_file.read_text()
    subprocess.run([str(ROOT / "ops" / "start-head.sh"), "--init"], env=env, capture_output=True)
    assert env_file.read_text() == before
    placeholder = base_env(tmp_path, FLEET_ENV_FILE=str(EXAMPLE_ENV))
    res = subprocess.run(
        [str(ROOT / "ops" / "start-head.sh"), "--native"], env=placeholder, capture_output=True, text=True
    )
    assert res.returncode == 1 and "set REDIS_PASSWORD" in res.stderr


# -- the GPU host ---------------------------------------------------------------------------

FAKE_FLEET = """#!/usr/bin/env bash
echo "$*" >> "{log}"
case "$1" in
  doctor) exit "${{DOCTOR_RC:-0}}" ;;
  worker) trap 'echo stopped >> "{log}"; exit 0' TERM
          while true; do sleep 0.1; done ;;
  *) exit 0 ;;
esac
"""


@pytest.mark.slow
def test_gpu_host_runs_doctor_first_then_workers(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    write_exe(bin_dir / "fleet", FAKE_FLEET.format(log=calls))
    env_file = settings_file(tmp_path, REDIS_PASSWORD="pw1", LOG_DIR=str(tmp_path / "logs"), GPUS="0,1")
    script = str(ROOT / "ops" / "start-gpu-host.sh")
    env = base_env(tmp_path, bin_dir, FLEET_ENV_FILE=str(env_file))
    # Given a failing pre-flight, Then no worker starts
    res = subprocess.run([script, "--native"], env={**env, "DOCTOR_RC": "1"}, capture_output=True, text=True)
    assert res.returncode == 1 and "fleet doctor failed" in res.stderr
    assert calls.read_text().splitlines() == ["doctor"]
    assert not (tmp_path / "logs" / "worker.pid").exists()
    # Given a passing one, Then the launcher runs on the configured GPUs until stopped
    res = subprocess.run([script, "--native"], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    pid = int((tmp_path / "logs" / "worker.pid").read_text())
    deadline = time.monotonic() + 10
    while "worker --gpus 0,1" not in calls.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    res = subprocess.run([script, "--native", "--stop"], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert calls.read_text().splitlines()[-1] == "stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # --gpus on the command line wins over the file
    subprocess.run([script, "--native", "--gpus", "3", "--skip-doctor"], env=env, capture_output=True, timeout=30)
    subprocess.run([script, "--native", "--stop"], env=env, capture_output=True, timeout=30)
    assert "worker --gpus 3" in calls.read_text()


def test_entrypoint_dispatch(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    write_exe(bin_dir / "fleet", FAKE_FLEET.format(log=calls))
    entry = str(ROOT / "docker" / "entrypoint.sh")
    env = base_env(tmp_path, bin_dir)
    for argv in (["plan", "--gpus", "6"], ["enqueue", "s3://b/p.jsonl", "--job", "j"], ["status", "--json"]):
        assert subprocess.run([entry, *argv], env=env, timeout=30).returncode == 0
    subprocess.run([entry], env=env, timeout=30)
    assert calls.read_text().splitlines() == [
        "plan --gpus 6", "enqueue s3://b/p.jsonl --job j", "status --json", "--help",
    ]  # fmt: skip
    res = subprocess.run([entry, "echo", "as given"], env=env, capture_output=True, text=True, timeout=30)
    assert res.stdout == "as given\n"


@pytest.mark.slow
def test_entrypoint_pod_stays_up(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [str(ROOT / "docker" / "entrypoint.sh"), "pod"], env=base_env(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.0)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


# -- prompts upload -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("client", ["boto3", "aws"])
def test_upload_prompts(client: str, tmp_path: Path, s3_bucket: str, s3_env: dict[str, str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": f"p{i}"}) + "\n" for i in range(100)))
    env = base_env(tmp_path, **s3_env)
    if client == "boto3":
        # A PATH without the aws CLI: the script falls back to boto3.
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        # python3: this interpreter (it has boto3), called by its path so a venv stays a venv;
        # a pyenv shim or the system python3 on PATH may lack boto3.
        write_exe(bin_dir / "python3", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        for tool in ("sha256sum", "wc", "tr", "cut", "bash", "env"):
            found = shutil.which(tool)
            assert found, tool
            (bin_dir / tool).symlink_to(found)
        env["PATH"] = str(bin_dir)
    elif shutil.which("aws") is None:
        pytest.skip("aws CLI not installed")
    dest = f"s3://{s3_bucket}/fleet/inputs/prompts.jsonl"
    script = str(ROOT / "ops" / "upload-prompts.sh")
    res = subprocess.run(["bash", script, str(prompts), dest], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "100 lines, 0 bad" in res.stderr
    body = boto3.client("s3").get_object(Bucket=s3_bucket, Key="fleet/inputs/prompts.jsonl")
    assert body["Body"].read() == prompts.read_bytes()
    # A bad line stops it before anything is sent.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "prompt": "x"}\nnot json\n[1, 2]\n')
    res = subprocess.run(
        ["bash", script, str(bad), f"s3://{s3_bucket}/bad.jsonl"], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode != 0 and "line(s) [2, 3]" in res.stderr
    assert "Contents" not in boto3.client("s3").list_objects_v2(Bucket=s3_bucket, Prefix="bad.jsonl")


# -- README's two commands and ops/setup.sh --------------------------------------------------


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("## Two commands", 1)[1].split("\n## ", 1)[0].split("```bash\n")[1:]
    return [b.split("```", 1)[0].strip() for b in blocks]


def test_readme_has_two_commands_from_a_fresh_clone() -> None:
    demo, tests = readme_commands()
    for command in (demo, tests):
        assert "\n" not in command and command.startswith("bash ops/setup.sh && ")
        # Nothing outside the project venv: no bare `fleet`, no system python.
        parts = [p.strip().split()[0] for p in command.split("&&")[1:]]
        assert all(p.startswith(".venv/bin/") for p in parts), parts
    assert tests.startswith("bash ops/setup.sh && .venv/bin/python -m pytest -q -ra -n ")
    # CI runs the same test command, a line of its own (first, while the engines' venvs build)
    assert tests.removeprefix("bash ops/setup.sh && ") in (ROOT / ".ci" / "run").read_text().splitlines()


def test_setup_never_touches_the_system_interpreter() -> None:
    setup, helper = ((ROOT / "ops" / name).read_text() for name in ("setup.sh", "uv.sh"))
    for text in (setup, helper):
        assert "--break-system-packages" not in text.replace("never with --break-system-packages", "")
    # pip brings uv into the venv, uv installs into the venv's interpreter; nothing else installs
    assert 'uv_into "$venv"' in setup and "pip install" not in setup
    into_venv = ('"$venv/bin/python" -m pip install',
                 'pip install --quiet --compile-bytecode --python "$venv/bin/python"')
    assert all(line in helper for line in into_venv)
    rest = helper
    for line in into_venv:
        rest = rest.replace(line, "")
    assert "pip install" not in rest.replace("`uv pip install`", "")


def test_uv_installs_from_where_pip_is_configured_to(tmp_path: Path) -> None:
    # Given a venv whose pip is configured with a wheel directory and two extra (local) indexes
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    config = "\n".join([":env:.find-links='/opt/wheels'", "global.cert='/etc/ssl/cert.pem'",
                        "global.extra-index-url='file:///a/simple file:///b/simple'"])  # fmt: skip
    write_exe(venv / "bin" / "python", f"""#!/bin/bash
if [ "$1 $2 $3 $4" = "-m pip config list" ]; then printf '%s\\n' "{config}"; exit 0; fi
echo "python $*" >> "{log}"
""")
    # When ops/uv.sh sets uv up in it
    res = subprocess.run(["bash", "-c", f'source {ROOT}/ops/uv.sh && uv_into "$1" && printf "%s\\n" "${{uv[@]}}"',
                          "bash", str(venv)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    # Then pip brought uv into that venv, and uv installs into its interpreter from the same places,
    # picking among them as pip does
    assert log.read_text().split("\n")[0].startswith("python -m pip install")
    assert "uv==" in log.read_text()
    assert res.stdout.splitlines() == [
        f"{venv}/bin/uv", "pip", "install", "--quiet", "--compile-bytecode", "--python", f"{venv}/bin/python",
        "--index-strategy", "unsafe-best-match", "--find-links", "/opt/wheels",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
    ]  # fmt: skip


def test_setup_pins_a_cpu_torch_before_the_extras_that_want_one() -> None:
    # A fresh Linux x86_64 machine would otherwise resolve the hf extra to PyPI's CUDA torch (GBs):
    # the CPU build comes first, from pip's indexes and wheel directories or PyTorch's CPU index,
    # and stays.
    text = (ROOT / "ops" / "setup.sh").read_text()
    torch = text.index('"torch==$TORCH_VERSION+cpu"')
    extras = text.index('-e ".[hf,dev,train,gcs,hub]"')
    assert torch < extras and '--constraint "$venv/torch-constraint.txt" -e ' in text
    assert "https://download.pytorch.org/whl/cpu" in text


SETUP_TOOLS = ("bash", "dirname", "sed", "grep", "rm", "env", "cat", "mkdir", "chmod", "ln", "touch")


class FakeDebian:
    """A PATH with only coreutils and shims: fake apt (logs, 'installs' shims), fake sudo/id,
    and Python interpreters that behave like a distribution's (too old, or lacking ensurepip)."""

    def __init__(self, tmp_path: Path, uid: int = 0, apt_offers: tuple[str, ...] = ()) -> None:
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.log = tmp_path / "calls.log"
        self.log.touch()
        self.real = sys._base_executable  # type: ignore[attr-defined]
        for tool in SETUP_TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
        write_exe(self.bin / "id", f"#!/bin/bash\necho {uid}\n")
        write_exe(self.bin / "sudo", f'#!/bin/bash\necho "sudo $*" >> "{self.log}"\nexec "$@"\n')
        write_exe(self.bin / "redis-server", "#!/bin/bash\nexit 0\n")
        offers = "|".join(apt_offers) or "__none__"
        write_exe(self.bin / "apt-cache", f"""#!/bin/bash
case "$2" in {offers}) echo "  Candidate: 3.11.0-1" ;; *) echo "  Candidate: (none)" ;; esac
""")
        write_exe(self.bin / "apt-get", f"""#!/bin/bash
echo "apt-get $*" >> "{self.log}"
for p in "$@"; do
  case "$p" in
    python3.1?-venv) touch "{self.bin}/.$p" ;;
    python3.1?) printf '#!/bin/bash\\nexec "{self.real}" "$@"\\n' > "{self.bin}/$p"; chmod +x "{self.bin}/$p" ;;
  esac
done
""")

    def python(self, name: str, version_ok: bool = True, venv_needs: str | None = None) -> None:
        """An interpreter: `version_ok` False = older than 3.11; `venv_needs` = the apt package
        without which `-m venv` fails, as Debian's python3 does without python3.X-venv."""
        guard = f'[ "$1 $2" = "-m venv" ] && [ ! -e "{self.bin}/.{venv_needs}" ] && exit 1\n' if venv_needs else ""
        old = '[ "$1" = "-c" ] && exit 1\n' if not version_ok else ""
        write_exe(self.bin / name, f'#!/bin/bash\n{old}{guard}exec "{self.real}" "$@"\n')

    def run(self, tmp_path: Path) -> subprocess.CompletedProcess[str]:
        env = {"PATH": str(self.bin), "HOME": str(tmp_path), "FLEET_VENV": str(tmp_path / "venv")}
        return subprocess.run(
            [str(self.bin / "bash"), str(ROOT / "ops" / "setup.sh"), "--venv-only"],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.mark.slow
def test_setup_on_debian12_installs_the_venv_package(tmp_path: Path) -> None:
    # Given Debian 12's python3 (3.11) without python3.11-venv, as a user with sudo
    deb = FakeDebian(tmp_path, uid=1000, apt_offers=("python3.11", "python3.11-venv"))
    deb.python("python3", venv_needs="python3.11-venv")
    res = deb.run(tmp_path)
    # Then python3.11-venv comes through sudo apt and the venv is made from python3
    assert res.returncode == 0, res.stderr
    assert any(c.startswith("sudo ") and "apt-get install" in c and "python3.11-venv" in c for c in deb.calls())
    assert (tmp_path / "venv" / "bin" / "python").exists()
    assert f"uses {deb.bin}/python3 (Python 3.11)" in res.stderr


@pytest.mark.slow
def test_setup_on_ubuntu2204_brings_python311(tmp_path: Path) -> None:
    # Given Ubuntu 22.04: python3 is 3.10, apt (universe) offers python3.11
    deb = FakeDebian(tmp_path, apt_offers=("python3.11", "python3.11-venv"))
    deb.python("python3", version_ok=False)
    res = deb.run(tmp_path)
    assert res.returncode == 0, res.stderr
    assert any("install" in c and "python3.11 python3.11-venv" in c for c in deb.calls()), deb.calls()
    assert f"uses {deb.bin}/python3.11" in res.stderr
    assert not any(c.startswith("sudo") for c in deb.calls())  # root: no sudo


def test_setup_without_a_usable_python_says_so(tmp_path: Path) -> None:
    deb = FakeDebian(tmp_path)
    deb.python("python3", version_ok=False)
    res = deb.run(tmp_path)
    assert res.returncode == 1
    assert "no Python >= 3.11 found" in res.stderr and "universe" in res.stderr
    assert not (tmp_path / "venv").exists()
