"""The model's own LM head as a score: negative log-perplexity, higher is better.

:func:`score` runs a corpus through the model (with interventions, e.g. PAPA constants, as
``hooks=``) and reads its LM head:

- ``"causal"`` (decoders): the mean negative log-likelihood of each real token given the tokens
  before it; the first token of a text is not predicted and padding never counts. It equals
  Hugging Face's ``model(input_ids, labels=input_ids).loss`` averaged over the tokens of the
  corpus;
- ``"mlm"`` (encoders): fixed masks (:func:`mlm_masks`): in each text ``mask_rate`` of its real
  non-special tokens (at least one) are replaced by the tokenizer's mask token ([MASK] for all
  of them: the model's own head was trained to fill [MASK]), chosen by a generator seeded from
  ``seed`` and the text's tokens, so that every intervention and every batching sees the same
  masks. The score is minus the mean cross-entropy of the original tokens at the masked
  positions;
- ``"pll"`` (encoders): the pseudo-log-likelihood of Salazar et al. (2020, "Masked Language Model
  Scoring", ACL): every real non-special token is masked in turn (one copy of the text per token)
  and scored given all the others; the score is the mean ``log p(token | rest)`` over the tokens
  of the corpus, and ``exp(-score)`` the pseudo-perplexity (their PPPL).

Scores are in nats per predicted token. The kind is part of every score (:class:`LMScore` names
it wherever the number is shown): the three are not comparable with one another.

A head that transformers initialised at load because the checkpoint had none (the default
all-MiniLM-L6-v2 is a bare encoder) is refused with :class:`UntrainedHead`: its scores are noise.

Inputs are tokenized in the ``"padded"`` layout (the tokenizer's own special tokens, right
padding), so masked positions are ordinary positions of ordinary inputs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, SupportsIndex

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import checks
from attnlens.core.estimator import Estimator
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.core.inputs import Batch
from attnlens.core.loading import is_causal, lm_head_trained, model_id, require_bridge
from attnlens.core.result import Result, frame, plain
from attnlens.engine import passes
from attnlens.engine.hooks import as_hooks
from attnlens.errors import InputError, InputTypeError, NotFittedError
from attnlens.evaluation.probing.features import Features, HiddenStates, extract
from attnlens.evaluation.probing.intervals import Interval, bootstrap_counts

__all__ = [
    "KINDS",
    "LMScore",
    "LMScorer",
    "UntrainedHead",
    "candidates",
    "mlm_masks",
    "pll_copies",
    "evaluate",
    "probe",
    "score",
]

#: the kinds of score, and how each is named wherever a score is shown
KINDS: dict[str, str] = {
    "causal": "causal LM",
    "mlm": "MLM (fixed masks)",
    "pll": "pseudo-log-likelihood",
}
#: the ``kind=`` values :func:`score` accepts (``"auto"``: causal for a decoder, MLM for an encoder)
KIND_CHOICES: tuple[str, ...] = ("auto", *KINDS)
#: every kind of score a :class:`LMScore` can hold: the head's own, and the MLM probe (:func:`probe`)
NAMES: dict[str, str] = {**KINDS, "probe": "MLM probe"}
#: the hook point whose input (the residual stream after any final norm / MLM transform, one
#: vector per position) :class:`LMScorer` narrows to the positions it scores, so the vocabulary
#: projection runs only there
UNEMBED_INPUT = "unembed.hook_in"


class UntrainedHead(InputError):
    """The model's LM head was not in its checkpoint: transformers initialised it at load, so any
    score read from it would be noise."""


@dataclass(frozen=True)
class LMScore(Result):
    """A score of the model's own LM head over a corpus.

    ``value``: minus the mean negative log-likelihood per predicted token (nats; higher is
    better); ``kind``: ``"causal"``, ``"mlm"`` or ``"pll"`` (see :data:`KINDS`); ``n_tokens``:
    predicted tokens (causal: real tokens but each text's first; mlm: masked tokens; pll: real
    non-special tokens); ``n_examples``: texts; ``perplexity``: ``exp(-value)`` (for ``"pll"``
    the pseudo-perplexity of Salazar et al. 2020, also :attr:`pseudo_perplexity`);
    ``model_id``; ``settings``: what else the number depends on (``max_len``, ``mask_rate``,
    ``seed``, ``mask`` (what replaces a masked token), ``hooks``: how many intervention hooks
    ran) and ``n_truncated``, the texts cut by ``max_len``. The MLM probe (kind ``"probe"``)
    also gives ``counts``, ``[text, 2]`` (the summed log-likelihood of each evaluation text's
    masked tokens, and how many), and ``interval``, the 95% bootstrap interval of ``value`` over
    the evaluation texts (:func:`attnlens.probing.intervals.bootstrap_counts`).

    A :class:`~attnlens.core.result.Result`: :attr:`table` is the score in one row
    (:attr:`COLUMNS`), :meth:`figure` a bar with its interval, :meth:`to_json` all of it.
    """

    COLUMNS: ClassVar[dict[str, str]] = {
        "kind": "causal, mlm, pll (the model's own head) or probe (the MLM probe)",
        "name": "the kind in words, as every view of the score names it",
        "value": "minus the mean negative log-likelihood per predicted token (nats; higher is better)",
        "low": "95% bootstrap interval of value over the evaluation texts: lower end (the MLM probe only)",
        "high": "95% bootstrap interval of value: upper end",
        "perplexity": "exp(-value) (a pseudo-perplexity for pll)",
        "n_tokens": "predicted tokens",
        "n_examples": "texts",
        "n_truncated": "texts cut by max_len",
        "model_id": "the model scored",
    }
    FORMAT: ClassVar[str] = "attnlens.LMScore/1"

    value: float
    kind: str
    n_tokens: int
    n_examples: int
    perplexity: float
    model_id: str
    settings: dict[str, Any] = field(default_factory=dict, hash=False)
    interval: Interval | None = field(default=None, hash=False, compare=False)
    counts: Any = field(default=None, hash=False, compare=False, repr=False)

    @property
    def name(self) -> str:
        """The kind in words: ``"causal LM"``, ``"MLM (fixed masks)"``, ``"pseudo-log-likelihood"``."""
        return NAMES[self.kind]

    @property
    def pseudo_perplexity(self) -> float:
        """``exp(-value)`` of a ``"pll"`` score (Salazar et al. 2020's PPPL); ``ValueError`` for
        another kind, whose :attr:`perplexity` is not a pseudo-perplexity."""
        if self.kind != "pll":
            raise InputError(
                f"a {self.name} score has a perplexity ({self.perplexity:.4g}), not a "
                "pseudo-perplexity; use kind='pll' for one."
            )
        return self.perplexity

    def __str__(self) -> str:
        ppl = "pseudo-perplexity" if self.kind == "pll" else "perplexity"
        return (
            f"{self.name} score {self.value:.4f} nats/token ({ppl} {self.perplexity:.4g}) over "
            f"{self.n_tokens} tokens of {self.n_examples} texts, {self.model_id}"
        )

    def __repr__(self) -> str:
        return f"LMScore({self})"

    @property
    def n_truncated(self) -> int:
        """Texts cut by ``max_len`` (``settings["n_truncated"]``; 0 where not recorded)."""
        return int(self.settings.get("n_truncated", 0))

    @property
    def table(self) -> Any:
        """The score as one row of :attr:`COLUMNS`."""
        nan = float("nan")
        return frame([{
            "kind": self.kind, "name": self.name, "value": self.value,
            "low": self.interval.low if self.interval else nan, "high": self.interval.high if self.interval else nan,
            "perplexity": self.perplexity, "n_tokens": self.n_tokens, "n_examples": self.n_examples,
            "n_truncated": self.n_truncated, "model_id": self.model_id,
        }], self.COLUMNS)

    def figure(self) -> Any:
        """The score as a bar with its 95% interval, where it has one (:func:`attnlens.plots.score_bars`)."""
        from attnlens.core.plots import score_bars

        row = self.table.iloc[0]
        return score_bars([self.name], [self.value], [row["low"]], [row["high"]], yaxis="nats per token",
                          title=f"{self.name} score of {self.model_id} ({self.n_tokens} tokens)")

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "kind": self.kind, "n_tokens": self.n_tokens, "n_examples": self.n_examples,
                "perplexity": self.perplexity, "model_id": self.model_id, "settings": plain(self.settings),
                "interval": None if self.interval is None else plain(vars(self.interval)),
                "counts": None if self.counts is None else plain(self.counts)}

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> LMScore:
        import numpy as np

        interval, counts = data.get("interval"), data.get("counts")
        if data["kind"] not in NAMES:
            raise ValueError(f"kind {data['kind']!r} is none of {', '.join(NAMES)}")
        return cls(value=float(data["value"]), kind=data["kind"], n_tokens=int(data["n_tokens"]),
                   n_examples=int(data["n_examples"]), perplexity=float(data["perplexity"]),
                   model_id=str(data["model_id"]), settings=dict(data.get("settings") or {}),
                   interval=None if interval is None else Interval(**interval),
                   counts=None if counts is None else np.asarray(counts, dtype=np.float64).reshape(-1, 2))


# ------------------------------------------------------------------------------------------------
# masks


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
    rate = _rate(rate)
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
    return _with_ids(batch, masked.to(device)), targets.to(device)


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
    copies = Batch(
        input_ids,
        batch.attention_mask[rows],
        batch.token_type_ids[rows],
        0,
        batch.layout,
        batch.max_len,
        batch.is_pair,
        {},
        batch.token_types,
        batch.positions_from_mask,
    )
    return copies, rows, positions


def _with_ids(batch: Batch, input_ids: Tensor) -> Batch:
    return Batch(
        input_ids,
        batch.attention_mask,
        batch.token_type_ids,
        batch.n_truncated,
        batch.layout,
        batch.max_len,
        batch.is_pair,
        dict(batch.extra),
        batch.token_types,
        batch.positions_from_mask,
    )


def _rate(rate: Any) -> float:
    rate = checks.finite(rate, "mask_rate", low=0, high=1)
    if not 0 < rate < 1:
        raise InputError(f"mask_rate must lie strictly between 0 and 1 (e.g. 0.15), got {rate}")
    return rate


# ------------------------------------------------------------------------------------------------
# the accumulator


def token_nll(
    logits: Float[Tensor, "n vocab"], targets: Int[Tensor, " n"]
) -> Float[Tensor, " n"]:
    """``-log softmax(logits)[target]`` per scored position (``n`` positions, ``vocab`` logits
    each), computed in float32 at least (as Hugging Face's cross-entropy loss)."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return -logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


class LMScorer(passes.Accumulator):
    """:func:`score` as an accumulator of :func:`attnlens.passes.run`.

    State (adds up over shards, checkpoints): ``nll``, the float64 sum of the negative
    log-likelihood of every predicted token, and ``count``, how many were predicted.

    Each batch: :meth:`prepare` makes the inputs (``"mlm"``: :func:`mlm_masks`; ``"pll"``:
    :func:`pll_copies`; ``"causal"``: the batch itself) and records which positions are scored
    and their target tokens; a hook at :data:`UNEMBED_INPUT` narrows the final residual stream to
    those positions (``[n, 1, d_model]``), so the vocabulary projection runs only there;
    :meth:`update_output` adds their negative log-likelihoods.
    """

    name = "lm"
    needs_output = True

    def __init__(self, model: Any, kind: str, *, mask_rate: float = 0.15, seed: int = 0) -> None:
        if kind not in KINDS:
            raise InputError(f"Unknown kind {kind!r}; use one of {', '.join(KIND_CHOICES)}.")
        mask_rate, seed = _rate(mask_rate), checks.whole_number(seed, "seed")
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

    def update_output(self, batch: passes.PassBatch, output: Any) -> None:
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


# ------------------------------------------------------------------------------------------------
# the score


def score(
    model: Any,
    texts: Iterable[str] | Iterable[tuple[str, str]],
    *,
    hooks: passes.FwdHooks = (),
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
    ``"mlm"`` or ``"pll"``; see this module's docstring. ``"causal"`` needs a decoder, ``"mlm"``
    and ``"pll"`` an encoder with a mask token.

    ``texts``: strings or ``(str, str)`` pairs (a list, a generator, a ``datasets`` column),
    tokenized ``batch_size`` at a time in the ``"padded"`` layout, truncated to ``max_len``
    tokens. With ``"pll"`` a batch of ``batch_size`` texts runs as one forward of one copy per
    token (``batch_size × length`` rows): use a small ``batch_size`` for long texts.

    ``mask_rate`` (``"mlm"``): the share of each text's real non-special tokens masked, in
    ``(0, 1)``; ``seed``: seeds the masks together with each text's tokens (:func:`mlm_masks`).
    ``layout``: ``"padded"``, or ``"papa"`` for an encoder under PAPA constants fitted in it (the
    masks fall on the same real tokens: only their positions differ).

    The forward computes logits only where a token is scored (:class:`LMScorer` narrows the
    input of the unembedding, ``unembed.hook_in``, to those positions): a hook of ``hooks`` on
    that point sees every position, one on ``unembed.hook_out`` sees ``[n_scored, 1, vocab]``.

    Raises :class:`UntrainedHead` when the checkpoint had no LM head (transformers initialised it
    at load: :func:`attnlens.loading.lm_head_trained`), e.g. for the default all-MiniLM-L6-v2.
    """
    require_bridge(model, "lm.score")
    hooks = as_hooks(hooks)  # a PapaHooks(fast=True) stays one: the pass runs its heads fast
    if isinstance(texts, str | bytes):
        raise InputTypeError(
            "texts must be a list (or other iterable) of strings, not one string; pass [text] "
            "for a single text."
        )
    if not isinstance(kind, str) or kind not in KIND_CHOICES:
        raise InputError(f"Unknown kind {checks.describe(kind)}; use one of {', '.join(KIND_CHOICES)}.")
    mask_rate = _rate(mask_rate)
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
    hint = (
        "use lm.probe to train a head on the frozen model, or a model whose checkpoint has its head"
        if "probe" in globals()
        else "train a head on the frozen model (an MLM probe), or load a model whose checkpoint has "
        "its head"
    )
    raise UntrainedHead(
        f"the {head} of {model_id(model)} was not in its checkpoint (transformers initialised it "
        f"at load), so its scores would be noise; {hint}."
    )


# ------------------------------------------------------------------------------------------------
# the MLM probe (PAPA's protocol, for every encoder)


class MaskedStates(HiddenStates):
    """Every layer's vectors at the masked positions of fixed masks (:func:`mlm_masks` with
    BERT's 80/10/10 mix), and the original token there (:attr:`Features.positions`)."""

    compact = False  # its masks are drawn over the columns of padded batches

    def __init__(self, model: Any, *, rate: float, seed: int, examples: Sequence = ()) -> None:
        super().__init__(int(model.cfg.n_layers), examples)
        self.tokenizer, self.rate, self.seed = model.tokenizer, rate, seed
        self._targets: Tensor | None = None
        self._original: Tensor | None = None

    def prepare(self, batch: Batch) -> Batch:
        masked, self._targets = mlm_masks(batch, self.tokenizer, rate=self.rate, seed=self.seed,
                                          mix=PROBE_MIX)
        self._original = batch.input_ids
        return masked

    def select(self, batch: passes.PassBatch) -> tuple[Tensor, Tensor, Tensor]:
        self.kind = "masked"
        return self._targets, self._original[self._targets], torch.zeros(0, dtype=torch.long)


#: [MASK] / random token / kept shares of the MLM probe's masks (Devlin et al. 2019, §3.1)
PROBE_MIX = (0.8, 0.1, 0.1)
#: File format of a saved :class:`MLMHead`.
HEAD_FORMAT = "attnlens.MLMHead/1"


class MLMHead(Estimator):
    """PAPA's MLM probe head, scikit-learn style: each masked token's vectors of all layers
    concatenated, ``Linear((L+1)·d, d) → GELU → Linear(d, vocab)`` (Hassid et al. 2022; their
    code's ``FreezeExtractPollerTokenClassification(mlm=True)``), trained with cross-entropy on
    the original tokens. :meth:`fit`, :meth:`log_likelihood` (per token), :meth:`score` (the
    mean, nats), :meth:`save` / :meth:`load` (safetensors, atomic, checksummed),
    ``get_params`` / ``set_params``.

    Hyper-parameters (attnlens's choices; PAPA does not publish them): ``epochs`` = 1,
    ``batch_size`` = 256 masked tokens, Adam with ``lr`` = 1e-3, ``seed`` = 0 (initial weights
    and order). One epoch because more overfits: on MiniLM with WikiText-2 (3,219 paragraphs,
    50,312 masked tokens to train, 6,239 to score, max_len 128) one epoch scored −5.85 nats, three
    −5.95 (lr 3e-3: −6.16), against −6.45 for the unigram distribution of the training tokens.
    """

    def __init__(self, *, epochs: int = 1, batch_size: int = 256, lr: float = 1e-3, seed: int = 0,
                 progress: bool = False) -> None:
        checks.whole_number(epochs, "epochs", minimum=1)
        checks.whole_number(batch_size, "batch_size", minimum=1)
        if checks.finite(lr, "lr", low=0) == 0:
            raise InputError("lr must be above 0 (nothing would be learned).")
        checks.whole_number(seed, "seed")
        # scikit-learn's contract: every argument stored unchanged (checked above)
        self.epochs, self.batch_size, self.lr, self.seed = epochs, batch_size, lr, seed
        self.progress = progress
        self.network: torch.nn.Sequential | None = None

    def fit(self, features: Features, vocab_size: int) -> MLMHead:
        """Train on masked-token ``features`` (their :attr:`~Features.positions` are the
        targets) over a vocabulary of ``vocab_size`` tokens; returns ``self``."""
        from torch import nn

        if features.kind != "masked":
            raise InputError(f"an MLM head trains on masked-token features, got {features.kind!r} ones.")
        inputs = features.vectors.flatten(1)
        targets = features.positions
        n = inputs.shape[0]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            width = features.d_model
            self.network = nn.Sequential(nn.Linear(inputs.shape[1], width), nn.GELU(),
                                         nn.Linear(width, vocab_size))
            # fused: one kernel per step over the 11.7M weights of the vocabulary layer (MiniLM),
            # half the time of a step of the per-tensor loop (140 to 75 ms, batch 32, 1 thread);
            # the same update rule
            optimiser = torch.optim.Adam(self.network.parameters(), lr=self.lr,
                                         fused=inputs.device.type in ("cpu", "cuda"))
            bar = passes.progress_bar(range(self.epochs * n), "MLM probe", self.progress)
            generator = torch.Generator().manual_seed(self.seed)
            try:
                for _ in range(self.epochs):
                    order = torch.randperm(n, generator=generator)
                    for start in range(0, n, self.batch_size):
                        rows = order[start : start + self.batch_size]
                        loss = torch.nn.functional.cross_entropy(
                            self.network(inputs[rows].float()), targets[rows])
                        optimiser.zero_grad()
                        loss.backward()
                        optimiser.step()
                        bar.update(len(rows))
            finally:
                bar.close()
        return self

    def log_likelihood(self, features: Features) -> Float[Tensor, " token"]:
        """``log p(original token)`` at each masked position of ``features``."""
        if self.network is None:
            raise NotFittedError("this MLMHead is not fitted yet; call fit(features, vocab_size) first.")
        out = []
        with torch.no_grad():
            for start in range(0, features.vectors.shape[0], 1024):
                logits = self.network(features.vectors[start : start + 1024].flatten(1).float())
                out.append(-token_nll(logits, features.positions[start : start + 1024]))
        return torch.cat(out)

    def score(self, features: Features) -> float:
        """Minus the mean cross-entropy over the masked tokens (nats; higher is better)."""
        return float(self.log_likelihood(features).double().mean())

    def save(self, path: Any) -> Any:
        """Write the fitted head to one safetensors file (atomically, with a checksum)."""
        import json

        if self.network is None:
            raise NotFittedError("this MLMHead is not fitted yet; nothing to save.")
        tensors = {name: value.detach().contiguous() for name, value in self.network.state_dict().items()}
        settings = {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": self.seed}
        # safetensors_bytes adds the checksum
        metadata = {"format": HEAD_FORMAT, "settings": json.dumps(settings, sort_keys=True)}
        return write_atomic(path, safetensors_bytes(tensors, metadata))

    @classmethod
    def load(cls, path: Any) -> MLMHead:
        """Read a head written by :meth:`save` (one ``ValueError`` for a damaged or foreign file)."""
        import json

        from torch import nn

        metadata, tensors = read_checked(path, what="MLM head", format=HEAD_FORMAT)
        if set(tensors) != {"0.weight", "0.bias", "2.weight", "2.bias"} or not all(
            checks.all_finite(value) for value in tensors.values()
        ):
            raise InputError(f"MLM head file {path} is damaged (missing or non-finite weights).")
        head = cls(**json.loads(metadata["settings"]))
        hidden, width = tensors["0.weight"].shape
        head.network = nn.Sequential(nn.Linear(width, hidden), nn.GELU(),
                                     nn.Linear(hidden, tensors["2.weight"].shape[0]))
        head.network.load_state_dict(tensors)
        return head


def probe(
    model: Any,
    texts: Sequence[str],
    *,
    eval_texts: Sequence[str] | None = None,
    hooks: passes.FwdHooks = (),
    mask_rate: float = 0.15,
    seed: int = 0,
    max_len: SupportsIndex = 128,
    layout: str | None = None,
    batch_size: SupportsIndex = 32,
    head: MLMHead | dict | None = None,
    cache: bool = True,
    cache_key: str | None = None,
    progress: bool = True,
) -> LMScore:
    """The MLM probe (PAPA's LM score, which works for every encoder, the default MiniLM
    included): a fresh :class:`MLMHead` trained on the frozen model under ``hooks``, scored as
    minus its mean cross-entropy on masked tokens (nats per token, kind ``"probe"``).

    Masks: ``mask_rate`` of each text's real tokens, fixed by ``seed`` and the text
    (:func:`mlm_masks`, BERT's 80/10/10 mix), so every intervention sees the same masks.
    ``texts`` train the head; it is scored on ``eval_texts`` (by default the last fifth of
    ``texts``, the head then training on the first four fifths). Features are extracted and
    cached as :func:`attnlens.probing.extract` does. attnlens's own protocol: the PAPA
    repository does not publish the corpus or the steps of its MLM probe, so its numbers are not
    the paper's (attnlens's examples use WikiText-2).
    """
    require_bridge(model, "lm.probe")
    if isinstance(texts, str | bytes):
        raise InputTypeError("texts must be a list of strings, not one string; pass [text] for one text.")
    texts = list(texts)
    if eval_texts is None:
        if len(texts) < 2:
            raise InputError("lm.probe needs at least 2 texts (the last fifth scores the head).")
        cut = len(texts) - max(1, len(texts) // 5)
        texts, eval_texts = texts[:cut], texts[cut:]
    mask_rate = _rate(mask_rate)
    seed = checks.whole_number(seed, "seed")
    max_len = checks.whole_number(max_len, "max_len", " of tokens (e.g. max_len=128)", minimum=1)
    batch_size = checks.whole_number(batch_size, "batch_size", " of texts per batch (e.g. 32)", minimum=1)
    if getattr(model.tokenizer, "mask_token_id", None) is None:
        raise InputError(f"{model_id(model)} has no mask token; the MLM probe needs an encoder.")
    if head is None or isinstance(head, dict):
        head = MLMHead(**{"seed": seed, "progress": progress, **(head or {})})
    variant = f"mlm-probe/{mask_rate}/{seed}/{PROBE_MIX}"
    options = dict(hooks=hooks, cache=cache, cache_key=cache_key, max_len=int(max_len),
                   layout=layout, batch_size=int(batch_size), progress=progress, variant=variant)
    train = extract(model, texts, description="MLM probe train",
                    states=MaskedStates(model, rate=mask_rate, seed=seed, examples=texts), **options)
    evaluation = extract(model, list(eval_texts), description="MLM probe eval",
                         states=MaskedStates(model, rate=mask_rate, seed=seed), **options)
    head.fit(train, int(model.cfg.d_vocab))
    value = head.score(evaluation)
    log_likelihood = head.log_likelihood(evaluation).double()
    owner = torch.repeat_interleave(torch.arange(len(evaluation)), evaluation.lengths)
    sums = torch.zeros(len(evaluation), dtype=torch.float64).index_add_(0, owner, log_likelihood)
    counts = torch.stack([sums, evaluation.lengths.double()], dim=1).numpy()  # mean = Σ sums / Σ n
    settings = {"kind": "probe", "mask_rate": mask_rate, "seed": seed, "mix": PROBE_MIX,
                "max_len": int(max_len), "layout": layout, "train_texts": len(texts),
                "train_tokens": int(train.vectors.shape[0]), "epochs": head.epochs}
    return LMScore(value=value, kind="probe", n_tokens=int(evaluation.vectors.shape[0]),
                   n_examples=len(eval_texts), perplexity=math.exp(-value), model_id=model_id(model),
                   settings=settings, interval=bootstrap_counts(counts, "accuracy", seed=seed), counts=counts)


def evaluate(model: Any, texts: Sequence[str], *, hooks: passes.FwdHooks = (), **options: Any) -> LMScore:
    """The LM score a curve or a report shows: the model's own head (:func:`score`, causal or
    fixed-mask MLM) where its checkpoint trained it, else the MLM probe (:func:`probe`). The
    kind is in the result (:attr:`LMScore.name`)."""
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
