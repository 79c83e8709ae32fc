"""The reference job every figure is translated into: hours and dollars on rented GPUs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReferenceJob:
    prompts: int = 902_087
    #: mean prompt tokens after templating (the planning example's figure)
    prompt_tokens: float = 1_000
    output_tokens: float = 1_818
    gpus: int = 6
    usd_per_gpu_hour: float = 5.49
    #: output tok/s of one B200 with its engine kept full
    tok_s_per_gpu: float = 3_000
    chunk_size: int = 512

    @property
    def total_tokens(self) -> float:
        return self.prompts * self.output_tokens

    @property
    def ideal_hours(self) -> float:
        """Wall hours with every GPU busy the whole time."""
        return self.total_tokens / (self.gpus * self.tok_s_per_gpu) / 3600

    @property
    def chunk_gpu_s(self) -> float:
        """Seconds of one GPU's full throughput that one chunk's outputs take."""
        return self.chunk_size * self.output_tokens / self.tok_s_per_gpu

    def cost(self, hours: float) -> float:
        return hours * self.gpus * self.usd_per_gpu_hour

    def at_efficiency(self, efficiency: float) -> dict[str, float]:
        """Hours and dollars when the GPUs deliver `efficiency` of their full throughput."""
        hours = self.ideal_hours / efficiency if efficiency > 0 else float("inf")
        return {"hours": round(hours, 2), "usd": round(self.cost(hours), 0),
                "extra_hours": round(hours - self.ideal_hours, 2),
                "extra_usd": round(self.cost(hours - self.ideal_hours), 0)}


REFERENCE = ReferenceJob()


def implications(sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What each measured figure means for the reference job (the JSON of each section)."""
    ref = REFERENCE
    out: dict[str, Any] = {"reference": {**asdict(ref), "ideal_hours": round(ref.ideal_hours, 2),
                                         "ideal_usd": round(ref.cost(ref.ideal_hours), 0),
                                         "chunk_gpu_s": round(ref.chunk_gpu_s, 1)}}
    occ = sections.get("occupancy", {}).get("data", {}).get("runs")
    if occ:
        out["occupancy"] = {f"K={r['k']}": ref.at_efficiency(r["occupancy"]) for r in occ}
    mk = sections.get("makespan", {}).get("data", {})
    if mk.get("ratio"):
        out["makespan"] = ref.at_efficiency(1 / mk["ratio"])
    pj = sections.get("projection", {}).get("data", {})
    if pj.get("fifo"):
        out["projection"] = {f"K={k}": ref.at_efficiency(v) for k, v in pj["fifo"].items()}
    sc = sections.get("scaling", {}).get("data", {}).get("runs")
    if sc:
        out["scaling"] = ref.at_efficiency(sc[-1]["efficiency"])
    ov = sections.get("overhead", {}).get("data", {})
    if ov.get("fraction_median") is not None:
        out["overhead"] = {"serial_upper_bound": ref.at_efficiency(1 / (1 + ov["fraction_median"]))}
    pr = sections.get("producer", {}).get("data", {})
    if pr.get("largest_prompts_s"):
        hours = ref.prompts / pr["largest_prompts_s"] / 3600
        out["producer"] = {"hours": round(hours, 3), "usd_if_gpus_wait": round(ref.cost(hours), 1)}
    hf = sections.get("hf", {}).get("data", {})
    if hf.get("ratio"):
        out["hf"] = ref.at_efficiency(min(1.0, hf["ratio"]))
    return out
