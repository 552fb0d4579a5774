#!/usr/bin/env bash
# The checks that need a GPU, on a machine with CUDA where this repository is (installed
# or not: it runs from the checkout) and nothing can be downloaded; at most 8 minutes.
#
#   bash scripts/gpu_check.sh [OUT_DIR]      # default docs/results/gpu
#
# 1. the tests marked `cuda` (deterministic gradients on the device, pinned host vectors,
#    the engine bit for bit run after run, a cluster on the GPU bit-identical to the
#    engine on it with float32 and bfloat16 on the wire);
# 2. scripts/bench_gpu.py: ResNet-18 on synthetic CIFAR-shaped data (n=20, S=4): the
#    engine on the GPU, the cluster on the GPU with keys and with --insecure, their
#    ratio, and where a round's time goes (compute, host-device copies, aggregation,
#    wire). Its table goes to OUT_DIR/output.md and OUT_DIR/results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/results/gpu}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
started=$(date +%s)

python3 - <<'PY' || exit 2
import sys
try:
    import torch, zmq  # noqa: F401
except ImportError as exc:
    sys.exit(f"gpu_check: {exc.name} is not importable here (pyzmq travels as a wheel: "
             "see the README's GPU section)")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device here")
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name(0)}; pyzmq {zmq.__version__}")
PY

echo "gpu_check: the tests marked cuda" >&2
timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider -W ignore::pytest.PytestConfigWarning \
  tests/unit/worker/test_device.py tests/integration/test_device_cluster.py

echo "gpu_check: ResNet-18, the cluster on the GPU against the engine on it" >&2
timeout $(( 470 - ($(date +%s) - started) )) python3 scripts/bench_gpu.py --out "$out"
echo "gpu_check: finished in $(( $(date +%s) - started )) s" >&2
