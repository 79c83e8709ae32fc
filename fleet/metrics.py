"""Prometheus metrics of a worker process, and the HTTP endpoint that serves them.

The metric objects are module-level so the worker's middleware updates them directly; each
worker process serves its own registry on its own port (settings.monitor.metrics_port plus the
worker's number), so no label names the worker: Prometheus' `instance` does.

    from fleet import metrics
    metrics.TOKENS.labels(kind="completion").inc(n)
    metrics.RUNNING_REQUESTS.set(k)
    metrics.observe_chunk(seconds, prompt_tokens=p, completion_tokens=c, accept_length=a)
    metrics.count_error(exc)
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, Info, start_http_server

#: Chunks run for minutes to hours (docs/architecture.md: a chunk ends with its longest completion).
CHUNK_SECONDS_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, float("inf"))
#: Tokens committed per speculative step: 1 (nothing accepted) up to draft tokens + 1.
ACCEPT_LENGTH_BUCKETS = (
    1.0,
    1.25,
    1.5,
    1.75,
    2.0,
    2.25,
    2.5,
    2.75,
    3.0,
    3.25,
    3.5,
    4.0,
    5.0,
    float("inf"),
)

TOKENS = Counter(
    "fleet_tokens", "Tokens processed by this worker's engine", ["kind"]
)  #: kind = "prompt" | "completion"
TOKENS_MADE = Counter(
    "fleet_tokens_made",
    "Output tokens this worker's engine made, counted as they stream (a committed chunk's completion tokens "
    "are also counted in fleet_tokens; the difference over a job is what was made twice)",
)
TOKENS_CONTINUED = Counter(
    "fleet_tokens_continued", "Checkpointed output tokens this worker continued from instead of making them again"
)
SAMPLES_ENDED_IN_CHECKPOINT = Counter(
    "fleet_samples_ended_in_checkpoint",
    "Samples whose checkpointed ids already ended them (an end id, a stop string, max tokens): kept as made, "
    "never continued",
)
SAMPLES_RESTARTED = Counter(
    "fleet_samples_restarted",
    "Samples started again from token 0 because their sampling cannot cross a seam on this engine",
)
REPETITION_STOPS = Counter(
    "fleet_repetition_stops", "Samples the repetition stop ended in an exact loop (finish reason repetition)"
)
RECORDS = Counter(
    "fleet_records", "Records finished by this worker", ["outcome"]
)  #: outcome = "ok" | "error" (a record that failed alone)
BEAT_SECONDS = Histogram(
    "fleet_beat_seconds",
    "Round trip of one heartbeat: every lease of this process renewed, with its runs' figures, in one script",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, float("inf")),
)
CHUNK_SECONDS = Histogram(
    "fleet_chunk_seconds",
    "Wall seconds from chunk start to committed result",
    buckets=CHUNK_SECONDS_BUCKETS,
)
CHUNKS_DONE = Counter("fleet_chunks_done", "Chunks whose result this worker committed")
RUNS_FAILED = Counter(
    "fleet_runs_failed", "Chunk runs that failed on this worker (requeued or quarantined: fleet.coord.retry)"
)
RUNNING_CHUNKS = Gauge("fleet_running_chunks", "Chunks this worker runs now (at most K slots)")
RUNNING_REQUESTS = Gauge("fleet_running_requests", "Requests in flight in this worker's engine")
ACCEPT_LENGTH = Gauge("fleet_spec_accept_length", "Mean tokens per speculative step over the last chunk")
ACCEPT_LENGTH_CHUNKS = Histogram(
    "fleet_spec_accept_length_chunks",
    "Per-chunk mean speculative accept length",
    buckets=ACCEPT_LENGTH_BUCKETS,
)
ERRORS = Counter("fleet_errors", "Errors by class", ["error_class"])
ENGINE_STALLED = Gauge(
    "fleet_engine_stalled", "1 once this worker's engine made no token for stall_s while requests ran (it restarts)"
)
STORE_UNREACHABLE_SINCE = Gauge(
    "fleet_store_unreachable_since_seconds",
    "Unix time since which the store refuses this worker's writes (0: it answers); results wait in its spool",
)
STORE_REQUESTS = Counter(
    "fleet_store_requests",
    "Requests this worker made of its store by method (PUT, GET, HEAD, LIST, DELETE, DeleteObjects) and kind of "
    "object (chunks, results, partial, manifest.json ...), as S3 bills them: a listing a request per 1,000 keys, "
    "a batch delete a request per 1,000 (fleet.store.counted)",
    ["method", "kind"],
)
SPOOLED_RESULTS = Gauge(
    "fleet_spooled_results", "Chunk results this worker keeps on its disk because the store refused them"
)
RETRACTIONS = Counter(
    "fleet_engine_retractions",
    "Running requests the engine retracted for KV room (SGLang): its batch outgrew the KV pool",
)
CHUNKS_REQUEUED = Counter(
    "fleet_chunks_requeued", "Chunk messages this process sent again: a failure, a hand-back, a lost lease or a stall"
)
ENGINE_MAX_RUNNING = Gauge(
    "fleet_engine_max_running",
    "S: requests the engine really runs at once (SGLang's, read back after start); running requests' ceiling",
)
USD_PER_GPU_HOUR = Gauge("fleet_usd_per_gpu_hour", "Price of this worker's GPU in USD per hour (settings)")
WORKER_DEATHS = Gauge(
    "fleet_worker_deaths", "Recorded deaths of this worker's processes while holding chunks: all, or in a row "
    "before finishing a batch", ["kind"]
)  #: kind = "all" | "in_a_row"
WORKER_BENCHED = Gauge(
    "fleet_worker_benched", "1 while this worker is benched: its processes keep dying before finishing a batch"
)
WORKER_START = Gauge(
    "fleet_worker_start_seconds",
    "Seconds from this process's birth (the kernel's) until each point of its start, in order: main, engine_begun, "
    "imported, runtime, engine_ready, consuming, first_token (fleet.worker.process.startclock)",
    ["until"],
)
ENGINE_START = Gauge(
    "fleet_engine_start_seconds",
    "Seconds from this process's birth to its engine ready: what a new host or a restart pays before any token",
)
READY_TO_FIRST_TOKEN = Gauge(
    "fleet_engine_ready_to_first_token_seconds", "Seconds from this process's engine ready to its first token"
)
RUN_FIRST_TOKEN = Histogram(
    "fleet_run_first_token_seconds",
    "Seconds from a chunk's delivery to this worker (its lease taken at once) to its run's first token",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, float("inf")),
)
WORKER = Info("fleet_worker", "Which worker this is: name, gpu, engine, model")

_server: WSGIServer | None = None
_thread: threading.Thread | None = None


def observe_chunk(
    seconds: float,
    *,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    records_ok: int = 0,
    records_error: int = 0,
    accept_length: float | None = None,
    retractions: int = 0,
) -> None:
    """Record one committed chunk (tokens are counted here unless already counted live)."""
    CHUNK_SECONDS.observe(seconds)
    CHUNKS_DONE.inc()
    if prompt_tokens:
        TOKENS.labels(kind="prompt").inc(prompt_tokens)
    if completion_tokens:
        TOKENS.labels(kind="completion").inc(completion_tokens)
    if records_ok:
        RECORDS.labels(outcome="ok").inc(records_ok)
    if records_error:
        RECORDS.labels(outcome="error").inc(records_error)
    if retractions:
        RETRACTIONS.inc(retractions)
    if accept_length is not None:
        ACCEPT_LENGTH.set(accept_length)
        ACCEPT_LENGTH_CHUNKS.observe(accept_length)


def count_error(exc: BaseException | type[BaseException]) -> None:
    """Count an error by its class name (fleet's tree decides recovery; this shows the mix)."""
    cls = exc if isinstance(exc, type) else type(exc)
    ERRORS.labels(error_class=cls.__name__).inc()


def set_worker_info(name: str, *, gpu: str = "", engine: str = "", model: str = "") -> None:
    WORKER.info({"name": name, "gpu": gpu, "engine": engine, "model": model})


def set_price(usd_per_gpu_hour: float) -> None:
    """The GPU's price, so dashboards can turn tokens into dollars."""
    USD_PER_GPU_HOUR.set(usd_per_gpu_hour)


def start_metrics_server(port: int | None, addr: str = "0.0.0.0") -> int | None:
    """Serve /metrics on `port` (0 = any free port); None = metrics off. Returns the bound port.

    One server per process: a second call returns the port already bound.
    """
    global _server, _thread
    if port is None:
        return None
    if _server is not None:
        return int(_server.server_port)
    _server, _thread = start_http_server(port, addr=addr)
    return int(_server.server_port)


def stop_metrics_server() -> None:
    global _server, _thread
    if _server is not None:
        _server.shutdown()
        _server.server_close()
    if _thread is not None:
        _thread.join(timeout=5)
    _server = _thread = None
