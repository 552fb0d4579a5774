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

Large inputs are split into column chunks run on ``torch.get_num_threads()`` threads
(``threads.run_chunked``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from common.learn.rules.kernels.threads import run_chunked

REGISTER_MAX_N = 50  # first-use compile time grows fast with n: about 5 s at n = 50
_DEAD = -1  # pruning label: the value at this position is not read
_UNIQUE = -2  # pruning label: the exact value at this position is read
_SCRATCH_BYTES = 32768  # scratch tiles are sized to stay in L1


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
"""{title}; generated by common.learn.rules.kernels, do not edit."""

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


# ------------------------------------------------------------------------ the rules' entry points


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
        return run_chunked(generated_kernel(n, "median", n), (G, rows), d, 64)
    prog = scratch_program(n, median_labels(n))
    width = tile_width(n)
    return run_chunked(_scratch_median, (G, rows, prog.ops, prog.final, width), d, width)


def coordinate_trimmed_mean(G: np.ndarray, q: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Per coordinate, the mean of ``G[rows]`` without its ``q`` smallest and ``q`` largest."""
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    m = n - 2 * q
    if n <= REGISTER_MAX_N:
        return run_chunked(generated_kernel(n, "trim", m), (G, rows), d, 64)
    prog = scratch_program(n, [0 if q <= j < n - q else _DEAD for j in range(n)])
    width = tile_width(n)
    args = (G, rows, prog.ops, prog.final, m, q, width)
    return run_chunked(_scratch_window, args, d, width)


def coordinate_window_mean(G: np.ndarray, m: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Per coordinate, the mean of the ``m`` values of ``G[rows]`` nearest to their median.

    Ties in distance keep the lower value (see ``_window_reduce``).
    """
    G, rows = _prepare(G, rows)
    n, d = rows.shape[0], G.shape[1]
    if n <= REGISTER_MAX_N:
        return run_chunked(generated_kernel(n, "window", m), (G, rows), d, 64)
    prog = scratch_program(n, window_labels(n, m))
    width = tile_width(n)
    args = (G, rows, prog.ops, prog.final, m, -1, width)
    return run_chunked(_scratch_window, args, d, width)
