#!/usr/bin/env bash
# Start (or stop) the workers of one GPU host: pre-flight with `fleet doctor`, then
# `fleet worker --gpus $GPUS`, one supervised worker per GPU. A second host joins by
# running this with the same ops/fleet.env; nothing else is configured.
#
#   ops/start-gpu-host.sh                 doctor, then workers (compose where Docker runs)
#   ops/start-gpu-host.sh --native        the same in this container (a RunPod/Vast.ai pod)
#   ops/start-gpu-host.sh --stop          SIGTERM: running chunks checkpoint and go back
#
# Options: --compose | --native, --foreground, --gpus SPEC (default $GPUS or all),
#          --skip-doctor, --stop. Settings: $FLEET_ENV_FILE (default ops/fleet.env).
set -euo pipefail
# shellcheck source=ops/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mode=auto
foreground=0
doctor=1
action=start
gpus=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --native) mode=native ;;
        --compose) mode=compose ;;
        --foreground) foreground=1 ;;
        --skip-doctor) doctor=0 ;;
        --stop) action=stop ;;
        --gpus)
            [[ $# -ge 2 ]] || die "--gpus needs a value (all or 0,1,4)"
            gpus="$2"
            shift
            ;;
        -h | --help)
            sed -n '2,12p' "$0"
            exit 0
            ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done

load_env
mode="$(resolve_mode "${mode}")"
GPUS="${gpus:-${GPUS:-all}}"
export GPUS
# Long enough for the workers' own grace (running chunks checkpoint and are released).
STOP_WAIT_S="${STOP_WAIT_S:-180}"

preflight() {
    [[ "${doctor}" == 1 ]] || return 0
    note "pre-flight: fleet doctor"
    "$@" || die "fleet doctor failed: fix the failed checks above before paying for GPU hours"
}

case "${mode}:${action}" in
    compose:start)
        preflight compose compose.gpu.yml run --rm --no-deps worker doctor
        compose compose.gpu.yml up -d worker
        compose compose.gpu.yml ps
        ;;
    compose:stop) compose compose.gpu.yml down --timeout "${STOP_WAIT_S}" ;;
    native:start)
        export FLEET_MODEL="${FLEET_MODEL:-${MODEL_DIR:-}}"
        # The workers' spools on the host's disk, where compose mounts them too (DATA_DIR).
        if [[ -n "${DATA_DIR:-}" ]]; then
            export FLEET_DATA_DIR="${FLEET_DATA_DIR:-${DATA_DIR}}"
        fi
        preflight fleet doctor
        if [[ "${foreground}" == 1 ]]; then
            exec fleet worker --gpus "${GPUS}"
        fi
        stop_pidfile "${LOG_DIR}/worker.pid" "${STOP_WAIT_S}"
        nohup fleet worker --gpus "${GPUS}" >> "${LOG_DIR}/worker.log" 2>&1 &
        echo $! > "${LOG_DIR}/worker.pid"
        note "workers on GPUs ${GPUS}: pid $(cat "${LOG_DIR}/worker.pid"), log ${LOG_DIR}/worker.log"
        ;;
    native:stop) stop_pidfile "${LOG_DIR}/worker.pid" "${STOP_WAIT_S}" ;;
    *) die "unknown mode ${mode}" ;;
esac
