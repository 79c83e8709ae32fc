"""Every Redis key fleet uses, in one place (the broker's own keys belong to kombu).

Keys live in the broker's Redis, so losing the broker loses them together with the queue:
the store stays the source of truth and `fleet enqueue` rebuilds both.
"""

from __future__ import annotations

PREFIX = "fleet"
#: kombu's Redis transport keeps one list per priority step: "<queue>", "<queue><sep><p>". Every
#: priority a message can have is a step of its own (fleet.coord.broker.message_priority): recovery,
#: then one list per job priority. A worker BRPOPs them in this order.
PRIORITY_STEPS = tuple(range(10))
PRIORITY_SEP = "\x06\x16"


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold a Celery queue's waiting messages (kombu's naming)."""
    return [queue if p == 0 else f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]


def lease(job: str, index: int) -> str:
    """String key, no TTL: the run holding a chunk, `name:pid#boot.run`. Live while its process's key
    (process_lease) lives: a chunk's renewal costs the broker nothing of its own. A dead process's
    chunk lease is deleted by the reaper (or taken over by the next acquirer)."""
    return f"{PREFIX}:{job}:lease:{index}"


def process_lease(process: str) -> str:
    """String key, PX TTL: the worker process `name:pid#boot` is alive (fleet.coord.leases.leased_process;
    the boot tells a restarted process with the same name and pid from the one before). Every chunk lease
    naming a run of it is live while this lives; its heartbeat renews it once a beat, whatever the chunks it holds."""
    return f"{PREFIX}:process-lease:{process}"


def lease_processes() -> str:
    """Hash process (`name:pid#boot`) -> ms epoch it last took a chunk lease: the reaper's round reads
    their keys (process_lease) and scans every running chunk's lease only when one ran out, when a lease
    was let go (lease_let_go), or every few rounds (fleet.coord.scangate). A dead process leaves it once
    a scan left none of the running set's chunks to recover, unless it took a lease since."""
    return f"{PREFIX}:lease-processes"


def lease_let_go() -> str:
    """String counter, no TTL: raised when a running chunk's lease is deleted and its chunk left watched
    for the reaper (a lease let go; a release after its process's key ran out): a reaper that saw it
    change scans the running set at its next round, though no process may look dead by then."""
    return f"{PREFIX}:lease-let-go"


def running() -> str:
    """Set of "job/index" members with a lease taken; the reaper scans it for expired leases."""
    return f"{PREFIX}:running"


def queued(job: str) -> str:
    """Set of chunk indexes with a message in the queue not yet started (avoids double enqueue)."""
    return f"{PREFIX}:{job}:queued"


def attempts(job: str) -> str:
    """Hash index -> attempts spent on the chunk's own failures (fleet.coord.retry); at the
    budget it is quarantined. Infra errors and worker loss spend none."""
    return f"{PREFIX}:{job}:attempts"


def crashes(job: str) -> str:
    """Hash index -> deaths of processes that ran the chunk alone within the crash window of
    starting it: the only deaths that count towards its quarantine (fleet.coord.retry)."""
    return f"{PREFIX}:{job}:crashes"


def retries(job: str) -> str:
    """Hash index -> requeues for faults not the chunk's (infra); sets the backoff."""
    return f"{PREFIX}:{job}:retries"


def lease_started() -> str:
    """Hash "job/index" -> ms epoch the current lease was taken; with lease_beat, how long
    a lost worker ran the chunk (the evidence fleet.coord.retry blames a crash on)."""
    return f"{PREFIX}:lease-started"


def lease_beat() -> str:
    """Hash "job/index" -> ms epoch of the lease's last renewal (its holder was alive then)."""
    return f"{PREFIX}:lease-beat"


def lease_holder() -> str:
    """Hash "job/index" -> the process (`name:pid`) whose run holds its lease now; the reaper reads
    which process a lost chunk died with (fleet.coord.suspects)."""
    return f"{PREFIX}:lease-holder"


def solo_runs() -> str:
    """Hash "job/index" -> owner running it alone (no other chunk in its process): only a
    death in such a run is evidence against the chunk itself (fleet.coord.retry)."""
    return f"{PREFIX}:solo-runs"


def solo_waits() -> str:
    """Hash "job/index" -> owner whose process the chunk waits in, leased, for the other chunks to
    end before it runs alone: a death then is no evidence either way (fleet.coord.retry)."""
    return f"{PREFIX}:solo-waits"


def suspects(job: str) -> str:
    """Hash index -> JSON of the quick deaths a chunk was in (shared or alone), the workers
    whose solo runs of it died, and the last one; cleared by a result or a long run."""
    return f"{PREFIX}:{job}:suspects"


def chunk_seconds(job: str) -> str:
    """List of the last run times of committed chunks; its median fits the crash window."""
    return f"{PREFIX}:{job}:chunk-seconds"


def worker_deaths() -> str:
    """Hash worker name -> deaths of its processes while holding chunks (all time)."""
    return f"{PREFIX}:worker-deaths"


def worker_streak() -> str:
    """Hash worker name -> its processes' deaths in a row before finishing a batch (as many
    chunks as they ran at once); a finished batch clears it; at `bench_after` the worker is
    benched (fleet.coord.retry)."""
    return f"{PREFIX}:worker-streak"


def worker_last_death() -> str:
    """Hash worker name -> ms epoch of its last recorded death (the bench counts from it)."""
    return f"{PREFIX}:worker-last-death"


def store_outages() -> str:
    """Hash worker name -> JSON {since_ms, waiting}: the store has refused this worker since then,
    and this many results wait in its spool (fleet.worker.process.spool); gone once it answers again."""
    return f"{PREFIX}:store-outages"


def worker_stalls() -> str:
    """Hash worker name -> JSON {stalls, stalled_s, at_ms}: its engine stopped making tokens for
    stall_s while requests ran (fleet.worker.process.watchdog); cleared when a process of it commits."""
    return f"{PREFIX}:worker-stalls"


def worker_last_commit() -> str:
    """Hash worker name -> ms epoch a process of it last committed, once it had finished a
    batch: whether the fleet has a healthy worker besides a dying one."""
    return f"{PREFIX}:worker-last-commit"


def process_dead(owner: str) -> str:
    """Short-lived: this process's death is recorded (once, whichever reaper sees it first);
    holds the worker's streak from before it, the judge of all its lost chunks."""
    return f"{PREFIX}:dead:{owner}"


def process_committed(owner: str) -> str:
    """Short-lived: this process finished a batch of chunks, so its death is not an early one."""
    return f"{PREFIX}:committed:{owner}"


# -- who saw a process die (fleet.coord.witness) -----------------------------------------


def process_witnessed(owner: str) -> str:
    """Short-lived string: how this process (`name:pid`) died, as something that outlived it saw it (its
    launcher reaping it with its exit status). Only a witnessed death is evidence against its chunks; a
    lease run out with none is a lost host (fleet.coord.retry)."""
    return f"{PREFIX}:witnessed:{owner}"


def process_lost(owner: str) -> str:
    """Short-lived: this process's death, which no one saw, is counted against its host (once, whichever
    reaper judges one of its chunks first)."""
    return f"{PREFIX}:lost:{owner}"


def host_losses() -> str:
    """Hash host -> processes lost with no witness of their death (the whole host gone: a preemption, a
    power cut, a kill of the launcher with its workers): counted against the host, never a chunk."""
    return f"{PREFIX}:host-losses"


def engine_starts() -> str:
    """Hash of what starting engines cost this broker's fleet (fleet.coord.enginestarts): `starts` (worker
    processes whose engine got ready), `seconds` and `gpu_seconds` (summed from each process's birth to its
    engine ready, the latter times its GPUs), `since_ms` (the first). One small hash `fleet status` reads whole."""
    return f"{PREFIX}:engine-starts"


def requeue_guard(job: str, index: int) -> str:
    """Short-lived key so that only one reaper re-enqueues an expired chunk."""
    return f"{PREFIX}:{job}:requeued:{index}"


def progress(job: str) -> str:
    """Sorted set of running chunk indexes scored by the samples each has not started yet: an idle
    worker reads the top few to pick whom to assist, never every running chunk. (Until issue 33
    a hash `fleet:<job>:progress`; a new name, so a fleet upgraded mid-job never meets the old type.)"""
    return f"{PREFIX}:{job}:unstarted"


def made(job: str) -> str:
    """Hash index -> output tokens engines made for the chunk over all its runs, counted as they
    stream; less the committed result's tokens, what was made twice (lost between flushes, copies)."""
    return f"{PREFIX}:{job}:made"


def pace(job: str) -> str:
    """Hash index -> JSON {made, started_ms, at_ms} of the chunk's current run: the tokens it made
    since it started, for `fleet status`'s tok/s and ETA before anything is committed."""
    return f"{PREFIX}:{job}:pace"


def assist(job: str, index: int) -> str:
    """Lease of the one idle worker helping a straggler chunk at the end of a job."""
    return f"{PREFIX}:{job}:assist:{index}"


def reaper_leader(store: str) -> str:
    """String key, PX TTL: the process (`name:pid`) whose reaper runs the recovery round for the
    store's whole fleet (`store`: fleet.store.identity.store_id); every other worker of the store
    only tries to take it (fleet.coord.recovery). One lead a store: each store's jobs need their
    own reaper, which reads that store."""
    return f"{PREFIX}:{store}:reaper-leader"


def stall_guard(job: str) -> str:
    """Short-lived key so that only one process re-enqueues a stalled job's chunks."""
    return f"{PREFIX}:{job}:stall-resync"


def chunk_stats(job: str) -> str:
    """Hash index -> ChunkStats JSON (fleet.store.results): a cache of the result headers for `fleet status`."""
    return f"{PREFIX}:{job}:stats"


def job_stores() -> str:
    """Hash job name -> id of the store it was enqueued into (fleet.store.identity.store_id): the
    job sets of every store on this broker. A store's reaper, assister and job metrics walk only
    its own jobs, and a job name belongs to one store on a broker (the per-job keys below are
    named by job alone)."""
    return f"{PREFIX}:job-stores"


def legacy_jobs() -> str:
    """Set of job names, one for every store on the broker (before issue 44): a store's reaper
    moves its own jobs from it into job_stores (those whose manifest it holds) and leaves the
    others' alone."""
    return f"{PREFIX}:jobs"


def member(job: str, index: int) -> str:
    return f"{job}/{index}"


def parse_member(value: str) -> tuple[str, int]:
    job, _, index = value.rpartition("/")
    return job, int(index)


def mismatched_workers() -> str:
    """Hash worker name -> JSON {job, identity_hash, differences, at}: workers whose engine
    settings differ from a job's (fleet.engines.identity); `fleet status` lists them."""
    return f"{PREFIX}:mismatched-workers"


#: kombu's Redis transport (Channel.unacked_key / unacked_index_key, kombu 5.x): a hash
#: delivery tag -> JSON [message, exchange, routing key] of messages a consumer took and
#: has not acked, and a zset delivery tag -> time taken. kombu restores an entry to its
#: queue only after the visibility timeout; `fleet enqueue` reads both to repair markers.
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"
