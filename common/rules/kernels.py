"""Sorting-network kernels behind the coordinate-wise rules.

MarMed, MeaMed and trimmed mean (Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant
SGD", ICML 2018) and the coordinate phase of Bulyan (El Mhamdi, Guerraoui, Rouault,
ICML 2018) need, per coordinate, a few order statistics of the n values of a column.
Per-column selection is branch-bound and slow; these kernels instead run a Batcher
merge-exchange sorting network (Knuth, TAOCP 5.3.4, algorithm M) on many columns at
once, each comparator a branch-free min/max that the compiler vectorises across
columns.  The network for n is generated in Python at first use and cached.

Two code shapes, both ``numba.njit(cache=True, nogil=True)``:

* n <= ``REGISTER_MAX_N``: Python source with the network and the reduction unrolled
  (wires are local variables, so they live in vector registers; loads are contiguous
  row reads, one vector per row) is generated per (rule kind, n, kept count), written
  once to a per-user directory and imported, so numba's on-disk cache works for it.
  This is several times faster than the scratch shape below.
* larger n, where compiling unrolled code gets slow: each tile of ``W`` columns is
  loaded row by row into an L1-resident scratch of ``n + 2`` rows and the comparators
  run row against row, each writing its min and max into two free rows.

Networks are pruned to what the reduction reads: unread positions are dead, positions
only summed form a group whose internal order does not matter, so trailing comparators
inside a group are dropped, and one whose other output is dead computes min or max only.

Non-finite values: as a value is loaded, NaN becomes +inf on even rows and -inf on odd
rows (of the rows being aggregated, in order).  NaN then acts as an extreme value: the
median stays within the range of the finite values while fewer than half the values of a
column are non-finite, and the trimmed / window means stay finite while at most ``q``
are.  With more bad values the result may be +-inf, or NaN where +inf and -inf meet in
a sum; below those counts it is never NaN.

Large inputs are split into column chunks run on ``torch.get_num_threads()`` threads.

The distance-based rules (Medoid, Krum, Multi-Krum, GeoMed, Bulyan) share the last
section: one float64 Gram matrix ``G @ G.T`` gives all pairwise distances.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import torch

REGISTER_MAX_N = 50  # first-use compile time grows fast with n: about 5 s at n = 50
_DEAD = -1  # pruning label: the value at this position is not read
_UNIQUE = -2  # pruning label: the exact value at this position is read
_MIN_COLUMNS_PER_THREAD = 32768
_SCRATCH_BYTES = 32768  # scratch tiles are sized to stay in L1

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """A forked child has none of the parent's threads: start a new pool when needed."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


# --------------------------------------------------------------------------- networks


def merge_exchange(n: int) -> list[tuple[int, int]]:
    """Batcher's merge-exchange sorting network for any ``n`` (Knuth's algorithm M).

    Each ``(i, j)`` with ``i < j`` puts the min of wires i, j on i and the max on j.
    """
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


def prune(n: int, labels: list[int]) -> list[tuple[int, int, bool, bool]]:
    """Comparators of the n-wire network still needed for outputs labelled ``labels``.

    A label is ``_DEAD``, ``_UNIQUE`` or a group id >= 0 (only the group's sum is read).
    Walking backwards, a comparator between two wires of the same group (or two dead
    wires) cannot change what is read and is dropped; a kept one makes both inputs
    unique.  Returns ``(i, j, need_min, need_max)`` in network order.
    """
    labels = list(labels)
    kept: list[tuple[int, int, bool, bool]] = []
    for a, b in reversed(merge_exchange(n)):
        la, lb = labels[a], labels[b]
        if la == lb and la != _UNIQUE:
            continue
        kept.append((a, b, la != _DEAD, lb != _DEAD))
        labels[a] = labels[b] = _UNIQUE
    kept.reverse()
    return kept


def median_labels(n: int) -> list[int]:
    """Only the middle position(s) are read (their sum, for even n)."""
    labels = [_DEAD] * n
    lo, hi = (n - 1) // 2, n // 2
    labels[lo] = labels[hi] = _UNIQUE if lo == hi else 0
    return labels


def window_labels(n: int, m: int) -> list[int]:
    """Labels for keeping a window of ``m`` sorted values (see ``_window_reduce``).

    With ``p = n - m``: positions ``< p`` and ``>= m`` are compared pairwise, the median
    must be exact (or its pair's sum), and the core ``p .. m-1`` is only summed.
    """
    p = n - m
    labels = [_UNIQUE if (j < p or j >= m) else 0 for j in range(n)]
    lo, hi = (n - 1) // 2, n // 2
    if lo == hi or labels[lo] == _UNIQUE or labels[hi] == _UNIQUE:
        labels[lo] = labels[hi] = _UNIQUE
    else:
        labels[lo] = labels[hi] = 1
    return labels


@dataclass(frozen=True)
class ScratchProgram:
    """A pruned network as scratch-row operations, for the large-n kernels.

    ``ops[k] = (a, b, lo, hi)``: read scratch rows ``a`` and ``b``, write the element-wise
    min to row ``lo`` and the max to row ``hi`` (-1: not needed).  Afterwards sorted
    position ``j`` lies in scratch row ``final[j]`` (-1 where dead).  Rows: ``n + 2``.
    """

    ops: np.ndarray
    final: np.ndarray


def scratch_program(n: int, labels: list[int]) -> ScratchProgram:
    """Allocate scratch rows for the pruned network; inputs are rows ``0 .. n-1``."""
    wire = list(range(n))
    free = [n, n + 1]
    ops = []
    for a, b, need_lo, need_hi in prune(n, labels):
        ra, rb = wire[a], wire[b]
        lo = free.pop(0) if need_lo else -1
        hi = free.pop(0) if need_hi else -1
        free += [ra, rb]
        wire[a], wire[b] = lo, hi
        ops.append((ra, rb, lo, hi))
    return ScratchProgram(
        ops=np.array(ops, dtype=np.int64).reshape(-1, 4),
        final=np.array(wire, dtype=np.int64),
    )


def tile_width(n: int) -> int:
    """Columns per tile: a power of two in 64..1024 keeping ``(n + 2) * W`` floats near L1."""
    w = 64
    while w < 1024 and (n + 2) * 4 * (2 * w) <= _SCRATCH_BYTES:
        w *= 2
    return w


# ------------------------------------------------------------- large-n scratch kernels


@numba.njit(cache=True, nogil=True)
def _window_reduce(S, final, m, kfix, w, c0, out, med, kk, acc):
    """``out[c0 + c]`` = mean of a window of ``m`` sorted values of tile column ``c``.

    Sorted position ``j`` of column ``c`` is ``S[final[j], c]``; ``p = n - m`` values are
    dropped.  With ``kfix >= 0`` the window starts at ``kfix`` (trimmed mean).  Otherwise
    it holds the ``m`` values nearest to the median ``med``: the start is
    ``k = #{t < p : med - s[t] > s[t+m] - med}``; the predicate is monotone in ``t``, so
    the window slides right exactly while its lowest value is strictly farther from the
    median than the next value above it (a distance tie keeps the lower value).
    """
    n = final.shape[0]
    p = n - m
    half = np.float32(0.5)
    zero = np.float32(0.0)
    lo = final[(n - 1) // 2]
    hi = final[n // 2]
    for c in range(w):
        acc[c] = zero
        kk[c] = kfix
    if kfix < 0:
        for c in range(w):
            med[c] = S[lo, c] if lo == hi else S[lo, c] * half + S[hi, c] * half
            kk[c] = 0
        for t in range(p):
            ra = final[t]
            rb = final[t + m]
            for c in range(w):
                kk[c] += (med[c] - S[ra, c]) > (S[rb, c] - med[c])
    for j in range(n):
        r = final[j]
        if r < 0:  # a dead position (outside every window the pruned network serves)
            continue
        if p <= j < m:  # the core is in every window
            for c in range(w):
                acc[c] += S[r, c]
        elif j < m:  # here j < p: kept iff k <= j
            for c in range(w):
                acc[c] += S[r, c] if kk[c] <= j else zero
        elif j >= p:  # here j >= m: kept iff j <= k + m - 1
            for c in range(w):
                acc[c] += S[r, c] if kk[c] > j - m else zero
        else:
            for c in range(w):
                acc[c] += S[r, c] if (kk[c] <= j and kk[c] > j - m) else zero
    inv = np.float32(1.0 / m)
    o = out[c0 : c0 + w]
    for c in range(w):
        o[c] = acc[c] * inv


@numba.njit(cache=True, nogil=True)
def _load_tile(G, rows, c0, w, S):
    """``S[i, :w] = G[rows[i], c0:c0+w]`` with NaN -> +inf (even i) / -inf (odd i)."""
    pos = np.float32(np.inf)
    neg = np.float32(-np.inf)
    for i in range(rows.shape[0]):
        src = G[rows[i], c0 : c0 + w]  # 0-based views keep the loops gather-free
        dst = S[i]
        if i % 2 == 0:
            for c in range(w):
                dst[c] = min(pos, src[c])  # min(inf, nan) is inf
        else:
            for c in range(w):
                dst[c] = max(neg, src[c])  # max(-inf, nan) is -inf


@numba.njit(cache=True, nogil=True)
def _run_ops(ops, w, S):
    """Apply the scratch-row comparator ops to the first ``w`` columns of ``S``."""
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
def _scratch_median(G, rows, ops, final, width, start, stop, out):
    """``out[c]`` = median of ``G[rows, c]`` for ``start <= c < stop``."""
    n = rows.shape[0]
    S = np.empty((n + 2, width), dtype=np.float32)
    lo = final[(n - 1) // 2]
    hi = final[n // 2]
    half = np.float32(0.5)
    for c0 in range(start, stop, width):
        w = min(width, stop - c0)
        _load_tile(G, rows, c0, w, S)
        _run_ops(ops, w, S)
        o = out[c0 : c0 + w]
        if lo == hi:
            for c in range(w):
                o[c] = S[lo, c]
        else:
            for c in range(w):
                o[c] = S[lo, c] * half + S[hi, c] * half


@numba.njit(cache=True, nogil=True)
def _scratch_window(G, rows, ops, final, m, kfix, width, start, stop, out):
    """``out[c]`` = window mean (see ``_window_reduce``) of ``G[rows, c]``."""
    n = rows.shape[0]
    S = np.empty((n + 2, width), dtype=np.float32)
    med = np.empty(width, dtype=np.float32)
    kk = np.empty(width, dtype=np.int64)
    acc = np.empty(width, dtype=np.float32)
    for c0 in range(start, stop, width):
        w = min(width, stop - c0)
        _load_tile(G, rows, c0, w, S)
        _run_ops(ops, w, S)
        _window_reduce(S, final, m, kfix, w, c0, out, med, kk, acc)


# ------------------------------------------------------ small-n generated kernels

_TEMPLATE = '''\
"""{title}; generated by common.rules.kernels, do not edit."""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def kernel(G, rows, start, stop, out):
    """out[c] for start <= c < stop, from the column G[rows, c]."""
    pos = np.float32(np.inf)
    neg = np.float32(-np.inf)
    half = np.float32(0.5)
    zero = np.float32(0.0)
    inv = np.float32({inv!r})
{views}
    o = out[start:stop]
    # An unsigned index needs no negative-index wraparound, so loads stay contiguous.
    for c in range(np.uint64(stop - start)):
{body}
'''


def _reduction_code(n: int, kind: str, m: int) -> list[str]:
    """Statements computing ``o[c]`` from the sorted wires ``v0 .. v{n-1}``."""
    lo, hi = (n - 1) // 2, n // 2
    if kind == "median":
        return [f"o[c] = v{lo}" if lo == hi else f"o[c] = v{lo} * half + v{hi} * half"]
    p = n - m
    if kind == "trim":  # sorted positions q .. q + m - 1 with p = 2q
        return ["o[c] = (" + " + ".join(f"v{j}" for j in range(p // 2, p // 2 + m)) + ") * inv"]
    # window: f_t says s_t lies farther below the median than s_{t+m} above it; the kept
    # window starts at k = #{t : f_t}, see _window_reduce.
    lines = [f"med = v{lo}" if lo == hi else f"med = v{lo} * half + v{hi} * half"]
    lines += [f"f{t} = (med - v{t}) > (v{t + m} - med)" for t in range(p)]
    terms = [f"v{j}" for j in range(p, m)]
    for j in [j for j in range(n) if not p <= j < m]:
        cond = ([f"not f{j}"] if j < p else []) + ([f"f{j - m}"] if j >= m else [])
        terms.append(f"(v{j} if {' and '.join(cond)} else zero)")
    lines.append("o[c] = (" + " + ".join(terms) + ") * inv")
    return lines


def generated_source(n: int, kind: str, m: int) -> str:
    """Unrolled kernel source; ``kind``: median, trim (``m = n - 2q`` kept) or window."""
    if kind == "median":
        labels, title = median_labels(n), f"Coordinate-wise median of n = {n}"
    elif kind == "trim":
        q = (n - m) // 2
        labels = [0 if q <= j < n - q else _DEAD for j in range(n)]
        title = f"Trimmed mean of n = {n}, q = {q}"
    else:
        labels = window_labels(n, m)
        title = f"Mean of the m = {m} of n = {n} values nearest the median"
    body = [f"v{i} = {'min(pos' if i % 2 == 0 else 'max(neg'}, x{i}[c])" for i in range(n)]
    for a, b, need_min, need_max in prune(n, labels):
        if need_min and need_max:
            body.append(f"v{a}, v{b} = min(v{a}, v{b}), max(v{a}, v{b})")
        elif need_min:
            body.append(f"v{a} = min(v{a}, v{b})")
        else:
            body.append(f"v{b} = max(v{a}, v{b})")
    body += _reduction_code(n, kind, m)
    return _TEMPLATE.format(
        title=title,
        inv=1.0 / m,
        views="\n".join(f"    x{i} = G[rows[{i}], start:stop]" for i in range(n)),
        body="\n".join(" " * 8 + line for line in body),
    )


def _kernel_dir() -> Path:
    """A private directory for generated sources, reused across processes when possible."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    path = Path(base) / "byzps" / "sortnet"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.stat().st_uid == os.getuid() and os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="byzps-sortnet-"))


@functools.cache
def generated_kernel(n: int, kind: str, m: int) -> Callable[..., None]:
    """Write (once) and import an unrolled kernel; numba caches its machine code on disk.

    The file name carries a hash of the source, so a changed generator never picks up
    a stale cache entry.
    """
    source = generated_source(n, kind, m)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"sortnet_{kind}_n{n}_m{m}_{digest}"
    path = _kernel_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import the generated kernel {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # numba's cache re-imports a kernel's module by name
    spec.loader.exec_module(module)
    return module.kernel


# ------------------------------------------------------------------------ dispatch


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(thread_name_prefix="rules-kernel")
        return _pool


def _run_chunked(kernel: Callable[..., None], args: tuple, d: int, align: int) -> np.ndarray:
    """``kernel(*args, start, stop, out)`` over column chunks, on torch's thread count."""
    out = np.empty(d, dtype=np.float32)
    if d == 0:
        return out
    chunks = max(1, min(torch.get_num_threads(), d // _MIN_COLUMNS_PER_THREAD))
    per_chunk = -(-d // chunks)
    step = -(-per_chunk // align) * align  # whole tiles per chunk
    bounds = [(s, min(s + step, d)) for s in range(0, d, step)]
    futures = [_executor().submit(kernel, *args, s, e, out) for s, e in bounds[1:]]
    kernel(*args, *bounds[0], out)
    for future in futures:
        future.result()
    return out


def _prepare(G: np.ndarray, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    G = np.ascontiguousarray(G, dtype=np.float32)
    if rows is None:
        return G, np.arange(G.shape[0], dtype=np.int64)
    return G, np.ascontiguousarray(rows, dtype=np.int64)


def coordinate_median(G: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Coordinate-wise median of ``G[rows]`` (mean of the two middle values for even n)."""
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    if n <= REGISTER_MAX_N:
        return _run_chunked(generated_kernel(n, "median", n), (G, rows), d, 64)
    prog = scratch_program(n, median_labels(n))
    width = tile_width(n)
    return _run_chunked(_scratch_median, (G, rows, prog.ops, prog.final, width), d, width)


def coordinate_trimmed_mean(G: np.ndarray, q: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Per coordinate, the mean of ``G[rows]`` without its ``q`` smallest and ``q`` largest."""
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    m = n - 2 * q
    if n <= REGISTER_MAX_N:
        return _run_chunked(generated_kernel(n, "trim", m), (G, rows), d, 64)
    prog = scratch_program(n, [0 if q <= j < n - q else _DEAD for j in range(n)])
    width = tile_width(n)
    args = (G, rows, prog.ops, prog.final, m, q, width)
    return _run_chunked(_scratch_window, args, d, width)


def coordinate_window_mean(G: np.ndarray, m: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Per coordinate, the mean of the ``m`` values of ``G[rows]`` nearest to their median.

    Ties in distance keep the lower value (see ``_window_reduce``).
    """
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    if n <= REGISTER_MAX_N:
        return _run_chunked(generated_kernel(n, "window", m), (G, rows), d, 64)
    prog = scratch_program(n, window_labels(n, m))
    width = tile_width(n)
    args = (G, rows, prog.ops, prog.final, m, -1, width)
    return _run_chunked(_scratch_window, args, d, width)


# --------------------------------------------------------------- Gram-matrix distances

_GRAM_CHUNK = 16384  # columns per float64 block of the Gram accumulation


def gram64(G: torch.Tensor) -> np.ndarray:
    """``G @ G.T`` accumulated in float64 over column blocks (one BLAS pass, no overflow).

    Squares of float32 values reach at most ~1.2e77, so the float64 Gram of any finite
    row is finite; a row with a NaN or an infinity gets a non-finite diagonal entry.
    """
    n, d = G.shape
    K = torch.zeros((n, n), dtype=torch.float64)
    for s in range(0, d, _GRAM_CHUNK):
        X = G[:, s : s + _GRAM_CHUNK].double()
        K.addmm_(X, X.T)
    return K.numpy()


def squared_distances(K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairwise squared Euclidean distances from a Gram matrix, and the finite-row mask.

    ``D2[i, j] = K[i, i] + K[j, j] - 2 K[i, j]``, clamped at 0 (rounding); 0 from a finite
    row to itself.  A row holding any non-finite value is at +inf from every row, itself
    included, so no selection ever prefers it to a finite row.
    """
    diag = np.diag(K).copy()
    finite = np.isfinite(diag)
    with np.errstate(invalid="ignore", over="ignore"):
        D2 = diag[:, None] + diag[None, :] - 2.0 * K
    D2 = np.maximum(D2, 0.0)
    np.fill_diagonal(D2, 0.0)
    D2[~finite, :] = np.inf
    D2[:, ~finite] = np.inf
    return D2, finite


# ------------------------------------------- row reductions and subset searches
#
# Centered clipping, ARC, bucketing, NNM, MDA and SMEA (``common/rules/``,
# ``common/rules/pre/``) need per-row norms, weighted sums of rows, means of groups of
# rows, and an exhaustive search over the subsets of n - q rows.  Sums over columns are
# taken over fixed blocks of ``_ROW_BLOCK`` columns, added in block order, so a result
# never depends on the number of threads that computed it.

_ROW_BLOCK = 65536  # columns per partial sum of the row norms


@numba.njit(cache=True, nogil=True)
def _row_sq_distance_blocks(G, v, use_v, block, b0, b1, partial):
    """``partial[b, i] = sum_{c in block b} (G[i, c] - v[c])^2`` in float64 (v = 0 if
    not ``use_v``), for blocks ``b0 <= b < b1``."""
    n, d = G.shape
    for b in range(b0, b1):
        c0 = b * block
        c1 = min(c0 + block, d)
        for i in range(n):
            row = G[i, c0:c1]
            acc = 0.0
            if use_v:
                vv = v[c0:c1]
                for c in range(c1 - c0):
                    x = np.float64(row[c]) - np.float64(vv[c])
                    acc += x * x
            else:
                for c in range(c1 - c0):
                    x = np.float64(row[c])
                    acc += x * x
            partial[b, i] = acc


def row_sq_distances(G: np.ndarray, v: np.ndarray | None = None) -> np.ndarray:
    """``||G[i] - v||^2`` for every row (``v`` None: the squared norms), in float64.

    A row holding a NaN or an infinity gets a non-finite value; a finite float32 row
    never overflows (at most ~1.2e77 per value).  Deterministic whatever the thread count.
    """
    G = np.ascontiguousarray(G, dtype=np.float32)
    n, d = G.shape
    use_v = v is not None
    vv = np.ascontiguousarray(v, dtype=np.float32) if use_v else np.zeros(1, dtype=np.float32)
    blocks = max(1, -(-d // _ROW_BLOCK))
    partial = np.zeros((blocks, n), dtype=np.float64)
    threads = max(1, min(torch.get_num_threads(), d // _MIN_COLUMNS_PER_THREAD, blocks))
    per = -(-blocks // threads)
    ranges = [(b, min(b + per, blocks)) for b in range(0, blocks, per)]
    args = (G, vv, use_v, _ROW_BLOCK)
    futures = [_executor().submit(_row_sq_distance_blocks, *args, b0, b1, partial)
               for b0, b1 in ranges[1:]]
    _row_sq_distance_blocks(*args, *ranges[0], partial)
    for future in futures:
        future.result()
    out = np.zeros(n, dtype=np.float64)
    for b in range(blocks):  # in block order, whatever the threads
        out += partial[b]
    return out


_TILE = 1024  # columns of the float64 accumulators kept in L1 by the row kernels


@numba.njit(cache=True, nogil=True)
def _shift_kernel(G, v, rows, w, start, stop, out):
    """``out[c] = v[c] + sum_k w[k] (G[rows[k], c] - v[c])`` in float64, for start <= c < stop."""
    acc = np.empty(_TILE, dtype=np.float64)
    total = 0.0
    for k in range(rows.shape[0]):
        total += w[k]
    for c0 in range(start, stop, _TILE):
        width = min(_TILE, stop - c0)
        vv = v[c0:c0 + width]
        for c in range(width):
            acc[c] = 0.0
        for k in range(rows.shape[0]):
            src = G[rows[k], c0:c0 + width]
            wk = w[k]
            for c in range(width):
                acc[c] += wk * np.float64(src[c])
        o = out[c0:c0 + width]
        for c in range(width):
            x = np.float64(vv[c])
            o[c] = np.float32(x + (acc[c] - total * x))


def weighted_shift(G: np.ndarray, v: np.ndarray, rows: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``v + sum_k w[k] (G[rows[k]] - v)`` as float32, accumulated in float64; only the
    listed rows are read (a row left out may hold anything)."""
    G = np.ascontiguousarray(G, dtype=np.float32)
    v = np.ascontiguousarray(v, dtype=np.float32)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    return _run_chunked(_shift_kernel, (G, v, rows, w), G.shape[1], 64)


@numba.njit(cache=True, nogil=True)
def _group_means_kernel(G, members, offsets, start, stop, out):
    """``out[b, c]`` = mean over ``members[offsets[b]:offsets[b+1]]`` of ``G[r, c]``,
    accumulated in float64, for start <= c < stop, one L1-sized tile of columns at a
    time (a tile of G is read from memory once, whatever the groups)."""
    acc = np.empty(_TILE, dtype=np.float64)
    for c0 in range(start, stop, _TILE):
        width = min(_TILE, stop - c0)
        for b in range(offsets.shape[0] - 1):
            for c in range(width):
                acc[c] = 0.0
            for k in range(offsets[b], offsets[b + 1]):
                src = G[members[k], c0:c0 + width]
                for c in range(width):
                    acc[c] += np.float64(src[c])
            inv = 1.0 / (offsets[b + 1] - offsets[b])
            o = out[b, c0:c0 + width]
            for c in range(width):
                o[c] = np.float32(acc[c] * inv)


def group_means(G: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """A (len(groups), d) float32 matrix: row b is the mean of the rows ``groups[b]`` of
    ``G`` (each non-empty), summed in float64 in the order given."""
    G = np.ascontiguousarray(G, dtype=np.float32)
    d = G.shape[1]
    members = np.ascontiguousarray(np.concatenate(groups), dtype=np.int64)
    offsets = np.zeros(len(groups) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(g) for g in groups])
    out = np.empty((len(groups), d), dtype=np.float32)
    if d == 0:
        return out
    chunks = max(1, min(torch.get_num_threads(), d // _MIN_COLUMNS_PER_THREAD))
    per_chunk = -(-d // chunks)
    step = -(-per_chunk // 64) * 64  # whole 64-column tiles per chunk
    bounds = [(s, min(s + step, d)) for s in range(0, d, step)]
    args = (G, members, offsets)
    futures = [_executor().submit(_group_means_kernel, *args, s, e, out) for s, e in bounds[1:]]
    _group_means_kernel(*args, *bounds[0], out)
    for future in futures:
        future.result()
    return out


@numba.njit(cache=True, nogil=True)
def _min_diameter_subset(D2, m):
    """The first subset (in lexicographic order) of ``m`` of the rows of ``D2`` whose
    largest pairwise value is smallest, by depth-first search with pruning: a partial
    subset whose diameter already reaches the best is not extended."""
    k = D2.shape[0]
    best = np.inf
    best_set = np.arange(m)
    idx = np.empty(m, dtype=np.int64)
    diam = np.zeros(m + 1)
    visited = 0
    t = 0
    idx[0] = -1
    while t >= 0:
        idx[t] += 1
        if idx[t] > k - (m - t):
            t -= 1
            continue
        visited += 1
        c = idx[t]
        dd = diam[t]
        for u in range(t):
            x = D2[idx[u], c]
            if x > dd:
                dd = x
        if dd >= best:  # no completion can be strictly better
            continue
        if t == m - 1:
            best = dd
            best_set[:] = idx
            continue
        diam[t + 1] = dd
        t += 1
        idx[t] = idx[t - 1]
    return best_set, best, visited


def min_diameter_subset(D2: np.ndarray, m: int) -> tuple[np.ndarray, float, int]:
    """(rows, squared diameter, search nodes visited) of the first subset of ``m`` rows
    in lexicographic order with the smallest diameter; ``D2`` finite squared distances."""
    return _min_diameter_subset(np.ascontiguousarray(D2, dtype=np.float64), int(m))


@numba.njit(cache=True, nogil=True)
def _centered_gram(K, idx, C):
    """``C`` = the centered Gram matrix H K[idx, idx] H of the rows ``idx`` (H = I - 11^T/m):
    its eigenvalues are those of their scatter matrix sum_i (x_i - mean)(x_i - mean)^T."""
    m = idx.shape[0]
    total = 0.0
    for a in range(m):
        s = 0.0
        for b in range(m):
            C[a, b] = K[idx[a], idx[b]]
            s += C[a, b]
        total += s
    total /= m * m
    for a in range(m):
        s = 0.0
        for b in range(m):
            s += C[a, b]
        ra = s / m
        for b in range(m):
            C[a, b] -= ra
    for b in range(m):
        s = 0.0
        for a in range(m):
            s += C[a, b]
        rb = s / m - total
        for a in range(m):
            C[a, b] -= rb + total
    for a in range(m):  # exactly symmetric for the eigensolver
        for b in range(a):
            x = 0.5 * (C[a, b] + C[b, a])
            C[a, b] = x
            C[b, a] = x


@numba.njit(cache=True, nogil=True)
def _all_below(C, bound, L):
    """Whether every eigenvalue of the symmetric ``C`` is below ``bound``: a Cholesky
    factorisation of bound*I - C (in ``L``) succeeds. Far cheaper than the eigenvalues."""
    m = C.shape[0]
    for j in range(m):
        s = bound - C[j, j]
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not s > 0.0:
            return False
        ljj = np.sqrt(s)
        L[j, j] = ljj
        for i in range(j + 1, m):
            t = -C[i, j]
            for k in range(j):
                t -= L[i, k] * L[j, k]
            L[i, j] = t / ljj
    return True


@numba.njit(cache=True, nogil=True)
def _min_eigen_subset(K, D2, m, rtol):
    """The first subset (lexicographic order) of ``m`` rows whose scatter matrix has the
    smallest largest eigenvalue, by depth-first search; a subset replaces the best one
    only if its eigenvalue is below ``best - rtol * |best|`` (within that margin the two
    tie, and the earlier wins).  Pruning: for rows i, j of a partial subset P,
    lambda_max(scatter(P)) >= ||x_i - x_j||^2 / 2, and the scatter only grows (in the PSD
    order) as rows are added, so a partial subset whose bound reaches that bar is not
    extended; a complete one is first tested with a Cholesky factorisation (is every
    eigenvalue below the bar?) and only then solved."""
    k = K.shape[0]
    best = np.inf
    bar = np.inf
    best_set = np.arange(m)
    idx = np.empty(m, dtype=np.int64)
    diam = np.zeros(m + 1)
    C = np.empty((m, m))
    L = np.empty((m, m))
    solved = 0
    t = 0
    idx[0] = -1
    while t >= 0:
        idx[t] += 1
        if idx[t] > k - (m - t):
            t -= 1
            continue
        c = idx[t]
        dd = diam[t]
        for u in range(t):
            x = D2[idx[u], c]
            if x > dd:
                dd = x
        if 0.5 * dd >= bar:
            continue
        if t == m - 1:
            _centered_gram(K, idx, C)
            if bar < np.inf and not _all_below(C, bar, L):
                continue
            solved += 1
            lam = np.linalg.eigvalsh(C)[m - 1]
            if lam < bar:
                best = lam
                bar = best - rtol * abs(best)
                best_set[:] = idx
            continue
        diam[t + 1] = dd
        t += 1
        idx[t] = idx[t - 1]
    return best_set, best, solved


def min_eigen_subset(K: np.ndarray, D2: np.ndarray, m: int,
                     rtol: float = 0.0) -> tuple[np.ndarray, float, int]:
    """(rows, largest eigenvalue of their scatter matrix, eigenproblems solved) of
    the first subset of ``m`` rows in lexicographic order minimising that eigenvalue, a
    later subset replacing the best only if below it by more than ``rtol`` of it; ``K``
    the rows' (finite) Gram matrix and ``D2`` their squared distances."""
    return _min_eigen_subset(np.ascontiguousarray(K, dtype=np.float64),
                             np.ascontiguousarray(D2, dtype=np.float64), int(m),
                             float(rtol))
