"""Row reductions: per-row squared distances, weighted sums of rows, means of groups of
rows (centered clipping, CAF, ARC, bucketing, NNM; the means of MDA's and SMEA's subsets).

Sums over columns are taken over fixed blocks of ``_ROW_BLOCK`` columns, added in block
order, so a result never depends on the number of threads that computed it.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from common.learn.rules.kernels.threads import MIN_COLUMNS_PER_THREAD, executor, run_chunked

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
    threads = max(1, min(torch.get_num_threads(), d // MIN_COLUMNS_PER_THREAD, blocks))
    per = -(-blocks // threads)
    ranges = [(b, min(b + per, blocks)) for b in range(0, blocks, per)]
    args = (G, vv, use_v, _ROW_BLOCK)
    futures = [executor().submit(_row_sq_distance_blocks, *args, b0, b1, partial)
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
    return run_chunked(_shift_kernel, (G, v, rows, w), G.shape[1], 64)


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
    return run_chunked(_group_means_kernel, (G, members, offsets), d, 64, out)


@numba.njit(cache=True, nogil=True)
def _nonfinite_kernel(G, edges, out):
    """``out[k]``: the values of ``G``'s columns ``edges[k]:edges[k + 1]`` that are NaN or
    an infinity (all exponent bits set), counted on the bits (a loop that vectorises)."""
    exponent = np.uint32(0x7F800000)
    for k in range(edges.shape[0] - 1):
        total = 0
        for i in range(G.shape[0]):
            row = G[i, edges[k]:edges[k + 1]].view(np.uint32)
            for c in range(row.shape[0]):
                total += np.int64((row[c] & exponent) == exponent)
        out[k] = total


def nonfinite_counts(G: np.ndarray, blocks: list[tuple[int, int]]) -> list[int]:
    """The NaN and infinite values of the (n, d) float32 matrix ``G`` in each column block
    ``(a, b)`` of ``blocks`` (contiguous, in order), in one pass that allocates nothing
    of G's size (``np.isfinite`` makes an n x d mask: 53 MB a round at d = 2.6M, n = 20)."""
    G = np.ascontiguousarray(G, dtype=np.float32)
    edges = np.array([blocks[0][0], *(b for _, b in blocks)], dtype=np.int64)
    out = np.zeros(len(blocks), dtype=np.int64)
    _nonfinite_kernel(G.reshape(-1, G.shape[-1]), edges, out)
    return out.tolist()
