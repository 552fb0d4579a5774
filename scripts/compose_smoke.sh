#!/usr/bin/env bash
# Compose smoke test: check that the shipped docker-compose.yml is what
# docker/cluster.env gives (it runs no proxy), generate the gambler experiment
# (docker/experiments/gambler.env over docker/cluster.env, written to the git-ignored
# docker/experiments/gambler.compose.yml: 4 servers, a gambler proxy in front of
# server 0, the workers, the evaluator), build the image, start that cluster, wait
# for the run to finish, and check:
#   * inside every node's running container: /keys holds exactly the key files its
#     identity loads (common.net.keys.needed_keys) and cannot be written; the root file
#     system cannot be written; /runs (its own directory) can; no other writable
#     mount than /runs, /tmp and Docker's own; and the engine applied the memory,
#     pids, read-only and log-rotation settings to every container;
#   * every container exited 0, none was OOM-killed;
#   * the evaluator reached the last round with top-1 >= PS_SMOKE_MIN_TOP1
#     (default 0.5; chance is 0.1) under the attack;
#   * each proxy corrupted values (corrupted_values summed over its rounds > 0);
#   * every server wrote all its rounds and its final shard (checkpoint);
#   * worker-1, whose process is killed (kill -9) a third into the run, was restarted
#     by its restart policy and the run still finished.
# It prints each service's peak memory (its cgroup's high-water mark, and the largest
# sampled anonymous + tmpfs memory) and processes against the limits it was given.
# Everything is torn down on exit, failure and Ctrl-C included; on failure the
# containers' states and log tails are printed. Exit 0 only when all checks pass.
#
# If no Docker engine answers, ../shared/tools/offline-docker.sh (beside the
# repository) is tried first. If no engine can be had at all, the script prints
# "SKIPPED compose smoke: <reason>" and exits 0 when PS_COMPOSE_ALLOW_SKIP=1,
# non-zero otherwise.
#
# Environment: PS_SMOKE_TIMEOUT (s, default 900) deadline for the run itself;
# PS_SMOKE_MIN_TOP1 (0.5); PS_IMAGE (byzps:latest); PS_RUNS_DIR (runs/compose);
# PS_COMPOSE_PROJECT (byzps-smoke); TORCH_INDEX_URL (build argument, see
# docs/docker.md); PS_UID/PS_GID (the uid:gid the containers run as).
set -euo pipefail

t0=$(date +%s)
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

export PS_IMAGE="${PS_IMAGE:-byzps:latest}"
export PS_RUNS_DIR="${PS_RUNS_DIR:-$repo/runs/compose}"
project="${PS_COMPOSE_PROJECT:-byzps-smoke}"
run_timeout_s="${PS_SMOKE_TIMEOUT:-900}"
min_top1="${PS_SMOKE_MIN_TOP1:-0.5}"
env_file="docker/cluster.env"
experiment="docker/experiments/gambler.env"  # its lines override the env file's
compose_file="docker/experiments/gambler.compose.yml"  # generated here, git-ignored
SMOKE="compose smoke" SMOKE_SKIP_VAR=PS_COMPOSE_ALLOW_SKIP
# shellcheck source=scripts/smoke_lib.sh
source scripts/smoke_lib.sh

# --- 1. a Docker engine, docker-compose and the base image ------------------------
ensure_engine_and_base_image
if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  skip_or_fail "neither docker-compose nor docker compose is installed"
fi
compose+=(-p "$project")

# --- 2. the shipped compose file matches the env file; the experiment's, generated ----
python3 docker/gen_compose.py --check >&2
"${compose[@]}" config -q
python3 docker/gen_compose.py --experiment "$experiment" -o "$compose_file" >&2
compose+=(-f "$compose_file")
"${compose[@]}" config -q

# a setting of the run: the experiment's value, else the env file's
env_value() { sed -n "s/^$1=//p" "$env_file" "$experiment" | tail -n 1; }
rounds="$(env_value PS_ROUNDS)"

# --- 3. the image ------------------------------------------------------------------
build_image

# --- 4. an empty output directory ----------------------------------------------------
# (as root it stays root's, and the compose file's runs-dir service hands it to the
# containers' user; otherwise the containers run as the caller)
mkdir -p "$PS_RUNS_DIR"
find "$PS_RUNS_DIR" -mindepth 1 -delete
if [ "$(id -u)" = 0 ]; then
  chown 0:0 "$PS_RUNS_DIR"
else
  export PS_UID="${PS_UID:-$(id -u)}" PS_GID="${PS_GID:-$(id -g)}"
fi

# --- 5. up, always down ----------------------------------------------------------
started=0
finish() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$started" = 1 ]; then
    if [ "$rc" != 0 ]; then
      echo "--- container states ---" >&2
      "${compose[@]}" ps -a >&2 || true
      echo "--- container logs (last 30 lines each) ---" >&2
      "${compose[@]}" logs --no-color --tail=30 >&2 || true
      echo "(full logs: ${compose[*]} logs SERVICE, before the tear-down)" >&2
    fi
    "${compose[@]}" down -v --remove-orphans -t 10 >/dev/null 2>&1 \
      || say "warning: docker-compose down failed"
  fi
  echo "compose smoke: total $(elapsed "$t0") s"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

t_run=$(date +%s)
started=1
# `up -d` itself waits for the servers' and the proxy's healthchecks (depends_on)
timeout 300 "${compose[@]}" up -d --no-build >&2
say "cluster up in $(elapsed "$t_run") s; waiting for the run to finish (deadline ${run_timeout_s} s)"

# --- 6. what each container can read and write, and what the engine applied ----------
# per node service: the key files its identity loads (from the topology the deployed
# compose file records: its env file and experiment)
mapfile -t wanted < <(python3 - "$compose_file" <<'PY'
import sys
from pathlib import Path

from common.net.keys import needed_keys
from ps.deploy.compose import ARGS_MARK, deployment_of, recorded_options
from ps.deploy.compose import service_environments

options = recorded_options(Path(sys.argv[1]), ARGS_MARK)
dep = deployment_of(options)
for name in service_environments(dep):
    files = needed_keys(name, dep.cfg.num_shards, dep.cfg.num_workers, dep.proxied)
    print(name, *sorted(files))
PY
)
[ "${#wanted[@]}" -gt 0 ] || fail "could not list the services' key files"
# shellcheck disable=SC2016  # expanded in the container
inside='
  held="$(ls -A /keys | LC_ALL=C sort | tr "\n" " ")"
  [ "$held" = "$1" ] || echo "/keys holds [$held], its identity loads [$1]"
  for f in /keys/*; do [ -r "$f" ] || echo "cannot read $f"; done
  if touch /keys/.probe 2>/dev/null; then rm -f /keys/.probe; echo "/keys is writable"; fi
  if touch /.probe 2>/dev/null; then rm -f /.probe; echo "the root file system is writable"; fi
  if touch /runs/.probe 2>/dev/null; then rm -f /runs/.probe; else echo "/runs is not writable"; fi
  awk "\$6 ~ /^rw/ {print \$5}" /proc/self/mountinfo | while read -r m; do
    case "$m" in
      /runs | /tmp | /dev | /dev/* | /proc | /proc/* | /sys/fs/cgroup) ;;  # its own
      /etc/hosts | /etc/hostname | /etc/resolv.conf) ;;  # its own, written by Docker
      *) echo "writable mount $m" ;;
    esac
  done'
t_checks=$(date +%s)
for line in "${wanted[@]}"; do
  read -r svc files <<<"$line"
  id="$("${compose[@]}" ps -q "$svc")"
  [ -n "$id" ] && [ "$(docker inspect -f '{{.State.Running}}' "$id")" = true ] \
    || fail "$svc is not running a few seconds into the run"
  problems="$(docker exec "$id" sh -c "$inside" sh "$files " 2>&1)" \
    || fail "$svc: docker exec failed: $problems"
  [ -z "$problems" ] || fail "$svc: $(tr '\n' ';' <<<"$problems")"
done
say "every node's container: /keys read-only with exactly its identity's ${#wanted[@]} key" \
  "sets, read-only root, /runs its own (${#wanted[@]} containers checked in" \
  "$(elapsed "$t_checks") s)"
mapfile -t ids < <("${compose[@]}" ps -a -q)
applied="$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.LogConfig.Type}} {{index .HostConfig.LogConfig.Config "max-size"}} {{index .HostConfig.LogConfig.Config "max-file"}}' "${ids[@]}" | sort)"
bad="$(awk '!($2 > 0 && $3 > 0 && $4 == "true" && $5 == "json-file" && $6 != "" && $7 != "")' \
  <<<"$applied")"
[ -z "$bad" ] || fail "limits, read-only root or log rotation not applied: $bad"
declare -A limit_of
while read -r svc memory pids _; do limit_of[$svc]="$memory:$pids"; done <<<"$applied"

# --- 7. wait: poll the containers' states, never a fixed sleep -----------------------
progress() {  # "round R" (+ " top-1 A") from the last line of a metrics file, or "-"
  local line
  line="$(tail -n 1 "$1" 2>/dev/null \
    | sed -n 's/.*"round": *\([0-9]*\)[^}]*"top1": *\([0-9.]*\).*/round \1 top-1 \2/p; t; s/.*"round": *\([0-9]*\).*/round \1/p')"
  echo "${line:--}"
}
progress_round() {  # the last round number of a metrics file, 0 if none
  local r
  r="$(tail -n 1 "$1" 2>/dev/null | sed -n 's/.*"round": *\([0-9]*\).*/\1/p')"
  echo "${r:-0}"
}
server0="$PS_RUNS_DIR/server-0/server-0.jsonl"
deadline=$((t_run + run_timeout_s))
next_report=$(($(date +%s) + 15))
killed=0
while :; do
  mapfile -t ids < <("${compose[@]}" ps -a -q)
  [ "${#ids[@]}" -gt 0 ] || { echo "FAILED compose smoke: no containers" >&2; exit 1; }
  states="$(docker inspect -f '{{.Name}} {{.State.Status}} {{.State.ExitCode}} {{.RestartCount}} {{.HostConfig.RestartPolicy.MaximumRetryCount}} {{.HostConfig.RestartPolicy.Name}} {{.State.Pid}} {{index .Config.Labels "com.docker.compose.service"}} {{.State.OOMKilled}} {{.Id}}' "${ids[@]}")"
  while read -r _ state _ _ _ _ pid svc _ id; do
    [ "$state" = running ] && sample_usage "$svc" "$pid" "$id"
  done <<<"$states"
  oom="$(awk '$9 == "true" {print $8}' <<<"$states")"
  [ -z "$oom" ] || fail "OOM-killed: $(tr '\n' ' ' <<<"$oom")"
  # exited non-zero for good: no restart policy, or its restarts used up
  failed="$(awk '$2 == "exited" && $3 != 0 && ($6 == "no" || $4 >= $5) {print substr($1, 2) " (exit " $3 ")"}' <<<"$states")"
  if [ -n "$failed" ]; then
    echo "FAILED compose smoke: container(s) failed: $(tr '\n' ' ' <<<"$failed")" >&2
    exit 1
  fi
  running="$(awk '$2 != "exited" || ($3 != 0 && $6 != "no" && $4 < $5)' <<<"$states" | wc -l)"
  [ "$running" = 0 ] && break
  if [ "$killed" = 0 ] && [ "$(progress_round "$server0")" -ge $((rounds / 3)) ]; then
    victim="$("${compose[@]}" ps -q worker-1)"
    pid="$(docker inspect -f '{{.State.Pid}}' "$victim")"
    say "killing worker-1 (host pid $pid) at round $(progress_round "$server0")"
    kill -9 "$pid"
    killed=1
  fi
  now=$(date +%s)
  if [ "$now" -ge "$deadline" ]; then
    echo "FAILED compose smoke: run not finished after ${run_timeout_s} s" \
      "($running containers still running)" >&2
    exit 1
  fi
  if [ "$now" -ge "$next_report" ]; then
    say "$(elapsed "$t_run") s: server-0 $(progress "$server0") of $rounds;" \
      "evaluator $(progress "$PS_RUNS_DIR/evaluator/evaluator.jsonl");" \
      "$running containers running"
    next_report=$((now + 15))
  fi
  sleep 2
done
run_s=$(elapsed "$t_run")
[ "$killed" = 1 ] || { echo "FAILED compose smoke: the run ended before worker-1 was killed" >&2; exit 1; }
restarts="$(docker inspect -f '{{.RestartCount}}' "$("${compose[@]}" ps -q worker-1)")"
[ "$restarts" -ge 1 ] || { echo "FAILED compose smoke: worker-1 was not restarted" >&2; exit 1; }
say "worker-1 was killed and restarted ($restarts restart(s)); the run finished"
echo "peak usage per container (sampled every 2 s from its cgroup) against its limits:"
usage_table $(for svc in $(printf '%s\n' "${!limit_of[@]}" | sort -V); do
  echo "$svc=${limit_of[$svc]}"; done)

# --- 8. check the metrics on the host ----------------------------------------------
result="$(python3 scripts/check_smoke_metrics.py "$PS_RUNS_DIR" "$env_file" "$experiment" \
  "$min_top1")" || {
  echo "$result" >&2
  echo "FAILED compose smoke: the metrics do not pass (see above)" >&2
  exit 1
}

echo "$result"
echo "PASSED compose smoke: build ${build_s} s, run ${run_s} s (metrics and logs in $PS_RUNS_DIR)"
