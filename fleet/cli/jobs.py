"""Job commands: run, validate, enqueue, status, export."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Annotated, Literal

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from fleet.audit.job import AuditCounts
from fleet.cli.app import (
    BrokerOpt,
    ChunkOpt,
    ColumnsOpt,
    ConfigOpt,
    DataDirOpt,
    EngineOpt,
    GpusOpt,
    JobOpt,
    ModelOpt,
    RevisionOpt,
    SlotsOpt,
    SplitOpt,
    StoreOpt,
    TurnsOpt,
    WorkersOpt,
    app,
    console,
    fail,
    input_flags,
    preflight,
    run_guarded,
    settings_from,
    setup_logging,
)
from fleet.cli.flags import input_url, job_name, positive
from fleet.cli.liveprogress import live_progress
from fleet.export.formats import FORMATS
from fleet.store.options import settable

#: `--format`: one of the export formats (fleet.export.formats.FORMATS)
ExportFormat = Literal[tuple(FORMATS)]  # type: ignore[valid-type]

_INPUT = ("prompts: a JSONL or Parquet file or a dataset folder (Parquet shards, save_to_disk), a path, "
          "s3://bucket/key, gs://bucket/key or hf://datasets/ORG/NAME")
InputArg = Annotated[str, typer.Argument(help=_INPUT, callback=input_url)]
#: run and enqueue take an input, or --redo JOB (fleet.producer.redo)
SourceArg = Annotated[str | None, typer.Argument(help=f"{_INPUT} (none with --redo)", callback=input_url)]
RedoOpt = Annotated[str | None, typer.Option(
    "--redo", callback=job_name, help="a second pass: this job's input is JOB's rows that did not finish (cut, "
    "ended in thinking, errors, loops); JOB must be complete")]

MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", help="sampling max tokens")]
#: a job's options (fleet.store.options): outside its identity, changed later with `fleet job set`
PriorityOpt = Annotated[int | None, typer.Option(
    "--priority", help="which job's chunks workers take first, -3 to 5, higher first (default 0); "
    "`fleet job set --job J priority=N` changes it later")]
MaxAttemptsOpt = Annotated[int | None, typer.Option(
    "--max-attempts", help="this job's failed attempts before a chunk is quarantined (default: the fleet's "
    "max_attempts setting)")]
DeadlineOpt = Annotated[str | None, typer.Option(
    "--deadline", help="no chunk of this job starts after this time: UTC, ISO 8601 (2026-12-07T06:00), or a "
    "duration from now (90m, 6h, 2d); chunks running then finish")]
TokenBudgetOpt = Annotated[int | None, typer.Option(
    "--token-budget", help="output tokens the engines may make for this job, every run counted; once made, no "
    "further chunk starts (running ones finish)")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help=f"a job option NAME=VALUE (again for more): {', '.join(settable())}")]


def option_flags(assignments: list[str] | None, **flags: object) -> dict[str, object]:
    """The job options the flags give, by name (fleet.store.options): `--set` words, then each
    option flag given (its name the option's); a bad word is one line."""
    from fleet.store.options import parse_assignments

    given: dict[str, object] = run_guarded(parse_assignments, assignments or [])
    return given | {name: value for name, value in flags.items() if value is not None}
#: `fleet run`'s CPU workers where --workers is not given
LOCAL_WORKERS = 2


def check_source(input: str | None, redo: str | None) -> None:
    if (input is None) == (redo is None):
        fail("give an input file, or --redo JOB to take a finished job's unfinished rows (not both)")


@app.command()
def run(
    input: SourceArg = None,
    *,
    job: JobOpt,
    redo: RedoOpt = None,
    workers: WorkersOpt = LOCAL_WORKERS,
    gpus: GpusOpt = None,
    engine: EngineOpt = None, model: ModelOpt = None, broker_url: BrokerOpt = None,
    store_url: StoreOpt = None, chunk_size: ChunkOpt = None, slots: SlotsOpt = None,
    data_dir: DataDirOpt = None, max_tokens: MaxTokensOpt = None, turns: TurnsOpt = None,
    config: ConfigOpt = None, split: SplitOpt = None, revision: RevisionOpt = None, columns: ColumnsOpt = None,
) -> None:
    """Everything on one machine: local Redis if none is set, workers, enqueue, progress."""
    check_source(input, redo)
    setup_logging()
    from fleet.tools.localrun import run_local

    settings = settings_from(engine=engine, model=model, broker_url=broker_url, store_url=store_url,
                             chunk_size=chunk_size, slots=slots, data_dir=data_dir, turns=turns, max_tokens=max_tokens,
                             **input_flags(config, split, revision, columns))
    gpu_list = None
    if gpus:
        from fleet.model.gpus import parse_gpu_spec

        gpu_list = run_guarded(parse_gpu_spec, gpus)
    preflight(settings, broker=bool(settings.broker_url), store=True)
    began = time.monotonic()
    st = run_guarded(run_local, settings, input, job, workers=workers, gpus=gpu_list, redo_of=redo)
    console.print(f"{st.records_done} records, {st.chunks_done}/{st.chunks_total} chunks, "
                  f"{st.completion_tokens:,} output tokens in {time.monotonic() - began:.1f}s")
    if not st.done:
        fail(f"{st.chunks_failed} chunk(s) failed: see `fleet status --job {job}`", code=1)


@app.command()
def enqueue(
    input: SourceArg = None,
    *,
    job: JobOpt,
    redo: RedoOpt = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="give quarantined chunks another round")] = False,
    priority: PriorityOpt = None, max_attempts: MaxAttemptsOpt = None, deadline: DeadlineOpt = None,
    token_budget: TokenBudgetOpt = None, set_options: SetOpt = None,
    engine: EngineOpt = None, model: ModelOpt = None, broker_url: BrokerOpt = None,
    store_url: StoreOpt = None, chunk_size: ChunkOpt = None, max_tokens: MaxTokensOpt = None,
    turns: TurnsOpt = None,
    config: ConfigOpt = None, split: SplitOpt = None, revision: RevisionOpt = None, columns: ColumnsOpt = None,
) -> None:
    """Producer: validate, write chunks and manifest, enqueue chunks with no result (idempotent).
    The job's options (--priority, --max-attempts, --deadline, --token-budget, --set) are stored
    beside its manifest, outside its identity: given again, they change; left out, they stay."""
    from fleet.producer.enqueue import enqueue as do_enqueue

    check_source(input, redo)
    options = option_flags(set_options, priority=priority, max_attempts=max_attempts, deadline=deadline,
                           token_budget=token_budget)
    settings = settings_from(engine=engine, model=model, broker_url=broker_url,
                             store_url=store_url, chunk_size=chunk_size, turns=turns, max_tokens=max_tokens,
                             **input_flags(config, split, revision, columns))
    # The broker first: a job whose chunks are written but cannot be queued helps nobody.
    preflight(settings, broker=True, store=True)
    with live_progress(console) as progress:
        report = run_guarded(do_enqueue, settings, input, job, retry_failed, progress, redo, options)
    console.print(
        f"job {job}: {report.chunks} chunks; enqueued {len(report.enqueued)}, done {report.done}, "
        f"running {report.running}, already queued {report.queued}, failed {report.failed}"
        + (f"; repaired {len(report.repaired)} stale queued marker(s)" if report.repaired else "")
    )
    console.print(f"max_tokens {report.max_tokens} ({report.max_tokens_from or 'as stored'})")
    console.print(f"options: {report.options}" + (f"; {report.moved} waiting chunk(s) moved to the new priority"
                                                  if report.moved else ""), highlight=False, soft_wrap=True)


@app.command()
def validate(
    input: InputArg,
    engine: EngineOpt = None, model: ModelOpt = None, turns: TurnsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    config: ConfigOpt = None, split: SplitOpt = None, revision: RevisionOpt = None, columns: ColumnsOpt = None,
) -> None:
    """Check an input as `fleet enqueue` would, with nothing running: every bad line, the
    record count, the forms seen, and prompt tokens with the model's tokenizer (--model)."""
    from fleet.producer.survey import survey

    settings = settings_from(engine=engine, model=model, turns=turns, **input_flags(config, split, revision, columns))
    report = run_guarded(survey, settings, input)
    typer.echo(json.dumps({**asdict(report), "ok": report.ok}, indent=2) if as_json else survey_text(report))
    if not report.ok:
        raise typer.Exit(1)


def survey_text(report) -> str:
    # an input with nothing to read (empty, compressed) has no bad line to count: its problem says what it is
    verdict = (f"no bad {report.unit}s" if report.ok else f"{report.bad_lines} bad {report.unit}(s)"
               if report.bad_lines else "unreadable")
    out = [f"{report.input}: {report.records:,} records ({report.samples:,} samples), {verdict}",
           "forms: " + (", ".join(f"{k} {v:,}" for k, v in report.forms.items()) or "-")]  # fmt: skip
    t = report.prompt_tokens
    if t is not None:
        counted = f" ({report.model})" if report.model else ""
        out.append(f"prompt tokens{counted}: mean {t['mean']:,}, p50 {t['p50']:,}, p99 {t['p99']:,}, "
                   f"max {t['max']:,}; total {t['total']:,}")
    elif report.records:
        out.append("prompt tokens: give --model to count them with the model's tokenizer")
    if report.over_context:
        out.append(f"{report.over_context:,} prompt(s) fill the context of {report.context:,} tokens "
                   "and would fail alone")
    out += [f"  {line}" for line in [*report.rejected, *report.problems]]
    return "\n".join(out)


@app.command()
def status(
    job: JobOpt,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    watch: Annotated[float | None, typer.Option("--watch", callback=positive, help="refresh every N seconds")] = None,
    broker_url: BrokerOpt = None, store_url: StoreOpt = None,
) -> None:
    """Chunks done / running / queued / failed, records, tokens, tok/s, ETA, cost."""
    from fleet.coord.broker import redis_client
    from fleet.monitor.status import job_status
    from fleet.store import store_for

    settings = settings_from(broker_url=broker_url, store_url=store_url)
    preflight(settings, broker=bool(settings.broker_url), store=True)
    store = store_for(settings)
    r = redis_client(settings) if settings.broker_url else None

    from fleet.store.manifest import require_manifest

    manifest = run_guarded(require_manifest, store, job)

    def current():
        return run_guarded(job_status, store, r, job, settings.monitor.usd_per_gpu_hour, manifest,
                           settings.failure.bench_after, redo=True)

    if as_json:
        while True:
            st = current()
            typer.echo(st.to_json() if watch is None else json.dumps(asdict(st)))
            if watch is None or st.done:
                return
            time.sleep(watch)
    if watch is None:
        console.print(status_table(current()))
        return
    with Live(status_table(current()), console=console, refresh_per_second=1) as live:
        while True:
            st = current()
            live.update(status_table(st))
            if st.done:
                return
            time.sleep(watch)


def retractions_text(retractions: int, samples: int) -> str:
    """Retractions and what they mean: SGLang admitted more than its KV pool holds at the
    job's real context, and each retracted request starts over (radix off) or waits."""
    if not retractions:
        return "0"
    per = f" ({retractions / samples:.2f} per sample)" if samples else ""
    return (f"{retractions:,}{per}: the batch outgrows the KV pool at this job's context; "
            "lower sglang.max_running_requests or raise sglang.context_tokens")


def redo_text(st) -> str:
    """Redo jobs (`--redo`) and what they finished of this job's unfinished samples."""
    if not st.redo_jobs:
        hint = f"; `fleet run --job NAME --redo {st.job}` generates them again" if st.samples_unfinished else ""
        return f"{st.samples_unfinished:,} unfinished sample(s){hint}"
    jobs = ", ".join(f"{name} ({done})" for name, done in st.redo_jobs.items())
    return f"{st.redo_finished:,} of {st.samples_unfinished:,} unfinished sample(s) finished since by {jobs}"


def engine_starts_text(starts: dict) -> str:
    """What starting engines has cost the fleet (broker-wide): on spot GPUs, what restarts cost."""
    if not starts.get("starts"):
        return "-"
    since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(starts["since_ms"] / 1000))
    return (f"{starts['gpu_seconds']:,.1f} GPU-s over {starts['starts']:,} worker process start(s), "
            f"{starts['seconds'] / starts['starts']:,.1f}s each from process start to engine ready "
            f"(fleet-wide, since {since})")


def status_table(st) -> Table:
    t = Table(title=f"job {st.job}", show_header=False)
    eta = "-" if st.eta_s is None else f"{st.eta_s / 3600:.2f} h"
    rows = [
        ("chunks", f"{st.chunks_done}/{st.chunks_total} done, {st.chunks_running} running, "
                   f"{st.chunks_queued} queued, {st.chunks_failed} failed"),
        ("records", f"{st.records_done}/{st.records_total} ({st.samples_done}/{st.samples_total} samples, "
                    f"{st.record_errors} record errors)"),
        ("truncated", f"{st.records_truncated} at max tokens ({st.records_truncated_in_thinking} inside the thinking)"),
        ("no answer", f"{st.records_ended_in_thinking} ended inside the thinking, "
                      f"{st.records_repetition} stopped in a loop (repetition)"),
        ("redo", redo_text(st)),
        ("tokens", f"{st.prompt_tokens:,} in, {st.completion_tokens:,} out, {st.tokens_in_flight:,} in flight"),
        ("continuation", f"{st.tokens_continued:,} tokens continued from checkpoints, "
                         f"{st.tokens_made_twice:,} made twice (lost between flushes, helpers' copies, "
                         f"{st.samples_restarted:,} samples restarted)"),
        ("audit", f"{st.audit_checked:,} samples checked against their ids at commit, {st.audit_failed:,} fail"),
        ("rate", f"{st.tok_s:,.1f} output tok/s, ETA {eta}"),
        ("cost", f"${st.cost_usd:,.2f} spent" + (f", ${st.projected_cost_usd:,.2f} projected"
                                                  if st.projected_cost_usd is not None else "")),
        ("engine starts", engine_starts_text(st.engine_starts)),
        ("workers", ", ".join(f"{w} {st.worker_tok_s.get(w, 0):,.0f} tok/s" for w in st.workers) or "-"),
        ("spec accept", "-" if st.spec_accept_length is None else f"{st.spec_accept_length:.2f} tokens/step"),
        ("retractions", retractions_text(st.retractions, st.samples_done)),
        ("$/M out tokens", "-" if st.usd_per_m_tokens is None else f"${st.usd_per_m_tokens:,.3f}"),
        ("options", st.options or "-"),
        *([("[bold yellow]held[/]", escape(st.held))] if st.held else []),
        ("done", str(st.done)),
    ]
    for k, v in rows:
        t.add_row(k, v)
    for defect in st.audit_defects:
        t.add_row("[bold red]audit defect[/]", escape(defect))
    for f in st.failed:
        t.add_row(f"failed {f['index']}", f"{f['error_type']}: {f['error']} ({f['attempts']} attempts)")
    for d in st.dying_workers:
        t.add_row(escape(f"dying {d['worker']}"),
                  f"{d['deaths']} deaths, {d['deaths_in_a_row']} in a row before finishing a batch"
                  + (": benched, backing off" if d["benched"] else ""))
    for host, n in st.lost_hosts.items():
        t.add_row(escape(f"lost host {host}"), f"{n} worker process(es) vanished with it, no one seeing them die: "
                                               "counted against the host, never their chunks")
    for o in st.store_outages:
        t.add_row(escape(f"store refuses {o['worker']}"),
                  f"for {o['unreachable_s']:.0f}s; {o['results_waiting']} result(s) wait in its spool")
    for w in st.stalled_workers:
        t.add_row(escape(f"stalled {w['worker']}"),
                  f"engine made no token for {w['stalled_s']:.0f}s with requests running ({w['stalls']} stall(s) "
                  "since it last committed): chunks handed back, restarted")
    for m in st.mismatched_workers:
        differs = escape("; ".join(m["differences"]))  # rich markup would eat "[...]" in values
        if m.get("kind") == "store":
            t.add_row(escape(f"misconfigured {m['worker']}"), f"another store, runs nothing: {differs}")
        else:
            t.add_row(escape(f"mismatched {m['worker']}"), f"other engine settings, runs nothing: {differs}")
    return t


@app.command()
def export(
    job: Annotated[list[str], typer.Option(
        "--job", "-j", callback=job_name, help="job name; again for its redo jobs (--redo): each row the version "
        "that finished, the later job's between two")],
    out: Annotated[str, typer.Option(
        "--out", "-o", help="local path (a FIFO or device is written through), - for standard output, "
        "s3://bucket/key, gs://bucket/key; with --format hf a folder or hf://datasets/ORG/NAME")],
    fmt: Annotated[ExportFormat | None, typer.Option(
        "--format", help="jsonl, parquet, specforge, tokens, openai or hf (a Hub-ready folder: Parquet shards and a "
        "dataset card); default by target: hf for hf://, parquet for .parquet, else jsonl")] = None,
    allow_incomplete: Annotated[bool, typer.Option(
        "--allow-incomplete", help="export the chunks done so far of an unfinished job")] = False,
    partial: Annotated[bool, typer.Option("--partial", hidden=True, help="old name of --allow-incomplete")] = False,
    stable: Annotated[bool, typer.Option("--stable", help="omit worker and latency, for byte comparison")] = False,
    only_finished: Annotated[bool, typer.Option(
        "--only-finished", help="only samples that stopped on their own with an answer (no max-tokens cuts, none ended "
        "inside the thinking, no errors)")] = False,
    allow_defects: Annotated[bool, typer.Option(
        "--allow-defects", help="exit 0 though rows that fail the audit were left out (a partial export) or rows "
        "that cannot be checked were written; without it either makes the export exit 1")] = False,
    store_url: StoreOpt = None,
) -> None:
    """Results in input order, every row audited first. Exit 1 when a row that fails the audit is left out or
    one that cannot be checked is written, unless --allow-defects; rows the format cannot hold, and
    --only-finished, are the user's choice (counted, exit 0)."""
    from fleet.export.formats import LeftOut
    from fleet.export.writer import export_job
    from fleet.store import store_for

    settings = settings_from(store_url=store_url)
    preflight(settings, store=True)
    left_out, audited = LeftOut(), AuditCounts()
    with live_progress(console) as progress:
        n = run_guarded(export_job, store_for(settings), job[0], out, fmt, allow_incomplete or partial, stable,
                        only_finished, left_out, progress, redo_jobs=job[1:], audited=audited,
                        max_attempts=settings.store_client.max_attempts)
    console.print(f"wrote {n} records to {'standard output' if out == '-' else out}")
    print_audit(audited)
    for reason, count in left_out.reasons.items():
        console.print(f"left out {count}: {reason}")
    if audited.bad:
        what = (f"{audited.failed:,} sample(s) failed the audit and were left out, {audited.unchecked:,} could not "
                "be checked and were written unverified (named above)")
        if not allow_defects:
            fail(f"{what}. Pass --allow-defects to accept such an export", code=1)
        console.print(f"[bold yellow]partial export (--allow-defects):[/] {what}", highlight=False)


def print_audit(audited: AuditCounts) -> None:
    console.print(audited.line(), highlight=False)
    for defect in audited.defects:
        console.print(f"[bold red]defect:[/] {escape(defect)}", highlight=False, soft_wrap=True)
    if audited.bad > len(audited.defects):
        console.print(f"and {audited.bad - len(audited.defects)} more defects")


@app.command()
def verify(
    job: JobOpt,
    allow_incomplete: Annotated[bool, typer.Option(
        "--allow-incomplete", help="audit the chunks done so far of an unfinished job")] = False,
    store_url: StoreOpt = None,
) -> None:
    """Audit a job's records without exporting them: each held to its own token ids (text, counts, where
    it ends and why), its input record's prompt and the job's configuration (docs/architecture.md, "Audit").
    Exit 1 when any record fails or cannot be checked."""
    from fleet.export.verify import verify_job
    from fleet.store import store_for

    settings = settings_from(store_url=store_url)
    preflight(settings, store=True)
    audited = AuditCounts()
    with live_progress(console) as progress:
        run_guarded(verify_job, store_for(settings), job, audited, allow_incomplete, progress)
    print_audit(audited)
    if audited.bad:
        fail(f"{audited.failed:,} sample(s) failed the audit, {audited.unchecked:,} could not be checked", code=1)
