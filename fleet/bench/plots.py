"""PNG plots of the suite's figures (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.bench.occupancy import OCCUPANCY_TARGET


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def occupancy_timeline(data: dict[str, Any], path: Path) -> Path:
    """K=1 against the default K: chunk-averaged occupancy and chunks in flight over time."""
    plt = _pyplot()
    runs = [r for r in data["runs"] if r["k"] == 1 or r["k_derived"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, height_ratios=[2, 1])
    for r in runs:
        label = f"K={r['k']}" + (" (default)" if r["k_derived"] else "")
        tl = r["timeline"]
        line, = top.plot(tl["t_s"], tl["occupancy"], label=f"{label}: mean {r['occupancy']:.3f}")
        top.axhline(r["occupancy"], color=line.get_color(), linestyle=":", linewidth=1)
        bottom.plot(tl["t_s"], tl["chunks_in_flight"], color=line.get_color(), label=label)
    top.axhline(OCCUPANCY_TARGET, color="grey", linestyle="--", linewidth=1, label=f"target {OCCUPANCY_TARGET}")
    top.set_ylabel("occupancy (chunk-averaged)")
    top.set_ylim(0, 1.15)
    top.set_title(f"Engine occupancy over a job: {data['workers']} workers, "
                  f"S={data['shape']['S']}, C={data['shape']['C']}, sigma={data['shape']['sigma']}", fontsize=10)
    top.legend(fontsize=8, loc="lower right")
    bottom.set_ylabel("chunks in flight")
    bottom.set_xlabel("seconds since the first chunk started")
    bottom.legend(fontsize=8)
    fig.text(0.01, 0.005, "each chunk's simulated work is spread evenly over its own run "
             "(results record chunk start and finish, not each request)", fontsize=7, color="grey")
    return _save(fig, path)


def occupancy_vs_kcs(data: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    runs = sorted(data["runs"], key=lambda r: r["kc_over_s"])
    x = [r["kc_over_s"] for r in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, [r["occupancy"] for r in runs], "o-", label="measured (fleet, real processes)")
    ax.plot(x, [r["model_occupancy"] for r in runs], "s--", alpha=0.7,
            label="model: FIFO continuous batching, no overhead, same lengths")
    for r in runs:
        ax.annotate(f"K={r['k']}" + ("*" if r["k_derived"] else ""), (r["kc_over_s"], r["occupancy"]),
                    textcoords="offset points", xytext=(5, -12), fontsize=8)
    ax.axhline(OCCUPANCY_TARGET, color="grey", linestyle="--", linewidth=1, label=f"target {OCCUPANCY_TARGET}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K x C / S (chunks in flight x chunk size / engine slots)")
    ax.set_ylabel("occupancy over the job")
    ax.set_ylim(0, 1.05)
    ax.set_title("Occupancy against K x C / S (* = default K)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def scaling(data: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    runs = data["runs"]
    w = [r["workers"] for r in runs]
    per = runs[0]["tok_s"] / runs[0]["workers"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(w, [per * n for n in w], "--", color="grey", label="linear (N x one worker)")
    ax.plot(w, [r["tok_s"] for r in runs], "o-", label="measured, whole job")
    ax.plot(w, [per * r["workers"] * r["model_efficiency"] for r in runs], "s:", alpha=0.7,
            label="model (FIFO, no overhead), whole job")
    if all(r.get("steady_efficiency") for r in runs):
        ax.plot(w, [r["steady_tok_s"] for r in runs], "^-", alpha=0.8,
                label="measured, while the queue is non-empty (approx., chunk-averaged)")
    for r in runs:
        ax.annotate(f"{r['efficiency']:.2f}", (r["workers"], r["tok_s"]), textcoords="offset points",
                    xytext=(5, -12), fontsize=8)
    ax.set_xlabel("workers on one broker")
    ax.set_ylabel("output tok/s over the job")
    ax.set_xticks(w)
    ax.set_title(f"Throughput against workers ({data['chunks_per_worker']} chunks per worker)", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(sections: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    """Every plot whose section ran; returns the files written."""
    written = []
    if "occupancy" in sections and not sections["occupancy"].get("error"):
        written.append(occupancy_timeline(sections["occupancy"]["data"], out / "occupancy_timeline.png"))
        written.append(occupancy_vs_kcs(sections["occupancy"]["data"], out / "occupancy_vs_kcs.png"))
    if "scaling" in sections and not sections["scaling"].get("error"):
        written.append(scaling(sections["scaling"]["data"], out / "scaling.png"))
    return written
