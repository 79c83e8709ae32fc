#!/usr/bin/env bash
# Start (or stop) the head: Redis, the broker, and Flower behind basic auth.
#
#   ops/start-head.sh --init          write ops/fleet.env with fresh secrets, then edit it
#   ops/start-head.sh                 start: docker compose where Docker runs, else native
#   ops/start-head.sh --native        start redis-server and Flower in this container (a pod)
#   ops/start-head.sh --stop          stop them (Redis flushes its append-only file first)
#
# Options: --compose | --native, --foreground (native: Redis stays in the foreground),
#          --no-flower, --init, --stop. Settings: $FLEET_ENV_FILE (default ops/fleet.env).
set -euo pipefail
# shellcheck source=ops/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mode=auto
foreground=0
flower=1
action=start
while [[ $# -gt 0 ]]; do
    case "$1" in
        --native) mode=native ;;
        --compose) mode=compose ;;
        --foreground) foreground=1 ;;
        --no-flower) flower=0 ;;
        --init) action=init ;;
        --stop) action=stop ;;
        -h | --help)
            sed -n '2,12p' "$0"
            exit 0
            ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done

if [[ "${action}" == init ]]; then
    init_env
    exit 0
fi
load_env
mode="$(resolve_mode "${mode}")"

REDIS_PORT="${REDIS_PORT:-6379}"
REDIS_BIND="${REDIS_BIND:-127.0.0.1}"
if [[ -d /workspace ]]; then
    REDIS_DIR="${REDIS_DIR:-/workspace/redis}"
else
    REDIS_DIR="${REDIS_DIR:-${REPO_DIR}/fleet-data/redis}"
fi
ping_host="${REDIS_BIND}"
[[ "${ping_host}" == "0.0.0.0" ]] && ping_host=127.0.0.1

redis_ping() {
    REDISCLI_AUTH="${REDIS_PASSWORD}" redis-cli -h "${ping_host}" -p "${REDIS_PORT}" ping 2> /dev/null
}

start_flower_native() {
    [[ "${flower}" == 1 ]] || return 0
    stop_pidfile "${LOG_DIR}/flower.pid" 10
    nohup fleet flower > "${LOG_DIR}/flower.log" 2>&1 &
    echo $! > "${LOG_DIR}/flower.pid"
    note "Flower on ${FLEET_FLOWER_ADDRESS:-127.0.0.1}:${FLEET_FLOWER_PORT:-5555}, log ${LOG_DIR}/flower.log"
}

start_native() {
    command -v redis-server > /dev/null || die "redis-server is not installed (apt-get install redis-server)"
    mkdir -p "${REDIS_DIR}"
    # The password goes to a private include file, not onto the command line.
    (
        umask 077
        printf 'requirepass %s\n' "${REDIS_PASSWORD}" > "${REDIS_DIR}/auth.conf"
    )
    local args=(redis-server "${OPS_DIR}/redis.conf" --include "${REDIS_DIR}/auth.conf"
        --dir "${REDIS_DIR}" --bind "${REDIS_BIND}" --port "${REDIS_PORT}")
    if [[ "${foreground}" == 1 ]]; then
        start_flower_native
        note "Redis on ${REDIS_BIND}:${REDIS_PORT} (foreground), data in ${REDIS_DIR}"
        exec "${args[@]}"
    fi
    if redis_ping | grep -q PONG; then
        note "Redis already answers on ${ping_host}:${REDIS_PORT}"
    else
        "${args[@]}" --daemonize yes --pidfile "${REDIS_DIR}/redis.pid" --logfile "${LOG_DIR}/redis.log"
        for _ in $(seq 50); do
            redis_ping | grep -q PONG && break
            sleep 0.2
        done
        redis_ping | grep -q PONG || die "Redis did not answer; see ${LOG_DIR}/redis.log"
        note "Redis on ${REDIS_BIND}:${REDIS_PORT}, data in ${REDIS_DIR}, log ${LOG_DIR}/redis.log"
    fi
    start_flower_native
}

stop_native() {
    stop_pidfile "${LOG_DIR}/flower.pid" 10
    if redis_ping | grep -q PONG; then
        note "stopping Redis (SHUTDOWN writes the append-only file first)"
        REDISCLI_AUTH="${REDIS_PASSWORD}" redis-cli -h "${ping_host}" -p "${REDIS_PORT}" shutdown || true
    fi
}

case "${mode}:${action}" in
    compose:start)
        services=(redis)
        [[ "${flower}" == 1 ]] && services+=(flower)
        compose compose.head.yml up -d "${services[@]}"
        compose compose.head.yml ps
        ;;
    compose:stop) compose compose.head.yml down ;;
    native:start) start_native ;;
    native:stop) stop_native ;;
    *) die "unknown mode ${mode}" ;;
esac
