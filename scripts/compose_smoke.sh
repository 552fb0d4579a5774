#!/usr/bin/env bash
# Compose smoke test: build the image, start the docker-compose cluster of
# docker-compose.yml (4 servers, a gambler proxy in front of server 0, the
# workers, the evaluator), wait for the run to finish, and check on the host:
#   * every container exited 0;
#   * the evaluator reached the last round with top-1 >= PS_SMOKE_MIN_TOP1
#     (default 0.5; chance is 0.1) under the attack;
#   * each proxy corrupted values (corrupted_values summed over its rounds > 0);
#   * every server wrote all its rounds and its final shard (checkpoint);
#   * worker-1, whose process is killed (kill -9) a third into the run, was restarted
#     by its restart policy and the run still finished.
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

# --- 2. the compose file matches the env file --------------------------------------
python3 docker/gen_compose.py --check >&2
"${compose[@]}" config -q

env_value() { sed -n "s/^$1=//p" "$env_file" | tail -n 1; }
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
      echo "(full logs: $PS_RUNS_DIR/logs/)" >&2
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

# --- 6. wait: poll the containers' states, never a fixed sleep -----------------------
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
deadline=$((t_run + run_timeout_s))
next_report=$(($(date +%s) + 15))
killed=0
while :; do
  mapfile -t ids < <("${compose[@]}" ps -a -q)
  [ "${#ids[@]}" -gt 0 ] || { echo "FAILED compose smoke: no containers" >&2; exit 1; }
  states="$(docker inspect -f '{{.Name}} {{.State.Status}} {{.State.ExitCode}} {{.RestartCount}} {{.HostConfig.RestartPolicy.MaximumRetryCount}} {{.HostConfig.RestartPolicy.Name}}' "${ids[@]}")"
  # exited non-zero for good: no restart policy, or its restarts used up
  failed="$(awk '$2 == "exited" && $3 != 0 && ($6 == "no" || $4 >= $5) {print substr($1, 2) " (exit " $3 ")"}' <<<"$states")"
  if [ -n "$failed" ]; then
    echo "FAILED compose smoke: container(s) failed: $(tr '\n' ' ' <<<"$failed")" >&2
    exit 1
  fi
  running="$(awk '$2 != "exited" || ($3 != 0 && $6 != "no" && $4 < $5)' <<<"$states" | wc -l)"
  [ "$running" = 0 ] && break
  if [ "$killed" = 0 ] && [ "$(progress_round "$PS_RUNS_DIR/server-0.jsonl")" -ge $((rounds / 3)) ]; then
    victim="$("${compose[@]}" ps -q worker-1)"
    pid="$(docker inspect -f '{{.State.Pid}}' "$victim")"
    say "killing worker-1 (host pid $pid) at round $(progress_round "$PS_RUNS_DIR/server-0.jsonl")"
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
    say "$(elapsed "$t_run") s: server-0 $(progress "$PS_RUNS_DIR/server-0.jsonl") of $rounds;" \
      "evaluator $(progress "$PS_RUNS_DIR/evaluator.jsonl"); $running containers running"
    next_report=$((now + 15))
  fi
  sleep 2
done
run_s=$(elapsed "$t_run")
[ "$killed" = 1 ] || { echo "FAILED compose smoke: the run ended before worker-1 was killed" >&2; exit 1; }
restarts="$(docker inspect -f '{{.RestartCount}}' "$("${compose[@]}" ps -q worker-1)")"
[ "$restarts" -ge 1 ] || { echo "FAILED compose smoke: worker-1 was not restarted" >&2; exit 1; }
say "worker-1 was killed and restarted ($restarts restart(s)); the run finished"

# --- 7. check the metrics on the host ----------------------------------------------
result="$(python3 - "$PS_RUNS_DIR" "$env_file" "$min_top1" <<'PY'
import glob
import json
import math
import os
import sys

runs, env_path, min_top1 = sys.argv[1], sys.argv[2], float(sys.argv[3])
env = {}
for line in open(env_path, encoding="utf-8"):
    key, sep, value = line.strip().partition("=")
    if sep and not key.startswith("#"):
        env[key] = value
rounds, shards = int(env["PS_ROUNDS"]), int(env["PS_SHARDS"])
attack = env.get("PS_PROXY_ATTACK", "none")


def records(name):
    path = os.path.join(runs, name)
    if not os.path.exists(path):
        sys.exit(f"{name} is missing in {runs}")
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


problems = []
evaluations = records("evaluator.jsonl")
final = evaluations[-1] if evaluations else {}
top1 = final.get("top1", float("nan"))
if final.get("round") != rounds:
    problems.append(f"the evaluator's last round is {final.get('round')}, expected {rounds}")
if not (math.isfinite(top1) and top1 >= min_top1):
    problems.append(f"final top-1 {top1} < {min_top1} (chance is 0.1)")

proxies = sorted(glob.glob(os.path.join(runs, "proxy-*.jsonl")))
corrupted = {}
for path in proxies:
    name = os.path.basename(path)
    corrupted[name] = sum(r.get("corrupted_values", 0) for r in records(name))
if attack != "none":
    if not proxies:
        problems.append("no proxy-*.jsonl: did the proxy run?")
    problems += [f"{name}: no value corrupted ({attack})" for name, c in corrupted.items() if c <= 0]

for s in range(shards):
    server = records(f"server-{s}.jsonl")
    if len(server) != rounds:
        problems.append(f"server-{s}.jsonl has {len(server)} rounds, expected {rounds}")
    elif not server[-1].get("params_finite", False):
        problems.append(f"server {s}: parameters not finite after the last round")
    if not os.path.exists(os.path.join(runs, f"shard-{s}.npz")):
        problems.append(f"the final checkpoint shard-{s}.npz is missing")

curve = " ".join(f"{r['round']}:{r['top1']:.3f}" for r in evaluations)
print(f"top-1 by round: {curve}")
print(
    f"rule {env.get('PS_RULE')} q={env.get('PS_Q')}, n={env.get('PS_WORKERS')} S={shards}, "
    f"{rounds} rounds, proxy attack {attack} (p={env.get('PS_GAMBLER_P')}): "
    f"final top-1 {top1:.4f} top-3 {final.get('top3', float('nan')):.4f}; corrupted values: "
    + (", ".join(f"{k.removesuffix('.jsonl')} {v}" for k, v in corrupted.items()) or "none")
)
if problems:
    print("problems: " + "; ".join(problems))
    sys.exit(1)
PY
)" || {
  echo "$result" >&2
  echo "FAILED compose smoke: the metrics do not pass (see above)" >&2
  exit 1
}

echo "$result"
echo "PASSED compose smoke: build ${build_s} s, run ${run_s} s (metrics and logs in $PS_RUNS_DIR)"
