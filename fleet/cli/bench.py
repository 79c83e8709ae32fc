"""`fleet bench`: the benchmark suite of issue 6 (README's targets, BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from fleet.bench import MEASUREMENTS
from fleet.cli.app import app, console, fail
from fleet.cli.flags import checked, positive
from fleet.errors import ConfigError

bench_app = typer.Typer(
    help="Measure occupancy, makespan, scaling, per-chunk overhead, the producer and fleet vs "
         "the bare engine; print a table, write JSON and PNG plots.",
    no_args_is_help=False,
)
app.add_typer(bench_app, name="bench")

DEFAULT_OUT = Path("bench-results")
#: chunk size of the SGLang CPU comparison: K = 16 x S / C chunks in flight (S 64 here) must be well
#: under the job's chunks, or fleet's job has no steady state to count (fleet.bench.pairs)
SGLANG_CPU_CHUNK = 64
QuickOpt = Annotated[bool, typer.Option("--quick", help="reduced sizes (~1 minute; what CI runs)")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="directory for bench.json, table.md and PNGs")]
KeepOpt = Annotated[bool, typer.Option("--keep", help="keep the temporary work directory (logs, stores)")]
#: `fleet bench --engine`: what each engine's benchmark is (bench's help)
BenchEngine = Literal["sim", "hf", "vllm", "sglang"]


def _counts(text: str) -> None:
    bad = [part for part in text.split(",") if part and not (part.strip().isdigit() and int(part) >= 1)]
    if bad:
        raise ConfigError(f"{bad[0]!r} is not a whole number of at least 1 (give e.g. 10,100)")


#: a comma list of counts (`--workers 10,100,1000`): each a whole number of at least 1
counts = checked(_counts)


def _run(names: list[str], quick: bool, out: Path | None, keep: bool) -> None:
    from fleet.bench.profile import FULL, QUICK
    from fleet.bench.suite import run_suite

    sections = run_suite(names, QUICK if quick else FULL, out or DEFAULT_OUT, keep, console)
    failed = [s.key for s in sections if s.error]
    if failed:
        fail(f"measurement(s) failed: {', '.join(failed)} (errors are in bench.json)", code=1)


def _options(ctx: typer.Context, quick: bool, out: Path | None, keep: bool) -> tuple[bool, Path | None, bool]:
    """Options given before the subcommand (`fleet bench --quick scaling`) count too."""
    parent = ctx.obj or {}
    return quick or parent.get("quick", False), out or parent.get("out"), keep or parent.get("keep", False)


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    quick: QuickOpt = False,
    out: OutOpt = None,
    keep: KeepOpt = False,
    engine: Annotated[BenchEngine, typer.Option("--engine", help="sim: the whole suite; hf: fleet vs bare "
                                        "engine only; vllm: fleet vs a bare AsyncLLM loop (needs vllm); "
                                        "sglang: MTP on vs off on this GPU host, or fleet vs the bare "
                                        "Engine where sglang.engine_kwargs put it on the CPU")] = "sim",
    requests: Annotated[int | None, typer.Option("--requests", min=1, help="sglang: requests per side "
                                                 "(default 2 x max_running_requests)")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1,
                                                   help="sglang, vllm: max tokens per request")] = None,
    pairs: Annotated[int, typer.Option("--pairs", min=1, help="vllm, sglang on the CPU: fleet/bare pairs, "
                                       "each at once on a shared CPU where it can (the median is the figure)")] = 3,
    min_window_s: Annotated[float, typer.Option("--min-window-s", min=0, help="vllm, sglang on the CPU: a bare probe "
                                                "grows the prompts until a window lasts this long (0: none)")] = 0.0,
) -> None:
    """Run every measurement (or the one named) and print the table."""
    ctx.obj = {"quick": quick, "out": out, "keep": keep}
    if ctx.invoked_subcommand is not None:
        return
    if engine == "sglang" and _sglang_on_cpu():
        _sglang_vs_bare(out, requests, max_tokens, pairs, min_window_s)
    elif engine == "sglang":
        _mtp(out, requests, max_tokens)
    elif engine == "hf":
        _run(["hf"], quick, out, keep)
    elif engine == "vllm":
        _vllm(out, quick, pairs, min_window_s, max_tokens)
    else:
        _run(list(MEASUREMENTS), quick, out, keep)


def _vllm(out: Path | None, quick: bool, pairs: int, min_window_s: float, max_tokens: int | None) -> None:
    import tempfile

    from rich.console import Console

    from fleet.bench.report import print_table, write_json
    from fleet.bench.vllmcompare import measure_vllm
    from fleet.errors import FleetError

    console = Console()
    prompts, default_tokens, chunk = (32, 32, 16) if quick else (256, 64, 64)
    max_tokens = max_tokens or default_tokens
    with tempfile.TemporaryDirectory(prefix="fleet-bench-vllm-") as tmp:
        try:
            section = measure_vllm(prompts, max_tokens, chunk, Path(tmp), 1 if quick else pairs, min_window_s,
                                   log=(out or DEFAULT_OUT) / "vllm.runs.jsonl")
        except FleetError as e:
            fail(str(e))
            return
    print_table([section], console)
    path = write_json((out or DEFAULT_OUT) / "vllm.json", [section], {"command": "fleet bench --engine vllm"})
    console.print(f"wrote {path}")


def _sglang_on_cpu() -> bool:
    """The settings put the engine on the CPU (sglang.engine_kwargs device "cpu")."""
    from fleet.settings import load_settings

    return load_settings().sglang.engine_kwargs.get("device") == "cpu"


def _sglang_vs_bare(out: Path | None, requests: int | None, max_tokens: int | None, pairs: int,
                    min_window_s: float) -> None:  # fmt: skip
    import os
    import tempfile

    from rich.console import Console

    from fleet.bench.report import print_table, write_json
    from fleet.bench.sglangcompare import measure_sglang_vs_bare
    from fleet.errors import FleetError

    try:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-sglang-") as tmp:
            section = measure_sglang_vs_bare(Path(tmp), dict(os.environ), requests or 128, max_tokens or 96,
                                             SGLANG_CPU_CHUNK, pairs, min_window_s,
                                             log=(out or DEFAULT_OUT) / "sglang-cpu.runs.jsonl")
    except FleetError as e:
        fail(str(e))
        return
    print_table([section], Console())
    command = {"command": "fleet bench --engine sglang (CPU)"}
    path = write_json((out or DEFAULT_OUT) / "sglang-cpu.json", [section], command)
    console.print(f"fleet / bare Engine = {section.data['ratio']:.3f}; wrote {path}")


def _mtp(out: Path | None, requests: int | None, max_tokens: int | None) -> None:
    from rich.console import Console

    from fleet.bench.mtp import measure_mtp
    from fleet.bench.report import print_table, write_json
    from fleet.errors import FleetError

    try:
        section = measure_mtp(requests, max_tokens)
    except FleetError as e:
        fail(str(e))
        return
    print_table([section], Console())
    path = write_json((out or DEFAULT_OUT) / "mtp.json", [section], {"command": "fleet bench --engine sglang"})
    console.print(f"use MTP {'on' if section.data['use_mtp'] else 'off'}; wrote {path}")


def _subcommand(name: str, doc: str) -> None:
    def command(ctx: typer.Context, quick: QuickOpt = False, out: OutOpt = None, keep: KeepOpt = False) -> None:
        _run([name], *_options(ctx, quick, out, keep))

    command.__doc__ = doc
    bench_app.command(name)(command)


def _register() -> None:
    for name, what in MEASUREMENTS.items():
        _subcommand(name, what[0].upper() + what[1:] + ".")


@bench_app.command("result-size")
def result_size(
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=1, help="output tokens per record")] = 1818,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=0, help="prompt tokens per record")] = 512,
) -> None:
    """Result bytes per record with and without token ids, and the total at the reference job."""
    from rich.table import Table

    from fleet.bench.reference import REFERENCE
    from fleet.bench.resultsize import measure

    table = Table(title=f"result size, {output_tokens} output / {prompt_tokens} prompt tokens, zstd chunk objects")
    for col in ("token ids", "results hold", "bytes/record", f"GB at {REFERENCE.prompts:,} records"):
        table.add_column(col)
    for r in measure(output_tokens=output_tokens, prompt_tokens=prompt_tokens):
        table.add_row(r["ids"], r["variant"], f"{r['bytes_per_record']:,}", f"{r['reference_gb']:,.2f}")
    console.print(table)


@bench_app.command("control-plane")
def control_plane(
    ctx: typer.Context,
    quick: QuickOpt = False,
    out: OutOpt = None,
    keep: KeepOpt = False,
    workers: Annotated[str | None, typer.Option("--workers", callback=counts, help="simulated workers per level, e.g. "
                                                "10,100,1000 (the restart and the wipe run at the last)")] = None,
    window_s: Annotated[float | None, typer.Option("--window-s", callback=positive,
                                                   help="seconds measured per level")] = None,
    more_k: Annotated[str | None, typer.Option("--more-k", callback=counts,
                                               help="other K to run at the largest level, e.g. "
                                               "4,32 (none: '')")] = None,
    k_workers: Annotated[int | None, typer.Option("--k-workers", min=1,
                                                  help="simulated workers at each other K (at most the largest "
                                                  "level)")] = None,
) -> None:
    """Broker load, lease renewals, recovery rounds and `fleet status` for N simulated workers on one
    redis-server (fleet's own coordination code; Celery's consumer measured from a real worker)."""
    import dataclasses
    import shutil
    import tempfile

    from fleet.bench.controlplane import FULL, QUICK, measure_control_plane
    from fleet.bench.report import print_table, write_json

    quick, out, keep = _options(ctx, quick, out, keep)
    profile = QUICK if quick else FULL
    if workers:
        profile = dataclasses.replace(profile, workers=tuple(int(w) for w in workers.split(",")))
    if window_s:
        profile = dataclasses.replace(profile, window_s=window_s)
    if more_k is not None:
        profile = dataclasses.replace(profile, more_k=tuple(int(k) for k in more_k.split(",") if k))
    if k_workers:
        profile = dataclasses.replace(profile, k_workers=k_workers)
    workdir = Path(tempfile.mkdtemp(prefix="fleet-bench-cp-"))
    try:
        section = measure_control_plane(profile, workdir, log=console.print)
    finally:
        if keep:
            console.print(f"kept the work directory {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table([section])
    command = "fleet bench control-plane" + (" --quick" if quick else "") + (f" --workers {workers}" if workers else "")
    command += f" --more-k '{more_k}'" if more_k is not None else ""
    command += f" --k-workers {k_workers}" if k_workers else ""
    path = write_json((out or DEFAULT_OUT) / "control-plane.json", [section], {"command": command})
    console.print(f"wrote {path}")


@bench_app.command("all")
def all_(ctx: typer.Context, quick: QuickOpt = False, out: OutOpt = None, keep: KeepOpt = False) -> None:
    """Every measurement (the same as `fleet bench` with no subcommand)."""
    _run(list(MEASUREMENTS), *_options(ctx, quick, out, keep))


_register()


def _seconds(text: str) -> tuple[float, ...]:
    """'20m,1h,4h' or '0,30,120' (seconds unless suffixed s, m or h) as seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        unit = units.get(part[-1])
        try:
            out.append(float(part[:-1]) * unit if unit else float(part))
        except ValueError:
            fail(f"{part!r} is not a duration: seconds, or a number followed by s, m or h")
    return tuple(out)


@bench_app.command("preemption")
def preemption(
    ctx: typer.Context,
    quick: QuickOpt = False,
    out: OutOpt = None,
    keep: KeepOpt = False,
    lifetimes: Annotated[str | None, typer.Option("--lifetimes", help="mean host lifetimes L of the job's time, "
                                                  "e.g. 20m,1h,4h (the default)")] = None,
    notices: Annotated[str | None, typer.Option("--notices", help="notice N between SIGTERM and SIGKILL, e.g. "
                                                "0,30s,120s (the default; 0 is a plain kill -9)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="the schedule's seed")] = 0,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="schedules drawn from --seed on, each with its own "
                                       "uninterrupted run; the ratios are averaged, with their range")] = 1,
    modes: Annotated[str | None, typer.Option("--modes", help="resume modes to run, of token, notice (fleet told "
                                              "the notice: it generates through it), row, chunk; default "
                                              "token,row,chunk")] = None,
    time_scale: Annotated[float | None, typer.Option("--time-scale", min=1, help="job seconds per wall second "
                                                     "(default 200; lower runs slower and closer to fleet's "
                                                     "default checkpoint and lease cadence)")] = None,
) -> None:
    """GPU-seconds per output token on hosts preempted on a seeded schedule against an uninterrupted run:
    fleet (continuation), row restart and chunk restart, side by side on one schedule."""
    import dataclasses
    import shutil
    import tempfile

    from fleet.bench.preemption import FULL, QUICK, markdown, plot, sweep, table
    from fleet.bench.report import write_json
    from fleet.errors import FleetError

    quick, out, keep = _options(ctx, quick, out, keep)
    profile = QUICK if quick else FULL
    if lifetimes:
        profile = dataclasses.replace(profile, lifetimes_s=_seconds(lifetimes))
    if notices is not None:
        profile = dataclasses.replace(profile, notices_s=_seconds(notices))
    profile = dataclasses.replace(profile, seed=seed, seeds=seeds)
    if modes:
        from fleet.bench.preemption import MODE_NAMES

        chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
        unknown = [m for m in chosen if m not in MODE_NAMES]
        if unknown or not chosen:
            fail(f"--modes: {', '.join(unknown) or 'none given'}: choose of {', '.join(MODE_NAMES)}")
        profile = dataclasses.replace(profile, modes=chosen)
    if time_scale:
        profile = dataclasses.replace(profile, shape=dataclasses.replace(profile.shape, time_scale=time_scale))
    workdir = Path(tempfile.mkdtemp(prefix="fleet-bench-preempt-"))
    try:
        section = sweep(profile, workdir, log=console.print)
    except FleetError as e:
        fail(str(e))
        return
    finally:
        if keep:
            console.print(f"kept the work directory {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    from rich.console import Console

    shown = console if console.is_terminal else Console(width=240)
    shown.print(table(section.data))
    shown.print(table(section.data, over_seeds=True))
    flags = [(quick, "--quick"), (lifetimes, f"--lifetimes {lifetimes}"), (notices is not None, f"--notices {notices}"),
             (modes, f"--modes {modes}"), (True, f"--seed {seed}"), (seeds > 1, f"--seeds {seeds}"),
             (time_scale, f"--time-scale {time_scale:g}" if time_scale else "")]
    command = " ".join(["fleet bench preemption", *(flag for given, flag in flags if given)])
    target = out or DEFAULT_OUT
    path = write_json(target / "preemption.json", [section], {"command": command})
    (target / "preemption.md").write_text(markdown(section.data))
    png = plot(section.data, target / "preemption.png")
    console.print(f"wrote {path}, {target / 'preemption.md'} and {png}")
