#!/usr/bin/env bash
# Shared by the ops scripts: the settings file, the run mode, logs. Source it, don't run it.

OPS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "${OPS_DIR}")"
ENV_FILE="${FLEET_ENV_FILE:-${OPS_DIR}/fleet.env}"

die() {
    echo "error: $*" >&2
    exit 1
}

note() {
    echo "==> $*" >&2
}

random_hex() {
    # 24 random bytes as hex: URL-safe, so it can sit in redis://:<password>@host.
    od -An -N24 -tx1 /dev/urandom | tr -d ' \n'
}

# Write the settings file from the example, with fresh secrets, readable by its owner only.
init_env() {
    if [[ -f "${ENV_FILE}" ]]; then
        note "${ENV_FILE} exists; leaving it as it is"
        return 0
    fi
    local redis_pw flower_pw grafana_pw
    redis_pw="$(random_hex)"
    flower_pw="$(random_hex)"
    grafana_pw="$(random_hex)"
    (
        umask 077
        sed -e "s/^REDIS_PASSWORD=.*/REDIS_PASSWORD=${redis_pw}/" \
            -e "s/^FLEET_FLOWER_BASIC_AUTH=.*/FLEET_FLOWER_BASIC_AUTH=admin:${flower_pw}/" \
            -e "s/^GRAFANA_ADMIN_PASSWORD=.*/GRAFANA_ADMIN_PASSWORD=${grafana_pw}/" \
            "${OPS_DIR}/fleet.env.example" > "${ENV_FILE}"
    )
    note "wrote ${ENV_FILE} with new secrets; set FLEET_STORE_URL, the AWS keys and the model, then rerun"
}

# Export every KEY=value of the settings file (compose reads the same file).
load_env() {
    [[ -f "${ENV_FILE}" ]] || die "no settings file ${ENV_FILE}: run '$0 --init' (or set FLEET_ENV_FILE)"
    set -a
    # shellcheck source=/dev/null
    source "${ENV_FILE}"
    set +a
    [[ "${REDIS_PASSWORD:-change-me}" != "change-me" ]] || die "set REDIS_PASSWORD in ${ENV_FILE}"
    LOG_DIR="${LOG_DIR:-${REPO_DIR}/fleet-logs}"
    mkdir -p "${LOG_DIR}"
}

have_compose() {
    command -v docker > /dev/null && docker compose version > /dev/null 2>&1
}

# compose where a Docker engine is at hand, native inside a rented container (no Docker there).
resolve_mode() {
    local wanted="$1"
    if [[ "${wanted}" != "auto" ]]; then
        echo "${wanted}"
    elif have_compose && docker info > /dev/null 2>&1; then
        echo compose
    else
        echo native
    fi
}

compose() {
    local file="$1"
    shift
    docker compose --env-file "${ENV_FILE}" -f "${REPO_DIR}/docker/${file}" "$@"
}

# Send SIGTERM to the process in a pid file and wait for it to go.
stop_pidfile() {
    local pidfile="$1" wait_s="$2" pid
    [[ -f "${pidfile}" ]] || return 0
    pid="$(cat "${pidfile}")"
    if kill -0 "${pid}" 2> /dev/null; then
        note "stopping pid ${pid} (${pidfile})"
        kill -TERM "${pid}"
        for _ in $(seq $((wait_s * 5))); do
            kill -0 "${pid}" 2> /dev/null || break
            sleep 0.2
        done
        kill -0 "${pid}" 2> /dev/null && die "pid ${pid} still running after ${wait_s} s"
    fi
    rm -f "${pidfile}"
}
