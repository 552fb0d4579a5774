#!/usr/bin/env bash
# The run's CURVE keys as Docker Swarm secrets, for docker/stack.yml (docs/deploy.md).
#
#   bash scripts/swarm_secrets.sh create              # fresh keys (ps-keys) -> one secret per key file
#   bash scripts/swarm_secrets.sh create --keys DIR   # the key files already in DIR instead
#   bash scripts/swarm_secrets.sh ls                  # the stack's secrets that exist
#   bash scripts/swarm_secrets.sh files               # the key files the stack needs (no Docker)
#   bash scripts/swarm_secrets.sh rm                  # remove them (after `docker stack rm`)
#
# Run it on a manager node. The stack file names the key files it needs (its
# `secrets:` section) and the ps-keys arguments that write them (its header); each
# file becomes the secret <prefix>-<file>, e.g. byzps-server-0.key_secret. Which
# service mounts which secret is the stack file's business: each service exactly the
# files its process loads (common.net.keys.needed_keys), so worker-<i>.key_secret goes to
# the service worker-<i> alone (docs/deploy.md). Fresh keys are written by `ps-keys`
# (on the PATH, else inside $PS_IMAGE: no network, read-only root, no capabilities)
# into a private temporary directory that is deleted once the secrets exist:
# afterwards the secret keys live only in the swarm's encrypted store and in the tmpfs
# of the containers that mount them. A run needs new secrets: remove the old ones
# first (secrets are immutable, and a stack that still uses one keeps it from removal).
#
# Environment: PS_SECRET_PREFIX (byzps; the same variable docker/stack.yml reads at
# `docker stack deploy`), PS_STACK_FILE (docker/stack.yml), PS_IMAGE (byzps:latest).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stack_file="${PS_STACK_FILE:-$repo/docker/stack.yml}"
prefix="${PS_SECRET_PREFIX:-byzps}"
image="${PS_IMAGE:-byzps:latest}"

die() { echo "swarm_secrets: $*" >&2; exit 1; }
usage() { sed -n '4,8p' "${BASH_SOURCE[0]}" | sed 's/^# //' >&2; exit 2; }

[ -f "$stack_file" ] || die "no stack file $stack_file (python3 docker/gen_stack.py writes it)"
# the key files the stack mounts: its secrets' names are "${PS_SECRET_PREFIX:-byzps}-<file>"
# shellcheck disable=SC2016  # that text, literally
mapfile -t files < <(sed -n 's/^    name: "\${PS_SECRET_PREFIX:-byzps}-\(.*\)"$/\1/p' "$stack_file")
[ "${#files[@]}" -gt 0 ] || die "$stack_file names no secrets (not written by docker/gen_stack.py?)"
keys_args="$(sed -n 's/^# ps-keys arguments: //p' "$stack_file")"
[ -n "$keys_args" ] || die "$stack_file has no '# ps-keys arguments:' line"

existing() {  # the stack's secrets that exist now, one name a line
  local f
  for f in "${files[@]}"; do
    docker secret inspect "$prefix-$f" >/dev/null 2>&1 && echo "$prefix-$f"
  done
  return 0
}

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT

create() {
  local keys_dir="" f
  if [ "${1:-}" = "--keys" ]; then
    [ -n "${2:-}" ] || usage
    keys_dir="$2"
  elif [ $# -gt 0 ]; then
    usage
  fi
  mapfile -t found < <(existing)
  [ "${#found[@]}" = 0 ] || die "secrets exist already (${found[0]}, ...): remove them first" \
    "(bash scripts/swarm_secrets.sh rm, after docker stack rm) or use another PS_SECRET_PREFIX"
  if [ -z "$keys_dir" ]; then
    tmp="$(mktemp -d /tmp/byzps-keys.XXXXXX)"
    keys_dir="$tmp/keys"
    # shellcheck disable=SC2086  # keys_args is a list of words
    if command -v ps-keys >/dev/null 2>&1; then
      ps-keys --dir "$keys_dir" $keys_args >&2
    else
      docker run --rm --network none --read-only --cap-drop ALL \
        --security-opt no-new-privileges:true --user "$(id -u):$(id -g)" -v "$tmp:/out" \
        "$image" ps-keys --dir /out/keys $keys_args >&2 \
        || die "ps-keys failed in $image (build it first: docker build -t $image .)"
    fi
  fi
  for f in "${files[@]}"; do
    [ -f "$keys_dir/$f" ] || die "$keys_dir/$f is missing (ps-keys $keys_args writes it)"
  done
  for f in "${files[@]}"; do
    docker secret create --label "byzps.secret-prefix=$prefix" "$prefix-$f" "$keys_dir/$f" \
      >/dev/null
  done
  echo "swarm_secrets: created ${#files[@]} secrets $prefix-${files[0]} .. $prefix-${files[-1]}" >&2
}

remove() {
  mapfile -t found < <(existing)
  if [ "${#found[@]}" -gt 0 ]; then
    docker secret rm "${found[@]}" >/dev/null
  fi
  echo "swarm_secrets: removed ${#found[@]} secrets ($prefix-*)" >&2
}

case "${1:-}" in
  create) shift; create "$@" ;;
  rm) remove ;;
  ls) existing ;;
  files) printf '%s\n' "${files[@]}" ;;
  *) usage ;;
esac
