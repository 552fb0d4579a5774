"""Where a process computes: ``--device cpu|cuda|cuda:N|auto``.

A worker process (all its workers), the evaluator and the reference engine compute on
one torch device each. ``auto`` takes CUDA when torch sees a GPU; ``cuda`` without an
index spreads the worker processes of one host over the visible GPUs (torch counts only
those ``CUDA_VISIBLE_DEVICES`` shows): ``ps-cluster`` hands its k-th worker process GPU k
modulo their number (:func:`spread_device`), and a worker process started alone takes
GPU (its first worker id / its workers) modulo their number: worker i of a deployment's
service per worker, GPU i. Asking for CUDA where there is none is a
``ConfigError``: one line, exit 2.

On CUDA every computation is made deterministic (:func:`deterministic`): the same
gradient for the same x, minibatch and device, run after run, so a cluster whose workers
compute on a GPU and the reference engine on the same GPU end bit-identical, as on the
CPU. The servers aggregate on the CPU: their numba kernels run within 2x of a GPU at
d = 11M on 16 cores, and a device round trip would cost what it saves.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from common.errors import ConfigError

if TYPE_CHECKING:
    import torch

DEVICE_CHOICES = ("cpu", "cuda", "cuda:N", "auto")
_CUDA_INDEX = re.compile(r"cuda:(\d+)")
# cuBLAS reproducibility: a fixed workspace (NVIDIA's documented setting), read when
# cuBLAS first starts in the process, so it is set before any CUDA work.
CUBLAS_WORKSPACE = ":4096:8"


def check_device(spec: str) -> str:
    """``spec`` if it names a device this option takes (``ConfigError`` if not): cpu,
    cuda, cuda:N or auto. Whether the machine has it is :func:`resolve_device`'s check."""
    if spec in ("cpu", "cuda", "auto") or _CUDA_INDEX.fullmatch(spec):
        return spec
    raise ConfigError(f"--device {spec!r}: expected cpu, cuda, cuda:N (N a GPU index) or "
                      "auto")


def cuda_devices() -> int:
    """How many CUDA devices torch sees here (0 without CUDA or without a GPU), asked of
    NVML where it can be: without starting CUDA in this process, which a launcher about
    to fork its workers must not do."""
    import torch

    if not torch.backends.cuda.is_built():
        return 0
    try:
        return torch.cuda.device_count()
    except RuntimeError:  # a driver that cannot start: no usable device
        return 0


def resolve_device(spec: str, slot: int = 0) -> torch.device:
    """The device a process computes on (:func:`select_device`), made deterministic
    (:func:`deterministic`)."""
    device = select_device(spec, slot)
    deterministic(device)
    return device


def select_device(spec: str, slot: int = 0) -> torch.device:
    """The torch device ``spec`` names on this machine; ``slot`` spreads plain ``cuda``
    (and ``auto`` on a GPU machine) over the visible GPUs: device ``slot`` modulo their
    number. ``ConfigError`` naming what is missing when CUDA is asked for and absent.
    Starts nothing on the device."""
    import torch

    check_device(spec)
    if spec == "cpu":
        return torch.device("cpu")
    count = cuda_devices()
    if count == 0:
        if spec == "auto":
            return torch.device("cpu")
        built = torch.version.cuda
        why = (f"torch {torch.__version__} was built without CUDA" if built is None else
               f"torch {torch.__version__} (CUDA {built}) sees no GPU here"
               + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})"
                  if "CUDA_VISIBLE_DEVICES" in os.environ else ""))
        raise ConfigError(f"--device {spec}: no CUDA device: {why}; use --device cpu or auto")
    match = _CUDA_INDEX.fullmatch(spec)
    if match is None:
        return torch.device("cuda", slot % count)
    index = int(match.group(1))
    if index >= count:
        raise ConfigError(f"--device {spec}: this machine shows {count} CUDA device(s), "
                          f"cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def deterministic(device: torch.device) -> None:
    """Make every computation on ``device`` deterministic (a CUDA device: cuBLAS's fixed
    workspace, cuDNN's deterministic algorithms and no autotuning, torch's deterministic
    algorithms, which refuse an operation that has none); nothing to do on the CPU, where
    one thread per process computes the same bits run after run. Uninitialised memory is
    not filled (what torch does by default in this mode): nothing reads it here, and
    filling every new tensor costs a pass over it."""
    if device.type != "cuda":
        return
    import torch
    import torch.utils.deterministic

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]  # a module property, unstubbed


def spread_device(spec: str, index: int) -> str:
    """The ``--device`` of a launcher's ``index``-th worker process: plain ``cuda`` (and
    ``auto`` where there is a GPU) as GPU ``index`` modulo the visible GPUs, so that the
    processes take the GPUs in turn; anything else as given."""
    if spec in ("cuda", "auto"):
        count = cuda_devices()
        if count:
            return f"cuda:{index % count}"
    return spec


def describe(device: torch.device) -> str:
    """``device`` in one phrase for a log line: cpu, or cuda:N and the GPU's name."""
    if device.type != "cuda":
        return str(device)
    import torch

    return f"{device} ({torch.cuda.get_device_name(device)})"
