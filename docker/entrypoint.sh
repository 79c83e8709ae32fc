#!/usr/bin/env bash
# Entrypoint of the fleet images.
#
#   worker|flower|enqueue|status|doctor|plan|export|run|bench ARGS   -> fleet <command> ARGS
#   head ARGS     -> ops/start-head.sh --native --foreground ARGS (Redis, and Flower)
#   gpu-host ARGS -> ops/start-gpu-host.sh --native --foreground ARGS (doctor, then workers)
#   pod           -> keep the container up for SSH (RunPod, Vast.ai): sshd when PUBLIC_KEY is set
#   anything else -> run as given (bash, python3 ...)
set -euo pipefail

OPS_DIR="${FLEET_OPS_DIR:-/opt/fleet/ops}"

start_sshd() {
    # RunPod passes the account's key as PUBLIC_KEY; without one there is no SSH to start.
    if [[ -z "${PUBLIC_KEY:-}" ]] || ! command -v sshd > /dev/null; then
        return 0
    fi
    mkdir -p /root/.ssh /run/sshd
    chmod 700 /root/.ssh
    touch /root/.ssh/authorized_keys
    if ! grep -qF "${PUBLIC_KEY}" /root/.ssh/authorized_keys; then
        printf '%s\n' "${PUBLIC_KEY}" >> /root/.ssh/authorized_keys
    fi
    chmod 600 /root/.ssh/authorized_keys
    ssh-keygen -A > /dev/null
    "$(command -v sshd)" -o PasswordAuthentication=no
}

command_name="${1:-}"
case "${command_name}" in
    worker | flower | enqueue | status | doctor | plan | export | run | bench | job-metrics | prom-targets)
        exec fleet "$@"
        ;;
    head)
        shift
        exec "${OPS_DIR}/start-head.sh" --native --foreground "$@"
        ;;
    gpu-host)
        shift
        exec "${OPS_DIR}/start-gpu-host.sh" --native --foreground "$@"
        ;;
    pod)
        start_sshd
        echo "fleet pod ready: see ${OPS_DIR}/runbook.md" >&2
        exec sleep infinity
        ;;
    "" | -h | --help | help)
        exec fleet --help
        ;;
    *)
        exec "$@"
        ;;
esac
