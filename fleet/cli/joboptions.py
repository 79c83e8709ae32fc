"""`fleet job set`: change a job's options (fleet.store.options) while it runs, without a restart."""

from __future__ import annotations

from typing import Annotated

import typer

from fleet.cli.app import BrokerOpt, JobOpt, StoreOpt, app, console, preflight, run_guarded, settings_from
from fleet.store.options import settable

job_app = typer.Typer(help="A job's options: what it may change without becoming another job.",
                      no_args_is_help=True)
app.add_typer(job_app, name="job")


@job_app.command("set")
def set_options(
    assignments: Annotated[list[str], typer.Argument(
        help=f"NAME=VALUE, one or more, of: {', '.join(settable())} (priority -3 to 5, higher first); NAME= sets "
        "one back to its default", metavar="NAME=VALUE...")],
    job: JobOpt,
    broker_url: BrokerOpt = None, store_url: StoreOpt = None,
) -> None:
    """Change a job's options: the workers' retry policy and reaper read them within seconds, and a new
    priority moves the job's waiting chunks to their new place in the queue at once."""
    from fleet.coord.broker import make_celery, redis_client
    from fleet.coord.chunkqueue import ChunkQueue
    from fleet.producer.jobset import apply_change, planned
    from fleet.store import store_for
    from fleet.store.manifest import require_manifest
    from fleet.store.options import parse_assignments

    settings = settings_from(broker_url=broker_url, store_url=store_url)
    wanted = run_guarded(parse_assignments, assignments)
    preflight(settings, broker=bool(settings.broker_url), store=True)
    store = store_for(settings)
    run_guarded(require_manifest, store, job)
    change = run_guarded(planned, store, job, wanted)
    r = redis_client(settings) if settings.broker_url else None
    queue = ChunkQueue.of(make_celery(settings), settings, r) if r is not None else None
    try:
        done = run_guarded(apply_change, store, r, queue, job, change)
    finally:
        if r is not None:
            r.close()
    console.print(f"job {job}: {done.after.summary()}" + (f"; {done.moved} waiting chunk(s) moved to the new "
                                                           "priority" if done.moved else ""),
                  highlight=False, soft_wrap=True)  # one line, whatever the terminal's width: scripts read it
    if r is None and done.after.priority != done.before.priority:
        console.print("no broker configured (FLEET_BROKER_URL): waiting chunks keep their place until requeued",
                      highlight=False)
