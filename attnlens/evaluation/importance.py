"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", §4.1-4.2):
``I_h = E_x |∂L(x)/∂ξ_h|``, where a gate ``ξ_h = 1`` multiplies head ``h``'s output ``z``, computed
over a corpus as one pass of the pass engine (:func:`attnlens.engine.passes.run`, with
gradients) and normalised per layer by the ℓ2 norm (:func:`attnlens.methods.ablation.normalize_by_layer`).

Evaluation: the loss is the model's own LM loss (:func:`attnlens.evaluation.lm.masks.mlm_masks` for
an encoder) or a task probe's (:class:`ProbeLoss`, :func:`task_loss`: a PAPA probe of
:mod:`attnlens.evaluation.probing` on a task of :mod:`attnlens.evaluation.tasks`). The
ablation itself (hooks, head means, the pruning curve) is :mod:`attnlens.methods.ablation`;
``attnlens.ablation`` gathers both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, SupportsIndex

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core import checks, devices, processing
from attnlens.core.inputs import default_layout
from attnlens.core.loading import is_causal, lm_head_trained, model_id, require_bridge
from attnlens.core.modes import gradients
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, PassBatch
from attnlens.engine.forward import FwdHooks
from attnlens.errors import InputError, InputTypeError, ModelBehaviourError
from attnlens.evaluation import probing, tasks
from attnlens.evaluation.lm.masks import mlm_masks
from attnlens.evaluation.lm.scorer import UntrainedHead
from attnlens.evaluation.probing.features import HiddenStates
from attnlens.methods.ablation import Importance, model_shape, normalize_by_layer, output_hook

__all__ = ["Gates", "GatesUnused", "LossFn", "ProbeLoss", "importance", "task_loss"]


class GatesUnused(InputError):
    """The loss of :func:`importance` does not depend on the heads' gates (e.g. it ignores the
    model's output), so every head's importance would be 0."""


#: ``loss(output, batch) -> Tensor`` of :func:`importance`
LossFn = Callable[..., Tensor]


class Gates(Accumulator):
    """The accumulator of :func:`importance`: a gate ``ξ = 1`` per example, layer and head
    (``[batch, layer, head]``, a leaf tensor requiring grad, made at the first ``hook_z`` of each
    batch in ``z``'s dtype) multiplies each head's output ``z``; after the forward, the gradient of
    the loss with respect to the gates is taken (:func:`torch.autograd.grad`: the model's weights
    get none) and ``|∂L/∂ξ|`` summed in float64.

    With a loss of one value per example (``[batch]``), ``∂(Σ L)/∂ξ_{b,h}`` is example ``b``'s own
    gradient (examples do not interact in eval mode), so the sum of their absolute values over the
    corpus, divided by the examples, is exactly ``E_x |∂L(x)/∂ξ_h|``. With a scalar loss, the
    gates of a batch are summed first: the gradient with respect to one gate shared by the batch.
    """

    name = "importance"
    needs_output = True
    needs_grad = True

    def __init__(self, model: Any, loss: LossFn | None, *, mask_rate: float = 0.15, seed: int = 0) -> None:
        n_layers, n_heads = model_shape(model)
        mask_rate, seed = checks.finite(mask_rate, "mask_rate", low=0.0, high=1.0), checks.whole_number(seed, "seed")
        self.model, self.loss, self.mask_rate, self.seed = model, loss, mask_rate, seed
        self.total = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        self.count = torch.zeros((), dtype=torch.float64)
        self.examples = torch.zeros((), dtype=torch.float64)
        self.per: str | None = None
        self.default = None
        if loss is None:
            self.default = "causal" if is_causal(model) else "mlm"
        self.gates: Tensor | None = None
        #: the start of the first batch whose loss was not finite (-1: none), noted off the CPU
        self._not_finite_at = torch.tensor(-1)
        self._targets: Tensor | None = None
        self._original: Tensor | None = None
        # a task probe reads layout positions (HiddenStates.select), so PAPA batches may run
        # compact; the MLM loss draws its masks over columns, and a given loss may read columns
        self.compact = isinstance(loss, ProbeLoss)

    def hooks(self, model: Any) -> list[tuple[str, Any]]:
        n_layers, n_heads = self.total.shape

        def gate(layer: int) -> Callable:
            def hook(z: Float[Tensor, "batch pos head d_head"], hook: Any) -> Tensor:
                if z.shape[2] != n_heads:
                    raise InputError(f"hook_z has {z.shape[2]} heads; the model's config says {n_heads}.")
                if self.gates is None:
                    self.gates = torch.ones(z.shape[0], n_layers, n_heads, dtype=z.dtype, device=z.device,
                                            requires_grad=True)
                return z * self.gates[:, layer, None, :, None]

            return hook

        return [(output_hook(model, layer), gate(layer)) for layer in range(n_layers)]

    def prepare(self, batch: Any) -> Any:
        if self.default != "mlm":
            return batch

        masked, targets = mlm_masks(batch, self.model.tokenizer, rate=self.mask_rate, seed=self.seed)
        self._targets, self._original = targets, batch.input_ids
        return masked

    def start_batch(self, batch: PassBatch) -> None:
        super().start_batch(batch)
        self.gates = None

    def _default_loss(self, output: Any, batch: PassBatch) -> Tensor:
        logits = getattr(output, "logits", output)
        ids = batch.batch.input_ids.to(logits.device)
        if self.default == "causal":
            real = batch.key_mask.to(logits.device)
            scored = real[:, 1:] & real[:, :-1]
            logits, targets = logits[:, :-1], ids[:, 1:]
        else:
            scored = self._targets.to(logits.device)
            targets = self._original.to(logits.device)
        nll = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1) if logits.dtype in (torch.float16, torch.bfloat16) else logits.flatten(0, 1),
            targets.flatten(), reduction="none",
        ).view(scored.shape)
        nll = nll * scored
        return nll.sum(1) / scored.sum(1).clamp_min(1)

    def update_output(self, batch: PassBatch, output: Any) -> None:
        if self.gates is None:
            raise ModelBehaviourError("hook_z did not fire: the importance gates were never applied.")
        value = (self.loss or self._default_loss)(output, batch)
        if not isinstance(value, Tensor):
            raise InputTypeError(f"loss must return a tensor (a scalar, or one value per example); got {checks.describe(value)}.")
        per = "batch" if value.ndim == 0 else "example"
        if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != self.gates.shape[0]):
            raise InputError(
                f"loss returned a tensor of shape {list(value.shape)}; return a scalar or one value "
                f"per example ([{self.gates.shape[0]}] for this batch)."
            )
        if self.per is not None and per != self.per:
            raise InputError("loss returned a scalar for some batches and one value per example for others.")
        self.per = per
        finite = torch.isfinite(value.detach()).all()
        if devices.reads_are_free(finite):
            if not bool(finite):
                raise _not_finite(batch.start)
        else:  # off the CPU: the first such batch noted on the device, read once, with the result
            noted = self._not_finite_at.to(finite.device)
            self._not_finite_at = torch.where(finite | (noted >= 0), noted, batch.start)
        unused = GatesUnused(
            "the loss does not depend on the heads' gates (it ignores the model's output, or what it "
            "reads is computed before the attention heads), so every head's importance would be 0; "
            "compute it from the model's output (or from a residual stream after the heads)."
        )
        if not value.requires_grad:
            raise unused
        (grad,) = torch.autograd.grad(value.sum(), self.gates, allow_unused=True)
        if grad is None:
            raise unused
        grad = grad.detach().double().to(self.total.device)  # where the state is (the pass's device)
        if per == "example":
            self.total += grad.abs().sum(0)
            self.count += grad.shape[0]
        else:
            self.total += grad.sum(0).abs()
            self.count += 1
        self.examples += grad.shape[0]
        self.gates = None

    def end_batch(self, batch: PassBatch) -> None:
        self.gates, self._targets, self._original = None, None, None

    def state_dict(self) -> dict[str, Tensor]:
        return {"total": self.total, "count": self.count, "examples": self.examples}

    def metadata(self) -> dict[str, Any]:
        return {"per": self.per}

    def load_state_dict(self, state: Mapping[str, Tensor], metadata: Mapping[str, Any]) -> None:
        super().load_state_dict(state, metadata)
        self.per = metadata.get("per", self.per)

    def merge(self, other: Accumulator) -> Gates:
        super().merge(other)
        self.per = self.per or getattr(other, "per", None)
        return self

    def result(self) -> Float[Tensor, "layer head"]:
        at = int(self._not_finite_at)
        if at >= 0 or not bool(torch.isfinite(self.total).all()):  # (a shard's loss, under torchrun)
            raise _not_finite(at)
        raw = self.total / self.count.clamp_min(1)
        if not bool((raw != 0).any()):
            raise GatesUnused(
                "every head's gradient is 0: the loss does not depend on the heads' gates (e.g. "
                "it multiplies the model's output by 0), so importance cannot rank them."
            )
        return raw


def _not_finite(start: int) -> InputError:
    if start >= 0:
        return InputError(f"loss is not finite (NaN or inf) for the batch starting at example {start}.")
    return InputError("the loss or its gradient is not finite (NaN or inf) for a batch (on another rank, under "
                      "torchrun); every head's importance would be NaN.")


class ProbeLoss:
    """A task's loss for :func:`importance`: a fitted PAPA probe (:class:`attnlens.evaluation.probing.PapaProbe`)
    read on the model's own hidden states of the batch being run, so that its gradient reaches the
    heads' gates (the "task probe's loss" of Michel et al.'s setting, §4.1, with the probe in
    place of a fine-tuned classifier).

    ``probe``: fitted on :func:`attnlens.evaluation.probing.extract` features of the same model, ``max_len``
    and layout (the tokens and layers it reads are those of
    :class:`attnlens.evaluation.probing.features.HiddenStates`); ``labels``: one label per example of the
    corpus (sequence tasks) or one list of word labels per example (token tasks), in corpus
    order; ``examples``: the corpus (word counts of :class:`attnlens.Words`).

    :func:`importance` installs its :meth:`hooks` itself; called as ``loss(output, batch)`` it
    returns each example's cross-entropy (``[batch]``; token tasks: the
    mean over the example's labelled words, 0 for an example without one). A label the probe
    never saw in training (a class missing from a small training subset) is not counted.
    """

    def __init__(self, model: Any, probe: Any, labels: Sequence, examples: Sequence) -> None:
        if getattr(probe, "network", None) is None:
            raise InputError("ProbeLoss needs a fitted PapaProbe; call probe.fit(features, labels) first.")
        if len(labels) != len(examples):
            raise InputError(f"{len(labels)} labels for {len(examples)} examples; give one per example.")

        self.model, self.probe, self.labels, self.examples = model, probe, list(labels), examples
        self.n_layers = int(model.cfg.n_layers)
        self._states = HiddenStates(self.n_layers, examples)
        self._layers: dict[int, Tensor] = {}
        for parameter in probe.network.parameters():
            parameter.requires_grad_(False)
        probe.network.eval()

    def hooks(self) -> list[tuple[str, Callable]]:
        """Hooks keeping the residual stream entering the first block and leaving every block
        (with its graph, unlike the feature extraction's)."""

        def keep(index: int) -> Callable:
            def hook(residual: Tensor, hook: Any) -> None:
                self._layers[index] = residual

            return hook

        names = ["blocks.0.hook_in"] + [f"blocks.{layer}.hook_out" for layer in range(self.n_layers)]
        return [(name, keep(index)) for index, name in enumerate(names)]

    def __call__(self, output: Any, batch: PassBatch) -> Float[Tensor, "batch"]:
        if sorted(self._layers) != list(range(self.n_layers + 1)):
            raise ModelBehaviourError(
                "ProbeLoss saw no hidden states: run it through ablation.importance (which installs "
                "its hooks) or pass hooks=loss.hooks() to the pass."
            )
        stacked = torch.stack([self._layers[i] for i in range(self.n_layers + 1)], dim=2)  # [b, pos, layer, d]
        self._layers = {}
        # which tokens, their positions, examples and targets: found on the host (the pass's
        # copy of the inputs) and moved in one pinned copy, so nothing waits for the device
        keep, positions, _ = self._states.select(batch)
        rows = keep.flatten().nonzero().squeeze(-1)
        example = torch.repeat_interleave(torch.arange(len(batch)), keep.sum(1))
        given = self.labels[batch.start : batch.start + len(batch)]
        unseen = self.probe.n_labels  # labels the probe never saw in training: not counted
        if self._states.kind == "sequence":
            targets = torch.tensor([int(label) for label in given], dtype=torch.long)
        else:
            targets = torch.cat([torch.as_tensor(tags, dtype=torch.long)[positions[example == row]]
                                 for row, tags in enumerate(given)])
        counted = targets < unseen
        rows, positions, example, targets, counted = devices.to_device(
            (rows, positions, example, targets.masked_fill(~counted, -100), counted), stacked.device)
        vectors = stacked.flatten(0, 1).index_select(0, rows).float()
        network = self.probe.network.to(vectors.device)
        logits = network(vectors, positions, example, len(batch))
        each = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
        if self._states.kind == "sequence":
            return each
        total = torch.zeros(len(batch), dtype=each.dtype, device=each.device).index_add_(0, example, each)
        words = torch.zeros(len(batch), dtype=each.dtype, device=each.device).index_add_(
            0, example, counted.to(each.dtype)
        )
        return total / words.clamp_min(1)


def task_loss(
    model: Any, task: str, *, data_dir: Any = None, train_limit: int | None = 4000,
    limit: int | None = 512, max_len: int = 128, layout: str | None = None, batch_size: int = 32,
    seed: int = 0, progress: bool = True,
) -> tuple[list, ProbeLoss]:
    """``(examples, loss)`` for :func:`importance` on a task of :mod:`attnlens.evaluation.tasks`,
    both from its train split: a PAPA probe fitted on ``train_limit`` examples (features of the
    model as it is, cached as :func:`attnlens.evaluation.probing.run` caches them), and ``limit``
    other examples with their labels, held out from the probe's (``None``: a fifth of the
    split), whose loss is differentiated. One seeded subset of ``train_limit + limit`` examples
    is drawn and split. The ranking of heads importance gives is a choice (which heads to prune),
    so it is made on training data: the dev split stays for the scores reported of the pruned
    model (:func:`attnlens.evaluation.pruning.prune_curve`)."""

    layout = default_layout(model) if layout is None else layout
    drawn = None if train_limit is None or limit is None else train_limit + limit
    pool = tasks.load(task, "train", data_dir=data_dir, limit=drawn, seed=seed)
    if len(pool) < 2:
        raise InputError(f"the train split of task {task!r} holds {len(pool)} example: importance needs two at "
                         "least, one to fit the probe on and one to differentiate its loss on.")
    n_held = max(1, len(pool) // 5) if limit is None else max(1, min(limit, len(pool) // 2))
    order = np.random.default_rng(seed).permutation(len(pool))
    held = dataclasses.replace(pool, examples=pool.examples.select(np.sort(order[:n_held])))
    train = dataclasses.replace(pool, examples=pool.examples.select(np.sort(order[n_held:])[:train_limit]))
    features = probing.extract(model, train.inputs(), max_len=max_len, layout=layout,
                               batch_size=batch_size, progress=progress, description=f"{task} train")
    probe = probing.PapaProbe(seed=seed, progress=progress).fit(features, train.labels())
    examples = held.inputs()
    return examples, ProbeLoss(model, probe, held.labels(), examples)


@gradients()  # the gates' gradients, whatever the caller's mode (its state made with them)
def importance(
    model: Any,
    corpus: Any,
    *,
    loss: LossFn | None = None,
    max_len: SupportsIndex = 128,
    layout: str | None = None,
    batch_size: SupportsIndex = 16,
    hooks: FwdHooks = (),
    mask_rate: float = 0.15,
    seed: int = 0,
    progress: bool = True,
    data_dir: Any = None,
    train_limit: int | None = 4000,
    limit: int | None = 512,
) -> Importance:
    """Head importance of Michel et al. 2019 (§4.1, eq. 2): ``I_h = E_x |∂L(x)/∂ξ_h|``, with a
    gate ``ξ_h = 1`` multiplying head ``h``'s output ``z`` (``blocks.{l}.attn.hook_z``), over
    ``corpus`` in one pass of :func:`attnlens.engine.passes.run` with gradients (:class:`Gates`; only
    the gates get gradients, not the model's weights). Returns :class:`Importance`: ``scores``
    normalised per layer by the ℓ2 norm (§4.2), ``raw`` before, :meth:`Importance.heads_ranked`.

    ``corpus``: texts (or :class:`attnlens.Words`), or the name of a task of
    :mod:`attnlens.evaluation.tasks` (``"sst2"``, ``"ner"``, ...): then the default loss is the task probe's
    (:func:`task_loss`: a PAPA probe fitted on ``train_limit`` training examples read from
    ``data_dir``, the loss on ``limit`` other training examples with their labels, held out from
    the probe's; :class:`ProbeLoss`).

    ``loss(output, batch)``: any differentiable callable of the model's output (the logits,
    ``[batch, pos, vocab]``) and the :class:`attnlens.engine.accumulator.PassBatch` (``batch.batch`` the
    inputs run, ``batch.key_mask`` the real tokens, ``batch.start`` the corpus index of its first
    example, e.g. to look up labels), returning one value per example (``[batch]``: the exact
    expectation over examples) or a scalar for the batch (then ``raw`` averages
    ``|∂L(batch)/∂ξ_h|`` over batches, as Michel et al.'s code does). A loss may read other hook
    points through ``hooks`` (e.g. keep ``blocks.{L-1}.hook_out``, the residual stream, for a
    task read-out). By default, the model's own LM loss: for a decoder the mean next-token
    negative log-likelihood of each text's real tokens; for an encoder the masked-LM loss on
    fixed masks (:func:`attnlens.evaluation.lm.masks.mlm_masks`, ``mask_rate``, ``seed``). A head that is not in
    the model's checkpoint (:func:`attnlens.core.loading.lm_head_trained` is False, e.g. the default
    all-MiniLM-L6-v2) is refused with :class:`attnlens.evaluation.lm.scorer.UntrainedHead`: pass ``loss=``.

    ``layout``: the inputs' layout (:func:`attnlens.tokenize`); ``None`` is the model's own, on an
    encoder the PAPA layout (the final [SEP] at position ``max_len - 1``, as the task probes'
    features have it), on a decoder the padded one. Michel et al. ran ordinary inputs: pass
    ``layout="padded"`` for theirs (on MiniLM the two layouts' importances differ).

    Raises :class:`GatesUnused` when the loss does not depend on the gates (no gradient reaches
    them, or every gradient is 0) instead of returning zeros.
    """
    require_bridge(model, "ablation.importance")
    processing.check(model, ("values",), "head importance (Michel et al. 2019's gates on each head's output z)")

    train_limit = checks.optional_count(train_limit, "train_limit", " of training examples (or None for all)")
    limit = checks.optional_count(limit, "limit", " of examples (or None for all)")
    mask_rate, seed = checks.finite(mask_rate, "mask_rate", low=0.0, high=1.0), checks.whole_number(seed, "seed")

    if isinstance(corpus, str) and corpus in tasks.NAMES:
        if loss is not None:
            raise InputError(
                f"importance(model, {corpus!r}) uses the task probe's loss; to use your own loss, "
                "pass the texts as the corpus."
            )
        corpus, loss = task_loss(
            model, corpus, data_dir=data_dir, train_limit=train_limit, limit=limit,
            max_len=int(max_len), layout=layout, seed=seed, progress=progress,
        )
    if isinstance(loss, ProbeLoss):
        hooks = [*hooks, *loss.hooks()]
    if loss is not None and not callable(loss):
        raise InputTypeError(f"loss must be a callable loss(output, batch) -> tensor; got {checks.describe(loss)}.")
    if loss is None and lm_head_trained(model) is False:
        raise UntrainedHead(
            f"ablation.importance's default loss is the model's own LM loss, but the LM head of "
            f"{model_id(model)} was not in its checkpoint (transformers initialised it at load), so "
            "its gradients would rank heads by noise. Pass loss=(output, batch) -> tensor: a loss "
            "of your task (e.g. a fixed linear read-out of the residual stream with labels)."
        )
    accumulator = Gates(model, loss, mask_rate=mask_rate, seed=seed)
    params = [(param, param.requires_grad) for param in model.parameters()]
    for param, _ in params:
        param.requires_grad_(False)
    try:
        summary = passes.run(
            model, corpus, [accumulator], max_len=max_len, layout=layout, batch_size=batch_size,
            hooks=hooks, progress=progress, description="ablation.importance",
        )
    finally:
        for param, flag in params:
            param.requires_grad_(flag)
    raw = accumulator.result()
    given = "task probe" if isinstance(loss, ProbeLoss) else "given"
    settings = {"loss": "default " + accumulator.default if accumulator.default else given,
                "max_len": summary.max_len, "layout": summary.layout, "hooks": len(list(hooks))}
    return Importance(
        scores=normalize_by_layer(raw).float(), raw=raw.float(), n_examples=summary.n_examples,
        per=accumulator.per or "example", settings=settings,
    )
