"""Which tokens a masked-LM score or probe masks: fixed masks (:func:`mlm_masks`), one copy per
token for a pseudo-log-likelihood (:func:`pll_copies`), and the tokens either may mask
(:func:`candidates`). See :mod:`attnlens.evaluation.lm` for the scores they serve."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from attnlens.core import checks
from attnlens.core.inputs import Batch
from attnlens.errors import InputError, InputTypeError

__all__ = ["candidates", "check_rate", "mlm_masks", "pll_copies"]


def _tokenizer(model_or_tokenizer: Any) -> Any:
    return getattr(model_or_tokenizer, "tokenizer", None) or model_or_tokenizer


def _special_ids(tokenizer: Any) -> Tensor:
    ids = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []) if i is not None}
    return torch.tensor(sorted(ids), dtype=torch.long)


def candidates(batch: Batch, tokenizer: Any) -> Bool[Tensor, "batch pos"]:
    """``[batch, pos]``: True at the real tokens of each example that are not special tokens
    ([CLS], [SEP], <s>, padding ...): those an MLM score may mask. ``tokenizer``: the model's
    (or the bridge)."""
    specials = _special_ids(_tokenizer(tokenizer)).to(batch.input_ids.device)
    return batch.attention_mask.bool() & ~torch.isin(batch.input_ids, specials)


def _row_seed(seed: int, ids: Sequence[int]) -> int:
    """A 63-bit seed from ``seed`` and a text's real token ids: the same text gets the same masks
    in any batch, with any intervention."""
    digest = hashlib.sha256(f"attnlens.lm/{seed}/".encode())
    digest.update(torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], "little") & (2**63 - 1)


def _mix(mix: Any) -> tuple[float, float, float]:
    if isinstance(mix, str) or not isinstance(mix, Sequence) or len(mix) != 3:
        raise InputTypeError(
            f"mix must be three numbers ([MASK], random token, keep), e.g. (0.8, 0.1, 0.1), got "
            f"{checks.describe(mix)}"
        )
    parts = tuple(checks.finite(p, f"mix[{i}]", low=0, high=1) for i, p in enumerate(mix))
    if abs(sum(parts) - 1) > 1e-6:
        raise InputError(f"mix must add up to 1 ([MASK], random token, keep), got {parts}")
    return parts  # type: ignore[return-value]


def mlm_masks(
    batch: Batch,
    tokenizer: Any,
    *,
    rate: float,
    seed: int = 0,
    mix: Sequence[float | int] = (1.0, 0.0, 0.0),
) -> tuple[Batch, Bool[Tensor, "batch pos"]]:
    """Fixed masks for a masked-LM score or probe: ``(masked_batch, targets)``.

    In each example (a row of ``batch``, ``[batch, pos]``), ``max(1, round(rate · n))`` of its
    ``n`` real non-special tokens (:func:`candidates`) are chosen; ``targets`` (``[batch, pos]``)
    is True there, and the original tokens are ``batch.input_ids[targets]``. The choice comes
    from a generator seeded with ``seed`` and the example's own real token ids (its content as
    the model sees it, after truncation), never from its place in the corpus or batch: the same
    text gets the same masks in a batch of 1 or of 32, under any intervention, in every call.

    ``mix``: the shares of chosen tokens replaced by the mask token, by a random non-special
    token of the vocabulary, and kept, as in BERT's pre-training (Devlin et al. 2019, §3.1:
    ``(0.8, 0.1, 0.1)``). The default ``(1, 0, 0)`` masks every chosen token, which is what a
    trained MLM head is scored on. The positions chosen do not depend on ``mix``.

    ``tokenizer``: the model's tokenizer (or the bridge); it must have a mask token.
    """
    tokenizer = _tokenizer(tokenizer)
    rate = check_rate(rate)
    seed = checks.whole_number(seed, "seed")
    p_mask, p_random, _ = _mix(mix)
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise InputError(
            f"{type(tokenizer).__name__} has no mask token, so masked-LM scoring cannot mask "
            "tokens; use an encoder with an MLM head (BERT, RoBERTa), or kind='causal' for a decoder."
        )
    specials = set(_special_ids(tokenizer).tolist())
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in specials], dtype=torch.long)
    ids = batch.input_ids.cpu()
    allowed = candidates(batch, tokenizer).cpu()
    real = batch.attention_mask.bool().cpu()
    masked = ids.clone()
    targets = torch.zeros_like(allowed)
    for row in range(ids.shape[0]):
        positions = allowed[row].nonzero().flatten()
        if positions.numel() == 0:
            raise InputError(f"example {row} of the batch has no token to mask (only special tokens).")
        generator = torch.Generator().manual_seed(_row_seed(seed, ids[row][real[row]].tolist()))
        n = max(1, math.floor(rate * positions.numel() + 0.5))
        # fixed order of draws: positions, then what replaces each, then the random tokens
        chosen = positions[torch.randperm(positions.numel(), generator=generator)[:n]].sort().values
        draw = torch.rand(n, generator=generator)
        random_ids = pool[torch.randint(len(pool), (n,), generator=generator)]
        replacement = torch.where(draw < p_mask, torch.tensor(mask_id), ids[row, chosen])
        replacement = torch.where((draw >= p_mask) & (draw < p_mask + p_random), random_ids, replacement)
        masked[row, chosen] = replacement
        targets[row, chosen] = True
    device = batch.input_ids.device
    return with_ids(batch, masked.to(device)), targets.to(device)


def pll_copies(
    batch: Batch, tokenizer: Any
) -> tuple[Batch, Int[Tensor, "copy"], Int[Tensor, "copy"]]:
    """The inputs of a pseudo-log-likelihood (Salazar et al. 2020): one copy of each example per
    real non-special token (:func:`candidates`), with that token replaced by the mask token.

    Returns ``(copies, rows, positions)``: ``copies`` a batch of ``[copy, pos]`` (the copies of
    example 0 first, in order of position), and for each copy the example it comes from
    (``rows``) and its masked position (``positions``); the original tokens are
    ``batch.input_ids[rows, positions]``."""
    tokenizer = _tokenizer(tokenizer)
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise InputError(
            f"{type(tokenizer).__name__} has no mask token, so a pseudo-log-likelihood cannot "
            "mask tokens; use an encoder with an MLM head, or kind='causal' for a decoder."
        )
    rows, positions = candidates(batch, tokenizer).nonzero(as_tuple=True)
    copy = torch.arange(rows.numel(), device=rows.device)
    input_ids = batch.input_ids[rows].clone()
    input_ids[copy, positions] = mask_id
    copies = dataclasses.replace(
        batch, input_ids=input_ids, attention_mask=batch.attention_mask[rows],
        token_type_ids=batch.token_type_ids[rows], n_truncated=0, extra={},
        position_ids=None if batch.position_ids is None else batch.position_ids[rows],
    )
    return copies, rows, positions


def with_ids(batch: Batch, input_ids: Tensor) -> Batch:
    """``batch`` with other token ids (its mask, token types, positions and the rest kept)."""
    return dataclasses.replace(batch, input_ids=input_ids, extra=dict(batch.extra))


def check_rate(rate: Any) -> float:
    """``mask_rate`` checked: a finite number strictly between 0 and 1 (one clear error otherwise)."""
    rate = checks.finite(rate, "mask_rate", low=0, high=1)
    if not 0 < rate < 1:
        raise InputError(f"mask_rate must lie strictly between 0 and 1 (e.g. 0.15), got {rate}")
    return rate
