"""The layout shows the architecture: few top-level modules, and parts that never import in a circle.

A part is a package under fleet/ (coord, store, model, engines, ...) or a top-level module.
Every import counts, including those inside functions and under TYPE_CHECKING, with no
exception: each engine's settings section lives in the settings part (fleet/settings/), which
the engines read and which never reads them.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

FLEET = Path(__file__).resolve().parent.parent / "fleet"
MAX_TOP_LEVEL_MODULES = 12


def part_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "fleet" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(FLEET.parent).with_suffix("")
    name = ".".join(rel.parts)
    return name.removesuffix(".__init__")


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def part_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in FLEET.rglob("*.py"):
        src = part_of(module_name(path))
        if src is None:
            continue
        graph.setdefault(src, set())
        for target in imported_modules(path):
            dst = part_of(target)
            # `from fleet import x` names the part x (a module or a package), never fleet itself
            if dst is None or dst == src or dst == "__version__":
                continue
            if (FLEET / dst).is_dir() or (FLEET / f"{dst}.py").exists():
                graph[src].add(dst)
    return graph


@pytest.mark.slow
def test_no_circle_between_parts():
    try:
        tuple(TopologicalSorter(part_graph()).static_order())
    except CycleError as e:
        pytest.fail(f"parts import each other in a circle: {e.args[1]}")


#: docs/architecture.md, "Parts": a part imports only parts of earlier rows (never its own row's)
LAYERS = [{"records", "errors", "settings", "metrics", "progress", "redact"}, {"store"}, {"model"}, {"coord"},
          {"engines"}, {"monitor", "audit"}, {"worker"}, {"producer"}, {"bench", "export", "tools"}, {"cli"},
          {"__main__"}]


@pytest.mark.slow
def test_parts_import_in_the_documented_direction():
    row = {part: n for n, parts in enumerate(LAYERS) for part in parts}
    graph = part_graph()
    assert set(graph) == set(row), "a part was added or removed: place it in LAYERS and docs/architecture.md"
    upward = sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts if row[dst] >= row[src])
    assert upward == [], "imports against the documented direction (docs/architecture.md, Parts)"


#: docs/architecture.md, "Parts": the worker's rooms by lifetime; a room imports only the rooms before it, and
#: the modules that wire them (runtime, celeryapp, main) sit above all three
WORKER_ROOMS = ["supervisor", "process", "run"]


def test_the_worker_rooms_import_in_the_documented_direction():
    worker = FLEET / "worker"
    rooms = sorted(p.name for p in worker.iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(WORKER_ROOMS), "a room was added or removed: place it in WORKER_ROOMS and the docs"
    upward = []
    for n, room in enumerate(WORKER_ROOMS):
        for path in (worker / room).rglob("*.py"):
            for target in imported_modules(path):
                parts = target.split(".")
                if parts[:2] != ["fleet", "worker"] or len(parts) < 3:
                    continue
                if parts[2] not in WORKER_ROOMS or WORKER_ROOMS.index(parts[2]) > n:
                    upward.append(f"{module_name(path)} -> {target}")
    assert upward == [], "a worker room imports a later room or the wiring (docs/architecture.md, Parts)"


def test_the_top_level_names_the_parts():
    loose = [p.name for p in FLEET.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(loose) <= MAX_TOP_LEVEL_MODULES, sorted(loose)


@pytest.mark.parametrize("package", sorted(p.name for p in FLEET.iterdir() if (p / "__init__.py").exists()))
def test_every_part_says_what_it_holds(package):
    init = (FLEET / package / "__init__.py").read_text(encoding="utf-8")
    assert ast.get_docstring(ast.parse(init)), f"fleet/{package}/__init__.py has no docstring"


#: a chunk's state in Redis (docs/architecture.md, "Redis keys" and "Recovery"), one family per owner: only
#: its owner names a family's keys
CHUNK_STATE = {
    "leases": ("running", "lease", "process_lease", "lease_started", "lease_beat", "requeue_guard", "assist",
               "job_stores", "legacy_jobs"),
    "chunkqueue": ("queued",),
    "counters": ("attempts", "crashes", "retries"),
    "figures": ("progress", "chunk_stats", "made", "pace"),
}
#: the crash evidence beside it (docs/architecture.md, "Redis keys" and "Failures"): only its owner names these
CRASH_EVIDENCE_KEYS = ("lease_holder", "solo_runs", "solo_waits", "suspects", "chunk_seconds", "worker_deaths",
                       "worker_streak", "worker_last_death", "worker_last_commit", "worker_stalls", "process_dead",
                       "process_committed")
#: who saw a process die, and the deaths no one saw (docs/architecture.md, "Failures")
WITNESS_KEYS = ("process_witnessed", "process_lost", "host_losses")
#: what starting engines cost the fleet, as each worker process adds its own (docs/architecture.md, "A worker's start")
ENGINE_START_KEYS = ("engine_starts",)
KEY_FAMILIES = [*((names, FLEET / "coord" / f"{owner}.py") for owner, names in CHUNK_STATE.items()),
                (CRASH_EVIDENCE_KEYS, FLEET / "coord" / "suspects.py"), (WITNESS_KEYS, FLEET / "coord" / "witness.py"),
                (ENGINE_START_KEYS, FLEET / "coord" / "enginestarts.py")]


def key_users(path: Path, names: tuple[str, ...]) -> set[str]:
    """The key functions of `names` a module names: keys.queued(...), or imported by name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in names and \
                isinstance(node.value, ast.Name) and node.value.id == "keys":
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("keys"):
            found.update(a.name for a in node.names if a.name in names)
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("names", "owner"), KEY_FAMILIES, ids=[*CHUNK_STATE, "suspects", "witness", "enginestarts"])
def test_one_module_owns_each_part_of_a_chunks_state_in_redis(names, owner):
    from fleet.coord import keys

    assert all(callable(getattr(keys, k, None)) for k in names), "keys.py renamed a key of this part"
    users = {str(p.relative_to(FLEET.parent)): key_users(p, names) for p in FLEET.rglob("*.py")
             if p not in (owner, FLEET / "coord" / "keys.py")}
    assert {p: u for p, u in users.items() if u} == {}, f"only {owner.relative_to(FLEET.parent)} may name these keys"
    assert key_users(owner, names) == set(names)


def test_the_benches_drive_the_worker_from_outside():
    """docs/architecture.md, "Parts": `fleet bench` measures what users run (`fleet` commands,
    `fleet worker` processes, the store, the metrics endpoint, Redis), never the worker's insides."""
    inside = sorted(f"{module_name(path)} -> {target}" for path in (FLEET / "bench").rglob("*.py")
                    for target in imported_modules(path) if target.split(".")[:2] == ["fleet", "worker"])
    assert inside == [], "fleet.bench imports the worker's internals"
