"""Effective attention of a decoder (``causal=True`` of
:func:`attnlens.engine.effective.effective_attention`): each row projected onto the values of the
keys its query reads.

On a decoder (``causal=True``; the model-level functions pass
:func:`attnlens.core.loading.is_causal`) query ``q`` reads only the keys ``k ≤ q``, so its row is
projected onto the column space of ``V_≤q``, the values of the valid keys up to ``q``: the causal
extension of Brunner et al. 2020 / Sun & Marasović 2021's projection to the keys a query can read,
the minimum-norm row among those the query could use that gives the same output,

``A⊥[q, :q+1] = V_≤q G_q⁺ o_q``, ``G_q = V_≤qᵀ V_≤q = Σ_{valid k ≤ q} v_k v_kᵀ``, ``o_q = (A V)_q``,

and ``A⊥[q, k] = 0`` for ``k > q``. Then ``A⊥`` is lower-triangular and ``A⊥ V = A V`` row by row
from the keys each query reads; a row does not depend on later tokens (the map of a text is the
leading block of the map of any longer text that starts with it). Projecting onto all of a
sequence's values instead (``causal=False`` on a decoder) puts weight, up to 0.3 to 0.4 absolute,
on keys after the query. ``G_q⁺`` keeps a direction when its singular value exceeds
``rtol · σ_max`` of that row's ``V_≤q`` (default ``max(n_q, d_head) · eps``, ``n_q`` the valid
keys up to ``q``). Routes, each row taking the first certified for it:

- rows whose distinct values (at most ``d_head``) are certified independent: each weight
  averaged over the exact copies of its value among the keys the row reads (:func:`_grouped`;
  then ``V_≤q``'s column space is the vectors constant on each set of copies), so a row without
  repeated values keeps its row exactly. Copies come from an integer hash of the values' bits
  and an entry-by-entry check (:func:`_repeats`); one float64 Cholesky factorisation of the
  ``key x key`` Gram matrix of each head's first ``d_head`` distinct values certifies every
  prefix (:func:`_distinct_prefixes_independent`; the values before a dependent one are
  certified on their own). A RoPE decoder's first layer gives each distinct token one value:
  SmolLM2-135M on 8 texts of 128 tokens has repeated values in 5,769 of its 9,216 first-layer
  rows, which all took the exact rule before, about half of the causal route's time; 765 do now;
- the other rows past ``d_head``, :data:`CAUSAL_BLOCK` at a time (:func:`_block`): one float64 Cholesky
  factorisation of the first row's Gram matrix ``G_f``, the later rows' ``G_q = G_f + U_jᵀU_j``
  (the ``j`` keys since) solved by the Woodbury identity, whose small ``j x j`` systems are the
  leading blocks of one matrix and share its Cholesky factor; certified when every singular
  value passes the tolerance (``σ_min(V_≤q)² ≥ 1 / ‖L_f⁻¹‖_F²``, since ``G_q`` only grows with
  ``q``, and ``σ_max² ≤ trace G_q``; at least :data:`GRAM_MIN_RTOL`, :data:`CAUSAL_QR_CERTIFY`
  for the QR route's inputs);
- the others (rank-deficient or badly conditioned prefixes): the exact rule on the row's own
  ``V_≤q``, the float64 eigendecomposition of ``G_q`` (the QR route's QR and SVD for float64
  inputs or a tiny ``rtol``); on the CPU, or off it for heads wider than :data:`attnlens.engine.effective.NO_READ_WIDTH`,
  after one read of which rows need it (one a call, as the other routes), for those rows alone,
  else for every row, taken where needed (``torch.where``, no read).

Every certificate and factorisation depends on the values alone, so with grouped key-value
heads (``v`` of ``[batch, kv_head, key, d_head]``) each is made once per key-value head, for the
query heads that read it (a group axis in the products).

The cost is a few ``d_head²`` products a row and one factorisation a block, against one
decomposition a head without ``causal``: on a CPU (1 thread, ``benchmarks/effective_causal.py``,
random values: no copies, whose search costs 6-14% of a call) 3.3x the non-causal call on
SmolLM2-sized heads with 9 value heads (``[8, 9, 128, 128]``, ``d_head = 64``: 39 ms against 12
ms), 2.1x with SmolLM2's 3 key-value heads (24 ms), 5.6x on MiniLM-sized ones (``d_head = 32``);
``effective.run`` of SmolLM2-135M on 8 texts of 128 tokens 1.35x its full forward (3.36x measured
the same day before copies were averaged, the CPU took
:data:`attnlens.engine.bases.CAUSAL_CPU_BYTES` of rows at a time and key-value heads were shared). ``padded=True`` takes every
position up to ``q``, padding included.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import devices
from attnlens.engine import bases
from attnlens.engine.bases import (
    GRAM_MIN_RTOL,
    cholesky_inverse_factor,
    inverse_factor,
    single_threaded,
)

#: query rows the causal route solves from one Cholesky factorisation (:func:`_block`)
CAUSAL_BLOCK = 32
#: bytes of float64 matrices the causal route's exact rule forms at once, on the CPU and off it
CAUSAL_CHUNK_BYTES = (2**27, 2**30)
#: tolerance below which the causal route's float64 Cholesky solve is not trusted for float64
#: inputs (or ``rtol`` below :data:`GRAM_MIN_RTOL`): a row whose values are worse conditioned
#: (about ``1 / CAUSAL_QR_CERTIFY``) takes the QR route instead, so its error stays near 1e-10
CAUSAL_QR_CERTIFY = 1e-3


def causal_effective_attention(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch kv_head key d_head"],
    valid: Bool[Tensor, "batch key"],
    rtol: float | None,
    use_qr: bool,
    *,
    every: bool = False,
) -> Float[Tensor, "batch head query key"]:
    """:func:`attnlens.engine.effective.effective_attention` with ``causal=True``: row ``q`` projected onto the column space
    of ``V_≤q``, the values of the valid keys ``k ≤ q`` (see "Causal models" in the module docstring).

    Rows whose distinct values are certified independent are averaged over the copies of each
    value (:func:`_grouped`: a row without repeated values keeps its row); the others,
    :data:`CAUSAL_BLOCK` at a time, are
    solved in float64, ``A⊥[q, :q+1] = V_≤q G_q⁻¹ o_q`` with ``G_q = V_≤qᵀ V_≤q`` and
    ``o_q = a_q V``, from one Cholesky factorisation a block that certifies every singular value
    above the tolerance (:func:`_block`); the rest (rank-deficient or badly conditioned
    prefixes) get the exact rule, :func:`_causal_exact`. On the CPU, or off it without ``every``, one
    read says which rows need that rule (only those get it); with ``every`` (off the CPU, heads up
    to :data:`attnlens.engine.effective.NO_READ_WIDTH` wide) every row's is computed and taken
    where needed (``torch.where``: no read)."""
    device = pattern.device
    if device.type == "mps":  # no float64 on MPS: on the CPU
        return causal_effective_attention(pattern.cpu(), v.cpu(), valid.cpu(), rtol, use_qr, every=every).to(device)
    batch, n_kv, n_keys, d_head = v.shape
    n_heads = pattern.shape[1]
    group = n_heads // n_kv  # query heads a key-value head serves (HF's repeat_kv order)
    free = devices.reads_are_free(pattern)
    eps = torch.finfo(torch.promote_types(v.dtype, torch.float32)).eps
    visible = valid[:, None, :] & torch.ones(n_keys, n_keys, dtype=torch.bool, device=device).tril()
    counts = visible.sum(-1)  # [batch, query]: the keys row q reads
    if rtol is None:  # NumPy's rule on each row's V_≤q: max(n_q, d_head) · eps
        tolerance = counts.clamp_min(d_head).to(torch.float64) * eps
    else:
        tolerance = torch.full(counts.shape, float(rtol), dtype=torch.float64, device=device)
    # [batch, kv_head, group, query, key]: each row on the keys it reads; every certificate
    # depends on the values alone, so it is made once for the query heads of a key-value head
    kept = pattern.masked_fill(~visible[:, None], 0).unflatten(1, (n_kv, group))
    rows64 = kept.double()
    v64 = v.double() * valid[:, None, :, None]
    short = counts <= d_head
    # rows whose distinct values are certified independent: each weight averaged over the copies
    # of its value (a row without repeated values keeps its row exactly)
    copy, exact = _repeats(v, valid)
    order = torch.arange(n_keys, device=device)
    distinct = valid[:, None, :] & (copy == order)
    n_distinct = distinct.cumsum(-1)  # [batch, kv_head, query]: the distinct values row q reads
    inexact = (~exact).cumsum(-1) > 0  # a row reads a key grouped with a copy that is not exact
    trace = (v64.square().sum(-1)).cumsum(-1)  # trace G_q (padded keys' values are 0)
    bound = tolerance.clamp_min(GRAM_MIN_RTOL) ** 2
    keep = ~inexact & _distinct_prefixes_independent(v64, distinct, n_distinct, trace, bound)
    # a certified Cholesky solve: errors of about eps64 · κ(V)², trusted to κ ~ 1e6 (1e3 for the
    # QR route's inputs: float64 values, a tiny rtol)
    floor = CAUSAL_QR_CERTIFY if use_qr else GRAM_MIN_RTOL
    solved = torch.zeros_like(keep)
    if free:  # the sequences with a repeated value alone (a row without one keeps its weights)
        out = kept.clone()
        repeated = (~distinct & valid[:, None, :]).any(-1).any(-1).nonzero().squeeze(-1)
        if len(repeated):
            out[repeated] = _grouped(rows64[repeated], copy[repeated, :, None], visible[repeated, None, None]).to(pattern.dtype)
    else:
        out = _grouped(rows64, copy[:, :, None], visible[:, None, None]).to(pattern.dtype)
    start = 0 if every else min(d_head, n_keys)  # a row before d_head reads at most d_head keys
    base = v64[:, :, :start].mT @ v64[:, :, :start]  # G of the keys before the first row solved
    for first in range(start, n_keys, CAUSAL_BLOCK):
        last = min(n_keys, first + CAUSAL_BLOCK)
        result, certified, base = _block(rows64, v64, base, first, last,
                                         tolerance[:, None, first:last].clamp_min(floor) ** 2)
        certified &= ~(short[:, None, first:last] | keep[:, :, first:last])
        result = result * visible[:, None, None, first:last]
        chunk = torch.where(certified[:, :, None, :, None], result.to(pattern.dtype), out[..., first:last, :])
        if every:
            exact = _causal_exact(
                rows64[..., first:last, :].transpose(2, 3), v64[:, :, None].expand(-1, -1, last - first, -1, -1),
                visible[:, None, first:last].expand(-1, n_kv, -1, -1),
                tolerance[:, None, first:last].expand(-1, n_kv, -1), use_qr,
            ).transpose(2, 3)
            needed = ~(certified | keep[:, :, first:last])
            chunk = torch.where(needed[:, :, None, :, None], exact.to(pattern.dtype), chunk)
        out[..., first:last, :] = chunk
        solved[:, :, first:last] = certified
    if every:
        return out.flatten(1, 2)
    needed = (~(keep | solved)).nonzero()  # the one read: rows for the exact rule
    per_row = n_keys * d_head * 8 * 4
    step = max(1, CAUSAL_CHUNK_BYTES[0 if free else 1] // per_row)
    for first in range(0, needed.shape[0], step):
        examples, heads, queries = needed[first:first + step].unbind(-1)
        exact = _causal_exact(
            rows64[examples, heads, :, queries], v64[examples, heads], visible[examples, queries],
            tolerance[examples, queries], use_qr,
        )
        out[examples, heads, :, queries] = exact.to(pattern.dtype)
    return out.flatten(1, 2)


def _block(
    rows64: Float[Tensor, "batch kv_head group query key"],
    v64: Float[Tensor, "batch kv_head key d_head"],
    base: Float[Tensor, "batch kv_head d_head d_head"],
    first: int,
    last: int,
    bound: Float[Tensor, "batch #kv_head row"],
) -> tuple[Float[Tensor, "batch kv_head group row key"], Bool[Tensor, "batch kv_head row"],
           Float[Tensor, "batch kv_head d_head d_head"]]:
    """Rows ``first .. last - 1`` solved from one Cholesky factorisation: ``V_≤q G_q⁻¹ o_q`` for
    each, with ``G_q = G_f + U_jᵀ U_j`` (``G_f`` the Gram matrix of row ``first``'s keys, ``U_j``
    the values of the ``j`` keys after it up to ``q``) by the Woodbury identity,
    ``G_q⁻¹ o = z − Y_j M_j⁻¹ U_j z`` with ``z = G_f⁻¹ o``, ``Y = G_f⁻¹ Uᵀ`` and ``M = I + U Y``,
    whose leading ``j x j`` blocks ``M_j`` share the Cholesky factor of ``M`` (a forward solve
    cut to its first ``j`` entries, then a back solve). Certified (the second value) where both
    factorisations succeed and every singular value of ``V_≤q`` passes the tolerance:
    ``σ_min(V_≤q)² ≥ σ_min(V_≤first)² ≥ 1 / ‖L_f⁻¹‖_F²`` (``G_q`` only grows with ``q``) and
    ``σ_max² ≤ trace G_q``, against ``bound`` (the squared tolerance of each row). The third value
    is the Gram matrix of the keys up to ``last - 1``, the next block's ``base``."""
    head = v64[:, :, first]
    gram = base + head[..., :, None] * head[..., None, :]  # G_f
    after = v64[:, :, first + 1:last]  # U: [batch, kv_head, m, d_head], m = rows - 1
    outputs = rows64[..., first:last, :] @ v64[:, :, None]  # o_q = a_q V: [batch, kv_head, group, rows, d_head]
    m, width = after.shape[2], last - first
    with single_threaded(gram.device):
        factor, info = torch.linalg.cholesky_ex(gram)
        z = torch.cholesky_solve(outputs.mT, factor[:, :, None])  # G_f⁻¹ o_q: [.., group, d_head, rows]
        y = torch.cholesky_solve(after.mT, factor)  # G_f⁻¹ Uᵀ: [batch, kv_head, d_head, m]
        inverse = inverse_factor(factor)  # L_f⁻¹, for the certificate
        correction = after @ y
        correction.diagonal(dim1=-2, dim2=-1).add_(1.0)  # M = I + U Y: [batch, kv_head, m, m]
        small, small_info = torch.linalg.cholesky_ex(correction)
        # row j (0 .. rows - 1) uses the first j keys after row first: U_j z_j, solved with M_j
        reads = torch.arange(m, device=gram.device)[:, None] < torch.arange(width, device=gram.device)[None, :]
        forward = torch.linalg.solve_triangular(small[:, :, None], (after[:, :, None] @ z) * reads, upper=False) * reads
        solved = torch.linalg.solve_triangular(small.mT[:, :, None], forward, upper=True)  # M_j⁻¹ U_j z_j
    coefficients = z - y[:, :, None] @ solved  # G_q⁻¹ o_q: [batch, kv_head, group, d_head, rows]
    result = (v64[:, :, None] @ coefficients).mT  # [.., group, rows, key]; cut to the visible keys by the caller
    norms = after.square().sum(-1)  # each later key's contribution to the trace
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None] + torch.nn.functional.pad(norms.cumsum(-1), (1, 0))
    inverse_norm2 = inverse.square().sum(dim=(-2, -1))[..., None]
    certified = (info == 0)[..., None] & (small_info == 0)[..., None] & (inverse_norm2 * trace * bound < 1.0)
    return result, certified, gram + after.mT @ after


def hash_weights(d_head: int, device: torch.device | str = "cpu") -> Int[Tensor, "d_head 2"]:
    """The fixed weights of :func:`_repeats`' hash, one for each half (32 bits) of each entry's
    bits: a Weyl sequence (multiples of Knuth's 2654435761 modulo ``top - 1``, plus 1) below
    ``top = 2⁶² / (2 · d_head · 2³²)``, so that the sum cannot overflow; made on ``device`` (no
    copy from the host)."""
    top = max(2, 2**62 // (2 * d_head * 2**32))
    steps = torch.arange(1, 2 * d_head + 1, device=device, dtype=torch.int64)
    return ((steps * 2654435761) % (top - 1) + 1).reshape(d_head, 2)


def _repeats(
    v: Float[Tensor, "batch kv_head key d_head"],
    valid: Bool[Tensor, "batch key"],
) -> tuple[Int[Tensor, "batch kv_head key"], Bool[Tensor, "batch kv_head key"]]:
    """Each key's first copy: the index of the first valid key with exactly the same value
    vector (the key itself when none before it has; an invalid key its own), and whether each
    key's value equals that copy's exactly. Candidates are the keys of equal hashes, an integer
    sum of the values' bits (32 at a time, each times a fixed weight, :func:`hash_weights`:
    exact, so equal values always hash equal, whatever the order of summation), found by one
    stable sort of the hashes; each key is then compared entry by entry
    with its candidate, so a key is grouped only with exact copies (a candidate that is not one
    is flagged, and the rows that read it take another route)."""
    batch, n_heads, n_keys, d_head = v.shape
    given = (v + 0.0).contiguous()  # + 0.0: -0.0 as 0.0
    if given.element_size() == 8:
        bits = given.view(torch.int64)
        pieces = torch.stack([bits & 0xFFFFFFFF, (bits >> 32) & 0xFFFFFFFF], dim=-1)
    else:  # 16 or 32 bits an entry: one piece
        width = given.element_size() * 8
        bits = given.view({16: torch.int16, 32: torch.int32}[width]).to(torch.int64)
        pieces = (bits & (2**width - 1))[..., None]
    weights = hash_weights(d_head, v.device)[:, : pieces.shape[-1]]
    hashed = (pieces * weights).sum((-2, -1))  # [batch, head, key], >= 0
    order = torch.arange(n_keys, device=v.device)
    hashed = torch.where(valid[:, None, :], hashed, -1 - order)  # an invalid key matches no other
    ranked, position = torch.sort(hashed, dim=-1, stable=True)  # equal hashes adjacent, in key order
    starts = torch.ones_like(ranked, dtype=torch.bool)
    starts[..., 1:] = ranked[..., 1:] != ranked[..., :-1]
    start = torch.where(starts, order, 0).cummax(-1).values  # the slot where each run of equals starts
    copy = torch.empty_like(position).scatter_(-1, position, position.gather(-1, start))
    exact = (v.gather(2, copy[..., None].expand(-1, -1, -1, d_head)) == v).all(-1)
    return copy, exact


def _grouped(
    rows64: Float[Tensor, "*head query key"],
    copy: Int[Tensor, "*#head key"],
    visible: Bool[Tensor, "*#head query key"],
) -> Float[Tensor, "*head query key"]:
    """Each row's weights averaged over the copies of a value among the keys it reads:
    ``A⊥[q, k] = mean of a_q over the keys j ≤ q whose value is k's``, the projection of ``a_q``
    onto the vectors constant on each set of copies, which is ``a_q``'s projection onto the column
    space of ``V_≤q`` when the distinct values are linearly independent (then that column space
    is exactly those vectors). A row with no repeated value keeps its weights exactly.
    ``copy`` (each key's first copy, :func:`_repeats`) and ``visible`` broadcast to the rows."""
    index = copy[..., None, :].expand_as(rows64)
    sums = torch.zeros_like(rows64).scatter_add_(-1, index, rows64)  # [.., query, first copy]
    counts = torch.zeros_like(rows64).scatter_add_(-1, index, visible.to(rows64.dtype).expand_as(rows64))
    return (sums.gather(-1, index) / counts.gather(-1, index).clamp_min(1.0)) * visible


def _distinct_prefixes_independent(
    v64: Float[Tensor, "batch kv_head key d_head"],
    distinct: Bool[Tensor, "batch kv_head key"],
    n_distinct: Int[Tensor, "batch kv_head query"],
    trace: Float[Tensor, "batch kv_head query"],
    bound: Float[Tensor, "batch query"],
) -> Bool[Tensor, "batch kv_head query"]:
    """Whether the first ``n_distinct[b, h, q]`` (at most ``d_head``) distinct values of a row are
    certified linearly independent with every singular value of ``V_≤q`` above the row's
    tolerance (True for a row that reads none; ``bound`` its squared tolerance, ``trace`` the
    trace of its ``G_q``).

    ``V_≤q = E U`` (``U`` the distinct values in order, ``E`` which copy each key is), so
    ``V_≤qᵀ V_≤q = Uᵀ D U`` with ``D ≥ I`` the copies' counts: ``σ_min(V_≤q)² ≥ σ_min(U)²``.
    The ``key x key`` Gram matrix ``H`` of the first ``d_head`` distinct values in float64 is
    factored ``H = L Lᵀ``; the leading ``m x m`` block of ``L`` factors that of ``H``, so one
    factorisation certifies every prefix: ``σ_min(U_m)² ≥ 1 / ‖L_m⁻¹‖_F²`` (the first ``m`` rows
    of ``L⁻¹``) and ``σ_max(V_≤q)² ≤ trace G_q``. A factorisation stops at the first prefix that
    is not positive definite (LAPACK's ``info``); the values before it are factored again on
    their own (the rest decoupled by unit rows), so the rows before a dependent value still pass."""
    batch, n_heads, n_keys, d_head = v64.shape
    width = min(d_head, n_keys)
    first = torch.sort(distinct.to(torch.uint8), dim=-1, descending=True, stable=True).indices[..., :width]
    values = v64.gather(2, first[..., None].expand(batch, n_heads, width, d_head))
    slots = distinct.gather(2, first)  # [batch, head, width]
    gram = values @ values.mT  # [batch, head, width, width]; empty slots' rows are 0
    diagonal = gram.diagonal(dim1=-2, dim2=-1)
    largest = diagonal.amax(-1, keepdim=True)
    scale = torch.where(largest > 0, largest, 1.0)

    def decoupled(kept: Tensor) -> Tensor:
        """``gram`` on the ``kept`` slots, a unit row of its own (at the scale of the largest)
        for each other one."""
        out = gram * (kept[..., :, None] & kept[..., None, :])
        out.diagonal(dim1=-2, dim2=-1).add_(~kept * scale)
        return out

    with single_threaded(gram.device):
        _, info = torch.linalg.cholesky_ex(decoupled(slots))
    order = torch.arange(width, device=gram.device)
    proven = order < torch.where(info > 0, info - 1, width)[..., None]  # the prefix factored
    factor_inv, info = cholesky_inverse_factor(decoupled(slots & proven))
    inverse_norm2 = (factor_inv**2).sum(-1).cumsum(-1)  # ‖L_m⁻¹‖_F², m = 1 … width
    index = (n_distinct - 1).clamp(0, width - 1)
    certified = (info == 0)[..., None] & proven.gather(2, index) & (
        inverse_norm2.gather(2, index) * trace * bound[:, None] < 1.0)
    return (certified & (n_distinct <= width)) | (n_distinct == 0)


def _causal_exact(
    rows: Float[Tensor, "*row group key"],
    v64: Float[Tensor, "*row key d_head"],
    visible: Bool[Tensor, "*row key"],
    tolerance: Float[Tensor, "*row"],
    use_qr: bool,
) -> Float[Tensor, "*row group key"]:
    """Rows of the causal route by the exact rule, each projected onto the column space of its
    own visible values (one basis for the ``group`` query heads of a key-value head): the
    eigendecomposition of the float64 Gram matrix (as the exact route), or float64 QR and an SVD
    of ``R`` (as the QR route) for float64 inputs or a tiny ``rtol``."""
    shape, n_keys, d_head = rows.shape, v64.shape[-2], v64.shape[-1]
    values = (v64 * visible[..., None]).reshape(-1, n_keys, d_head)
    tolerance = tolerance.reshape(-1)
    if use_qr:
        basis = bases.basis_qr(values, tolerance) * visible.reshape(-1, n_keys, 1)
    else:
        basis = bases.eigen_basis(values, values.mT @ values, tolerance)
    projected = (rows.reshape(-1, shape[-2], n_keys) @ basis) @ basis.mT
    return projected.reshape(shape)
