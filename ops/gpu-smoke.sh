#!/usr/bin/env bash
# GPU smoke test: the same prompts through `fleet run --engine sglang` and through SGLang's
# own offline throughput benchmark, with the same engine kwargs (`fleet engine-args`) and the
# same sampling (the model's generation_config.json); prints both output tok/s and the ratio.
#
#   ops/gpu-smoke.sh [MODEL_DIR]       # or MODEL=...; without one, `fleet tiny-model` is used
#
# Env: PROMPTS (256), MAX_TOKENS (256), WORK (a new temp dir), PYTHON (python), and any
# FLEET_* setting (FLEET_SGLANG__MTP, FLEET_SGLANG__MAX_RUNNING_REQUESTS, ...).
# Needs a GPU, redis-server, and the sglang venv (ops/sglang-venv.sh). Nothing comes from
# the hub unless MODEL is a hub id. fleet's tok/s is output tokens over the span from the
# first chunk's start to the last chunk's end (`fleet status --json` elapsed_s), so engine
# start-up is left out of both numbers.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python}"
model="${1:-${MODEL:-}}"
prompts="${PROMPTS:-256}"
max_tokens="${MAX_TOKENS:-256}"
work="${WORK:-$(mktemp -d -t fleet-smoke.XXXXXX)}"
cd "$root"
mkdir -p "$work"

die() { echo "gpu-smoke: $*" >&2; exit 2; }
command -v nvidia-smi >/dev/null || die "no nvidia-smi: this needs a GPU"
command -v redis-server >/dev/null || die "fleet run needs redis-server"
"$py" -c "import sglang" 2>/dev/null || die "sglang is not importable by $py: run ops/sglang-venv.sh"

if [[ -z "$model" ]]; then
    model="$work/tiny-model"
    "$py" -m fleet tiny-model "$model" >/dev/null
    export FLEET_SGLANG__MTP="${FLEET_SGLANG__MTP:-false}"  # a tiny Qwen3 has no MTP head
fi
export FLEET_ENGINE=sglang FLEET_MODEL="$model" FLEET_SAMPLING__MAX_TOKENS="$max_tokens"
export FLEET_DATA_DIR="$work/data" FLEET_STORE_URL="$work/store"
echo "gpu-smoke: model $model, $prompts prompts x $max_tokens tokens, work dir $work" >&2

# -- the same prompts for both: fleet JSONL and a ShareGPT file for the benchmark -------------
"$py" - "$work" "$prompts" <<'PY'
import json
import pathlib
import sys

work, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
topics = ["a lighthouse", "prime numbers", "a Celery worker", "tea", "the moon", "a bridge", "rain", "chess"]
texts = [f"Explain {topics[i % len(topics)]} to a curious child, with example {i}." for i in range(n)]
lines = (json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": t}]}) for i, t in enumerate(texts))
(work / "prompts.jsonl").write_text("\n".join(lines) + "\n")
share = [{"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]} for t in texts]
(work / "sharegpt.json").write_text(json.dumps(share))
PY

# -- fleet ----------------------------------------------------------------------------------------
gpu_flags=()
if "$py" -m fleet run --help 2>/dev/null | grep -q -- "--gpus"; then
    gpu_flags=(--gpus 0)
fi
"$py" -m fleet run "$work/prompts.jsonl" --job smoke --engine sglang --model "$model" \
    --workers 1 "${gpu_flags[@]}"
"$py" -m fleet status --job smoke --json >"$work/status.json"

# -- SGLang's own benchmark, same kwargs and sampling ------------------------------------------
"$py" -m fleet engine-args --engine sglang --model "$model" >"$work/engine-args.json"
mapfile -t server_flags < <("$py" - "$work/engine-args.json" <<'PY'
import json
import sys

for key, value in json.load(open(sys.argv[1])).items():
    flag = "--" + key.replace("_", "-")
    if value is True:
        print(flag)
    elif value is False or value is None:
        continue
    elif isinstance(value, list):
        print(flag, *value, sep="\n")
    else:
        print(flag, json.dumps(value) if isinstance(value, dict) else value, sep="\n")
PY
)
# The same mapping the engine uses (top_k 0 -> -1, which SGLang requires; the penalties).
sampling="$("$py" -c 'import json; from fleet.model.facts import model_facts, NEUTRAL; from fleet.settings import Settings
from fleet.records import Sampling; from fleet.engines.wire import sglang_sampling
s = model_facts(Settings())["sampling"]; p = sglang_sampling(Sampling(**{k: s[k] for k in NEUTRAL}), 1, [], False)
print(json.dumps({k: v for k, v in p.items() if k not in ("max_new_tokens", "stop_token_ids")}))')"
bench_module="sglang.benchmark.offline_throughput"  # sglang 0.5.23; older releases: sglang.bench_offline_throughput
"$py" -c "import $bench_module" 2>/dev/null || bench_module="sglang.bench_offline_throughput"
"$py" -m "$bench_module" "${server_flags[@]}" \
    --dataset-name sharegpt --dataset-path "$work/sharegpt.json" --num-prompts "$prompts" \
    --sharegpt-output-len "$max_tokens" --apply-chat-template --disable-ignore-eos \
    --extra-request-body "$sampling" --result-filename "$work/bench.jsonl"

# -- report ---------------------------------------------------------------------------------------
"$py" - "$work" <<'PY'
import json
import pathlib
import sys

work = pathlib.Path(sys.argv[1])
status = json.loads((work / "status.json").read_text())
bench = json.loads((work / "bench.jsonl").read_text().splitlines()[-1])
fleet_tok_s = status["completion_tokens"] / max(status["elapsed_s"], 1e-9)
bench_tok_s = bench["output_throughput"]
print(f"fleet run : {status['completion_tokens']:>10,} output tokens in {status['elapsed_s']:8.1f} s = {fleet_tok_s:10,.1f} tok/s")
print(f"sglang    : {bench['total_output_tokens']:>10,} output tokens in {bench['total_latency']:8.1f} s = {bench_tok_s:10,.1f} tok/s")
print(f"ratio fleet / sglang = {fleet_tok_s / bench_tok_s:.3f}")
if not status["done"]:
    sys.exit("gpu-smoke: the fleet job did not finish every chunk")
PY
