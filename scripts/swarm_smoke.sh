#!/usr/bin/env bash
# Swarm smoke test: check that the shipped docker/stack.yml is what docker/cluster.env
# gives (it runs no proxy), generate the gambler experiment's stack
# (docker/experiments/gambler.env over docker/cluster.env, written to the git-ignored
# docker/experiments/gambler.stack.yml: 4 servers, a gambler proxy in front of server 0,
# one service per worker, the evaluator), deploy it as a Docker Swarm stack on this
# machine, and check:
#   * the keys arrive as secrets: each service's /run/secrets/keys holds exactly the
#     key files the stack gives it (a worker: its own secret key, no other), and no
#     environment holds key material; the root file system is read-only and /runs (the
#     service's own volume) writable; the engine applied the memory and pids limits,
#     the read-only root and the log rotation to every container;
#   * the evaluator reached the last round with top-1 >= PS_SMOKE_MIN_TOP1 (default
#     0.5; chance is 0.1) under the attack, and the proxy corrupted values;
#   * every server wrote all its rounds with finite parameters and its final shard;
#   * each worker service wrote worker-<i>.jsonl in its own volume, ids 0..n-1;
#   * the container of worker-1, killed (docker kill) a third into the run, was
#     replaced by swarm (a new task of the service) and the run finished;
#   * every task ended complete (exit 0) and none was restarted after it finished.
# It prints each service's peak memory and processes against its limits, as the compose
# smoke does. Everything it made is removed on exit, failure and Ctrl-C included (stack,
# its containers, network and volumes, the secrets; the swarm itself when this script
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
experiment="docker/experiments/gambler.env"  # its lines override the env file's
stack_file="docker/experiments/gambler.stack.yml"  # generated here, git-ignored
export PS_STACK_FILE="$repo/$stack_file"  # the stack scripts/swarm_secrets.sh reads
volume_prefix="${stack}_runs-"  # <stack>_runs-<service>: each service's own volume
SMOKE="swarm smoke" SMOKE_SKIP_VAR=PS_SWARM_ALLOW_SKIP
# shellcheck source=scripts/smoke_lib.sh
source scripts/smoke_lib.sh

# --- 1. a Docker engine and the base image -------------------------------------------
ensure_engine_and_base_image

# --- 2. the shipped stack file matches the env file; the experiment's, generated ------
python3 docker/gen_stack.py --check >&2
python3 docker/gen_stack.py --experiment "$experiment" -o "$stack_file" >&2
max_attempts="$(sed -n 's/.*max_attempts: \([0-9]*\).*/\1/p' "$stack_file" | head -n 1)"
[ -n "$max_attempts" ] || fail "no max_attempts in $stack_file"
# a setting of the run: the experiment's value, else the env file's
env_value() { sed -n "s/^$1=//p" "$env_file" "$experiment" | tail -n 1; }
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
stack_volumes() { docker volume ls -q --filter "name=$volume_prefix" | grep "^$volume_prefix" || true; }
[ -z "$(stack_volumes)" ] \
  || fail "volumes ${volume_prefix}* exist already (their checkpoints would be resumed): remove them"
if [ "$swarm_state" = active ] && [ -n "$(PS_SECRET_PREFIX="$PS_SECRET_PREFIX" \
    bash scripts/swarm_secrets.sh ls)" ]; then
  fail "secrets $PS_SECRET_PREFIX-* exist already (PS_SECRET_PREFIX names others)"
fi

# --- 5. always clean up ------------------------------------------------------------
deployed=0
secrets=0
links=""
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
    # shellcheck disable=SC2046  # one volume name per word
    docker volume rm $(stack_volumes) >/dev/null 2>&1 || say "warning: could not remove the volumes"
    [ -z "$links" ] || rm -rf "$links"
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
# each service's volume, by service name, in one directory of links (single node: every
# volume is local), laid out as a compose runs directory: <links>/<service>/<file>
links="$(mktemp -d /tmp/byzps-swarm-runs.XXXXXX)"
link_volumes() {
  local v
  for v in $(stack_volumes); do
    [ -e "$links/${v#"$volume_prefix"}" ] \
      || ln -s "$(docker volume inspect -f '{{.Mountpoint}}' "$v")" "$links/${v#"$volume_prefix"}"
  done
}
metrics() { echo "$links/${1%.jsonl}/$1"; }  # a service's metrics file, in its own volume
progress_round() {  # the last round of a metrics file, 0 if none
  local r
  r="$(tail -n 1 "$(metrics "$1")" 2>/dev/null | sed -n 's/.*"round": *\([0-9]*\).*/\1/p')"
  echo "${r:-0}"
}
# what each service's container holds and may write (run in it as its user)
# shellcheck disable=SC2016  # expanded in the container
inside='
  cd /run/secrets/keys || exit 1
  held="$(ls -A | LC_ALL=C sort | tr "\n" " ")"
  [ "$held" = "$1" ] || echo "/run/secrets/keys holds [$held], the stack gives [$1]"
  env_now="$(tr "\0" "\n" </proc/1/environ)"
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
  done
  if touch /.probe 2>/dev/null; then rm -f /.probe; echo "the root file system is writable"; fi
  if touch /runs/.probe 2>/dev/null; then rm -f /runs/.probe; else echo "/runs is not writable"; fi'
check_container() {  # service container-id
  local given problems secrets
  given="$(docker service inspect --format '{{range .Spec.TaskTemplate.ContainerSpec.Secrets}}{{.File.Name}}{{"\n"}}{{end}}' \
    "${stack}_$1" | sed 's#.*/##' | grep . | LC_ALL=C sort | tr '\n' ' ')"
  problems="$(docker exec "$2" sh -c "$inside" sh "$given" 2>&1)" \
    || fail "$1: docker exec failed: $problems"
  [ -z "$problems" ] || fail "$1: $(tr '\n' ';' <<<"$problems")"
  secrets="$(tr ' ' '\n' <<<"$given" | grep -c 'key_secret$')"
  [ "$secrets" = 1 ] && [[ " $given" == *" $1.key_secret "* ]] \
    || fail "$1 holds secret keys [$given], not its own alone"
  say "$1: /run/secrets/keys holds exactly its $(wc -w <<<"$given") key files ($secrets secret" \
    "key(s); modes checked, none in the environment), read-only root, /runs writable"
}
expected_slots="$(replicas | awk '{s += $2} END {print s + 0}')"
deadline=$((t_run + run_timeout_s))
next_report=$(($(date +%s) + 15))
killed_task=""
checked=""
declare -A limit_of
while :; do
  table="$(tasks)"
  # per service and slot: its latest task's state and how many tasks it had
  latest="$(awk '{n[$1" "$2]++; s[$1" "$2]=$3} END {for (k in s) print k, s[k], n[k]}' \
    <<<"$table")"
  gone="$(awk -v max="$max_attempts" '($3 == "failed" || $3 == "rejected" || $3 == "orphaned") \
    && $4 > max {print $1 "." $2 " (" $3 " " $4 " times)"}' <<<"$latest")"
  [ -z "$gone" ] || fail "task(s) failed for good: $(tr '\n' ' ' <<<"$gone")"
  complete="$(awk '$3 == "complete"' <<<"$latest" | wc -l)"
  [ "$complete" = "$expected_slots" ] && break
  link_volumes
  # every running container: its limits as applied, its usage sampled from its cgroup
  mapfile -t running_ids < <(awk '$3 == "running" && $6 != "-" {print $6}' <<<"$table")
  if [ "${#running_ids[@]}" -gt 0 ]; then
    while read -r svc pid id memory pids ro log size files oom; do
      svc="${svc#"${stack}"_}"
      [ "$oom" = false ] || fail "$svc was OOM-killed"
      [ "$memory" -gt 0 ] && [ "$pids" -gt 0 ] && [ "$ro" = true ] && [ "$log" = json-file ] \
        && [ -n "$size" ] && [ -n "$files" ] \
        || fail "$svc: limits, read-only root or log rotation not applied:" \
          "$memory $pids $ro $log $size $files"
      limit_of[$svc]="$memory:$pids"
      sample_usage "$svc" "$pid" "$id"
    done < <(docker inspect -f '{{index .Config.Labels "com.docker.swarm.service.name"}} {{.State.Pid}} {{.Id}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.LogConfig.Type}} {{index .HostConfig.LogConfig.Config "max-size"}} {{index .HostConfig.LogConfig.Config "max-file"}} {{.State.OOMKilled}}' \
      "${running_ids[@]}" 2>/dev/null || true)
  fi
  # once server-0, proxy-0 and worker-1 run: what each container holds
  for svc in server-0 proxy-0 worker-1 evaluator; do
    [[ " $checked " == *" $svc "* ]] && continue
    container="$(awk -v s="$svc" '$1 == s && $3 == "running" {print $6}' <<<"$table" | tail -n 1)"
    [ -n "$container" ] && [ "$container" != - ] || continue
    check_container "$svc" "$container"
    checked="$checked $svc"
  done
  if [ -z "$killed_task" ] && [ "$(progress_round server-0.jsonl)" -ge $((rounds / 3)) ]; then
    read -r killed_task container < <(awk '$1 == "worker-1" && $3 == "running" \
      {print $5, $6}' <<<"$table" | tail -n 1) || true
    if [ -n "$killed_task" ]; then
      say "killing worker-1 (task ${killed_task:0:12}) at round $(progress_round server-0.jsonl)"
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
link_volumes
for svc in server-0 proxy-0 worker-1 evaluator; do
  [[ " $checked " == *" $svc "* ]] || fail "the run ended before $svc's container was checked"
done
[ -n "$killed_task" ] || fail "the run ended before a worker was killed"
victim="$(awk '$1 == "worker-1"' <<<"$table")"
killed_state="$(awk -v id="$killed_task" '$5 == id {print $3 " (exit " $7 ")"}' <<<"$victim")"
if [ "$(wc -l <<<"$victim")" -lt 2 ] || [ "$(tail -n 1 <<<"$victim" | awk '{print $3}')" != complete ]
then
  fail "worker-1 was not replaced after the kill: $victim"
fi
say "worker-1: killed task $killed_state, replaced by swarm" \
  "($(($(wc -l <<<"$victim") - 1)) new task(s)), the last one complete; the run finished"
others="$(awk -v id="$killed_task" '$5 != id && $3 != "complete" {print $1 "." $2 " " $3}' \
  <<<"$table")"
[ -z "$others" ] || fail "tasks other than the killed one did not complete: $others"
echo "peak usage per container (sampled every 2 s from its cgroup) against its limits:"
usage_table $(for svc in $(printf '%s\n' "${!limit_of[@]}" | sort -V); do
  echo "$svc=${limit_of[$svc]}"; done)

# --- 8. check the metrics in the volumes ---------------------------------------------
result="$(python3 scripts/check_smoke_metrics.py "$links" "$env_file" "$experiment" "$min_top1" \
  --workers "$workers")" || {
  echo "$result" >&2
  fail "the metrics do not pass (see above)"
}

echo "$result"
echo "PASSED swarm smoke: build ${build_s} s, run ${run_s} s"
