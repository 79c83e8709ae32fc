#!/usr/bin/env bash
# Start (or stop) the head: Redis, the broker, Flower behind basic auth, and monitoring:
# `fleet job-metrics` and Prometheus scraping every worker (METRICS_HOSTS x
# METRICS_WORKERS_PER_HOST at FLEET_METRICS_PORT + n, written by `fleet prom-targets`);
# compose adds Grafana with ops/grafana/fleet.json. --native runs Prometheus when the
# `prometheus` binary is installed (apt-get install prometheus); import the dashboard
# into any Grafana.
#
#   ops/start-head.sh --init          write ops/fleet.env with fresh secrets, then edit it
#   ops/start-head.sh                 start: docker compose where Docker runs, else native
#   ops/start-head.sh --native        start redis-server and Flower in this container (a pod)
#   ops/start-head.sh --stop          stop them (Redis flushes its append-only file first)
#
# Options: --compose | --native, --foreground (native: Redis stays in the foreground),
#          --no-flower, --no-monitoring, --init, --stop. Settings: $FLEET_ENV_FILE (default ops/fleet.env).
set -euo pipefail
# shellcheck source=ops/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mode=auto
foreground=0
flower=1
monitoring=1
action=start
while [[ $# -gt 0 ]]; do
    case "$1" in
        --native) mode=native ;;
        --compose) mode=compose ;;
        --foreground) foreground=1 ;;
        --no-flower) flower=0 ;;
        --no-monitoring) monitoring=0 ;;
        --init) action=init ;;
        --stop) action=stop ;;
        -h | --help)
            sed -n '2,17p' "$0"
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

PROMETHEUS_PORT="${PROMETHEUS_PORT:-9090}"
JOB_METRICS_PORT="${JOB_METRICS_PORT:-9399}"
# compose mounts ops/prometheus; --native runs from a copy in LOG_DIR (the checkout stays clean).
TARGETS="${OPS_DIR}/prometheus/targets/fleet.json"
PROM_CONF_DIR="${LOG_DIR}/prometheus-conf"

# Prometheus' list of endpoints: every worker of every GPU host, and the job exporter.
targets_args() {
    target_args=(--hosts "${METRICS_HOSTS:-127.0.0.1}" --workers "${METRICS_WORKERS_PER_HOST:-8}"
        --port "${FLEET_METRICS_PORT:-9400}" --job-metrics "$1")
}

start_monitoring_native() {
    [[ "${monitoring}" == 1 ]] || return 0
    mkdir -p "${PROM_CONF_DIR}"
    cp "${OPS_DIR}/prometheus/prometheus.yml" "${PROM_CONF_DIR}/prometheus.yml"
    targets_args "127.0.0.1:${JOB_METRICS_PORT}"
    fleet prom-targets "${target_args[@]}" --out "${PROM_CONF_DIR}/targets/fleet.json"
    stop_pidfile "${LOG_DIR}/job-metrics.pid" 10
    nohup fleet job-metrics --port "${JOB_METRICS_PORT}" > "${LOG_DIR}/job-metrics.log" 2>&1 &
    echo $! > "${LOG_DIR}/job-metrics.pid"
    if ! command -v prometheus > /dev/null; then
        note "prometheus is not installed (apt-get install prometheus): job metrics on :${JOB_METRICS_PORT} only"
        return 0
    fi
    stop_pidfile "${LOG_DIR}/prometheus.pid" 30
    nohup prometheus --config.file="${PROM_CONF_DIR}/prometheus.yml" \
        --storage.tsdb.path="${PROMETHEUS_DIR:-${LOG_DIR}/prometheus}" \
        --web.listen-address="${PROMETHEUS_BIND:-127.0.0.1}:${PROMETHEUS_PORT}" \
        > "${LOG_DIR}/prometheus.log" 2>&1 &
    echo $! > "${LOG_DIR}/prometheus.pid"
    note "Prometheus on ${PROMETHEUS_BIND:-127.0.0.1}:${PROMETHEUS_PORT}, targets ${PROM_CONF_DIR}/targets"
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
        start_monitoring_native
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
    start_monitoring_native
}

stop_native() {
    stop_pidfile "${LOG_DIR}/flower.pid" 10
    stop_pidfile "${LOG_DIR}/prometheus.pid" 30
    stop_pidfile "${LOG_DIR}/job-metrics.pid" 10
    if redis_ping | grep -q PONG; then
        note "stopping Redis (SHUTDOWN writes the append-only file first)"
        REDISCLI_AUTH="${REDIS_PASSWORD}" redis-cli -h "${ping_host}" -p "${REDIS_PORT}" shutdown || true
    fi
}

case "${mode}:${action}" in
    compose:start)
        services=(redis)
        [[ "${flower}" == 1 ]] && services+=(flower)
        if [[ "${monitoring}" == 1 ]]; then
            mkdir -p "$(dirname "${TARGETS}")"
            targets_args job-metrics:9399
            compose compose.head.yml run --rm --no-deps -v "$(dirname "${TARGETS}"):/targets" job-metrics \
                prom-targets "${target_args[@]}" --out /targets/fleet.json
            services+=(job-metrics prometheus grafana)
        fi
        compose compose.head.yml up -d "${services[@]}"
        compose compose.head.yml ps
        ;;
    compose:stop) compose compose.head.yml down ;;
    native:start) start_native ;;
    native:stop) stop_native ;;
    *) die "unknown mode ${mode}" ;;
esac
