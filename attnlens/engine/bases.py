"""Orthonormal bases of the column space of value matrices, and their certificates: the routes
of effective attention (:mod:`attnlens.engine.effective`, :mod:`attnlens.engine.effective_causal`).

Each function takes a stack of matrices (a leading ``matrix`` axis: every example and head of a
batch) and works on their device:

- :func:`basis_refined`: float32 Cholesky QR with one refinement step, and which matrices it
  certifies (:func:`full_rank_certified`: every singular value above the tolerance, from the
  Cholesky factor alone);
- :func:`basis_exact` / :func:`eigen_basis`: the float64 rule from the Gram matrix's
  eigendecomposition, over the eigenpairs the tolerance keeps;
- :func:`basis_qr`: float64 QR and an SVD of ``R``, for float64 inputs or a tolerance below
  :data:`GRAM_MIN_RTOL`;
- :func:`cholesky_inverse_factor` / :func:`inverse_factor`: ``L⁻¹`` of each Gram matrix's
  Cholesky factor (from the matrix, or from the factor);
- :func:`single_threaded`: batched LAPACK calls on many tiny matrices with one CPU thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.core import devices

#: smallest ``rtol`` the refined and exact routes resolve reliably; below it the QR route is used
GRAM_MIN_RTOL = 1e-6
#: bytes of float64 rows (``head x query x key``) a decoder's effective attention takes at once
#: on the CPU: a longer batch runs a few sequences at a time, so that its float64 matrices stay
#: in cache (the same numbers: each sequence's arithmetic is its own). Measured at 1 thread on
#: SmolLM2-135M's 30 layers stacked (``effective.run``, ``[240, 9, 128, 128]``): 2.8x faster than
#: all at once. The encoder's rule gains nothing from it (MiniLM's 6 layers stacked: 0.94x)
CAUSAL_CPU_BYTES = 2**24
#: largest orthogonality defect ``max |U₁ᵀU₁ − I|`` of the float32 first pass that the refined route
#: accepts; beyond it (measured: ``κ(V)`` above about 200) a head goes to the float64 exact route
REFINE_MAX_DEFECT = 1e-3


@contextlib.contextmanager
def single_threaded(device: torch.device) -> Iterator[None]:
    """Run batched LAPACK calls on many tiny matrices with one CPU thread.

    Torch calls LAPACK once per matrix; with several threads each call may open a parallel region,
    which costs little on an idle machine but up to a scheduler time slice per matrix on a busy
    one (measured: a batch of 384 triangular solves 0.8 s with 2 threads vs 4 ms with 1).
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def cholesky_inverse_factor(gram: Tensor) -> tuple[Tensor, Tensor]:
    """``L⁻¹`` for the Cholesky factor ``gram = L Lᵀ`` of each matrix, and LAPACK's ``info``."""
    with single_threaded(gram.device):
        factor, info = torch.linalg.cholesky_ex(gram)
        return inverse_factor(factor), info


def inverse_factor(factor: Tensor) -> Tensor:
    """``L⁻¹`` of each lower-triangular Cholesky factor ``L`` (a triangular solve of ``I``)."""
    eye = torch.eye(factor.shape[-1], dtype=factor.dtype, device=factor.device).expand_as(factor)
    with single_threaded(factor.device):
        return torch.linalg.solve_triangular(factor, eye, upper=False)


def full_rank_certified(gram: Tensor, factor_inv: Tensor, tolerance: Tensor) -> Tensor:
    """Cheap sufficient test that every singular value of ``V`` passes ``tolerance · σ_max``.

    ``σ_min² ≥ 1 / ‖L⁻¹‖_F²`` and ``σ_max² ≤ trace G``, without an eigendecomposition. NaNs
    (a failed factorisation) give False.
    """
    inverse_norm2 = torch.linalg.vector_norm(factor_inv, dim=(-2, -1)) ** 2
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    return inverse_norm2 * trace * tolerance.to(gram.dtype) ** 2 < 1.0


def basis_refined(
    flat: Float[Tensor, "matrix key d_head"], tolerance: Float[Tensor, "matrix"]
) -> tuple[Float[Tensor, "matrix key d_head"], Bool[Tensor, "matrix"]]:
    """float32 Cholesky QR with one refinement step, and which matrices it certifies.

    First pass ``U₁ = V L⁻ᵀ`` from the float32 Gram matrix; its orthogonality defect
    ``E = U₁ᵀU₁ − I`` (about ``eps · κ(V)²``) is removed by ``U = U₁ (I − E/2 + 3E²/8)``, the
    second-order expansion of ``(I + E)^(-1/2)`` (residual defect of order ``E³``). Certified:
    the factorisation succeeded, ``max |E| ≤`` :data:`REFINE_MAX_DEFECT`, and every singular value
    passes the tolerance. Uncertified matrices' columns are meaningless (possibly NaN).
    """
    gram = flat.mT @ flat  # [matrix, d_head, d_head]
    factor_inv, info = cholesky_inverse_factor(gram)
    first = flat @ factor_inv.mT
    defect = first.mT @ first
    defect.diagonal(dim1=-2, dim2=-1).sub_(1.0)
    correction = torch.baddbmm(defect, defect, defect, beta=-0.5, alpha=0.375)  # -E/2 + 3E²/8
    correction.diagonal(dim1=-2, dim2=-1).add_(1.0)
    basis = first @ correction
    largest_defect = defect.abs().amax(dim=(-2, -1))
    certified = (
        (info == 0)
        & (largest_defect <= REFINE_MAX_DEFECT)
        & full_rank_certified(gram, factor_inv, tolerance)
    )
    return basis, certified


def basis_qr(v64: Float[Tensor, "matrix key d_head"], tolerance: Float[Tensor, "matrix"]) -> Tensor:
    """float64 QR route: ``V = Q R``, SVD of the small ``R``, kept left singular vectors ``Q U_R``."""
    with single_threaded(v64.device):
        q, r = torch.linalg.qr(v64, mode="reduced")  # q: [.., key, d_head], r: [.., d_head, d_head]
        u_r, sigma, _ = torch.linalg.svd(r)
    keep = sigma > tolerance[:, None] * sigma[..., :1]
    basis = q @ (u_r * keep[..., None, :].to(u_r.dtype))  # [.., key, min(key, d_head)]
    short = v64.shape[-1] - basis.shape[-1]  # fewer keys than d_head: pad with zero columns
    return torch.nn.functional.pad(basis, (0, short)) if short else basis


def basis_exact(v64: Float[Tensor, "matrix key d_head"], tolerance: Float[Tensor, "matrix"]) -> Tensor:
    """float64 exact route: ``U = V Q_r Σ_r⁻¹`` over the eigenpairs of ``G = VᵀV`` kept by
    ``tolerance`` (the heads the refined route does not certify)."""
    return eigen_basis(v64, v64.mT @ v64, tolerance)


def eigh(gram: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.linalg.eigh(gram)``, without its read of the error codes off the CPU."""
    if devices.reads_are_free(gram) or not hasattr(torch, "_linalg_eigh"):
        return torch.linalg.eigh(gram)
    eigenvalues, vectors = torch._linalg_eigh(gram, "L", True)
    return eigenvalues, vectors


def eigen_basis(v64: Tensor, gram: Tensor, tolerance: Tensor) -> Tensor:
    """The exact rule ``U = V Q_r Σ_r⁻¹`` over the eigenpairs of ``G = VᵀV`` kept by ``tolerance``."""
    with single_threaded(gram.device):
        # torch.linalg.eigh reads LAPACK's error codes back (a wait on a GPU); its kernel without
        # that check gives the same pairs (a symmetric matrix has them; NaN input gives NaN)
        eigenvalues, vectors = eigh(gram)
    eigenvalues = eigenvalues.clamp_min(0.0)
    keep = eigenvalues > tolerance[:, None] ** 2 * eigenvalues[:, -1:]
    scale = torch.where(keep, eigenvalues.clamp_min(torch.finfo(torch.float64).tiny).rsqrt(), 0.0)
    return v64 @ (vectors * scale[:, None, :])
