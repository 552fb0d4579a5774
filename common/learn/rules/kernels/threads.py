"""The kernels' thread pool: large inputs split into column chunks, one per thread
(``torch.get_num_threads()``), the first chunk run by the caller."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

MIN_COLUMNS_PER_THREAD = 32768

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """A forked child has none of the parent's threads: start a new pool when needed."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def executor() -> ThreadPoolExecutor:
    """The process's pool of kernel threads (a new one in a forked child)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(thread_name_prefix="rules-kernel")
        return _pool


def run_chunked(kernel: Callable[..., None], args: tuple, d: int, align: int,
                out: np.ndarray | None = None) -> np.ndarray:
    """``kernel(*args, start, stop, out)`` over column chunks of ``d`` columns (whole
    tiles of ``align``), on torch's thread count; ``out`` (default: a float32 vector of
    ``d``) is returned."""
    out = np.empty(d, dtype=np.float32) if out is None else out
    if d == 0:
        return out
    chunks = max(1, min(torch.get_num_threads(), d // MIN_COLUMNS_PER_THREAD))
    per_chunk = -(-d // chunks)
    step = -(-per_chunk // align) * align  # whole tiles per chunk
    bounds = [(s, min(s + step, d)) for s in range(0, d, step)]
    futures = [executor().submit(kernel, *args, s, e, out) for s, e in bounds[1:]]
    kernel(*args, *bounds[0], out)
    for future in futures:
        future.result()
    return out
