"""Inner products of stored vectors with one query, on the calling thread alone.

``matrix @ vector`` in numpy goes to OpenBLAS, which splits a large product across its threads,
and those threads then spin, waiting for more work, long after the call: measured in a process
ingesting one stored message after another, a second core was busy for 29 ms of every 31 ms
message, taken from the model's thread, the database's and the event loop. narrmem's products are
one query against stored rows, where a second thread saves little: FAISS's single-threaded SIMD
kernel (FAISS is already narrmem's vector index) computes them without touching any thread pool,
and faster than one-thread BLAS. Process-wide BLAS settings, which are the embedding
application's, stay as they are.
"""

from __future__ import annotations

import faiss
import numpy as np


def inner_products(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``rows @ query`` as float32: ``rows`` is (n, d), ``query`` is (d,). Mapped, read-only rows
    are read in place."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    query = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
    if rows.ndim != 2 or rows.shape[1] != query.shape[0]:
        raise ValueError(f"cannot multiply rows of shape {rows.shape} by a vector of {query.shape[0]}")
    out = np.empty(len(rows), dtype=np.float32)
    if len(rows):
        faiss.fvec_inner_products_ny(  # type: ignore[attr-defined]
            faiss.swig_ptr(out),
            faiss.swig_ptr(query),
            faiss.swig_ptr(rows),
            query.shape[0],
            len(rows),
        )
    return out
