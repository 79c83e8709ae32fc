"""What Celery's own consumer asks of the broker, measured from a real `fleet worker`.

The control-plane bench (fleet.bench.controlplane) replaces Celery's consumer by a stand-in
that sends what this measures: one real worker on its own redis-server, idle (an empty queue)
and busy (every slot running a long chunk, its engine full), every command it sends read from
MONITOR. kombu's own connections (its BRPOP, its subscription) name themselves
(fleet.coord.pool.KOMBU_NAME); the process's pool carries fleet's commands and kombu's short ones
(fleet.coord.transport), told apart by the keys they touch (`kombu_command`). A command a script
runs is the script's, not a client's.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from fleet.bench.procs import WorkerHost, clean_env, run_fleet, wait_until
from fleet.coord import leases
from fleet.coord.keys import PREFIX
from fleet.coord.localredis import LocalRedis
from fleet.coord.pool import CLIENT_NAME
from fleet.errors import FleetError

QUEUE = "celerycost"
#: the busy worker's chunks: long (seconds of sim steps a record) so none ends in the window
BUSY_ENV = {"FLEET_CHUNK_SIZE": "4", "FLEET_SLOTS": "4", "FLEET_SIM__MAX_RUNNING": "8",
            "FLEET_SIM__STEP_S": "0.05", "FLEET_SIM__MEAN_OUTPUT_TOKENS": "5000", "FLEET_SIM__SIGMA": "0.1"}


@dataclass
class Phase:
    """One window's commands per second, by sender and command (name and first argument)."""

    seconds: float
    celery: dict[str, float] = field(default_factory=dict)
    fleet: dict[str, float] = field(default_factory=dict)
    #: bytes of the PUBLISHes kombu sent (a worker's heartbeat and task events), mean
    publish_bytes: float = 0.0

    @property
    def celery_per_s(self) -> float:
        return sum(self.celery.values())

    @property
    def fleet_per_s(self) -> float:
        return sum(self.fleet.values())


@dataclass
class CeleryCost:
    """What one real worker's Celery consumer costs the broker."""

    idle: Phase
    busy: Phase
    #: pattern subscriptions (PSUBSCRIBE) one worker holds: every PUBLISH is matched against each
    patterns: list[str]
    #: connections one worker keeps open, kombu's and fleet's
    connections: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("idle", "busy"):
            phase = getattr(self, name)
            out[name] |= {"celery_per_s": round(phase.celery_per_s, 3), "fleet_per_s": round(phase.fleet_per_s, 3)}
        return out


#: what only kombu sends on the shared pool: events, and its acks' and bindings' keys
KOMBU_COMMANDS = {"PUBLISH", "ZADD", "ZREM", "HDEL", "ZRANGE", "ZREVRANGEBYSCORE"}
KOMBU_KEYS = ("unacked", "_kombu.", "/")


def kombu_command(words: list[str]) -> bool:
    """Whether a command the shared pool carried is kombu's: fleet's keys all start with its prefix,
    and fleet sends none of KOMBU_COMMANDS."""
    name = words[0].upper() if words else ""
    if name in KOMBU_COMMANDS:
        return True
    first = words[3] if name in ("EVALSHA", "EVAL") and len(words) > 3 else words[1] if len(words) > 1 else ""
    return first.strip('"').startswith(KOMBU_KEYS) and not first.strip('"').startswith(PREFIX)


def listen(port: int, seconds: float | None = None, until: threading.Event | None = None) -> tuple[Phase, list[str]]:
    """Every command the server runs for `seconds` (or until `until` is set), by sender (MONITOR);
    and the patterns kombu's clients subscribed meanwhile (PSUBSCRIBE)."""
    counts: dict[str, Counter[str]] = {"celery": Counter(), "fleet": Counter()}
    publish: list[int] = []
    patterns: list[str] = []
    names: dict[str, str] = {}
    #: a connection's open transaction (commands seen in it) and whose it is
    multi: dict[str, int] = {}
    owner: dict[str, str] = {}
    admin = redis.Redis(port=port, client_name="bench")
    # No read timeout: redis-py (8 and later: 5 s by default) drops the connection when a read times
    # out, which ends a MONITOR on a broker quiet for a while (a worker still importing its engine).
    # The loop ends at the first command past its end instead, which a timer sends if no one does.
    watcher = redis.Redis(port=port, client_name="bench", socket_timeout=None)
    began = time.time()
    end = began + seconds if seconds is not None else float("inf")
    nudge = threading.Timer(seconds + 0.1, admin.ping) if seconds is not None else None
    if nudge is not None:
        nudge.daemon = True
        nudge.start()
    with watcher.monitor() as monitor:
        for cmd in _commands(monitor, end, until):
            if cmd.get("client_type") == "lua":
                continue
            addr = f"{cmd['client_address']}:{cmd['client_port']}"
            if addr not in names:
                names.update({c["addr"]: c.get("name", "") for c in admin.client_list()})
            who = names.get(addr, "")
            words = cmd["command"].split()
            name = words[0].upper() if words else ""
            if who == "bench" or name in ("CLIENT", "MONITOR", "HELLO"):
                continue
            if name == "PSUBSCRIBE" and who != CLIENT_NAME:
                patterns += words[1:]
            label = f"{name} {words[1][:40]}" if len(words) > 1 and name in ("PUBLISH", "BRPOP", "EVALSHA") else name
            if name == "MULTI":  # a transaction is its first command's sender's
                multi[addr] = 1
                continue
            kombus = who != CLIENT_NAME or kombu_command(words)
            if addr in multi and name != "EXEC":
                multi[addr] += 1
                if multi[addr] == 2:
                    owner[addr] = "celery" if kombus else "fleet"
                    counts[owner[addr]]["MULTI"] += 1
            if name == "EXEC" and addr in multi:
                del multi[addr]
                counts[owner.get(addr, "fleet")][label] += 1
                continue
            counts["celery" if kombus else "fleet"][label] += 1
            if name == "PUBLISH" and kombus:
                publish.append(len(cmd["command"]))
    if nudge is not None:
        nudge.cancel()
    admin.close()
    took = max(1e-3, (seconds if seconds is not None else time.time() - began))
    per_s = {k: {c: round(n / took, 4) for c, n in v.most_common()} for k, v in counts.items()}
    phase = Phase(round(took, 1), per_s["celery"], per_s["fleet"], sum(publish) / len(publish) if publish else 0.0)
    return phase, patterns


def _commands(monitor: Any, end: float, until: threading.Event | None) -> Iterator[dict[str, Any]]:
    """MONITOR's commands until `end` or `until`, seen at the first command after either (the
    caller sends one when the broker may be quiet)."""
    while time.time() < end and not (until is not None and until.is_set()):
        cmd = monitor.next_command()
        if cmd["time"] > end:
            return
        yield cmd


def measure_celery(workdir: Path, seconds: float = 30.0) -> CeleryCost:
    """One real worker (sim engine), idle then busy, `seconds` each; its subscriptions as it starts."""
    workdir.mkdir(parents=True, exist_ok=True)
    server = LocalRedis(workdir / "redis", persist=False).start()
    admin = redis.Redis(port=server.port, client_name="bench")
    env = clean_env(workdir, {"FLEET_BROKER_URL": server.url, "FLEET_STORE_URL": str(workdir / "store"),
                              "FLEET_ENGINE": "sim", "FLEET_QUEUE": QUEUE, **BUSY_ENV})
    booted = threading.Event()
    startup: list[list[str]] = []
    watcher = threading.Thread(target=lambda: startup.append(listen(server.port, until=booted)[1]), daemon=True)
    watcher.start()
    time.sleep(0.5)  # MONITOR is on before the worker connects
    host = WorkerHost(env, 1, workdir / "worker.log", host="celerycost").start()
    try:
        host.wait_ready()
        time.sleep(3)  # past its start: the consumer's first declarations
        booted.set()
        admin.ping()  # one more command, so the MONITOR loop sees the event
        watcher.join(10)
        idle, _ = listen(server.port, seconds)
        prompts = workdir / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"c{i}", "prompt": "x"}) + "\n" for i in range(32)))
        run_fleet(["enqueue", str(prompts), "--job", "celerycost"], env, 120, workdir)
        slots = int(BUSY_ENV["FLEET_SLOTS"])
        wait_until(lambda: len(leases.running_indexes(admin, "celerycost")) >= slots, 60, "every slot running")
        time.sleep(3)
        busy, _ = listen(server.port, seconds)
        clients = Counter("fleet" if c.get("name") == CLIENT_NAME else "celery"
                          for c in admin.client_list() if c.get("name") != "bench")
    finally:
        booted.set()
        host.stop()
        admin.close()
        server.stop()
    if not startup:
        raise FleetError("the MONITOR of the worker's start ended in an error (see the log above): its "
                         "subscriptions are unknown")
    return CeleryCost(idle, busy, startup[0], dict(clients))


def replay_mix(cost: CeleryCost, phase: str = "busy") -> list[tuple[str, float]]:
    """The stand-in's steady-state schedule per worker: (command, per second) of the phase (busy or
    idle), PUBLISH kept (its cost grows with pattern subscriptions), every other command sent as a PING."""
    out: dict[str, float] = {}
    for label, rate in getattr(cost, phase).celery.items():
        kind = "PUBLISH" if label.startswith("PUBLISH") else "PING"
        out[kind] = out.get(kind, 0.0) + rate
    return sorted(out.items())
