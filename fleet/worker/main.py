"""Entry point of one worker process: `python -m fleet.worker.main --name gpu0@host`."""

from __future__ import annotations

import argparse
import contextlib

#: seconds between a worker's heartbeat events (Celery's default is 2): each is a PUBLISH that
#: Redis matches against every pattern subscription (a worker's remote-control channel is one),
#: so a thousand workers at 2 s cost the broker more than their leases do. Flower marks a worker
#: offline after two missed ones (docs/architecture.md, "Scaling").
EVENT_HEARTBEAT_S = 10


def start_engine_early() -> None:
    """The engine starts first, on its own thread, and loads while Celery's imports and setup run (a
    second or more); the runtime waits for it before it reads the model and before Celery consumes
    (docs/architecture.md, "A worker's start"). Not an engine whose start forks Python processes (vLLM's
    EngineCore): a child forked while this thread imports would keep that import's lock for ever.
    Settings or an engine that cannot be built are decided where they always were: the runtime builds
    the engine again, fails, and the process exits for its launcher to restart it."""
    from fleet.engines.specs import spec_for
    from fleet.settings import load_settings
    from fleet.worker.process.enginehost import start_early

    with contextlib.suppress(Exception):
        settings = load_settings()
        spec = spec_for(settings)
        if spec.starts_early:
            start_early(spec.build(settings))


def main(argv: list[str] | None = None) -> None:
    from fleet.worker.process.startclock import CLOCK

    CLOCK.mark("main")
    parser = argparse.ArgumentParser(prog="fleet-worker")
    parser.add_argument("--name", required=True, help="Celery node name, e.g. gpu0@host")
    parser.add_argument("--concurrency", type=int, required=True, help="K chunk slots")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)

    from fleet.worker.supervisor.parent import engine_processes_die_with_their_parent, from_env

    from_env()
    engine_processes_die_with_their_parent()
    start_engine_early()
    from fleet.coord.broker import chunk_queue
    from fleet.worker.celeryapp import app, settings

    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={args.concurrency}",
            f"--hostname={args.name}",
            f"--queues={chunk_queue(settings)}",
            f"--loglevel={args.loglevel}",
            "--task-events",
            # Mingle asks every worker for its state at each start and gossip subscribes each
            # worker to every other's events: both grow with the square of the fleet, and fleet
            # uses neither (docs/architecture.md, "Scaling").
            "--without-mingle",
            "--without-gossip",
            f"--heartbeat-interval={EVENT_HEARTBEAT_S}",
        ]
    )


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__":  # imported first in every child multiprocessing spawns below a worker
    from fleet.worker.supervisor.parent import spawned_below_a_worker

    spawned_below_a_worker()
