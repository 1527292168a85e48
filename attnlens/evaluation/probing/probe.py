"""The PAPA probe: a small classifier trained on a frozen model's features (scikit-learn style).

Hassid et al. 2022 (PAPA, §3.3) measure a frozen model by a probe over all its layers, as in
their code's ``FreezeExtractPoller`` (sentence and pair tasks) and
``FreezeExtractPollerTokenClassification`` (token tasks):

- **sequence** (sentence, pair): for each layer ``l = 0..L`` a learned weight per position
  ``w[l, p]`` (initialised to ``1 / max_len``, masked to the example's real tokens) pools the
  layer's vectors; the pooled vectors of all layers are concatenated, ``[s_0; …; s_L]``
  (``(L + 1) · d``), then ``Linear((L + 1)·d, d) → tanh → dropout → Linear(d, n_labels)``;
- **token** (NER, POS): each word's first sub-token, its vectors of all layers concatenated, then
  the same MLP.

By default the probe is the paper's: ``pooling="sum"``, ``standardize=False``. Two variants
are available, and were attnlens's defaults until they were compared on examples held out from
the training split (``benchmarks/probe_choices.py``, ``docs/probe_choices.md``: on MiniLM no
combination of the two was better than another on a majority of five tasks, so the one with no
change, the paper's, is the default):

- ``pooling="mean"``: ``s_l = (max_len / n) · Σ_p w[l, p] · h_l[p]`` over the ``n`` real tokens,
  i.e. the plain mean of the tokens while ``w`` keeps its initial value; the paper's ``"sum"``
  (``s_l = Σ_p w[l, p] · h_l[p]``) shrinks a short sentence's vector by ``n / max_len``, so the
  probe must learn length before content (token probes pool nothing: there it has no effect);
- ``standardize=True``: every input vector is standardised per (layer, dimension) with the
  training vectors' mean and standard deviation (``mean`` / ``scale`` buffers, saved with the
  probe), so that a few outlier dimensions of BERT-style hidden states (magnitudes 10-100× the
  others) do not dominate the first layer.

Hyper-parameters: :func:`attnlens.evaluation.probing.run` trains with the task's row of PAPA's Table 3
(Appendix B; :data:`attnlens.evaluation.probing.TABLE3`: learning rate, batch size, epochs, max length),
with Adam and no weight decay. The class's own defaults (used when no task names a recipe) are
attnlens's: ``epochs`` = 10, ``batch_size`` = 32, ``lr`` = 1e-3. Always:

- ``hidden``: width of the MLP's hidden layer, default ``d_model`` (as the paper's ``Linear``);
- ``dropout`` = 0.1 before the last layer (BERT's classifier dropout);
- ``seed`` = 0: the initial weights and the order of the examples, so a fit is reproducible.

Training runs in float32 on the float16 features, on the features' device (where
:func:`attnlens.evaluation.probing.features.extract` returns them: the model's); the index
arithmetic of each step (which rows, which example) runs on the host, where the features' lengths
and positions stay. Several
probes of one shape (seeds, points of a task) train as one stacked model with
:func:`attnlens.evaluation.probing.stacked.fit_many`, each member the same fit as its own.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from attnlens.core import devices, memory
from attnlens.core.checks import all_finite, finite, flag, whole_number
from attnlens.core.estimator import Estimator
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.core.modes import gradients, own_arithmetic
from attnlens.engine.batches import progress_bar
from attnlens.errors import InputError, MismatchError, NotFittedError
from attnlens.evaluation import tasks
from attnlens.evaluation.probing.features import EDITED_WEIGHTS, Features

#: File format of a saved probe.
FORMAT = "attnlens.PapaProbe/1"

#: Vectors converted to float32 at a time when the training vectors are summed: a chunk small
#: enough to stay in the processor's cache (256 · 7 · 384 floats ≈ 2.8 MB for MiniLM) for its
#: three passes (convert, square, sum), where one of 16,384 (176 MB) goes to memory for each:
#: 12.9x faster on MRPC's 200,000 vectors at one thread (``benchmarks/probe_rows.py``).
CHUNK = 256


class ProbeNetwork(nn.Module):
    """The probe's network (see the module docstring). ``mean`` / ``scale``: ``[layer, d_model]``
    buffers that standardise every input vector, set by :meth:`PapaProbe.fit` from the training
    vectors (identity until then)."""

    def __init__(self, n_layers: int, d_model: int, hidden: int, n_labels: int, max_len: int,
                 sequence: bool, dropout: float, pooling: str = "mean", standardize: bool = True) -> None:
        super().__init__()
        self.sequence = sequence
        self.max_len = max_len
        self.pooling = pooling
        self.standardize = standardize
        if sequence:
            self.position_weights = nn.Parameter(torch.full((n_layers, max_len), 1.0 / max_len))
        self.register_buffer("mean", torch.zeros(n_layers, d_model))
        self.register_buffer("scale", torch.ones(n_layers, d_model))
        self.dense = nn.Linear(n_layers * d_model, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, n_labels)

    def forward(self, vectors: Float[Tensor, "token layer d_model"], positions: Int[Tensor, " token"],
                example: Int[Tensor, " token"], n_examples: int) -> Float[Tensor, "row label"]:
        """Logits of each example (sequence probes) or each token (word probes).

        ``vectors``: the kept tokens' vectors of every layer; ``positions``: each token's position
        in the layout (sequence) or word index (words); ``example``: the example each token
        belongs to, ``0 .. n_examples - 1``."""
        if not self.sequence:
            if self.standardize:
                vectors = (vectors - self.mean) / self.scale
            return self.out(self.dropout(torch.tanh(self.dense(vectors.flatten(1)))))
        # s[e, l] = Σ_{p in e} w[l, p] · (h_l[p] − μ_l) / σ_l, summed over the raw vectors: the
        # pooling is linear, so standardising the pooled vector (subtracting μ_l · Σ_p w[l, p],
        # dividing by σ_l) equals standardising every token first, at a few tokens' cost
        weights = self.position_weights[:, positions].T  # [token, layer]
        pooled = torch.zeros((n_examples, *vectors.shape[1:]), dtype=vectors.dtype, device=vectors.device)
        pooled.index_add_(0, example, vectors * weights[:, :, None])
        if self.standardize:
            total = torch.zeros((n_examples, weights.shape[1]), dtype=weights.dtype, device=weights.device)
            total.index_add_(0, example, weights)
            pooled = (pooled - self.mean * total[:, :, None]) / self.scale
        if self.pooling == "mean":
            # Σ_p w[l, p] h[p] · max_len / n: the mean of the n real tokens while w = 1 / max_len
            # (a count by index_add_: on a GPU bincount reads the largest index back to size its output)
            tokens = vectors.new_zeros(n_examples).index_add_(0, example, vectors.new_ones(len(example))).clamp_min(1)
            pooled = pooled * (self.max_len / tokens)[:, None, None]
        return self.out(self.dropout(torch.tanh(self.dense(pooled.flatten(1)))))


@dataclass
class ProbeSettings:
    """The probe's hyper-parameters (see the module docstring)."""

    hidden: int | None = None
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    dropout: float = 0.1
    seed: int = 0
    pooling: str = "sum"
    standardize: bool = False
    early_stopping: bool = False
    validation_fraction: float = 0.1
    n_iter_no_change: int = 2
    min_epochs: int = 1


#: How a sequence probe pools a layer's token vectors (see the module docstring).
POOLINGS: tuple[str, ...] = ("mean", "sum")


class PapaProbe(Estimator):
    """PAPA's probe, scikit-learn style: :meth:`fit` on :class:`Features` and labels,
    :meth:`predict`, :meth:`score`, :meth:`save` / :meth:`load`, ``get_params`` / ``set_params``
    (``sklearn.base.clone`` works).

    Labels: one int per example (sequence features) or, for word features, one list of ints per
    example, aligned with its words; words without a vector (cut by ``max_len``) are skipped in
    training and predicted as the most frequent training label.
    """

    def __init__(self, *, hidden: int | None = None, epochs: int = 10, batch_size: int = 32,
                 lr: float = 1e-3, weight_decay: float = 0.0, dropout: float = 0.1, seed: int = 0,
                 pooling: str = "sum", standardize: bool = False, early_stopping: bool = False,
                 validation_fraction: float = 0.1, n_iter_no_change: int = 2, min_epochs: int = 1,
                 progress: bool = False) -> None:
        given = dict(locals())
        self.settings = ProbeSettings(
            hidden=None if hidden is None else whole_number(hidden, "hidden", minimum=1),
            epochs=whole_number(epochs, "epochs", minimum=1),
            batch_size=whole_number(batch_size, "batch_size", minimum=1),
            lr=finite(lr, "lr", low=0.0),
            weight_decay=finite(weight_decay, "weight_decay", low=0.0),
            dropout=finite(dropout, "dropout", low=0.0, high=1.0),
            seed=whole_number(seed, "seed"),
            pooling=pooling,
            standardize=standardize,
            early_stopping=early_stopping,
            validation_fraction=finite(validation_fraction, "validation_fraction", low=0.0, high=0.5),
            n_iter_no_change=whole_number(n_iter_no_change, "n_iter_no_change", minimum=1),
            min_epochs=whole_number(min_epochs, "min_epochs", minimum=1),
        )
        if pooling not in POOLINGS:
            raise InputError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}.")
        flag(standardize, "standardize")
        flag(early_stopping, "early_stopping")
        if self.settings.lr == 0 or self.settings.dropout == 1:
            raise InputError("lr must be above 0 and dropout below 1 (nothing would be learned).")
        for name in self._param_names():  # scikit-learn's contract: every argument, unchanged
            setattr(self, name, given[name])
        self.network: ProbeNetwork | None = None
        self.n_labels = 0
        self.fallback = 0
        self.max_len = 0
        self.made_for: dict[str, Any] = {}  # what the probe was fitted on (predict checks it)

    # ---- training ----------------------------------------------------------------------------

    @gradients()  # autograd on, whatever the caller's mode
    def fit(self, features: Features, labels: list, *, task: str | None = None,
            label_names: Sequence[str] | None = None,
            scorer: Callable[[np.ndarray, list], float] | None = None) -> PapaProbe:
        """Train on ``features`` and their ``labels``; returns ``self``. ``task`` and
        ``label_names`` (optional) are recorded with the features' kind and shape, and
        :meth:`predict` refuses features made for something else.

        With ``early_stopping``, a share ``validation_fraction`` of the examples is held out and
        judged after every epoch, by ``scorer(indices, predictions)`` (higher is better: the
        task's metric of :meth:`predict`'s lists for the examples at ``indices``) or, without one,
        by the mean cross-entropy; training stops after ``n_iter_no_change`` epochs without a
        better one and keeps the weights of the best epoch (``epochs_``; the values from epoch
        ``min_epochs`` on in ``validation_scores_``; earlier epochs are not judged), as
        scikit-learn's ``MLPClassifier(early_stopping=True)``.

        Like a pass, the first fit of a process keeps freed memory for reuse
        (:func:`attnlens.core.memory.reuse_freed_memory`): features read from the cache run no
        pass first, and every step makes and frees float32 copies of its examples' vectors."""
        memory.reuse_freed_memory()
        targets = label_targets(features.check_finite(), labels)
        valid = targets >= 0
        if not valid.any():
            raise InputError("no labelled example to train the probe on.")
        self.n_labels = int(targets[valid].max()) + 1  # this fit's labels: a refit is a fresh fit
        self.fallback = int(torch.bincount(targets[valid], minlength=self.n_labels).argmax())
        self.max_len = features.max_len
        self.made_for = made_for_record(features, task, label_names)
        generator = torch.Generator().manual_seed(self.settings.seed)

        n = len(features)
        train, held = held_out_split(n, self.settings.validation_fraction if self.settings.early_stopping else 0.0,
                                     generator)
        device = features.vectors.device
        # initial weights and dropout: from the seed (the global generators restored after)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.settings.seed)
            self.network = ProbeNetwork(
                features.n_layers, features.d_model, self.settings.hidden or features.d_model,
                self.n_labels, features.max_len, features.kind == "sequence", self.settings.dropout,
                self.settings.pooling, self.settings.standardize,
            ).to(device)  # built on the CPU: the same initial weights wherever it trains
            if self.settings.standardize:
                standardize(self.network, features, targets)
            # fused: one kernel per step for all parameters (a third faster than the per-tensor
            # loop on a small probe, where Adam is a quarter of a step); same update rule
            optimiser = torch.optim.Adam(self.network.parameters(), lr=self.settings.lr,
                                         weight_decay=self.settings.weight_decay,
                                         fused=features.vectors.device.type in ("cpu", "cuda"))
            loss = nn.CrossEntropyLoss(ignore_index=-1)
            bar = progress_bar(range(self.settings.epochs * len(train)), "probe", self.progress)
            self.validation_scores_: list[float] = []
            best, best_state, waited = -float("inf"), None, 0
            try:
                for epoch in range(1, self.settings.epochs + 1):
                    self.network.train()
                    order = train[torch.randperm(len(train), generator=generator)]
                    for start in range(0, len(order), self.settings.batch_size):
                        chosen = order[start : start + self.settings.batch_size]
                        logits, _, wanted = self._logits(features, chosen, targets)
                        value = loss(logits, wanted)
                        optimiser.zero_grad()
                        value.backward()
                        optimiser.step()
                        bar.update(len(chosen))
                    if held is None or epoch < self.settings.min_epochs:
                        continue
                    current = (scorer(held.numpy(), self._predict(features, held)) if scorer is not None
                               else -self._loss(features, targets, held))
                    self.validation_scores_.append(float(current))
                    if current > best:
                        best, waited = current, 0
                        best_state = {key: value.clone() for key, value in self.network.state_dict().items()}
                    else:
                        waited += 1
                        if waited >= self.settings.n_iter_no_change:
                            break
            finally:
                bar.close()
                self.network.eval()
            if best_state is not None:
                self.network.load_state_dict(best_state)
            first = min(self.settings.min_epochs, self.settings.epochs)
            self.epochs_ = (int(torch.tensor(self.validation_scores_).argmax()) + first
                            if self.validation_scores_ else self.settings.epochs)
        return self

    def _loss(self, features: Features, targets: Tensor, chosen: Tensor, batch_size: int = 256) -> float:
        """The mean cross-entropy of the examples ``chosen`` (per labelled row: words for token
        probes), in evaluation mode."""
        self.network.eval()
        total, count = 0.0, 0
        with torch.no_grad(), own_arithmetic():
            for start in range(0, len(chosen), batch_size):
                part = chosen[start : start + batch_size]
                logits, _, wanted = self._logits(features, part, targets)
                kept = wanted >= 0
                total += float(nn.functional.cross_entropy(logits[kept], wanted[kept], reduction="sum"))
                count += int(kept.sum())
        return total / max(count, 1)

    def _logits(self, features: Features, chosen: Tensor, targets: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The logits of the examples ``chosen``, the feature rows they read, and (with the
        fit's ``targets``) the step's targets (:func:`targets_of`) on the logits' device."""
        lengths = features.lengths[chosen]
        example = torch.repeat_interleave(torch.arange(len(chosen)), lengths)
        # the kept rows of the chosen examples: each example's first row plus 0 .. length - 1
        starts = features.offsets[:-1][chosen] - (lengths.cumsum(0) - lengths)
        rows = starts[example] + torch.arange(int(lengths.sum()))
        # the index arithmetic on the host (lengths, positions: host metadata), the vectors where
        # they are; the step's indices reach their device in one copy (devices.to_device: pinned,
        # no wait; a copy from pageable memory would wait for the device at every step)
        device = features.vectors.device
        positions = features.positions.index_select(0, rows.to(features.positions.device))
        wanted = None if targets is None else targets_of(targets, features, chosen, rows)
        moved, positions, example, wanted = devices.to_device((rows, positions, example, wanted), device)
        # index_select: 5x faster than vectors[rows], the same rows
        vectors = features.vectors.index_select(0, moved).float()
        logits = self.network(vectors, positions, example, len(chosen))
        return logits, rows, wanted

    # ---- prediction --------------------------------------------------------------------------

    def predict(self, features: Features, *, batch_size: int = 256, task: str | None = None) -> list:
        """Label ints per example (sequence) or per word (words: every word of each example,
        the ones without a vector given the most frequent training label).
        :class:`~attnlens.errors.MismatchError` for features of another kind or shape than the
        probe was fitted on, or of another ``task`` (given here, or the features' ``task``)."""
        batch_size = whole_number(batch_size, "batch_size", " of examples per batch", minimum=1)
        if self.network is None:
            raise NotFittedError("this PapaProbe is not fitted yet; call fit(features, labels) first.")
        _check_made_for(self.made_for, features, task if task is not None else getattr(features, "task", None))
        predicted = self._predict(features.check_finite(), torch.arange(len(features)), batch_size)
        names = self.made_for.get("label_names")
        if not names:
            return predicted
        # the ints with the label set they index: a task refuses them unless they are its own labels
        return tasks.labelled(predicted, names, self.made_for.get("task"))

    def _predict(self, features: Features, examples: Tensor, batch_size: int = 256) -> list:
        """:meth:`predict`'s lists for the examples at ``examples`` (in evaluation mode)."""
        self.network.eval()
        outputs: list = []
        with torch.no_grad(), own_arithmetic():
            for start in range(0, len(examples), batch_size):
                chosen = examples[start : start + batch_size]
                logits, _, _ = self._logits(features, chosen)
                # one read of the device per batch
                outputs.extend(as_lists(features, chosen, logits.argmax(-1).cpu(), self.fallback))
        return outputs

    def score(self, features: Features, labels: list) -> float:
        """The share of correct predictions: of examples (sequence features) or of words (word
        features), as scikit-learn's ``ClassifierMixin.score``; a task's own metric is
        :meth:`attnlens.evaluation.tasks.Task.score` of :meth:`predict`."""
        predicted = self.predict(features)
        if len(labels) != len(predicted):
            raise InputError(f"{len(labels)} labels for {len(predicted)} examples; give one per example.")
        if features.kind == "sequence":
            pairs = [(int(p), int(y)) for p, y in zip(predicted, labels, strict=True)]
        else:
            pairs = [(int(p), int(y)) for ps, ys in zip(predicted, labels, strict=True)
                     for p, y in zip(ps, ys, strict=True)]
        return sum(p == y for p, y in pairs) / max(1, len(pairs))

    def _after_set_params(self, fresh: Estimator) -> None:
        self.settings = fresh.settings

    # ---- files -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted probe to one safetensors file (atomically, with a checksum)."""
        if self.network is None:
            raise NotFittedError("this PapaProbe is not fitted yet; nothing to save.")
        tensors = {name: value.detach().contiguous() for name, value in self.network.state_dict().items()}
        metadata = {"format": FORMAT, "settings": json.dumps(asdict(self.settings), sort_keys=True),
                    "n_labels": str(self.n_labels), "fallback": str(self.fallback),
                    "max_len": str(self.max_len), "sequence": str(self.network.sequence),
                    "made_for": json.dumps(self.made_for, sort_keys=True)}  # safetensors_bytes adds the checksum
        return write_atomic(path, safetensors_bytes(tensors, metadata))

    @classmethod
    def load(cls, path: str | os.PathLike) -> PapaProbe:
        """Read a probe written by :meth:`save` (``ValueError`` for a damaged or foreign file)."""
        metadata, tensors = read_checked(path, what="probe", format=FORMAT)
        if not all(all_finite(value) for value in tensors.values()):
            raise InputError(f"probe file {path} holds non-finite weights.")
        settings = json.loads(metadata["settings"])
        # written before these settings existed: the paper's sum pooling, no standardisation
        settings.setdefault("pooling", "sum")
        settings.setdefault("standardize", False)
        probe = cls(**settings)
        probe.n_labels, probe.fallback = int(metadata["n_labels"]), int(metadata["fallback"])
        probe.max_len = int(metadata["max_len"])
        probe.made_for = json.loads(metadata.get("made_for", "{}"))  # older files: none recorded
        sequence = metadata["sequence"] == "True"
        dense = tensors["dense.weight"]
        n_layers_d = dense.shape[1]
        n_layers = tensors["position_weights"].shape[0] if sequence else None
        d_model = n_layers_d // n_layers if sequence else n_layers_d  # token probes: stored whole
        if "mean" not in tensors:  # written before standardisation existed: identity
            tensors["mean"] = torch.zeros(n_layers or 1, d_model)
            tensors["scale"] = torch.ones(n_layers or 1, d_model)
        probe.network = ProbeNetwork(tensors["mean"].shape[0], tensors["mean"].shape[1], dense.shape[0],
                                     probe.n_labels, probe.max_len, sequence, probe.settings.dropout,
                                     probe.settings.pooling, probe.settings.standardize)
        probe.network.load_state_dict(tensors)
        probe.network.eval()
        return probe


def standardize(network: ProbeNetwork, features: Features, targets: Tensor) -> None:
    """Set ``network``'s ``mean`` / ``scale`` to the training vectors' per (layer, dimension)
    mean and standard deviation: every kept token (sequence probes) or every labelled word
    (word probes). Summed in float32 per chunk of :data:`CHUNK` vectors (relative error ≤
    256 · 2⁻²⁴ ≈ 1.5e-5 of the sum of magnitudes in the worst case, far below what moves a
    probe) into float64 totals; a constant dimension keeps scale 1."""
    device = features.vectors.device
    labelled = None if features.kind == "sequence" else (targets >= 0).to(device)
    total = torch.zeros(features.vectors.shape[1:], dtype=torch.float64, device=device)
    square = torch.zeros_like(total)
    for start in range(0, features.vectors.shape[0], CHUNK):
        chunk = features.vectors[start : start + CHUNK]
        if labelled is not None:
            chunk = chunk[labelled[start : start + CHUNK]]
        chunk = chunk.float()
        total += chunk.sum(0)
        square += (chunk * chunk).sum(0)
    count = max(1, features.vectors.shape[0] if labelled is None else int((targets >= 0).sum()))
    mean = total / count
    std = (square / count - mean.square()).clamp_min(0).sqrt()
    network.mean.copy_(mean.float())
    network.scale.copy_(torch.where(std > 1e-3, std, torch.ones_like(std)).float())


def label_targets(features: Features, labels: list) -> Tensor:
    """One target per example (sequence) or per kept vector (words; -1: unlabelled). Labels are
    the indices of their classes (whole numbers, ``"3"`` read as 3): a label that is none, or a
    negative one of a sequence (which training would skip as unlabelled), is refused."""
    if len(labels) != len(features):
        raise InputError(f"{len(labels)} labels for {len(features)} examples; give one per example.")
    if features.kind == "sequence":
        targets = torch.as_tensor(_label_ints(labels, "label"), dtype=torch.long)
        if len(targets) and int(targets.min()) < 0:
            raise InputError(f"label {int(targets.min())} of example {int(targets.argmin())} is negative; labels "
                             "are class indices 0, 1, ... (give each example its class).")
        return targets
    targets = torch.full((features.vectors.shape[0],), -1, dtype=torch.long)
    offsets = features.offsets
    for index, tags in enumerate(labels):
        words = features.positions[offsets[index] : offsets[index + 1]]
        if len(tags) != int(features.n_words[index]):
            raise InputError(
                f"example {index} has {int(features.n_words[index])} words but {len(tags)} labels."
            )
        tags = torch.as_tensor(_label_ints(tags, f"label of example {index}"), dtype=torch.long)
        targets[offsets[index] : offsets[index + 1]] = tags[words]
    return targets


def _label_ints(labels: Sequence[Any], what: str) -> list[int]:
    """``labels`` as ints (:class:`~attnlens.errors.InputError` naming the first that is not a
    whole number: a label name must be turned into its class index first)."""
    ints = []
    for label in labels:
        try:
            if isinstance(label, float | np.floating) and float(label).is_integer():
                label = int(label)
            ints.append(int(label) if isinstance(label, str) else operator.index(label))
        except (TypeError, ValueError):
            raise InputError(f"{what} {label!r} is not a class index (0, 1, ...); give labels as the indices "
                             "of their classes (e.g. [label_names.index(name) for name in names]).") from None
    return ints


def made_for_record(features: Features, task: str | None, label_names: Sequence[str] | None) -> dict[str, Any]:
    """What a probe fitted on ``features`` was made for (recorded in its file)."""
    return {"task": None if task is None else str(task),
            "label_names": None if label_names is None else [str(name) for name in label_names],
            "kind": features.kind, "n_layers": features.n_layers, "d_model": features.d_model,
            "model": features.model or None}


def _check_made_for(made_for: dict[str, Any], features: Features, task: str | None) -> None:
    """:class:`~attnlens.errors.MismatchError` naming the first fact of ``features`` (or the
    ``task`` they are for) that differs from what the probe was fitted on."""
    found = {"task": task, "kind": features.kind, "n_layers": features.n_layers, "d_model": features.d_model,
             "model": features.model or None}
    for fact, value in found.items():
        recorded = made_for.get(fact)
        if recorded is not None and value is not None and recorded != value:
            raise MismatchError(
                f"this probe was fitted on {fact} {recorded!r}; the features given have {fact} "
                f"{value!r}. Fit a probe on features of {fact} {value!r}, or give features like its own."
                + (f" {EDITED_WEIGHTS}" if fact == "model" else "")
            )


def held_out_split(n: int, validation: float, generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
    """Indices of the examples trained on and of those held out (a share ``validation`` of
    them, at least one, drawn with ``generator``; none held out when ``validation`` is 0 or
    ``n`` < 10)."""
    count = int(round(validation * n))
    if validation == 0 or n < 10:
        return torch.arange(n), None
    count = max(1, min(count, n - 1))
    order = torch.randperm(n, generator=generator)
    return order[count:].sort().values, order[:count].sort().values


def as_lists(features: Features, chosen: Int[Tensor, " example"], predicted: Int[Tensor, " row"],
             fallback: int) -> list:
    """:meth:`PapaProbe.predict`'s lists of the examples ``chosen`` from ``predicted``, the label
    of each of their rows (examples of sequence features; the kept words of word features, example
    after example): an int per example, or a list of ints per example, one per word (words
    without a vector get ``fallback``)."""
    if features.kind == "sequence":
        return [int(value) for value in predicted]
    outputs, position = [], 0
    for index in chosen.tolist():
        count = int(features.lengths[index])
        words = features.positions[features.offsets[index] : features.offsets[index + 1]]
        tags = [fallback] * int(features.n_words[index])
        for word, label in zip(words.tolist(), predicted[position : position + count].tolist(), strict=True):
            tags[word] = label
        outputs.append(tags)
        position += count
    return outputs


def targets_of(targets: Tensor, features: Features, chosen: Tensor, rows: Tensor) -> Tensor:
    """The targets of a training step: per chosen example (sequence) or per chosen row (words)."""
    return targets[chosen] if features.kind == "sequence" else targets[rows]
