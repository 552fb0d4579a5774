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
# * A replica of the swarm stack's worker service (docker/stack.yml) has
#   PS_WORKER_SLOT={{.Task.Slot}} (1, 2, ...): its worker id is the slot - 1
#   (PS_WORKER_ID, replacing any given), its log name gets "-<id>", and a replica
#   whose id is not in PS_BYZANTINE_WORKERS drops PS_WORKER_ATTACK (it is honest).
set -uo pipefail

[ -n "${PS_READY_FILE:-}" ] && rm -f "$PS_READY_FILE"

if [ -n "${PS_WORKER_SLOT:-}" ]; then
  if ! [[ "$PS_WORKER_SLOT" =~ ^[0-9]+$ ]] || [ "$((10#$PS_WORKER_SLOT))" -lt 1 ]; then
    echo "entrypoint: PS_WORKER_SLOT must be a task slot (1, 2, ...), got '$PS_WORKER_SLOT'" >&2
    exit 2
  fi
  export PS_WORKER_ID=$((10#$PS_WORKER_SLOT - 1))
  [ -n "${PS_LOG_NAME:-}" ] && export PS_LOG_NAME="$PS_LOG_NAME-$PS_WORKER_ID"
  if [ -n "${PS_BYZANTINE_WORKERS:-}" ] \
      && [[ ",${PS_BYZANTINE_WORKERS// /}," != *",$PS_WORKER_ID,"* ]]; then
    unset PS_WORKER_ATTACK
  fi
fi

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
