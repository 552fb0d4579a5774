#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian machine (root) with access
# to the package registries only: the Fashion-MNIST dataset package, iptables (for the
# network-namespace test), a CPU torch,
# then the project itself with its test and TensorBoard extras.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "install: Debian's dataset-fashion-mnist (the default dataset)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "install: warning: /usr/share/datasets/fashion-mnist missing; install Debian's" \
      "dataset-fashion-mnist or pass --dataset synthetic / --data-dir" >&2
  fi
fi

# iptables: the network-namespace test drops packets with it (skipped without it)
if ! command -v iptables >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "install: Debian's iptables (random packet loss in tests/integration/test_netns.py)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null
fi

PIP="${PIP:-python3 -m pip}"
# torch first, pinned to the CPU build on this machine's disk: the project's own
# requirement is a range (torch>=2.1) that this satisfies, so pip adds nothing larger.
$PIP install -q --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}"
$PIP install -q --disable-pip-version-check -e '.[test,tensorboard]'
echo "install: done ($(python3 -c 'import torch, zmq, numba; print("torch", torch.__version__, "pyzmq", zmq.__version__, "numba", numba.__version__)'))" >&2
