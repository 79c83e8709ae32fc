#!/usr/bin/env bash
# Upload a prompts JSONL to S3 (or any S3-compatible store), checked first and verified after.
#
#   ops/upload-prompts.sh prompts.jsonl s3://bucket/fleet/inputs/prompts.jsonl [--no-check]
#
# Every line must parse as a JSON object (fleet enqueue checks the fields too, with line
# numbers, before it enqueues anything). Uses the aws CLI when present, else boto3; both
# follow the AWS credential chain and AWS_ENDPOINT_URL.
set -euo pipefail

die() {
    echo "error: $*" >&2
    exit 1
}

[[ $# -ge 2 ]] || die "usage: $0 PROMPTS.jsonl s3://bucket/key [--no-check]"
src="$1"
dest="$2"
check=1
[[ "${3:-}" == "--no-check" ]] && check=0
[[ -f "${src}" ]] || die "no file ${src}"
[[ "${dest}" == s3://*/* ]] || die "destination must be s3://bucket/key, got ${dest}"

PYTHON="$(command -v python3 || command -v python)" || die "python3 is needed"

if [[ "${check}" == 1 ]]; then
    echo "==> checking ${src}" >&2
    "${PYTHON}" - "${src}" << 'PY'
import json, sys
bad, n = [], 0
with open(sys.argv[1], "rb") as f:
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            bad.append(n)
print(f"{n} lines, {len(bad)} bad", file=sys.stderr)
if bad:
    sys.exit(f"not a JSON object on line(s) {bad[:10]}{' ...' if len(bad) > 10 else ''}")
PY
fi

size="$(wc -c < "${src}" | tr -d ' ')"
sha="$(sha256sum "${src}" | cut -d' ' -f1)"
echo "==> uploading ${src} (${size} bytes, sha256 ${sha}) to ${dest}" >&2

if command -v aws > /dev/null; then
    aws s3 cp "${src}" "${dest}" --only-show-errors --metadata "sha256=${sha}"
    remote="$(aws s3api head-object --bucket "$(echo "${dest#s3://}" | cut -d/ -f1)" \
        --key "${dest#s3://*/}" --query ContentLength --output text)"
else
    remote="$("${PYTHON}" - "${src}" "${dest}" "${sha}" << 'PY'
import sys
import boto3
src, dest, sha = sys.argv[1:4]
bucket, key = dest[len("s3://"):].split("/", 1)
s3 = boto3.client("s3")
s3.upload_file(src, bucket, key, ExtraArgs={"Metadata": {"sha256": sha}})
print(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
PY
)"
fi

[[ "${remote}" == "${size}" ]] || die "uploaded size ${remote} != local size ${size}"
echo "==> done: ${dest}" >&2
echo "next: fleet enqueue ${dest} --job <name>" >&2
