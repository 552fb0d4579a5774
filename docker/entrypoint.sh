#!/bin/bash
# Entrypoint of the byzps image.
#
# * Removes a stale PS_READY_FILE (the healthcheck tests for it; the server or
#   proxy writes it again once it listens).
# * For the roles (ps-server, ps-worker, ps-proxy) with PS_OUT_DIR set, checks that
#   the output directory is writable, with a clear message and exit 2 if it is not.
#   Other commands (ps-keys, the runs-dir service's shell, --help) are left alone.
# * Then execs the command: the process is PID 1 and gets SIGTERM/SIGINT from
#   `docker stop` itself (servers save their shard, workers exit 130), and its exit
#   status is the container's. Its output goes to Docker's log driver only, which
#   the generated files rotate (json-file, max-size/max-file; docker compose logs,
#   docker service logs): no copy is written to PS_OUT_DIR.
set -uo pipefail

[ -n "${PS_READY_FILE:-}" ] && rm -f "$PS_READY_FILE"

if [ $# -eq 0 ]; then
  set -- ps-server --help
fi

case "$1" in
  ps-server | ps-worker | ps-proxy)
    if [ -n "${PS_OUT_DIR:-}" ] \
        && ! { mkdir -p "$PS_OUT_DIR" 2>/dev/null && [ -w "$PS_OUT_DIR" ]; }; then
      echo "entrypoint: $PS_OUT_DIR is not writable by uid $(id -u); make the host directory" \
        "writable for it (run with PS_UID=\$(id -u) PS_GID=\$(id -g), see docs/docker.md)" >&2
      exit 2
    fi
    ;;
esac

exec "$@"
