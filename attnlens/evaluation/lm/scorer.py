"""The model's own LM head as a score (see :mod:`attnlens.evaluation.lm` for the kinds):
:class:`LMScorer`, the accumulator of a pass; :func:`score`, which runs it over a corpus; and
:func:`evaluate`, the score a curve or a report shows (this one where the checkpoint trained the
head, else the MLM probe of :mod:`attnlens.evaluation.probing.mlm`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attnlens.core import checks
from attnlens.core.inputs import Batch
from attnlens.core.loading import is_causal, lm_head_trained, model_id, require_bridge
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, PassBatch
from attnlens.engine.forward import FwdHooks
from attnlens.engine.hooks import as_hooks
from attnlens.errors import InputError, InputTypeError
from attnlens.evaluation.lm.masks import check_rate, mlm_masks, pll_copies
from attnlens.evaluation.lm.result import KINDS, LMScore
from attnlens.evaluation.probing.mlm import probe

__all__ = ["KIND_CHOICES", "LMScorer", "UntrainedHead", "evaluate", "score", "token_nll"]

#: the ``kind=`` values :func:`score` accepts (``"auto"``: causal for a decoder, MLM for an encoder)
KIND_CHOICES: tuple[str, ...] = ("auto", *KINDS)
#: the hook point whose input (the residual stream after any final norm / MLM transform, one
#: vector per position) :class:`LMScorer` narrows to the positions it scores, so the vocabulary
#: projection runs only there
UNEMBED_INPUT = "unembed.hook_in"


class UntrainedHead(InputError):
    """The model's LM head was not in its checkpoint: transformers initialised it at load, so any
    score read from it would be noise."""


def token_nll(
    logits: Float[Tensor, "n vocab"], targets: Int[Tensor, " n"]
) -> Float[Tensor, " n"]:
    """``-log softmax(logits)[target]`` per scored position (``n`` positions, ``vocab`` logits
    each), computed in float32 at least (as Hugging Face's cross-entropy loss)."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return -logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


class LMScorer(Accumulator):
    """:func:`score` as an accumulator of :func:`attnlens.engine.passes.run`.

    State (adds up over shards, checkpoints): ``nll``, the float64 sum of the negative
    log-likelihood of every predicted token, and ``count``, how many were predicted.

    Each batch: :meth:`prepare` makes the inputs (``"mlm"``: :func:`~attnlens.evaluation.lm.masks.mlm_masks`; ``"pll"``:
    :func:`~attnlens.evaluation.lm.masks.pll_copies`; ``"causal"``: the batch itself) and records which positions are scored
    and their target tokens; a hook at :data:`UNEMBED_INPUT` narrows the final residual stream to
    those positions (``[n, 1, d_model]``), so the vocabulary projection runs only there;
    :meth:`update_output` adds their negative log-likelihoods.
    """

    name = "lm"
    needs_output = True

    def __init__(self, model: Any, kind: str, *, mask_rate: float = 0.15, seed: int = 0) -> None:
        if kind not in KINDS:
            raise InputError(f"Unknown kind {kind!r}; use one of {', '.join(KIND_CHOICES)}.")
        mask_rate, seed = check_rate(mask_rate), checks.whole_number(seed, "seed")
        self.model, self.kind, self.mask_rate, self.seed = model, kind, mask_rate, seed
        self.nll = torch.zeros((), dtype=torch.float64)
        self.count = torch.zeros((), dtype=torch.int64)
        self._rows: Tensor | None = None
        self._positions: Tensor | None = None
        self._targets: Tensor | None = None
        self._narrowed = False

    def hooks(self, model: Any) -> list[tuple[str, Any]]:
        if UNEMBED_INPUT not in model.hook_dict:
            return []  # update_output picks the positions from the full logits

        def narrow(
            residual: Float[Tensor, "batch pos d_model"], hook: Any
        ) -> Float[Tensor, "n 1 d_model"]:
            self._narrowed = True
            return residual[self._rows, self._positions][:, None]

        return [(UNEMBED_INPUT, narrow)]

    def prepare(self, batch: Batch) -> Batch:
        tokenizer = self.model.tokenizer
        if self.kind == "causal":
            real = batch.attention_mask.bool()
            rows, positions = (real[:, 1:] & real[:, :-1]).nonzero(as_tuple=True)
            self._set(rows, positions, batch.input_ids[rows, positions + 1])
            return batch
        if self.kind == "mlm":
            masked, targets = mlm_masks(batch, tokenizer, rate=self.mask_rate, seed=self.seed)
            rows, positions = targets.nonzero(as_tuple=True)
            self._set(rows, positions, batch.input_ids[rows, positions])
            return masked
        copies, rows, positions = pll_copies(batch, tokenizer)
        self._set(torch.arange(rows.numel(), device=rows.device), positions, batch.input_ids[rows, positions])
        return copies

    def _set(self, rows: Tensor, positions: Tensor, targets: Tensor) -> None:
        self._rows, self._positions, self._targets = rows, positions, targets
        self._narrowed = False

    def update_output(self, batch: PassBatch, output: Any) -> None:
        logits = getattr(output, "logits", output)
        if self._narrowed:
            logits = logits[:, 0]
        else:
            logits = logits[self._rows, self._positions]
        nll = token_nll(logits, self._targets.to(logits.device))
        self.nll += nll.detach().double().sum().to(self.nll.device)  # on the device in a pass
        self.count += nll.numel()  # a host number: the positions were chosen on the host

    def state_dict(self) -> dict[str, Tensor]:
        return {"nll": self.nll, "count": self.count}

    def result(self) -> tuple[float, int]:
        """``(mean log-likelihood per predicted token, predicted tokens)``."""
        count = int(self.count)
        if count == 0:
            raise InputError("no token was predicted: every text has a single token.")
        return -float(self.nll) / count, count



def score(
    model: Any,
    texts: Iterable[str] | Iterable[tuple[str, str]],
    *,
    hooks: FwdHooks = (),
    kind: str = "auto",
    max_len: SupportsIndex = 128,
    batch_size: SupportsIndex = 16,
    mask_rate: float = 0.15,
    seed: int = 0,
    layout: str = "padded",
    progress: bool = True,
) -> LMScore:
    """The model's own LM head over ``texts`` as minus the mean negative log-likelihood per
    predicted token (nats; higher is better), with ``hooks`` (TransformerLens ``fwd_hooks``:
    interventions such as :func:`attnlens.papa.hooks`) active in every forward.

    ``kind``: ``"auto"`` (``"causal"`` for a decoder, ``"mlm"`` for an encoder), ``"causal"``,
    ``"mlm"`` or ``"pll"``; see :mod:`attnlens.evaluation.lm`. ``"causal"`` needs a decoder, ``"mlm"``
    and ``"pll"`` an encoder with a mask token.

    ``texts``: strings or ``(str, str)`` pairs (a list, a generator, a ``datasets`` column),
    tokenized ``batch_size`` at a time in the ``"padded"`` layout, truncated to ``max_len``
    tokens. With ``"pll"`` a batch of ``batch_size`` texts runs as one forward of one copy per
    token (``batch_size × length`` rows): use a small ``batch_size`` for long texts.

    ``mask_rate`` (``"mlm"``): the share of each text's real non-special tokens masked, in
    ``(0, 1)``; ``seed``: seeds the masks together with each text's tokens (:func:`~attnlens.evaluation.lm.masks.mlm_masks`).
    ``layout``: ``"padded"``, or ``"papa"`` for an encoder under PAPA constants fitted in it (the
    masks fall on the same real tokens: only their positions differ).

    The forward computes logits only where a token is scored (:class:`LMScorer` narrows the
    input of the unembedding, ``unembed.hook_in``, to those positions): a hook of ``hooks`` on
    that point sees every position, one on ``unembed.hook_out`` sees ``[n_scored, 1, vocab]``.

    Raises :class:`UntrainedHead` when the checkpoint had no LM head (transformers initialised it
    at load: :func:`attnlens.core.loading.lm_head_trained`), e.g. for the default all-MiniLM-L6-v2.
    """
    require_bridge(model, "lm.scorer.score")
    hooks = as_hooks(hooks)  # a PapaHooks(fast=True) stays one: the pass runs its heads fast
    if isinstance(texts, str | bytes):
        raise InputTypeError(
            "texts must be a list (or other iterable) of strings, not one string; pass [text] "
            "for a single text."
        )
    if not isinstance(kind, str) or kind not in KIND_CHOICES:
        raise InputError(f"Unknown kind {checks.describe(kind)}; use one of {', '.join(KIND_CHOICES)}.")
    mask_rate = check_rate(mask_rate)
    seed = checks.whole_number(seed, "seed")
    max_len = checks.whole_number(max_len, "max_len", " of tokens (e.g. max_len=128)", minimum=1)
    batch_size = checks.whole_number(batch_size, "batch_size", " of texts per batch (e.g. 16)", minimum=1)
    causal = is_causal(model)
    if kind == "auto":
        kind = "causal" if causal else "mlm"
    if kind == "causal" and not causal:
        raise InputError(
            f"kind='causal' needs a decoder; {model_id(model)} is an encoder, whose head fills "
            "masked tokens: use kind='mlm' or kind='pll'."
        )
    if kind != "causal" and causal:
        raise InputError(
            f"kind={kind!r} needs an encoder with a masked-LM head; {model_id(model)} is a "
            "decoder, whose head predicts the next token: use kind='causal'."
        )
    _require_trained_head(model, causal)
    scorer = LMScorer(model, kind, mask_rate=mask_rate, seed=seed)
    settings: dict[str, Any] = {"kind": kind, "max_len": max_len, "layout": layout}
    if kind == "mlm":
        settings.update(mask_rate=mask_rate, seed=seed, mask="all [MASK]")
    if kind == "pll":
        settings.update(mask="each token in turn, [MASK]")
    summary = passes.run(
        model, texts, [scorer], max_len=max_len, layout=layout, batch_size=batch_size,
        hooks=hooks, progress=progress, description=f"lm.score ({KINDS[kind]})",
        settings=settings,
    )
    value, count = scorer.result()
    settings["hooks"] = len(hooks)
    settings["n_truncated"] = summary.n_truncated
    return LMScore(
        value=value,
        kind=kind,
        n_tokens=count,
        n_examples=summary.n_examples,
        perplexity=math.exp(-value),
        model_id=model_id(model),
        settings=settings,
    )


def _require_trained_head(model: Any, causal: bool) -> None:
    if lm_head_trained(model) is not False:
        return
    head = "LM head" if causal else "MLM head"
    hint = ("use the MLM probe (attnlens.evaluation.probing.mlm.probe) to train a head on the frozen "
            "model, or a model whose checkpoint has its head")
    raise UntrainedHead(
        f"the {head} of {model_id(model)} was not in its checkpoint (transformers initialised it "
        f"at load), so its scores would be noise; {hint}."
    )


def evaluate(model: Any, texts: Sequence[str], *, hooks: FwdHooks = (), **options: Any) -> LMScore:
    """The LM score a curve or a report shows: the model's own head (:func:`score`, causal or
    fixed-mask MLM) where its checkpoint trained it, else the MLM probe
    (:func:`attnlens.evaluation.probing.mlm.probe`). The kind is in the result
    (:attr:`attnlens.evaluation.lm.result.LMScore.name`)."""
    causal = is_causal(model)
    if causal or lm_head_trained(model) is True:
        allowed = {"max_len", "batch_size", "mask_rate", "seed", "progress", "layout"}
        chosen = {key: value for key, value in options.items() if key in allowed}
        if causal:
            chosen["layout"] = "padded"
        return score(model, texts, hooks=hooks, **chosen)
    allowed = {"max_len", "batch_size", "mask_rate", "seed", "progress", "layout", "head", "cache",
               "eval_texts"}
    return probe(model, texts, hooks=hooks, **{k: v for k, v in options.items() if k in allowed})
