# Shared by scripts/compose_smoke.sh and scripts/swarm_smoke.sh (sourced, not run):
# messages, the skip-or-fail convention, a Docker engine with the base image, and the
# image build. Before sourcing, set SMOKE (the test's name, e.g. "compose smoke"),
# SMOKE_SKIP_VAR (the variable that turns "no engine" into a skip), t0 and repo.
# shellcheck shell=bash disable=SC2154  # t0 and repo: set by the sourcing script

offline_docker="$repo/../shared/tools/offline-docker.sh"

say() { printf '%s: %s\n' "$SMOKE" "$*" >&2; }
elapsed() { echo $(($(date +%s) - $1)); }
fail() { echo "FAILED $SMOKE: $*" >&2; exit 1; }

# Exit 0 with "SKIPPED <smoke>: why" when $SMOKE_SKIP_VAR=1, else fail.
skip_or_fail() {
  if [ "${!SMOKE_SKIP_VAR:-0}" = 1 ]; then
    echo "SKIPPED $SMOKE: $1"
    echo "$SMOKE: total $(elapsed "$t0") s"
    exit 0
  fi
  echo "FAILED $SMOKE: $1 (set $SMOKE_SKIP_VAR=1 to skip instead)" >&2
  echo "$SMOKE: total $(elapsed "$t0") s"
  exit 1
}

# A Docker engine that answers, and the Dockerfile's base image: started or built with
# ../shared/tools/offline-docker.sh (beside the repository) when there is none.
ensure_engine_and_base_image() {
  engine_up() { docker info >/dev/null 2>&1; }
  if ! command -v docker >/dev/null 2>&1 || ! engine_up; then
    if [ -f "$offline_docker" ] && [ "$(id -u)" = 0 ]; then
      say "no Docker engine answers; starting one with $offline_docker"
      bash "$offline_docker" >&2 || skip_or_fail "$offline_docker could not start an engine"
    fi
    command -v docker >/dev/null 2>&1 || skip_or_fail "no docker command"
    engine_up || skip_or_fail "no Docker engine answers (docker info failed)"
  fi
  local base_image
  base_image="$(awk '/^ARG BASE_IMAGE=/{sub(/^ARG BASE_IMAGE=/, ""); print; exit}' Dockerfile)"
  if ! docker image inspect "$base_image" >/dev/null 2>&1 \
      && ! timeout 120 docker pull -q "$base_image" >/dev/null 2>&1; then
    if [ -f "$offline_docker" ] && [ "$(id -u)" = 0 ]; then
      say "cannot pull $base_image; building a stand-in with $offline_docker"
      bash "$offline_docker" >&2 || skip_or_fail "no base image $base_image"
    else
      skip_or_fail "base image $base_image can neither be found nor pulled"
    fi
  fi
}

# Build $PS_IMAGE (TORCH_INDEX_URL passed on as a build argument); sets build_s.
build_image() {
  local t_build build_log
  t_build=$(date +%s)
  local build_args=()
  [ -n "${TORCH_INDEX_URL:-}" ] && build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
  build_log="$(mktemp /tmp/byzps-build.XXXXXX)"
  if ! docker build "${build_args[@]}" -t "$PS_IMAGE" . >"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    rm -f "$build_log"
    fail "docker build failed"
  fi
  rm -f "$build_log"
  build_s=$(elapsed "$t_build")
  say "image $PS_IMAGE built in ${build_s} s ($(docker image inspect -f '{{.Size}}' \
    "$PS_IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}'))"
}

# --- what each container used: sampled from its cgroup on every poll ----------------
# mem_peak[svc]: the cgroup's own high-water mark of charged memory (page cache included:
# memory.max_usage_in_bytes, cgroup v1; memory.peak, v2); anon_peak[svc]: the largest
# sampled anonymous + tmpfs memory (what the kernel cannot reclaim: what an OOM kill is
# about); pids_peak[svc]: the most processes and threads seen; restarts reset nothing.
declare -A mem_peak anon_peak pids_peak

_cgroup_dir() {  # controller pid container-id -> the container's cgroup directory for
  # the controller (v1), or its v2 directory; nothing unless the path names the container
  # (a pid of a container that just exited may already be another process's)
  local rel
  rel="$(awk -F: -v c="$1" '$2 == c {print $3; exit}' "/proc/$2/cgroup" 2>/dev/null)"
  if [[ "$rel" == *"$3"* ]] && [ -d "/sys/fs/cgroup/$1$rel" ]; then
    echo "/sys/fs/cgroup/$1$rel"
    return
  fi
  rel="$(awk -F: '$1 == 0 {print $3; exit}' "/proc/$2/cgroup" 2>/dev/null)"
  if [[ "$rel" == *"$3"* ]] && [ -d "/sys/fs/cgroup$rel" ]; then echo "/sys/fs/cgroup$rel"; fi
}

_max_into() {  # array key value: array[key] = max(array[key], value)
  local -n into=$1
  [ -n "$3" ] && [ "$3" -gt "${into[$2]:-0}" ] && into[$2]=$3
  return 0
}

# sample_usage SERVICE PID CONTAINER-ID: fold the container's current figures into the peaks
sample_usage() {
  local svc=$1 pid=$2 id=$3 dir value
  [ -n "$pid" ] && [ "$pid" != 0 ] && [ -n "$id" ] || return 0
  dir="$(_cgroup_dir memory "$pid" "$id")"
  if [ -n "$dir" ]; then
    for f in memory.max_usage_in_bytes memory.peak memory.current; do
      value="$(cat "$dir/$f" 2>/dev/null)" && { _max_into mem_peak "$svc" "$value"; break; }
    done
    value="$(awk '$1 == "total_rss" || $1 == "total_shmem" || $1 == "anon" || $1 == "shmem" \
      {s += $2} END {printf "%.0f\n", s}' "$dir/memory.stat" 2>/dev/null)"
    _max_into anon_peak "$svc" "$value"
  fi
  dir="$(_cgroup_dir pids "$pid" "$id")"
  if [ -n "$dir" ]; then
    value="$(cat "$dir/pids.current" 2>/dev/null)" && _max_into pids_peak "$svc" "$value"
  fi
  return 0
}

# usage_table SERVICE=LIMIT_BYTES:PIDS_LIMIT ...: the peaks against the limits
usage_table() {
  local entry svc limit pids
  printf '%-11s %10s %14s %18s %11s\n' service "limit MiB" "peak MiB (all)" \
    "peak MiB (anon+tmp)" "pids peak/limit"
  for entry in "$@"; do
    svc="${entry%%=*}"; limit="${entry#*=}"; pids="${limit#*:}"; limit="${limit%%:*}"
    printf '%-11s %10d %14s %18s %11s\n' "$svc" $((limit >> 20)) \
      "$([ -n "${mem_peak[$svc]:-}" ] && echo $((mem_peak[$svc] >> 20)) || echo -)" \
      "$([ -n "${anon_peak[$svc]:-}" ] && echo $((anon_peak[$svc] >> 20)) || echo -)" \
      "${pids_peak[$svc]:--}/$pids"
  done
}
