#!/bin/bash
# Entrypoint of the byzps image.
#
# * Removes a stale PS_READY_FILE (the healthcheck tests for it; the server or
#   proxy writes it again once it listens).
# * With PS_OUT_DIR and PS_LOG_NAME set (the compose services set both), checks
#   that the output directory is writable, with a clear message and exit 2 if it
#   is not, and copies the command's stdout and stderr to
#   $PS_OUT_DIR/logs/$PS_LOG_NAME.log as well as to the container's output.
# * Forwards SIGTERM/SIGINT to the command (bash is PID 1 here) and exits with
#   the command's exit status after the log copy is complete.
set -uo pipefail

[ -n "${PS_READY_FILE:-}" ] && rm -f "$PS_READY_FILE"

if [ $# -eq 0 ]; then
  set -- ps-server --help
fi

if [ -z "${PS_OUT_DIR:-}" ] || [ -z "${PS_LOG_NAME:-}" ]; then
  exec "$@"
fi

log_dir="$PS_OUT_DIR/logs"
if ! mkdir -p "$log_dir" 2>/dev/null || ! [ -w "$PS_OUT_DIR" ] || ! [ -w "$log_dir" ]; then
  echo "entrypoint: $PS_OUT_DIR is not writable by uid $(id -u); make the host directory" \
    "writable for it (run with PS_UID=\$(id -u) PS_GID=\$(id -g), see docs/docker.md)" >&2
  exit 2
fi

fifo="$(mktemp -u /tmp/ps-log.XXXXXX)"
mkfifo "$fifo"
tee -a "$log_dir/$PS_LOG_NAME.log" <"$fifo" &
tee_pid=$!
"$@" >"$fifo" 2>&1 &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
trap 'kill -INT "$child" 2>/dev/null' INT

wait "$child"
status=$?
# a trapped signal interrupts `wait`: wait again for the command's own status
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
  status=$?
done
wait "$tee_pid"
rm -f "$fifo"
exit "$status"
