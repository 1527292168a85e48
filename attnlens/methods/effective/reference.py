"""Slow reference for effective attention: a per-(example, head) NumPy float64 SVD loop.

Written from the paper's definition (Brunner et al. 2020, Sec. 4; Sun & Marasović 2021), for tests
and the benchmark only; use :func:`attnlens.effective_attention` for real work. For each example
and head: restrict ``V`` to the valid keys, ``U, S, Wt = svd(V_valid)``, keep the left singular
vectors with ``S > tol · S.max()``, ``P = U_r U_rᵀ`` and ``A⊥ = A_valid P`` on the valid
(query, key) block. Entries outside that block are 0 (the reference has no padding).

``causal=True`` (a decoder): row by row, ``V_≤q`` is ``V`` on the valid keys ``k ≤ q``,
``U, S, Wt = svd(V_≤q)`` with the same rule (``max(n_q, d_head) · eps``, ``n_q`` the keys row ``q``
reads), and ``A⊥[q, :q+1] = a_q U_r U_rᵀ`` on those keys, 0 after ``q``.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float
from torch import Tensor


def effective_attention_loop(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch kv_head key d_head"],
    key_mask: Bool[Tensor, "batch key"],
    *,
    rtol: float | None = None,
    eps: float = float(np.finfo(np.float32).eps),
    causal: bool = False,
) -> Float[np.ndarray, "batch head query key"]:
    """``A⊥`` on each sequence's valid block, one NumPy float64 SVD per (example, head), or per
    (example, head, query) with ``causal=True``. ``v`` per head, or per key-value head with
    grouped heads (query head ``h`` reads ``h // (head / kv_head)``, as
    :func:`attnlens.engine.effective.effective_attention`).

    ``rtol`` default: ``max(n_valid, d_head) · eps`` (NumPy's ``matrix_rank`` rule), with ``eps``
    the machine epsilon of the dtype the activations were computed in (float32 by default).
    """
    attention = pattern.detach().cpu().double().numpy()
    values = v.detach().cpu().double().numpy()
    values = np.repeat(values, attention.shape[1] // values.shape[1], axis=1)  # each query head's
    valid = key_mask.detach().cpu().numpy().astype(bool)
    out = np.zeros_like(attention)
    if causal:
        return _causal_loop(attention, values, valid, out, rtol, eps)
    for example in range(attention.shape[0]):
        keys = np.flatnonzero(valid[example])
        if keys.size == 0:  # an all-padding example: nothing is valid, A⊥ is 0
            continue
        block = np.ix_(keys, keys)
        for head in range(attention.shape[1]):
            v_valid = values[example, head][keys]
            u, s, _ = np.linalg.svd(v_valid, full_matrices=False)
            tol = (max(v_valid.shape) * eps if rtol is None else rtol) * s.max()
            u_r = u[:, s > tol]
            projector = u_r @ u_r.T
            out[example, head][block] = attention[example, head][block] @ projector
    return out


def _causal_loop(
    attention: np.ndarray, values: np.ndarray, valid: np.ndarray, out: np.ndarray, rtol: float | None, eps: float
) -> np.ndarray:
    """The causal reference: each valid query row ``q`` projected onto the column space of the
    values of the valid keys ``k ≤ q`` (one SVD per example, head and query)."""
    for example in range(attention.shape[0]):
        for query in np.flatnonzero(valid[example]):
            keys = np.flatnonzero(valid[example, : query + 1])
            for head in range(attention.shape[1]):
                v_seen = values[example, head][keys]
                u, s, _ = np.linalg.svd(v_seen, full_matrices=False)
                tol = (max(v_seen.shape) * eps if rtol is None else rtol) * s.max()
                u_r = u[:, s > tol]
                out[example, head, query, keys] = attention[example, head, query, keys] @ u_r @ u_r.T
    return out
