"""Generate a chunk's missing samples on the engine loop, record by record, reading each
request's token stream as it is made.

Each sample continues from its checkpointed prefix where one exists, and its new ids go
into the run as they stream, for the next checkpoint (docs/architecture.md, "Tokens as they are made").
A record that fails alone becomes an error record and the chunk goes on; any other
exception fails the whole run, so an incomplete chunk is never reported done.

With `turns = all` (fleet/model/turns.py) a conversation's sample runs its turns one after
another in one slot: each turn's prompt holds the turns generated before it, a finished turn
goes into the run (and the next checkpoint) before the next one starts, a run starts at the
first turn its checkpoints lack, and the first turn that does not finish ends the record.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from fleet import metrics
from fleet.engines.base import Engine
from fleet.errors import ConfigError, RecordError
from fleet.model.repetition import Cycle, RepetitionSettings, RepetitionWatch, watch_for
from fleet.model.turns import turn_count, turn_prompt
from fleet.records import (
    TURN_FIELDS,
    GenRequest,
    GenResult,
    InputRecord,
    OutputRecord,
    Sampling,
    record_sampling,
    record_seed,
)
from fleet.store.results import finished
from fleet.worker.process.watchdog import EngineClock
from fleet.worker.run.chunk import ChunkRun, LiveSample, sample_key

log = logging.getLogger(__name__)


def job_sampling(config: dict[str, Any]) -> dict[str, Any]:
    """The job's sampling as its manifest resolved it at enqueue; one without max_tokens (a manifest
    fleet did not write) is refused, naming the field, before any request is built."""
    sampling = config.get("sampling") or {}
    if sampling.get("max_tokens") is None:
        raise ConfigError("the job's manifest holds no sampling.max_tokens (a manifest fleet did not write): "
                          "enqueue the job again under another --job name")
    return sampling


def requests_for(run: ChunkRun) -> list[tuple[InputRecord, GenRequest]]:
    """Requests for every sample the chunk still lacks (checkpointed ones are skipped), each with its
    final sampling (record_sampling): what the engine sends, unchanged."""
    assert run.manifest is not None
    config = run.manifest.config
    defaults, job_seed = job_sampling(config), config["seed"]
    out = []
    for record in run.records:
        for sample in range(record.sample_count(defaults.get("n", 1))):
            if sample_key(record.id, sample) in run.finished:
                continue
            request = GenRequest(
                record_id=record.id,
                chunk=run.index,
                sample=sample,
                sampling=record_sampling(defaults, record, record_seed(job_seed, record, sample)),
                messages=record.messages,
                prompt=record.prompt,
                input_ids=record.input_ids,
                enable_thinking=config.get("enable_thinking", True),
                return_output_ids=config.get("return_output_ids", False),
            )
            out.append((record, request))
    return out


def to_output(
    run: ChunkRun, record: InputRecord, req: GenRequest, res: GenResult, model: str | None,
    continued_at: list[int] | None = None,
) -> dict:
    meta = res.meta or {}
    return OutputRecord(
        id=record.id,
        sample=req.sample,
        output=res.text,
        reasoning=res.reasoning,
        output_ids=res.output_ids if req.return_output_ids else None,
        prompt_tokens=res.prompt_tokens,
        completion_tokens=res.completion_tokens,
        finish_reason=res.finish_reason,  # type: ignore[arg-type]
        in_thinking=res.in_thinking,
        error=res.error,
        chunk=run.index,
        worker=run.worker,
        model=model,
        cached_tokens=meta.get("cached_tokens"),
        spec_accept_length=meta.get("spec_accept_length"),
        spec_verify_ct=meta.get("spec_verify_ct"),
        latency_s=meta.get("latency_s"),
        retractions=meta.get("retractions"),
        prompt_digest=meta.get("prompt_digest"),
        continued_at=continued_at or None,
        extra=record.extra,
        pos=record.pos,
    ).model_dump(mode="json")


def turn_sampling(sampling: Sampling, turn: int) -> Sampling:
    """Turn k's sampling: the sample's, with a seed of its own, so sampled turns do not repeat
    one random stream and a rerun of turn k asks for the same one."""
    if turn == 0 or sampling.seed is None:
        return sampling
    return replace(sampling, seed=(sampling.seed + turn) & 0x7FFFFFFF)


def error_output(run: ChunkRun, record: InputRecord, req: GenRequest, err: Exception, model: str | None) -> dict:
    res = GenResult(text="", completion_tokens=0, prompt_tokens=0, finish_reason="error", error=str(err))
    return to_output(run, record, req, res, model)


def longest_first(engine: Engine, pairs: list[tuple[InputRecord, GenRequest]]) -> list[tuple[InputRecord, GenRequest]]:
    """Admit the longest expected requests first, so a chunk's tail is not its longest record
    started last; keeps input order when the engine cannot predict lengths."""
    predicted = [engine.predict_tokens(req) for _, req in pairs]
    if any(p is None for p in predicted):
        return pairs
    order = sorted(range(len(pairs)), key=lambda i: -predicted[i])  # type: ignore[operator]
    return [pairs[i] for i in order]


async def ended_prefix(
    engine: Engine, req: GenRequest, watch: RepetitionWatch | None
) -> tuple[GenResult, Cycle | None] | None:
    """The record of a sample whose checkpointed ids already end it, else None. Its last run made an
    end id, a stop string, its max tokens or a loop and stopped before its record was kept (a
    hand-over, a kill): the record is what that run made, with the reason its ids give, and nothing
    is generated past its end (docs/architecture.md, "Tokens as they are made")."""
    ending = await engine.ended(req)
    if ending is not None:
        req.prefix_ids = req.prefix_ids[: ending.length]
    cycle = watch.feed(req.prefix_ids) if watch is not None else None
    if cycle is not None:  # the loop was already there when the last run stopped
        return await engine.cut(req, [], "repetition"), cycle
    if ending is not None:
        metrics.SAMPLES_ENDED_IN_CHECKPOINT.inc()
        return await engine.cut(req, [], ending.reason), None
    return None


async def read_stream(
    engine: Engine, req: GenRequest, run: ChunkRun, live: LiveSample, repetition: RepetitionSettings,
    clock: EngineClock | None = None,
) -> tuple[GenResult, Cycle | None]:
    """Read one request's stream to its end, keeping every delta in the run as it comes; a
    closed stream (the chunk cancelled) ends the request inside the engine. The repetition
    stop watches the whole output (a continued sample's prefix first) and ends a loop early:
    the record keeps what it made, with finish reason `repetition`."""
    watch = watch_for(repetition)
    if req.prefix_ids:
        ended = await ended_prefix(engine, req, watch)
        if ended is not None:
            return ended
    stream = engine.stream(req)
    result, new = None, 0
    try:
        async for delta in stream:
            if delta.ids:
                run.extend(live, delta.ids)
                new += len(delta.ids)
                if clock is not None:
                    clock.tick()
                cycle = watch.feed(delta.ids) if watch is not None else None
                if cycle is not None and delta.result is None:  # closing the stream aborts the request
                    metrics.REPETITION_STOPS.inc()
                    return await engine.cut(req, live.ids[len(req.prefix_ids) :], "repetition"), cycle
            if delta.result is not None:
                result = delta.result
    finally:
        await stream.aclose()
    if result is None:
        raise RecordError(f"{engine.name} engine ended record {req.record_id!r} without a result")
    return result, None


async def generate_chunk(
    run: ChunkRun, engine: Engine, gate: asyncio.Semaphore | None = None, clock: EngineClock | None = None
) -> None:
    model = engine.model_name()
    repetition = RepetitionSettings.of_job(run.manifest.config if run.manifest else {})
    gate = gate or asyncio.Semaphore(engine.max_running)
    nonce = uuid.uuid4().hex[:8]
    watched = clock or EngineClock()
    every_turn = (run.manifest.config if run.manifest else {}).get("turns") == "all"

    async def one(record: InputRecord, req: GenRequest) -> None:
        async with gate:
            await admitted(record, req)

    async def generated(record: InputRecord, req: GenRequest, turn: int = 0) -> dict:
        """One request (a sample, or one turn of it) to its end, as an output record."""
        began = time.monotonic()
        live = run.begin(record.id, req.sample, turn)
        req.prefix_ids = list(live.ids)
        req.request_id = f"{run.name}/{record.id}/{req.sample}" + (f"/turn{turn}" if turn else "") + f"/{nonce}"
        if req.prefix_ids and (why := engine.restart_reason(req)) and not await engine.ended(req):
            log.info("chunk %s: record %r sample %d starts again from token 0, not %d: %s", run.name, record.id,
                     req.sample, len(req.prefix_ids), why)
            run.restart(live)
            req.prefix_ids = []
        if req.prefix_ids:
            metrics.TOKENS_CONTINUED.inc(len(req.prefix_ids))
        run.inflight += 1
        watched.enter()
        try:
            res, cycle = await read_stream(engine, req, run, live, repetition, watched)
            res.meta.setdefault("latency_s", round(time.monotonic() - began, 4))
            out = to_output(run, record, req, res, model, live.continued_at)
            out["repetition_period"] = cycle.period if cycle else None
            return out
        finally:
            run.inflight -= 1
            watched.leave()

    async def admitted(record: InputRecord, req: GenRequest) -> None:
        if every_turn and record.messages:
            await conversation(record, req)
            return
        try:
            run.add(await generated(record, req))
        except RecordError as e:
            run.add(error_output(run, record, req, e, model))

    async def conversation(record: InputRecord, req: GenRequest) -> None:
        """Every turn of a conversation's sample in order, from the first its checkpoints lack."""
        assert record.messages is not None
        count, done = turn_count(record.messages), run.done_turns(record.id, req.sample)
        turn = len(done)
        try:
            while True:
                if turn >= count:  # checkpoints of another conversation under this id: never made here
                    raise RecordError(f"the conversation has {count} turns, the checkpoints {turn}")
                turn_req = replace(req, messages=turn_prompt(record.messages, done), prefix_ids=[],
                                   sampling=turn_sampling(req.sampling, turn))  # fmt: skip
                out = await generated(record, turn_req, turn)
                done.append({"turn": turn, **{k: out.get(k) for k in TURN_FIELDS if k != "turn"}})
                if turn + 1 >= count or not finished(out):
                    break
                run.add_turn(record.id, req.sample, done[-1])
                turn += 1
        except RecordError as e:
            out = error_output(run, record, req, RecordError(f"turn {turn}: {e}"), model)
        run.add({**out, "turns": done}, turn)

    tasks = [asyncio.ensure_future(one(rec, req)) for rec, req in longest_first(engine, requests_for(run))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
