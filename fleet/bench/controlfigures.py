"""The control-plane bench's table (fleet.bench.controlplane): per level of N workers, what the
broker served and how fast; the restart, the wipe, Celery's own share and the store's cost.

Targets (issue 33), at steady state: <= 10 commands a second per worker sent to the broker (a
script counts once), <= 0.25 ms of Redis CPU a second per worker; at 1,000 workers Redis under
30% of one core, p99 lease renewal under 50 ms, `fleet status` under 2 s.
"""

from __future__ import annotations

import statistics
from typing import Any

from fleet.bench.report import Figure, Section, at_most

SENT_PER_WORKER = 10.0
CPU_MS_PER_WORKER = 0.25
#: at the largest level (1,000 workers)
REDIS_CORE_PCT, P99_MS, STATUS_S = 30.0, 50.0, 2.0
#: the fleet's connections at most this share of the shipped `maxclients` (ops/redis.conf)
CONNECTIONS_PCT = 50.0
#: per-worker commands at the largest level over the smallest: flat means linear in the fleet
LINEAR_WITHIN = 1.25


def per_worker(level: dict[str, Any]) -> tuple[float, float]:
    """Commands Redis ran and ms of Redis CPU a second per simulated worker, the probe's own share
    (measured alone at the level, `probe_broker`) taken out: the instrument is not a worker."""
    n, broker = level["workers"], level["broker"]
    probe = level.get("probe_broker") or {"commands": 0.0, "cpu_s": 0.0}
    return (max(0.0, broker["commands"] - probe["commands"]) / n,
            max(0.0, broker["cpu_s"] - probe["cpu_s"]) * 1000 / n)


def probe_note(level: dict[str, Any]) -> str:
    probe = level.get("probe_broker")
    if not probe:
        return ""
    return f"the probe's own {probe['commands']:.0f} commands and {probe['cpu_s'] * 1000:.2f} ms/s taken out"


def level_figures(level: dict[str, Any], largest: bool) -> list[Figure]:
    n = level["workers"]
    broker = level["broker"]
    sent = level["sent_per_s"] / n
    ran, cpu_ms = per_worker(level)
    figures = [
        at_most(f"{n} workers: commands sent per worker", round(sent, 2), SENT_PER_WORKER, "/s",
                note=f"Celery's stand-in {level['celery_sent_per_s'] / n:.2f}/s of it"),
        Figure(f"{n} workers: commands Redis ran per worker", round(ran, 1), "/s",
               note="; ".join(filter(None, ["scripts' own commands counted", probe_note(level)]))),
        at_most(f"{n} workers: Redis CPU per worker", round(cpu_ms, 4), CPU_MS_PER_WORKER, "ms/s",
                note=probe_note(level)),
    ]
    core = Figure(f"{n} workers: Redis CPU", round(broker["cpu_s"] * 100, 2), "%", note="of one core")
    probe, own = level["probe_ms"], level["beat_ms"]
    p99 = Figure(f"{n} workers: lease renewal (a worker's beat, K={level['k']}) p99", probe["p99"], "ms",
                 note=f"p50 {probe['p50']} ms, {probe['n']} beats of the probe; the simulated workers' own "
                      f"(crowded processes, niced): p50 {own['p50']}, p99 {own['p99']} ms")
    status = Figure(f"{n} workers: fleet status", round(statistics.median(level["status"]["s"]), 3), "s",
                    note=f"{level['chunks']:,} chunks, {level['chunks_done_before']:,} done; Redis "
                         f"{level['status']['redis_cpu_ms']} ms a call")
    if largest:
        figures.append(at_most(f"{n} workers: leases lost", level.get("lost_before_wipe", level.get("lost", 0)), 0,
                               note="warm-up, window, looks and restart (the wipe takes every lease on purpose)"))
        core = at_most(core.name, core.value or 0.0, REDIS_CORE_PCT, "%", core.note)
        p99 = at_most(p99.name, p99.value or 0.0, P99_MS, "ms", p99.note)
        status = at_most(status.name, status.value or 0.0, STATUS_S, "s", status.note)
    rounds = level["round_s"]
    held = level.get("connections")
    if held:
        figures.append(at_most(f"{n} workers: Redis connections, share of the shipped maxclients",
                               round(held["share"] * 100, 1), CONNECTIONS_PCT, "%",
                               note=f"{held['held']:,} of {held['maxclients']:,}; per worker {held['per_worker']}; "
                                    f"{level['broker'].get('refused', 0)} refused"))
    figures += [core, p99, status,
                Figure(f"{n} workers: reaper round (leader)", rounds["p50"], "s",
                       note=f"max {rounds['max']}, {rounds['n']} rounds"),
                Figure(f"{n} workers: the bench's own client CPU", round(level["client_cpu"] * 100, 1), "%",
                       note="of one core, every simulated worker and the driver")]
    return figures


def k_figures(level: dict[str, Any]) -> list[Figure]:
    """Another K at the same workers: what a worker costs the broker as it runs more chunks."""
    n, k = level["workers"], level["k"]
    ran, cpu_ms = per_worker(level)
    return [
        at_most(f"K={k}, {n} workers: commands sent per worker", round(level["sent_per_s"] / n, 2), SENT_PER_WORKER,
                "/s"),
        at_most(f"K={k}, {n} workers: commands Redis ran per worker", round(ran, 2), SENT_PER_WORKER, "/s",
                note="scripts' own commands counted"),
        at_most(f"K={k}, {n} workers: Redis CPU per worker", round(cpu_ms, 4), CPU_MS_PER_WORKER, "ms/s",
                note="; ".join(filter(None, [probe_note(level)]))),
        at_most(f"K={k}, {n} workers: lease renewal p99", level["probe_ms"]["p99"] or 0.0, P99_MS, "ms",
                note=f"p50 {level['probe_ms']['p50']} ms"),
        at_most(f"K={k}, {n} workers: leases lost", level.get("lost_before_wipe", level.get("lost", 0)), 0),
        *look_figures(level),
    ]


def look_figures(level: dict[str, Any]) -> list[Figure]:
    """The job exporter and Flower beside the level (fleet.bench.looks): did they hold the broker."""
    looks, slow = level.get("looks"), level.get("slowlog")
    if not looks:
        return []
    n, k = level["workers"], level["k"]
    held = level.get("connections") or {}
    maxclients = held.get("maxclients") or 1
    tag = f"K={k}, {n} workers" if k != 16 else f"{n} workers"
    out = [
        Figure(f"{tag}: job-metrics scrapes beside the fleet", looks["scrapes"], "",
               note=f"{looks['scrape_errors']} unanswered or without the job's figures (the exporter serves its last "
                    f"figures while the broker is away), longest {looks['scrape_s_max']} s"),
        at_most(f"{tag}: peak Redis connections, share of the shipped maxclients",
                round(looks["peak_connections"] * 100 / maxclients, 1), CONNECTIONS_PCT, "%",
                note=f"{looks['peak_connections']:,} of {maxclients:,} (sampled every 0.5 s, restart included)"),
    ]
    if looks.get("flower"):
        out.append(at_least_workers(tag, looks["flower_workers"], n, looks))
    if slow:
        out.append(Figure(f"{tag}: longest command Redis ran in the window", slow["longest_ms"], "ms",
                          note=f"{slow['longest']} ({slow['client'] or 'unnamed'}); {slow['count']} over "
                               f"{slow['over_ms']} ms (slow log, every client)"))
    return out


def at_least_workers(tag: str, known: int, n: int, looks: dict[str, Any]) -> Figure:
    return at_most(f"{tag}: workers Flower does not know of (from their events)", max(0, n - known), 0,
                   note=f"{known} known; {looks['refreshes']} workers-page refreshes (inspect broadcasts), "
                        f"{looks['refresh_errors']} failed, longest {looks['refresh_s_max']} s")


def idle_figures(level: dict[str, Any]) -> list[Figure]:
    """The end of a job: idle workers' assist polls and Celery's idle consumer."""
    n = level["workers"]
    ran, cpu_ms = per_worker(level)
    return [
        at_most(f"idle at a job's end, {n} workers: commands Redis ran per worker", round(ran, 2), SENT_PER_WORKER,
                "/s", note=f"sent {level['sent_per_s'] / n:.2f}/s, Celery's idle stand-in "
                           f"{level['celery_sent_per_s'] / n:.2f}/s of it; {probe_note(level)}"),
        at_most(f"idle at a job's end, {n} workers: Redis CPU per worker", round(cpu_ms, 4), CPU_MS_PER_WORKER,
                "ms/s"),
    ]


def restart_figures(level: dict[str, Any], label: str = "restart") -> list[Figure]:
    """The broker restarted under a level's fleet: its clients back, connections refused, leases lost."""
    restart, back = level["restart"], level.get("reconnect", {})
    fleet_s, celery_s = back.get("fleet_s") or {}, back.get("celery_s") or {}
    lost = level.get("lost_in_restart", 0)
    return [
        Figure(f"{label}: fleet's clients back (first beat), p5-p95", fleet_s.get("p95"), "s",
               note=f"p5 {fleet_s.get('p5')} s, p50 {fleet_s.get('p50')} s after the broker answered "
                    f"({back.get('beat_back')} of {back.get('workers')} workers)"),
        # kombu's consumer waits 2, 4, 6 ... s (jittered) between tries: on a loaded machine none may be back
        # by the watch's end, which is a count, not a missing figure
        Figure(f"{label}: Celery stand-ins back, p5-p95", celery_s["p95"], "s",
               note=f"p5 {celery_s['p5']} s, p50 {celery_s['p50']} s (kombu's 2, 4, 6 ... s, jittered)")
        if celery_s else
        Figure(f"{label}: Celery stand-ins back by the watch's end", back.get("celery_back", 0), "",
               note=f"of {back.get('workers')} (kombu's 2, 4, 6 ... s, jittered)"),
        Figure(f"{label}: new connections in the busiest 100 ms", restart["peak_per_100ms"], "",
               note=f"of {restart['connections']} in {len(restart['connections_by_s'])} s"),
        at_most(f"{label}: connections refused", restart.get("refused", 0), 0,
                note=f"{restart.get('held_after', 0):,} held after"),
        at_most(f"{label}: leases lost", lost, 0, note=f"{restart['leases_after']:,} of {restart['leases_before']:,} "
                f"live after, down {restart['down_s']} s"),
    ]


def wipe_figures(level: dict[str, Any]) -> list[Figure]:
    """The broker lost everything under a level's fleet: leases taken back, every chunk accounted for."""
    wipe = level["wipe"]
    return [
        Figure("wipe: every lease taken back", wipe["leases_back_s"], "s", note="workers retake at their next poll"),
        at_most("wipe: chunks not accounted for after enqueue",
                wipe["chunks"] - wipe["enqueued"] - wipe["running"] - wipe["done"], 0,
                note=f"enqueued {wipe['enqueued']:,}, running {wipe['running']:,}, done {wipe['done']:,} "
                     f"in {wipe['enqueue_s']} s; status then {wipe['status_after_s']} s (stats cache lost)"),
    ]


def section(data: dict[str, Any]) -> Section:
    levels = data["levels"]
    figures: list[Figure] = []
    for level in levels:
        figures += level_figures(level, level is levels[-1])
    first, last = levels[0], levels[-1]
    ratio = (last["sent_per_s"] / last["workers"]) / max(1e-9, first["sent_per_s"] / first["workers"])
    figures.append(at_most(f"commands sent per worker, {last['workers']} over {first['workers']} workers",
                           round(ratio, 3), LINEAR_WITHIN, note="1.0: the broker's load grows linearly"))
    figures += look_figures(last)
    if "restart" in last:
        figures += restart_figures(last)
    if "wipe" in last:
        figures += wipe_figures(last)
    if data.get("idle"):
        figures += idle_figures(data["idle"])
    for level in data.get("by_k", []):
        figures += k_figures(level)
        if "restart" in level:
            figures += restart_figures(level, f"K={level['k']}, {level['workers']} workers, restart")
    celery = data["celery"]
    figures.append(Figure("Celery's consumer per worker, measured (busy / idle)", celery["busy"]["celery_per_s"],
                          "/s", note=f"idle {celery['idle']['celery_per_s']}/s; patterns {celery['patterns']}"))
    store = data.get("store")
    if store:
        figures += [
            Figure("S3 requests per GPU-hour (PUT, LIST, POST)", store["put_class"], "",
                   note=f"checkpoints {store['per_gpu_hour']['PUT partial']:,}; GET/HEAD {store['get_class']}"),
            Figure("S3 request cost per GPU-hour", store["usd_per_gpu_hour"], "$",
                   note=f"reference job ({store['reference_gpu_hours']} GPU-h): ${store['reference_usd']}"),
        ]
    return Section("control-plane", f"the control plane at {last['workers']:,} workers (K={data['shape']['k']})",
                   figures, data)
