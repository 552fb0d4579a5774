"""Tiled sorting-network kernels behind the coordinate-wise rules.

MarMed, MeaMed and trimmed mean (Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant
SGD", ICML 2018) and Bulyan's coordinate phase (El Mhamdi et al., ICML 2018) all need,
per coordinate, a few order statistics of the n values in that column.  Per-column
selection is branch-bound and slow; instead each kernel:

1. loads a tile of ``W`` columns of the (n, d) matrix row by row (sequential reads)
   into a small scratch buffer ``S`` of ``n + 2`` rows that stays in L1;
2. runs a Batcher merge-exchange sorting network (Knuth, TAOCP 5.3.4, algorithm M)
   row against row, each comparator vectorised across the ``W`` columns and writing
   its min and max into two free scratch rows (not in place), and
3. reduces the sorted (or partly sorted) rows to one output value per column.

The network for a given n is generated in Python at first use and cached.  It is
pruned for what the reduction reads: a wire that nobody reads is dead, and a set of
output positions whose values are only summed is a *group* whose internal order does
not matter, so a trailing comparator between two wires of the same group (or two dead
wires) is dropped, and a comparator with one dead output computes only the other.

Non-finite values: while a tile is loaded, NaN becomes +inf on even rows and -inf on
odd rows (of the rows being aggregated, in order).  A NaN then behaves like an extreme
value, so the median stays inside the range of the finite values while fewer than half
the values of a column are non-finite, and the trimmed / window means stay finite while
at most ``q`` are.  With more bad values than that the result may be +-inf (or NaN
where +inf and -inf meet in a sum); it is never NaN below those counts.

Kernels are compiled with ``numba.njit(cache=True, nogil=True)``; large inputs are split
into column chunks run on ``torch.get_num_threads()`` threads.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
import torch

# Label of an output wire during pruning: dead (not read), unique (its exact value is
# read), or a non-negative group id (only the sum of the group is read).
_DEAD = -1
_UNIQUE = -2

# Below this many columns per thread, splitting across threads does not pay.
_MIN_COLUMNS_PER_THREAD = 32768
_SCRATCH_BYTES = 32768  # scratch of (n + 2) rows x W columns kept about this size (L1)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


@dataclass(frozen=True)
class Network:
    """A pruned sorting network compiled to scratch-row operations.

    ``ops[k] = (a, b, lo, hi)``: read scratch rows ``a`` and ``b``, write their
    element-wise min to row ``lo`` and max to row ``hi`` (-1: not needed).  After the
    last op, sorted position ``j`` of the column is in scratch row ``final[j]``
    (-1 for a dead position).  ``rows`` is the scratch height.
    """

    ops: np.ndarray
    final: np.ndarray
    rows: int


def merge_exchange(n: int) -> list[tuple[int, int]]:
    """Batcher's merge-exchange sorting network for any ``n`` (Knuth's algorithm M)."""
    comparators: list[tuple[int, int]] = []
    if n < 2:
        return comparators
    t = (n - 1).bit_length()
    p = 1 << (t - 1)
    while p > 0:
        q, r, d = 1 << (t - 1), 0, p
        while True:
            comparators.extend((i, i + d) for i in range(n - d) if i & p == r)
            if q == p:
                break
            d, q, r = q - p, q >> 1, p
        p >>= 1
    return comparators


def _compile(n: int, labels: list[int]) -> Network:
    """Prune the merge-exchange network for ``labels`` and allocate scratch rows."""
    labels = list(labels)
    kept: list[tuple[int, int, bool, bool]] = []
    for a, b in reversed(merge_exchange(n)):
        la, lb = labels[a], labels[b]
        if la == lb and la != _UNIQUE:
            continue  # a swap inside one group (or between dead wires) changes nothing read
        kept.append((a, b, la != _DEAD, lb != _DEAD))
        labels[a] = labels[b] = _UNIQUE
    kept.reverse()
    wire = list(range(n))
    free = [n, n + 1]
    ops = []
    for a, b, need_lo, need_hi in kept:
        ra, rb = wire[a], wire[b]
        lo = free.pop(0) if need_lo else -1
        hi = free.pop(0) if need_hi else -1
        free += [ra, rb]
        wire[a], wire[b] = lo, hi
        ops.append((ra, rb, lo, hi))
    return Network(
        ops=np.array(ops, dtype=np.int64).reshape(-1, 4),
        final=np.array(wire, dtype=np.int64),
        rows=n + 2,
    )


@functools.cache
def median_network(n: int) -> Network:
    """Network that leaves the median position(s) ``(n-1)//2`` and ``n//2`` correct."""
    labels = [_DEAD] * n
    lo, hi = (n - 1) // 2, n // 2
    labels[lo] = labels[hi] = _UNIQUE if lo == hi else 0
    return _compile(n, labels)


@functools.cache
def trim_network(n: int, q: int) -> Network:
    """Network that leaves the multiset of sorted positions ``q .. n-q-1`` correct."""
    return _compile(n, [0 if q <= j < n - q else _DEAD for j in range(n)])


@functools.cache
def window_network(n: int, m: int) -> Network:
    """Network for the window reduction keeping ``m`` of ``n`` sorted values.

    With ``p = n - m`` values dropped, sorted positions ``< p`` and ``>= m`` are compared
    pairwise and must be exact, the median positions must be exact (or their sum, for
    even n), and the always-kept core ``p .. m-1`` is only summed.
    """
    p = n - m
    labels = [_UNIQUE if (j < p or j >= m) else 0 for j in range(n)]
    lo, hi = (n - 1) // 2, n // 2
    if lo == hi or labels[lo] == _UNIQUE or labels[hi] == _UNIQUE:
        labels[lo] = labels[hi] = _UNIQUE
    else:
        labels[lo] = labels[hi] = 1
    return _compile(n, labels)


def tile_width(n: int) -> int:
    """Columns per tile: a power of two, 64..1024, scratch of (n+2) rows near 32 KiB."""
    w = 64
    while w < 1024 and (n + 2) * 4 * (2 * w) <= _SCRATCH_BYTES:
        w *= 2
    return w


@numba.njit(cache=True, nogil=True)
def _load_tile(G, rows, c0, w, S):  # pragma: no cover - compiled
    """Copy columns ``c0 .. c0+w`` of ``G[rows]`` into ``S``; NaN -> +inf/-inf by row parity."""
    pos = np.float32(np.inf)
    neg = np.float32(-np.inf)
    for i in range(rows.shape[0]):
        fill = pos if i % 2 == 0 else neg
        r = rows[i]
        for c in range(w):
            v = G[r, c0 + c]
            S[i, c] = fill if v != v else v


@numba.njit(cache=True, nogil=True)
def _run_network(ops, w, S):  # pragma: no cover - compiled
    """Apply the compiled comparator ops to the first ``w`` columns of ``S``."""
    for k in range(ops.shape[0]):
        a = ops[k, 0]
        b = ops[k, 1]
        lo = ops[k, 2]
        hi = ops[k, 3]
        if lo >= 0 and hi >= 0:
            for c in range(w):
                x = S[a, c]
                y = S[b, c]
                S[lo, c] = min(x, y)
                S[hi, c] = max(x, y)
        elif lo >= 0:
            for c in range(w):
                S[lo, c] = min(S[a, c], S[b, c])
        else:
            for c in range(w):
                S[hi, c] = max(S[a, c], S[b, c])


@numba.njit(cache=True, nogil=True)
def _median_kernel(G, rows, ops, final, width, start, stop, out):  # pragma: no cover
    """``out[c]`` = median of ``G[rows, c]`` for ``start <= c < stop``."""
    n = rows.shape[0]
    S = np.empty((n + 2, width), dtype=np.float32)
    lo = final[(n - 1) // 2]
    hi = final[n // 2]
    half = np.float32(0.5)
    for c0 in range(start, stop, width):
        w = min(width, stop - c0)
        _load_tile(G, rows, c0, w, S)
        _run_network(ops, w, S)
        for c in range(w):
            out[c0 + c] = S[lo, c] * half + S[hi, c] * half


@numba.njit(cache=True, nogil=True)
def _trim_kernel(G, rows, ops, final, q, width, start, stop, out):  # pragma: no cover
    """``out[c]`` = mean of sorted positions ``q .. n-q-1`` of ``G[rows, c]``."""
    n = rows.shape[0]
    S = np.empty((n + 2, width), dtype=np.float32)
    acc = np.empty(width, dtype=np.float32)
    inv = np.float32(1.0 / (n - 2 * q))
    for c0 in range(start, stop, width):
        w = min(width, stop - c0)
        _load_tile(G, rows, c0, w, S)
        _run_network(ops, w, S)
        r = final[q]
        for c in range(w):
            acc[c] = S[r, c]
        for j in range(q + 1, n - q):
            r = final[j]
            for c in range(w):
                acc[c] += S[r, c]
        for c in range(w):
            out[c0 + c] = acc[c] * inv


@numba.njit(cache=True, nogil=True)
def _window_kernel(G, rows, ops, final, m, width, start, stop, out):  # pragma: no cover
    """``out[c]`` = mean of the ``m`` values of ``G[rows, c]`` nearest to their median.

    Sorted values ``s``, median ``med``, ``p = n - m``: the kept values are the window
    ``s[k .. k+m-1]`` with ``k = #{t < p : med - s[t] > s[t+m] - med}``.  The predicate is
    monotone in ``t``, so ``k`` is where the window stops sliding right: a window moves
    only when its lowest value is strictly farther from the median than the next value
    above it (ties keep the lower value; equal values give the same sum).
    """
    n = rows.shape[0]
    p = n - m
    S = np.empty((n + 2, width), dtype=np.float32)
    med = np.empty(width, dtype=np.float32)
    kk = np.empty(width, dtype=np.int64)
    acc = np.empty(width, dtype=np.float32)
    half = np.float32(0.5)
    zero = np.float32(0.0)
    inv = np.float32(1.0 / m)
    lo = final[(n - 1) // 2]
    hi = final[n // 2]
    for c0 in range(start, stop, width):
        w = min(width, stop - c0)
        _load_tile(G, rows, c0, w, S)
        _run_network(ops, w, S)
        for c in range(w):
            med[c] = S[lo, c] * half + S[hi, c] * half
            kk[c] = 0
            acc[c] = zero
        for t in range(p):
            ra = final[t]
            rb = final[t + m]
            for c in range(w):
                kk[c] += (med[c] - S[ra, c]) > (S[rb, c] - med[c])
        for j in range(n):
            r = final[j]
            if p <= j < m:  # the core is in every window
                for c in range(w):
                    acc[c] += S[r, c]
            elif j < m:  # s[j] is kept iff k <= j
                for c in range(w):
                    acc[c] += S[r, c] if kk[c] <= j else zero
            elif j >= p:  # s[j] is kept iff j <= k + m - 1
                for c in range(w):
                    acc[c] += S[r, c] if kk[c] > j - m else zero
            else:  # j < p and j >= m: kept iff k <= j <= k + m - 1
                for c in range(w):
                    acc[c] += S[r, c] if (kk[c] <= j and kk[c] > j - m) else zero
        for c in range(w):
            out[c0 + c] = acc[c] * inv


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(thread_name_prefix="rules-kernel")
        return _pool


def _run_chunked(kernel, d: int, width: int, *args) -> None:
    """Run ``kernel(*args[:-1], width, start, stop, out)`` over column chunks in threads."""
    *head, out = args
    chunks = max(1, min(torch.get_num_threads(), d // _MIN_COLUMNS_PER_THREAD))
    if chunks == 1:
        kernel(*head, width, 0, d, out)
        return
    step = -(-d // chunks)
    step = -(-step // width) * width  # whole tiles per chunk
    bounds = [(s, min(s + step, d)) for s in range(0, d, step)]
    futures = [
        _executor().submit(kernel, *head, width, s, e, out) for s, e in bounds[1:]
    ]
    kernel(*head, width, bounds[0][0], bounds[0][1], out)
    for f in futures:
        f.result()


def _prepare(G: np.ndarray, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if rows is None:
        rows = np.arange(G.shape[0], dtype=np.int64)
    return np.ascontiguousarray(G, dtype=np.float32), np.ascontiguousarray(rows, np.int64)


def coordinate_median(G: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Coordinate-wise median of ``G[rows]`` (mean of the two middle values for even n)."""
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    net = median_network(n)
    out = np.empty(d, dtype=np.float32)
    _run_chunked(_median_kernel, d, tile_width(n), G, rows, net.ops, net.final, out)
    return out


def coordinate_trimmed_mean(G: np.ndarray, q: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Per coordinate, the mean of ``G[rows]`` without its ``q`` largest and ``q`` smallest."""
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    net = trim_network(n, q)
    out = np.empty(d, dtype=np.float32)
    _run_chunked(_trim_kernel, d, tile_width(n), G, rows, net.ops, net.final, q, out)
    return out


def coordinate_window_mean(G: np.ndarray, m: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Per coordinate, the mean of the ``m`` values of ``G[rows]`` nearest to their median."""
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    net = window_network(n, m)
    out = np.empty(d, dtype=np.float32)
    _run_chunked(_window_kernel, d, tile_width(n), G, rows, net.ops, net.final, m, out)
    return out
