"""The MLM probe (PAPA's LM score, Hassid et al. 2022, for every encoder, the default MiniLM
included): :class:`MLMHead`, a head trained on the frozen model's masked-token vectors of every
layer, :class:`MaskedStates`, the accumulator that extracts them, and :func:`probe`, which trains
and scores a head under any hooks. A learner beside :class:`attnlens.evaluation.probing.PapaProbe`
and :class:`attnlens.evaluation.probing.LinearBaseline`; its score is an
:class:`attnlens.evaluation.lm.result.LMScore` of kind ``"probe"``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, SupportsIndex

import torch
from jaxtyping import Float
from torch import Tensor, nn

from attnlens.core import checks, devices
from attnlens.core.estimator import Estimator
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.core.fingerprints import fingerprints_kept
from attnlens.core.inputs import Batch
from attnlens.core.loading import model_id, require_bridge
from attnlens.core.modes import gradients, own_arithmetic
from attnlens.engine.accumulator import PassBatch
from attnlens.engine.batches import progress_bar
from attnlens.engine.forward import FwdHooks
from attnlens.errors import InputError, InputTypeError, NotFittedError
from attnlens.evaluation.lm.masks import check_rate, mlm_masks
from attnlens.evaluation.lm.result import LMScore
from attnlens.evaluation.probing.features import Features, HiddenStates, extract
from attnlens.evaluation.probing.intervals import bootstrap_counts

__all__ = ["HEAD_FORMAT", "MLMHead", "MaskedStates", "PROBE_MIX", "probe"]


class MaskedStates(HiddenStates):
    """Every layer's vectors at the masked positions of fixed masks (:func:`~attnlens.evaluation.lm.masks.mlm_masks` with
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

    def select(self, batch: PassBatch) -> tuple[Tensor, Tensor, Tensor]:
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

    Hyper-parameters: PAPA's Table 3 (Hassid et al. 2022, Appendix B, row MLM): 2 ``epochs``,
    Adam with ``lr`` = 5e-4, a batch of 8 sequences of 128 tokens. This probe trains on the
    masked tokens alone, so its batch is counted in them: ``batch_size`` = 154, the masked tokens
    of 8 sequences of 128 at BERT's 15% masking rate (8 · 128 · 0.15 ≈ 154). ``seed`` = 0
    (initial weights and order). No choice is made on the scored texts.
    """

    def __init__(self, *, epochs: int = 2, batch_size: int = 154, lr: float = 5e-4, seed: int = 0,
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
        #: the model whose features it was fitted on (:attr:`Features.model`; "" when unknown)
        self.fitted_on_ = ""

    @gradients()  # autograd on, whatever the caller's mode
    def fit(self, features: Features, vocab_size: int) -> MLMHead:
        """Train on masked-token ``features`` (their :attr:`~Features.positions` are the
        targets) over a vocabulary of ``vocab_size`` tokens; returns ``self``."""
        if features.kind != "masked":
            raise InputError(f"an MLM head trains on masked-token features, got {features.kind!r} ones.")
        inputs = features.check_finite().vectors.flatten(1)
        targets = features.positions
        n = inputs.shape[0]
        device = inputs.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            width = features.d_model
            # built on the CPU (the same initial weights wherever it trains), trained on the features' device
            self.network = nn.Sequential(nn.Linear(inputs.shape[1], width), nn.GELU(),
                                         nn.Linear(width, vocab_size)).to(device)
            # fused: one kernel per step over the 11.7M weights of the vocabulary layer (MiniLM),
            # half the time of a step of the per-tensor loop (140 to 75 ms, batch 32, 1 thread);
            # the same update rule
            optimiser = torch.optim.Adam(self.network.parameters(), lr=self.lr,
                                         fused=inputs.device.type in ("cpu", "cuda"))
            bar = progress_bar(range(self.epochs * n), "MLM probe", self.progress)
            generator = torch.Generator().manual_seed(self.seed)
            try:
                for _ in range(self.epochs):
                    order = torch.randperm(n, generator=generator)
                    for start in range(0, n, self.batch_size):
                        rows = order[start : start + self.batch_size]
                        # the step's rows and targets in one copy (devices.to_device: no wait)
                        moved, wanted = devices.to_device((rows, targets[rows]), device)
                        loss = torch.nn.functional.cross_entropy(self.network(inputs[moved].float()), wanted)
                        optimiser.zero_grad()
                        loss.backward()
                        optimiser.step()
                        bar.update(len(rows))
            finally:
                bar.close()
        self.fitted_on_ = features.model
        return self

    def log_likelihood(self, features: Features) -> Float[Tensor, " token"]:
        """``log p(original token)`` at each masked position of ``features`` (on the host: one
        read of the device for all of them)."""
        if self.network is None:
            raise NotFittedError("this MLMHead is not fitted yet; call fit(features, vocab_size) first.")
        width = self.network[0].in_features
        if features.kind != "masked" or features.vectors.shape[1:].numel() != width:
            raise InputError(f"an MLM head scores masked-token features of {width} values a row (as it was "
                             f"fitted on), got {features.kind!r} ones of {features.vectors.shape[1:].numel()}.")
        features.check_model(self.fitted_on_, "MLM head").check_finite()
        out = []
        with torch.no_grad(), own_arithmetic():
            for start in range(0, features.vectors.shape[0], 1024):
                logits = self.network(features.vectors[start : start + 1024].flatten(1).float())
                targets = devices.to_device(features.positions[start : start + 1024], logits.device)
                # -log softmax(logits)[target], as the scorer's token_nll (the logits are float32)
                out.append(-torch.nn.functional.cross_entropy(logits, targets, reduction="none"))
        return torch.cat(out).cpu()

    def score(self, features: Features) -> float:
        """Minus the mean cross-entropy over the masked tokens (nats; higher is better)."""
        return float(self.log_likelihood(features).double().mean())

    def save(self, path: Any) -> Any:
        """Write the fitted head to one safetensors file (atomically, with a checksum)."""
        if self.network is None:
            raise NotFittedError("this MLMHead is not fitted yet; nothing to save.")
        tensors = {name: value.detach().contiguous() for name, value in self.network.state_dict().items()}
        settings = {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": self.seed}
        # safetensors_bytes adds the checksum
        metadata = {"format": HEAD_FORMAT, "settings": json.dumps(settings, sort_keys=True),
                    "fitted_on": self.fitted_on_}
        return write_atomic(path, safetensors_bytes(tensors, metadata))

    @classmethod
    def load(cls, path: Any) -> MLMHead:
        """Read a head written by :meth:`save` (one ``ValueError`` for a damaged or foreign file)."""
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
        head.fitted_on_ = metadata.get("fitted_on", "")  # older files: not recorded
        return head


@fingerprints_kept()  # the weights do not change during a probe: fingerprinted once
def probe(
    model: Any,
    texts: Sequence[str],
    *,
    eval_texts: Sequence[str] | None = None,
    hooks: FwdHooks = (),
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
    (:func:`~attnlens.evaluation.lm.masks.mlm_masks`, BERT's 80/10/10 mix), so every
    intervention sees the same masks.
    ``texts`` train the head; it is scored on ``eval_texts`` (by default the last fifth of
    ``texts``, the head then training on the first four fifths). Features are extracted and
    cached as :func:`attnlens.evaluation.probing.extract` does. attnlens's own protocol: the PAPA
    repository does not publish the corpus or the steps of its MLM probe, so its numbers are not
    the paper's (attnlens's examples use WikiText-2).
    """
    require_bridge(model, "the MLM probe")
    if isinstance(texts, str | bytes):
        raise InputTypeError("texts must be a list of strings, not one string; pass [text] for one text.")
    texts = list(texts)
    if eval_texts is None:
        if len(texts) < 2:
            raise InputError("the MLM probe needs at least 2 texts (the last fifth scores the head).")
        cut = len(texts) - max(1, len(texts) // 5)
        texts, eval_texts = texts[:cut], texts[cut:]
    mask_rate = check_rate(mask_rate)
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
