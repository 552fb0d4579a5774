#!/usr/bin/env bash
# Swarm smoke test: deploy docker/stack.yml (4 servers, a gambler proxy in front of
# server 0, one worker service of n replicas, the evaluator: docker/cluster.env) as a
# Docker Swarm stack on this machine, and check:
#   * the keys arrive as secrets: each service's /run/secrets/keys holds exactly the
#     key files the stack gives it, and no environment holds key material;
#   * the evaluator reached the last round with top-1 >= PS_SMOKE_MIN_TOP1 (default
#     0.5; chance is 0.1) under the attack, and the proxy corrupted values;
#   * every server wrote all its rounds with finite parameters and its final shard;
#   * the worker replicas took the ids 0..n-1 from their task slots (worker-<i>.jsonl);
#   * the container of worker slot 2 (worker id 1), killed (docker kill) a third into
#     the run, was replaced by swarm (a new task in the same slot) and the run finished;
#   * every task ended complete (exit 0) and none was restarted after it finished.
# Everything it made is removed on exit, failure and Ctrl-C included (stack, its
# containers, network and volume, the secrets; the swarm itself when this script
# initialised it, with the docker_gwbridge network it created); the image stays, as
# with the compose smoke. On failure the tasks and the services' log tails are printed.
#
# If no Docker engine answers, ../shared/tools/offline-docker.sh (beside the
# repository) is tried first. If no engine (or no swarm) can be had, the script prints
# "SKIPPED swarm smoke: <reason>" and exits 0 when PS_SWARM_ALLOW_SKIP=1, 1 otherwise.
#
# Environment: PS_SMOKE_TIMEOUT (s, default 900) deadline for the run; PS_SMOKE_MIN_TOP1
# (0.5); PS_IMAGE (byzps:latest); PS_SWARM_STACK (byzps-smoke); PS_SECRET_PREFIX
# (byzps-smoke); PS_SWARM_ADVERTISE_ADDR (127.0.0.1, for `docker swarm init`);
# TORCH_INDEX_URL (build argument, see docs/docker.md).
set -euo pipefail

t0=$(date +%s)
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

export PS_IMAGE="${PS_IMAGE:-byzps:latest}"
export PS_SECRET_PREFIX="${PS_SECRET_PREFIX:-byzps-smoke}"
stack="${PS_SWARM_STACK:-byzps-smoke}"
run_timeout_s="${PS_SMOKE_TIMEOUT:-900}"
min_top1="${PS_SMOKE_MIN_TOP1:-0.5}"
env_file="docker/cluster.env"
stack_file="docker/stack.yml"
volume="${stack}_runs"
max_attempts="$(sed -n 's/.*max_attempts: \([0-9]*\).*/\1/p' "$stack_file" | head -n 1)"
SMOKE="swarm smoke" SMOKE_SKIP_VAR=PS_SWARM_ALLOW_SKIP
# shellcheck source=scripts/smoke_lib.sh
source scripts/smoke_lib.sh

# --- 1. a Docker engine and the base image -------------------------------------------
ensure_engine_and_base_image

# --- 2. the stack file matches the env file ----------------------------------------
python3 docker/gen_stack.py --check >&2
env_value() { sed -n "s/^$1=//p" "$env_file" | tail -n 1; }
rounds="$(env_value PS_ROUNDS)"
workers="$(env_value PS_WORKERS)"

# --- 3. the image ------------------------------------------------------------------
build_image

# --- 4. a swarm, and nothing of ours in it yet ---------------------------------------
swarm_state="$(docker info --format '{{.Swarm.LocalNodeState}}')"
had_gwbridge=0
docker network inspect docker_gwbridge >/dev/null 2>&1 && had_gwbridge=1
initialised=0
case "$swarm_state" in
  active)
    [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" = true ] \
      || skip_or_fail "this node is a swarm worker, not a manager: run it on a manager"
    say "using the swarm this node is in"
    ;;
  inactive) ;;
  *) skip_or_fail "the node's swarm state is '$swarm_state'" ;;
esac
if docker stack ls --format '{{.Name}}' 2>/dev/null | grep -qx "$stack"; then
  fail "a stack named $stack is deployed already (PS_SWARM_STACK names another)"
fi
docker volume inspect "$volume" >/dev/null 2>&1 \
  && fail "the volume $volume exists already (its checkpoints would be resumed): remove it"
if [ "$swarm_state" = active ] && [ -n "$(PS_SECRET_PREFIX="$PS_SECRET_PREFIX" \
    bash scripts/swarm_secrets.sh ls)" ]; then
  fail "secrets $PS_SECRET_PREFIX-* exist already (PS_SECRET_PREFIX names others)"
fi

# --- 5. always clean up ------------------------------------------------------------
deployed=0
secrets=0
finish() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$deployed" = 1 ]; then
    if [ "$rc" != 0 ]; then
      echo "--- tasks ---" >&2
      docker stack ps --no-trunc "$stack" >&2 || true
      for svc in $(docker stack services --format '{{.Name}}' "$stack" 2>/dev/null); do
        echo "--- $svc (last 20 lines) ---" >&2
        docker service logs --no-task-ids --tail 20 "$svc" >&2 2>&1 || true
      done
    fi
    docker stack rm "$stack" >/dev/null 2>&1 || say "warning: docker stack rm failed"
    # stack rm returns at once; its containers and network go in the background
    local until=$(($(date +%s) + 90))
    while [ -n "$(docker ps -aq --filter "label=com.docker.stack.namespace=$stack")" ] \
        || docker network inspect "${stack}_byzps" >/dev/null 2>&1; do
      [ "$(date +%s)" -lt "$until" ] || { say "warning: $stack not gone after 90 s"; break; }
      sleep 1
    done
    docker volume rm "$volume" >/dev/null 2>&1 || say "warning: could not remove $volume"
  fi
  if [ "$secrets" = 1 ]; then
    bash scripts/swarm_secrets.sh rm >/dev/null 2>&1 || say "warning: could not remove secrets"
  fi
  if [ "$initialised" = 1 ]; then
    docker swarm leave --force >/dev/null 2>&1 || say "warning: docker swarm leave failed"
    if [ "$had_gwbridge" = 0 ]; then
      docker network rm docker_gwbridge >/dev/null 2>&1 || true
    fi
  fi
  echo "swarm smoke: total $(elapsed "$t0") s"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

if [ "$swarm_state" = inactive ]; then
  initialised=1
  docker swarm init --advertise-addr "${PS_SWARM_ADVERTISE_ADDR:-127.0.0.1}" >/dev/null \
    || skip_or_fail "docker swarm init failed"
  say "initialised a single-node swarm (left again at the end)"
fi

# --- 6. secrets, deploy ----------------------------------------------------------
secrets=1
bash scripts/swarm_secrets.sh create
t_run=$(date +%s)
deployed=1
docker stack deploy --resolve-image never -c "$stack_file" "$stack" >&2
say "stack $stack deployed; waiting for the run to finish (deadline ${run_timeout_s} s)"

# --- 7. wait: poll the tasks, never a fixed sleep ----------------------------------
declare -A service_name
tasks() {  # one line per task: service slot state created-at task-id container-id exit-code
  local ids
  service_name=()
  while read -r id name; do service_name[$id]="${name#"${stack}"_}"; done \
    < <(docker service ls -q --filter "label=com.docker.stack.namespace=$stack" \
        | xargs -r docker service inspect --format '{{.ID}} {{.Spec.Name}}')
  mapfile -t ids < <(docker stack ps -q --no-trunc "$stack" 2>/dev/null)
  [ "${#ids[@]}" -gt 0 ] || return 0
  docker inspect --type task --format '{{.ServiceID}} {{.Slot}} {{.Status.State}} {{.CreatedAt.UnixNano}} {{.ID}} {{with .Status.ContainerStatus}}{{.ContainerID}} {{.ExitCode}}{{end}}' "${ids[@]}" \
    | while read -r sid slot state created id container code; do
        echo "${service_name[$sid]:-?} $slot $state $created $id ${container:--} ${code:--}"
      done | sort -k1,1 -k2,2n -k4,4n
}
replicas() {  # service desired-replicas
  docker service ls --filter "label=com.docker.stack.namespace=$stack" \
    --format '{{.Name}} {{.Replicas}}' | sed -e "s/^${stack}_//" -e 's#[0-9]*/\([0-9]*\).*#\1#'
}
volume_dir=""
metrics() {  # path of a metrics file in the stack's volume (single node: its mountpoint)
  [ -n "$volume_dir" ] || volume_dir="$(docker volume inspect -f '{{.Mountpoint}}' "$volume" \
    2>/dev/null || true)"
  echo "${volume_dir:-/nonexistent}/$1"
}
progress_round() {  # the last round of a metrics file, 0 if none
  local r
  r="$(tail -n 1 "$(metrics "$1")" 2>/dev/null | sed -n 's/.*"round": *\([0-9]*\).*/\1/p')"
  echo "${r:-0}"
}
expected_slots="$(replicas | awk '{s += $2} END {print s + 0}')"
deadline=$((t_run + run_timeout_s))
next_report=$(($(date +%s) + 15))
killed_task=""
checked_secrets=0
while :; do
  table="$(tasks)"
  # per slot: its latest task's state and how many tasks it had
  latest="$(awk '{n[$1" "$2]++; s[$1" "$2]=$3} END {for (k in s) print k, s[k], n[k]}' \
    <<<"$table")"
  gone="$(awk -v max="$max_attempts" '($3 == "failed" || $3 == "rejected" || $3 == "orphaned") \
    && $4 > max {print $1 "." $2 " (" $3 " " $4 " times)"}' <<<"$latest")"
  [ -z "$gone" ] || fail "task(s) failed for good: $(tr '\n' ' ' <<<"$gone")"
  complete="$(awk '$3 == "complete"' <<<"$latest" | wc -l)"
  [ "$complete" = "$expected_slots" ] && break
  if [ "$checked_secrets" = 0 ]; then
    # once server-0 and a worker run: what each container holds under /run/secrets/keys
    srv="$(awk '$1 == "server-0" && $3 == "running" {print $6}' <<<"$table" | tail -n 1)"
    wrk="$(awk '$1 == "worker" && $3 == "running" {print $6}' <<<"$table" | tail -n 1)"
    if [ -n "$srv" ] && [ -n "$wrk" ] && [ "$srv" != - ] && [ "$wrk" != - ]; then
      for pair in "server-0 $srv" "worker $wrk"; do
        read -r svc container <<<"$pair"
        given="$(docker service inspect --format '{{range .Spec.TaskTemplate.ContainerSpec.Secrets}}{{.File.Name}}{{"\n"}}{{end}}' \
          "${stack}_$svc" | sed 's#.*/##' | grep . | sort | tr '\n' ' ')"
        held="$(docker exec "$container" sh -c 'ls /run/secrets/keys' | sort | tr '\n' ' ')"
        [ "$held" = "$given" ] || fail "$svc holds /run/secrets/keys: $held; the stack gives: $given"
        # secret files 0400, public ones 0444, owned by the image's user; and no key of
        # them in the process's environment
        problems="$(docker exec "$container" sh -c '
          cd /run/secrets/keys; env_now="$(tr "\0" "\n" </proc/1/environ)"
          for f in *; do
            case "$f" in *.key_secret) want="400 1000";; *) want="444 1000";; esac
            [ "$(stat -L -c "%a %u" "$f")" = "$want" ] || echo "$f: mode/owner $(stat -L -c "%a %u" "$f")"
            keys="$(sed -n "s/.*-key = \"\(.*\)\"/\1/p" "$f")"
            [ -n "$keys" ] || echo "$f: no key in it"
            set -f
            for k in $keys; do
              case "$env_now" in *"$k"*) echo "$f: its key is in the environment";; esac
            done
            set +f
          done')"
        [ -z "$problems" ] || fail "$svc: $problems"
        say "$svc: /run/secrets/keys holds exactly its $(wc -w <<<"$held") key files" \
          "(modes checked, none in the environment)"
      done
      secret_files="$(docker exec "$srv" sh -c 'ls /run/secrets/keys' | grep -c 'key_secret$')"
      [ "$secret_files" = 1 ] || fail "server-0 holds $secret_files secret key files, not 1"
      checked_secrets=1
    fi
  fi
  if [ -z "$killed_task" ] && [ "$(progress_round server-0.jsonl)" -ge $((rounds / 3)) ]; then
    read -r killed_task container < <(awk '$1 == "worker" && $2 == 2 && $3 == "running" \
      {print $5, $6}' <<<"$table" | tail -n 1) || true
    if [ -n "$killed_task" ]; then
      say "killing worker slot 2 (worker id 1, task ${killed_task:0:12}) at round" \
        "$(progress_round server-0.jsonl)"
      docker kill "$container" >/dev/null
    fi
  fi
  now=$(date +%s)
  [ "$now" -lt "$deadline" ] \
    || fail "run not finished after ${run_timeout_s} s ($complete of $expected_slots tasks complete)"
  if [ "$now" -ge "$next_report" ]; then
    running="$(awk '$3 == "running"' <<<"$latest" | wc -l)"
    say "$(elapsed "$t_run") s: server-0 round $(progress_round server-0.jsonl) of $rounds;" \
      "evaluator round $(progress_round evaluator.jsonl); $running tasks running," \
      "$complete of $expected_slots complete"
    next_report=$((now + 15))
  fi
  sleep 2
done
run_s=$(elapsed "$t_run")
[ "$checked_secrets" = 1 ] || fail "the run ended before the secrets could be checked"
[ -n "$killed_task" ] || fail "the run ended before a worker was killed"
slot2="$(awk '$1 == "worker" && $2 == 2' <<<"$table")"
killed_state="$(awk -v id="$killed_task" '$5 == id {print $3 " (exit " $7 ")"}' <<<"$slot2")"
if [ "$(wc -l <<<"$slot2")" -lt 2 ] || [ "$(tail -n 1 <<<"$slot2" | awk '{print $3}')" != complete ]
then
  fail "worker slot 2 was not replaced after the kill: $slot2"
fi
say "worker slot 2: killed task $killed_state, replaced by swarm" \
  "($(($(wc -l <<<"$slot2") - 1)) new task(s)), the last one complete; the run finished"
others="$(awk -v id="$killed_task" '$5 != id && $3 != "complete" {print $1 "." $2 " " $3}' \
  <<<"$table")"
[ -z "$others" ] || fail "tasks other than the killed one did not complete: $others"

# --- 8. check the metrics in the volume ----------------------------------------------
result="$(python3 - "$(dirname "$(metrics x)")" "$env_file" "$min_top1" "$workers" <<'PY'
import glob
import json
import math
import os
import sys

runs, env_path, min_top1, workers = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
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
        sys.exit(f"{name} is missing in the volume")
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


problems = []
evaluations = records("evaluator.jsonl")
final = evaluations[-1] if evaluations else {}
top1 = final.get("top1", float("nan"))
if final.get("round") != rounds:
    problems.append(f"the evaluator's last round is {final.get('round')}, expected {rounds}")
if not (math.isfinite(top1) and top1 >= min_top1):
    problems.append(f"final top-1 {top1} < {min_top1} (chance is 0.1)")
corrupted = {os.path.basename(p): sum(r.get("corrupted_values", 0) for r in records(os.path.basename(p)))
             for p in sorted(glob.glob(os.path.join(runs, "proxy-*.jsonl")))}
if attack != "none":
    if not corrupted:
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
ids = sorted(int(os.path.basename(p)[len("worker-"):-len(".jsonl")])
             for p in glob.glob(os.path.join(runs, "worker-*.jsonl")))
if ids != list(range(workers)):
    problems.append(f"worker metrics for ids {ids}, expected 0..{workers - 1} (one per slot)")
print("top-1 by round: " + " ".join(f"{r['round']}:{r['top1']:.3f}" for r in evaluations))
print(f"rule {env.get('PS_RULE')} q={env.get('PS_Q')}, n={workers} S={shards}, {rounds} rounds, "
      f"proxy attack {attack} (p={env.get('PS_GAMBLER_P')}): final top-1 {top1:.4f} "
      f"top-3 {final.get('top3', float('nan')):.4f}; corrupted values: "
      + (", ".join(f"{k.removesuffix('.jsonl')} {v}" for k, v in corrupted.items()) or "none")
      + f"; worker ids {ids[0]}..{ids[-1]}")
if problems:
    print("problems: " + "; ".join(problems))
    sys.exit(1)
PY
)" || {
  echo "$result" >&2
  fail "the metrics do not pass (see above)"
}

echo "$result"
echo "PASSED swarm smoke: build ${build_s} s, run ${run_s} s"
