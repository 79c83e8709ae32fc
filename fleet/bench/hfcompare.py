"""Fleet against the bare engine: the tiny `hf` model through `fleet run` versus a plain
batched `model.generate` loop over the same prompts, batch size and max tokens.

Both sides decode greedily, so they produce (nearly) the same tokens and the ratio of
their output tok/s is what fleet's machinery costs: the broker, chunk reads and
commits, the engine's batching loop and its per-row sampler and stopper. The bare loop
runs in its own process like the worker does, with the same torch threads; each side's
best of `repeats` runs is compared, because two shared cores make single runs noisy.

Run alone, this module is the bare loop: `python -m fleet.bench.hfcompare --model DIR
--input PROMPTS --batch 16 --max-tokens 96` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleet.bench.jobstats import read_job, throughput
from fleet.bench.procs import clean_env, json_from_stdout, run_fleet, write_prompts
from fleet.bench.profile import Profile
from fleet.bench.report import Figure, Section, at_least, best_of_each
from fleet.errors import FleetError
from fleet.store import open_store

HF_TARGET = 0.95
#: One torch thread on each side. With two threads on two shared cores, OpenMP's
#: spin-waiting made a run 45x slower whenever another process held one core.
TORCH_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FLEET_HF__THREADS": "1"}


def bare_generate(model_dir: str, prompts_path: str, batch: int, max_tokens: int) -> dict[str, Any]:
    """A plain transformers loop: template, left-pad, generate, decode; timed after loading."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos_ids)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, eos_token_id=sorted(eos_ids),
                              pad_token_id=pad)
    records = [json.loads(line) for line in Path(prompts_path).read_text().splitlines() if line]
    began = time.perf_counter()
    prompts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True,
                                       return_dict=True)["input_ids"] for r in records]
    tokens = 0
    with torch.inference_mode():
        for start in range(0, len(prompts), batch):
            enc = tok.pad({"input_ids": prompts[start:start + batch]}, return_tensors="pt")
            out = model.generate(**enc, generation_config=config)
            for row in out[:, enc["input_ids"].shape[1]:].tolist():
                n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
                tokens += n
                tok.decode(row[:n], skip_special_tokens=True)
    seconds = time.perf_counter() - began
    return {"prompts": len(prompts), "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "threads": torch.get_num_threads()}


def run_bare(workdir: Path, model: Path, prompts: Path, profile: Profile) -> dict[str, Any]:
    args = ["--model", str(model), "--input", str(prompts), "--batch", str(profile.hf_batch),
            "--max-tokens", str(profile.hf_max_tokens)]
    done = subprocess.run([sys.executable, "-m", "fleet.bench.hfcompare", *args], env=clean_env(workdir, TORCH_THREADS),
                          capture_output=True, text=True, timeout=600, cwd=workdir)
    if done.returncode != 0:
        raise FleetError(f"bare generate loop exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json_from_stdout(done)


def run_fleet_hf(workdir: Path, model: Path, prompts: Path, profile: Profile, n: int, i: int) -> dict[str, Any]:
    data_dir = workdir / f"hf-fleet-{i}"
    shutil.rmtree(data_dir, ignore_errors=True)
    env = clean_env(workdir, {
        "FLEET_DATA_DIR": str(data_dir),
        "FLEET_HF__MAX_BATCH": str(profile.hf_batch),
        "FLEET_SAMPLING__MAX_TOKENS": str(profile.hf_max_tokens),
        "FLEET_SAMPLING__TEMPERATURE": "0",
        "FLEET_CHUNK_SIZE": str(profile.hf_chunk_size),
        **TORCH_THREADS,
    })
    job = f"hf-{i}"
    run_fleet(["run", str(prompts), "--job", job, "--engine", "hf", "--model", str(model), "--workers", "1"],
              env, 600, workdir)
    chunks = -(-n // profile.hf_chunk_size)
    run = read_job(open_store(str(data_dir / "store")), job, chunks)
    return {"prompts": n, "tokens": run.tokens, "seconds": run.makespan_s, "tok_s": throughput(run),
            "chunks": chunks}


def measure_hf(profile: Profile, workdir: Path) -> Section:
    model = workdir / "tiny-model"
    if not (model / "config.json").exists():
        run_fleet(["tiny-model", str(model)], clean_env(workdir), 300, workdir)
    n = profile.hf_prompts
    prompts = write_prompts(workdir / f"prompts-{n}.jsonl", n)
    bare, fleet = [], []
    for i in range(profile.hf_repeats):
        bare.append(run_bare(workdir, model, prompts, profile))
        fleet.append(run_fleet_hf(workdir, model, prompts, profile, n, i))
    best_bare, best_fleet, ratio = best_of_each(bare, fleet)
    figures = [
        at_least("fleet tok/s / bare generate tok/s", round(ratio, 4), HF_TARGET,
                 note=f"best of {profile.hf_repeats}; batch {profile.hf_batch}, {profile.hf_max_tokens} max tokens"),
        Figure("fleet", best_fleet["tok_s"], "tok/s", note=f"{best_fleet['tokens']:,} tokens"),
        Figure("bare generate loop", best_bare["tok_s"], "tok/s", note=f"{best_bare['tokens']:,} tokens"),
    ]
    data = {"prompts": n, "batch": profile.hf_batch, "torch_threads": 1, "max_tokens": profile.hf_max_tokens,
            "chunk_size": profile.hf_chunk_size, "ratio": ratio, "bare": bare, "fleet": fleet}
    return Section("hf", "fleet vs bare engine (hf tiny model, CPU)", figures, data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet.bench.hfcompare", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    print(json.dumps(bare_generate(args.model, args.input, args.batch, args.max_tokens)))


if __name__ == "__main__":
    main()
