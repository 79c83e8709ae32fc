"""Pre-flight checks a user runs before paying for GPU hours (`fleet doctor`).

Each check answers one question with real I/O (a Redis PING, a store round trip, the
driver's GPU list, the model's files, SGLang's own argument validation) and never raises:
a failure becomes a failed Check with a detail that says what to fix. Secrets in URLs
are redacted.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleet.coord.pool import HEAD_CONNECTIONS, MAXCLIENTS_HEADROOM, WORKER_CONNECTIONS, maxclients_needed
from fleet.engines.specs import spec_for
from fleet.errors import ConfigError
from fleet.model.gpus import query_gpus
from fleet.monitor.flower import is_loopback
from fleet.redact import redact_url
from fleet.settings import Settings
from fleet.store import open_store

BROKER_TIMEOUT_S = 5.0
PROBE_PREFIX = "_doctor"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    skipped: bool = False  #: not applicable here; counts as ok

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else ("ok" if self.ok else "FAIL")


def _skip(name: str, detail: str) -> Check:
    return Check(name, True, detail, skipped=True)


def _scrub(text: str, url: str | None) -> str:
    """Remove a URL's password from an error message that may quote it."""
    password = urlsplit(url).password if url else None
    return text.replace(password, "***") if password else text


# -- broker --------------------------------------------------------------------------------


def check_broker(settings: Settings, gpus: int | None = None) -> Check:
    """The broker answers, keeps what it is given, and has room for the fleet's connections
    (`gpus`: the planned fleet, a worker per GPU at most)."""
    url = settings.broker_url
    if not url:
        return Check("broker", False, "FLEET_BROKER_URL is not set (redis://:password@host:port/db)")
    shown = redact_url(url)
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=BROKER_TIMEOUT_S, socket_timeout=BROKER_TIMEOUT_S)
        try:
            client.ping()
            notes = _broker_config_notes(client) + _broker_room_notes(client, gpus)
        finally:
            client.close()
    except Exception as e:  # redis errors, bad URLs: report, never raise
        return Check("broker", False, f"{shown}: {type(e).__name__}: {_scrub(str(e), url)}")
    parts = urlsplit(url)
    if parts.password is None and not is_loopback(parts.hostname or ""):
        return Check("broker", False, f"{shown}: reachable but has no password and is not on loopback")
    bad = [n for n in notes if n.startswith("!")]
    if bad:
        return Check("broker", False, f"{shown}: " + "; ".join(n[1:] for n in bad))
    return Check("broker", True, "; ".join([f"{shown} answers PING", *notes]))


def _broker_config_notes(client: Any) -> list[str]:
    """Persistence and eviction facts; '!' marks one that loses work (docs/architecture.md, Redis)."""
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
        aof = client.config_get("appendonly").get("appendonly")
    except Exception:  # CONFIG disabled on managed Redis: nothing to say
        return ["CONFIG not available, persistence unchecked"]
    notes = []
    if policy and policy != "noeviction":
        notes.append(f"!maxmemory-policy is {policy}: Redis may evict queued chunks; set noeviction")
    if aof != "yes":
        notes.append("appendonly no: a Redis restart empties the queue (`fleet enqueue` rebuilds it)")
    return notes


def _broker_room_notes(client: Any, gpus: int | None) -> list[str]:
    """Room for the fleet's connections under `maxclients` (fleet.coord.pool); '!' marks too little."""
    try:
        limit = int(client.config_get("maxclients").get("maxclients"))
    except Exception:  # CONFIG disabled on managed Redis
        return ["CONFIG not available, maxclients unchecked"]
    fits = max(0, (limit // MAXCLIENTS_HEADROOM - HEAD_CONNECTIONS) // WORKER_CONNECTIONS)
    if gpus is None:
        return [f"maxclients {limit}: room for {fits} single-GPU workers ({WORKER_CONNECTIONS} connections each, "
                f"{MAXCLIENTS_HEADROOM}x over)"]
    need = maxclients_needed(gpus)
    if limit < need:
        return [f"!maxclients {limit} is below what {gpus} GPUs need ({need}: {WORKER_CONNECTIONS} connections a "
                f"worker and {HEAD_CONNECTIONS} for the head, {MAXCLIENTS_HEADROOM}x over for a reconnection); past "
                f"it Redis refuses new workers and `fleet` commands: set maxclients >= {need} (and the open-files "
                f"limit above it)"]
    return [f"maxclients {limit}: room for {gpus} GPUs (needs {need})"]


# -- store ---------------------------------------------------------------------------------


def check_store(settings: Settings) -> Check:
    url = settings.resolved_store_url
    shown = redact_url(url)
    probe = f"{PROBE_PREFIX}/{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    payload = b"fleet doctor probe"
    try:
        store = open_store(url, settings.store_client.max_attempts, settings.store_client.multipart_threshold_mb)
        store.put(probe, payload)
        try:
            if store.get(probe) != payload:
                return Check("store", False, f"{shown}: read back different bytes")
            # Results are committed by a conditional put; some S3-compatible stores ignore it.
            once = store.put_if_absent(probe + ".once", payload)
            twice = store.put_if_absent(probe + ".once", payload)
        finally:
            store.delete(probe)
            store.delete(probe + ".once")
    except Exception as e:
        return Check("store", False, f"{shown}: {type(e).__name__}: {_scrub(str(e), url)}")
    if not (once and not twice):
        return Check(
            "store",
            False,
            f"{shown}: conditional put not honoured (results could be written twice)",
        )
    return Check("store", True, f"{shown}: put, get, conditional put and delete work")


# -- GPUs ----------------------------------------------------------------------------------


def check_gpus(settings: Settings) -> Check:
    if not spec_for(settings).needs_gpu:
        return _skip("gpus", f"engine {settings.engine} does not need a GPU")
    gpus, source = query_gpus()
    if not gpus:
        return Check("gpus", False, f"no GPU visible: {source}")
    names: dict[str, int] = {}
    for g in gpus:
        label = f"{g.name} ({g.memory_mib} MiB)"
        names[label] = names.get(label, 0) + 1
    listed = ", ".join(f"{n} x {label}" for label, n in names.items())
    return Check("gpus", True, f"{listed} via {source}")


# -- model ---------------------------------------------------------------------------------


def _resolve_model_dir(model: str) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception as e:
        raise ConfigError(f"{model}: not a directory and not in the local HF cache") from e


def model_problems(model_dir: Path) -> tuple[list[str], str]:
    """What is missing from a model directory, and a summary of what is there."""
    problems = []
    config = model_dir / "config.json"
    if not config.is_file():
        problems.append("config.json missing")
    else:
        try:
            json.loads(config.read_text())
        except ValueError as e:
            problems.append(f"config.json unreadable: {e}")
    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        problems.append(f"no tokenizer ({' or '.join(TOKENIZER_FILES)})")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            problems.append(f"{len(missing)} of {len(shards)} weight shards missing ({missing[0]}, ...)")
        weights = [model_dir / s for s in shards if s not in missing]
    else:
        weights = list(model_dir.glob("*.safetensors")) or list(model_dir.glob("pytorch_model*.bin"))
        if not weights:
            problems.append("no weights (*.safetensors or pytorch_model*.bin)")
    empty = [w.name for w in weights if w.stat().st_size == 0]
    if empty:
        problems.append(f"empty weight files: {', '.join(empty[:3])}")
    partial = list(model_dir.rglob("*.incomplete"))
    if partial:
        problems.append(f"{len(partial)} download(s) incomplete")
    size_gb = sum(w.stat().st_size for w in weights) / 1e9
    return (
        problems,
        f"{model_dir}: config.json, tokenizer, {len(weights)} weight file(s), {size_gb:.1f} GB",
    )


def check_model(settings: Settings) -> Check:
    if not settings.model:
        if not spec_for(settings).needs_model:
            return _skip("model", f"engine {settings.engine} needs no model")
        return Check("model", False, f"engine {settings.engine} needs FLEET_MODEL (a model directory)")
    try:
        model_dir = _resolve_model_dir(settings.model)
        problems, summary = model_problems(model_dir)
    except Exception as e:
        return Check("model", False, str(e))
    if problems:
        return Check("model", False, f"{model_dir}: " + "; ".join(problems))
    return Check("model", True, summary)


# -- engine args ---------------------------------------------------------------------------


def check_engine_args(settings: Settings) -> Check:
    """The engine's own validation of the kwargs fleet builds (its spec's validate_args)."""
    try:
        detail = spec_for(settings).validate_args(settings)
    except Exception as e:
        return Check("engine args", False, f"{type(e).__name__}: {e}")
    if detail is None:
        return _skip("engine args", f"engine {settings.engine} has no engine args to validate")
    return Check("engine args", True, detail)


CHECKS: tuple[Callable[[Settings], Check], ...] = (
    check_broker,
    check_store,
    check_gpus,
    check_model,
    check_engine_args,
)


def run_checks(settings: Settings, gpus: int | None = None) -> list[Check]:
    """Every check, in order; a check that crashes is reported as failed, not raised. `gpus`: the
    planned fleet's, for the broker's room."""
    results = []
    for check in CHECKS:
        try:
            results.append(check_broker(settings, gpus) if check is check_broker else check(settings))
        except Exception as e:
            name = check.__name__.removeprefix("check_").replace("_", " ")
            results.append(Check(name, False, f"check crashed: {type(e).__name__}: {e}"))
    return results
