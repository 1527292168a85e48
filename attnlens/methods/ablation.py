"""Head ablation (Michel et al. 2019): ablation hooks in four modes, head means, importance
scores (the pruning curve, which installs the hooks through the interventions' registry, is
:mod:`attnlens.evaluation.pruning`).

The guide with examples is the public module's docstring, :mod:`attnlens.ablation`, which gathers
these names with head importance's (:mod:`attnlens.evaluation.importance`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, SupportsIndex

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.core import checks, devices, models, processing, seam
from attnlens.core.files import tensor_checksum
from attnlens.core.heads import HeadSet, as_headset, n_selected
from attnlens.core.loading import is_causal, model_id, require_bridge
from attnlens.core.plots import head_grid
from attnlens.core.result import Result, frame, plain
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, PassBatch
from attnlens.engine.forward import FwdHooks
from attnlens.engine.hooks import Hooks
from attnlens.errors import InputError, InputTypeError
from attnlens.methods import papa
from attnlens.methods.papa.intervene import looks_causal

__all__ = [
    "MODES",
    "ORDERS",
    "AblationHooks",
    "HeadMeans",
    "Importance",
    "check_order",
    "head_means",
    "hooks",
    "normalize_by_layer",
    "output_hook",
    "uniform_pattern",
]

#: The ablation modes of :func:`hooks`, and what each does to a selected head.
MODES: dict[str, str] = {
    "zero": "the head's output z (hook_z) is 0",
    "uniform": "the head's attention is uniform over the valid keys (causal: keys <= query)",
    "mean": "the head's output z is its corpus mean (per head, over real tokens; head_means)",
    "papa": "the head's attention is replaced by PAPA constants (papa.hooks)",
}
#: Orders of heads by importance (:meth:`Importance.heads`; the pruning curve,
#: :func:`attnlens.evaluation.pruning.prune_curve`): least important first (Michel et al.) or
#: most first.
ORDERS: tuple[str, ...] = ("ascending", "descending")


# ------------------------------------------------------------------------------------------------
# hook points and shapes


def output_hook(model: Any, layer: int) -> str:
    """The hook point carrying layer ``layer``'s per-head outputs ``z`` (``[batch, pos, head,
    d_head]``): the architecture's :attr:`~attnlens.core.models.Architecture.output_hook`, by default
    ``blocks.{layer}.attn.hook_z`` (it exists on every bridge, grouped-query models included)."""
    architecture = models.find(model) if model is not None and hasattr(model, "original_model") else None
    n_layers = getattr(getattr(model, "cfg", None), "n_layers", None)
    layer = checks.whole_number(layer, "layer") if n_layers is None else checks.index(layer, "layer", n_layers, "layers")
    template = architecture.output_hook if architecture is not None else "blocks.{layer}.attn.hook_z"
    return template.format(layer=layer)


def _as_headset(heads: Any, known: list[tuple[str, tuple[int, int]]]) -> HeadSet:
    """``heads`` as a :class:`HeadSet` (:func:`attnlens.core.heads.as_headset`; ``(layer, head)``
    pairs take the shape of the first of ``known``: the model, the means, the constants)."""
    if isinstance(heads, list | tuple) and not known:
        raise InputError(
            "heads given as (layer, head) pairs need the model's shape: pass model= (or build "
            "HeadSet.from_heads(pairs, n_layers, n_heads))."
        )
    selected = as_headset(heads, known[0][1] if known else None)
    if selected is None:
        raise InputTypeError(
            f"heads must be a HeadSet (attnlens.core.heads.HeadSet, e.g. Importance.heads(0.5)), (layer, "
            f"head) pairs such as [(0, 3), (5, 11)], or a boolean [layer, head] tensor; got "
            f"{checks.describe(heads)}."
        )
    return selected


def model_shape(model: Any) -> tuple[int, int]:
    """``(n_layers, n_heads)`` of a TransformerLens model."""
    return int(model.cfg.n_layers), int(model.cfg.n_heads)


def _check_shape(heads: HeadSet, known: list[tuple[str, tuple[int, int]]]) -> None:
    """``ValueError`` unless ``heads`` and every ``(source, (layers, heads))`` agree."""
    for source, shape in known:
        if tuple(heads.shape) != tuple(shape):
            raise InputError(
                f"the HeadSet is {list(heads.shape)} (layers x heads) but {source} has "
                f"{list(shape)}: the heads belong to another model. Build them for this one, e.g. "
                f"HeadSet.from_heads(pairs, {shape[0]}, {shape[1]})."
            )


def _check_heads_in(z_or_pattern_heads: int, heads: HeadSet, what: str) -> None:
    if z_or_pattern_heads != heads.shape[1]:
        raise InputError(
            f"the HeadSet is {list(heads.shape)} (layers x heads) but the model's {what} has "
            f"{z_or_pattern_heads} heads: the heads belong to another model."
        )


# ------------------------------------------------------------------------------------------------
# ablation hooks


class AblationHooks(Hooks):
    """``(hook_name, hook_fn)`` pairs for ``run_with_hooks`` (and ``hooks=`` of
    :func:`attnlens.evaluation.probing.run`, :func:`attnlens.evaluation.lm.scorer.score`, :func:`attnlens.engine.passes.run`) that
    ablate ``heads`` in ``mode`` (:data:`MODES`). Attributes: ``heads``, ``mode``, ``means``
    (``"mean"``), ``constants`` and ``papa`` (the delegated :class:`attnlens.papa.PapaHooks`,
    ``"papa"``), ``causal`` (``"uniform"``: True / False, or None when read off each pattern).
    A HeadSet with no head gives an empty list: no hook, the model itself."""

    def __init__(
        self,
        items: Iterable[tuple[str, Callable]],
        *,
        heads: HeadSet,
        mode: str,
        means: Tensor | None = None,
        constants: Any = None,
        papa: Any = None,
        causal: bool | None = None,
    ) -> None:
        super().__init__(items)
        self.heads, self.mode, self.means = heads, mode, means
        self.constants, self.papa, self.causal = constants, papa, causal

    def key(self) -> str:
        """A stable hash of everything that makes these hooks what they are (mode, heads, hook
        points, means, causality; for ``"papa"`` the key of the PAPA hooks): equal keys, equal
        interventions. Probe features under these hooks are cached by it
        (:func:`attnlens.evaluation.probing.features.hooks_key`)."""
        if self.papa is not None:
            return f"ablation:papa:{self.papa.key()}"
        tensors = {"heads": self.heads.mask.to(torch.uint8)}
        if self.means is not None:
            tensors["means"] = self.means.detach()
        names = "|".join(name for name, _ in self)
        return f"ablation:{self.mode}:{self.causal}:{names}:{tensor_checksum(tensors)}"

    def __repr__(self) -> str:
        n_layers, n_heads = self.heads.shape
        return f"AblationHooks({self.mode!r}, {len(self.heads)} of {n_layers * n_heads} heads, {len(self)} hooks)"


def hooks(
    heads: HeadSet | Sequence[tuple[int, int]] | Bool[Tensor, "layer head"],
    mode: str = "zero",
    *,
    model: Any = None,
    means: Float[Tensor, "layer head d_head"] | None = None,
    constants: Any = None,
) -> AblationHooks:
    """Forward hooks that ablate ``heads`` in ``mode`` (Michel et al. 2019 ablate by masking,
    ``"zero"``; the other modes are common alternatives). ``heads``: a :class:`HeadSet`, a boolean
    ``[layer, head]`` tensor, or ``(layer, head)`` pairs (e.g. ``[(0, 3), (5, 11)]``; their
    shape is the model's, the means' or the constants', whichever is given). The modes:

    - ``"zero"``: the head's output ``z`` (``blocks.{l}.attn.hook_z``) is exactly 0;
    - ``"uniform"``: the head's attention (``hook_pattern``) is ``1 / n_valid`` on each valid key
      of its query row (real tokens, :func:`attnlens.core.seam.key_mask`; on a causal model only keys
      at or before the query) and 0 elsewhere. Causality comes from ``model``, else from each
      pattern (no weight above the diagonal: causal). On BERT/RoBERTa the edit reaches the
      output through attnlens's seam (load with :func:`attnlens.load`);
    - ``"mean"``: ``z`` is the head's corpus mean ``means[l, h]`` at every position, ``means``
      ``[layer, head, d_head]`` from :func:`head_means`;
    - ``"papa"``: PAPA constants (``constants=``, :class:`attnlens.papa.PapaConstants` or data-free
      ones) replace the head's attention: exactly ``papa.hooks(constants, heads=heads)``.

    ``model`` (optional): checks that ``heads`` (and ``means`` / ``constants``) have its
    ``[layers, heads]`` shape, names its output hook, and for ``"uniform"`` gives causality and
    checks that pattern edits reach its output. Without it the shape is checked against
    ``means`` / ``constants`` and, at run time, against the head count of each hooked tensor.
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise InputError(
            f"Unknown ablation mode {checks.describe(mode)}; use one of "
            + "; ".join(f"{name!r} ({what})" for name, what in MODES.items())
            + "."
        )
    if means is not None and mode != "mean":
        raise InputError(f"means= is only used with mode='mean' (got mode={mode!r}).")
    if constants is not None and mode != "papa":
        raise InputError(f"constants= is only used with mode='papa' (got mode={mode!r}).")
    known: list[tuple[str, tuple[int, int]]] = []
    if model is not None:
        require_bridge(model, "ablation.hooks")
        if mode == "zero":
            processing.check(model, ZERO_READS, ZERO_WHAT)
        known.append((f"the model {model_id(model)}", model_shape(model)))
    if mode == "mean":
        if means is None:
            raise InputError(
                "mode='mean' replaces each head's output by its corpus mean: pass "
                "means=ablation.head_means(model, corpus), a [layer, head, d_head] tensor."
            )
        means = checks.shape(checks.tensor(means, "means"), "means", [None, None, None], "layer, head, d_head")
        if not means.is_floating_point():
            raise InputTypeError(f"means must be a float tensor, got {checks.describe(means)}.")
        checks.finite_tensor(means, "means")
        if model is not None and int(model.cfg.d_head) != means.shape[2]:
            raise InputError(
                f"means has d_head {means.shape[2]} but the model's heads have d_head "
                f"{int(model.cfg.d_head)}: they were computed on another model."
            )
        known.append(("means", (int(means.shape[0]), int(means.shape[1]))))
        means = means.detach()
    if mode == "papa":
        if constants is None:
            raise InputError(
                "mode='papa' replaces attention by PAPA constants: pass constants= "
                "(papa.fit(model, texts), or a data-free papa.uniform / papa.identity ...)."
            )
        if not hasattr(constants, "n_layers") or not hasattr(constants, "n_heads"):
            raise InputTypeError(
                f"constants must be PapaConstants or TrainableConstants, got {type(constants).__name__}."
            )
        known.append(("the PAPA constants", (int(constants.n_layers), int(constants.n_heads))))
    heads = _as_headset(heads, known)
    _check_shape(heads, known)

    if mode == "papa":
        if model is not None:
            constants.check_compatible(model)
        delegated = papa.hooks(constants, heads=heads)
        return AblationHooks(delegated, heads=heads, mode=mode, constants=constants, papa=delegated)

    causal: bool | None = None
    if mode == "uniform" and model is not None:
        if not seam.is_installed(model):
            raise InputError(
                "mode='uniform' edits hook_pattern, and pattern edits do not reach this model's "
                "output; load it with attnlens.load()."
            )
        causal = is_causal(model)
    items: list[tuple[str, Callable]] = []
    for layer in range(heads.shape[0]):
        selected = heads.mask[layer]
        if not bool(selected.any()):
            continue
        if mode == "uniform":
            items.append((f"blocks.{layer}.attn.hook_pattern", _uniform_hook(heads, selected, causal)))
        elif mode == "zero":
            items.append((output_hook(model, layer), _zero_hook(heads, selected)))
        else:
            items.append((output_hook(model, layer), _mean_hook(heads, selected, means[layer])))
    return AblationHooks(items, heads=heads, mode=mode, means=means, causal=causal)


#: what the zero ablation reads of the model (:func:`attnlens.core.processing.check`): a head's
#: output ``z = A V`` is the model's only with its value biases in ``V``; the mean ablation
#: replaces ``z`` by its mean, which the folded bias shifts as it does ``z``, the output the same
ZERO_READS, ZERO_WHAT = ("values",), "the zero ablation (each head's output z set to 0)"


def _zero_hook(heads: HeadSet, selected: Tensor) -> Callable:
    def zero(z: Float[Tensor, "batch pos head d_head"], hook: Any) -> Tensor:
        _check_heads_in(z.shape[2], heads, "hook_z")
        return z.masked_fill(selected.to(z.device)[None, None, :, None], 0.0)

    zero.check_model = functools.partial(processing.check, reads=ZERO_READS, what=ZERO_WHAT)  # type: ignore[attr-defined]
    return zero


def _mean_hook(heads: HeadSet, selected: Tensor, layer_means: Tensor) -> Callable:
    def mean(z: Float[Tensor, "batch pos head d_head"], hook: Any) -> Tensor:
        _check_heads_in(z.shape[2], heads, "hook_z")
        if z.shape[3] != layer_means.shape[1]:
            raise InputError(
                f"means has d_head {layer_means.shape[1]} but the model's heads have d_head "
                f"{z.shape[3]}: they were computed on another model."
            )
        value = layer_means.to(device=z.device, dtype=z.dtype)[None, None]
        return torch.where(selected.to(z.device)[None, None, :, None], value, z)

    return mean


def uniform_pattern(
    valid: Bool[Tensor, "batch key"], n_queries: int, *, causal: bool, dtype: torch.dtype = torch.float32
) -> Float[Tensor, "batch query key"]:
    """Uniform attention over the valid keys of each query row: ``1 / n_valid`` on each key
    that is a real token (``valid``) and, when ``causal``, at or before the query (queries are
    the last ``n_queries`` positions); 0 elsewhere. A row with no valid key is all 0."""
    n_keys = valid.shape[1]
    n_queries = checks.whole_number(n_queries, "n_queries", " of query positions", minimum=1)
    causal = checks.flag(causal, "causal (whether keys after each query are hidden, as in a decoder)")
    allowed = valid[:, None, :].expand(valid.shape[0], n_queries, n_keys)
    if causal:
        allowed = allowed & torch.ones(n_queries, n_keys, dtype=torch.bool, device=valid.device).tril(
            n_keys - n_queries
        )
    rows = allowed.to(dtype)
    return rows / rows.sum(-1, keepdim=True).clamp_min(1.0)


def _uniform_hook(heads: HeadSet, selected: Tensor, causal: bool | None) -> Callable:
    def uniform(pattern: Float[Tensor, "batch head query key"], hook: Any) -> Tensor:
        _check_heads_in(pattern.shape[1], heads, "hook_pattern")
        is_causal = looks_causal(pattern) if causal is None else causal
        valid = seam.key_mask(pattern, causal=is_causal)
        flat = uniform_pattern(valid, pattern.shape[2], causal=is_causal, dtype=pattern.dtype)
        return torch.where(selected.to(pattern.device)[None, :, None, None], flat[:, None], pattern)

    return uniform


# ------------------------------------------------------------------------------------------------
# corpus means of z ("mean" mode)


class HeadMeans(Accumulator):
    """Sum of every head's output ``z`` over the real tokens of a corpus (float64) and the
    number of real tokens: the accumulator of :func:`head_means`."""

    name = "head_means"
    needs_residual = True  # the last layer's hook_z fires after its hook_pattern
    compact = True  # a sum over real tokens: where they sit does not matter
    any_order = True

    def __init__(self, model: Any) -> None:
        n_layers, n_heads = model_shape(model)
        d_head = int(model.cfg.d_head)
        self.sums = torch.zeros(n_layers, n_heads, d_head, dtype=torch.float64)
        self.tokens = torch.zeros((), dtype=torch.float64)

    def hooks(self, model: Any) -> list[tuple[str, Any]]:
        def keep(layer: int) -> Callable:
            def hook(z: Float[Tensor, "batch pos head d_head"], hook: Any) -> None:
                real = self.current.key_mask.to(torch.float64)  # a product, not a selection: nothing read
                self.sums[layer] += torch.einsum("bphd,bp->hd", z.detach().double(), real).to(self.sums.device)

            return hook

        return [(output_hook(model, layer), keep(layer)) for layer in range(self.sums.shape[0])]

    def end_batch(self, batch: PassBatch) -> None:
        self.tokens += batch.n_tokens  # counted on the host

    def state_dict(self) -> dict[str, Tensor]:
        return {"sums": self.sums, "tokens": self.tokens}

    def result(self) -> Float[Tensor, "layer head d_head"]:
        if float(self.tokens) == 0:
            raise InputError("the corpus has no real token: head_means needs at least one.")
        return (self.sums / self.tokens).float()


def head_means(
    model: Any,
    corpus: Any,
    *,
    max_len: SupportsIndex = 128,
    layout: str | None = None,
    batch_size: SupportsIndex = 32,
    hooks: FwdHooks = (),
    progress: bool = True,
) -> Float[Tensor, "layer head d_head"]:
    """Each head's mean output ``z`` (``blocks.{l}.attn.hook_z``) over every real token of
    ``corpus`` (padding excluded), ``[layer, head, d_head]`` float32 on the CPU: the values of
    mean ablation (``hooks(heads, "mean", means=...)``). One pass of
    :func:`attnlens.engine.passes.run` (summed in float64); ``hooks`` are active during it.
    ``layout``: as :func:`attnlens.tokenize`'s, ``None`` the model's own (the PAPA layout on an
    encoder, the padded one on a decoder); take the means in the layout the ablation will run on
    (on MiniLM the two layouts' means differ by about a quarter)."""
    require_bridge(model, "ablation.head_means")
    accumulator = HeadMeans(model)
    passes.run(model, corpus, [accumulator], max_len=max_len, layout=layout, batch_size=batch_size,
               hooks=hooks, progress=progress, description="ablation.head_means")
    return accumulator.result()


# ------------------------------------------------------------------------------------------------
# importance (Michel et al. 2019, §4.1-4.2)


@dataclass
class Importance(Result):
    """Head importance of :func:`importance` (Michel et al. 2019, eq. 2).

    ``scores``: ``[layer, head]``, ``raw`` divided by its layer's ℓ2 norm (Michel et al. §4.2;
    what pruning ranks by); ``raw``: ``I_h = E_x |∂L(x)/∂ξ_h|`` before normalising;
    ``n_examples``: examples the expectation is over; ``per``: ``"example"`` when the loss gave
    one value per example (the exact ``E_x``), ``"batch"`` when it gave one per batch (then
    ``raw`` is the mean over batches of ``|∂L(batch)/∂ξ_h|``, as in Michel et al.'s code).

    A :class:`~attnlens.core.result.Result`: :attr:`table` has one row per head
    (:attr:`COLUMNS`), :meth:`figure` is the ``[layer, head]`` grid of ``scores``,
    :meth:`to_json` keeps all of it.
    """

    COLUMNS: ClassVar[dict[str, str]] = {
        "layer": "layer index, from 0",
        "head": "head index within the layer, from 0",
        "score": "importance divided by its layer's l2 norm (what pruning ranks by)",
        "raw": "importance E_x |dL(x)/d xi_h| before normalising",
        "rank": "place in heads_ranked('ascending'): 0 is the least important head, pruned first",
    }
    FORMAT: ClassVar[str] = "attnlens.Importance/1"

    scores: Float[Tensor, "layer head"]
    raw: Float[Tensor, "layer head"]
    n_examples: int = 0
    per: str = "example"
    settings: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # a NaN would be ranked (argsort puts it last) and pruned in a silently wrong order; read
        # on the host only (a device's scores are not read back here)
        for name in ("scores", "raw"):
            value = checks.tensor(getattr(self, name), name)
            if devices.reads_are_free(value):
                checks.finite_tensor(value.detach(), f"Importance {name} (one finite importance per "
                                     "[layer, head]; compute them again with attnlens.ablation.importance)")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.scores.shape)

    def heads_ranked(self, order: str = "ascending") -> list[tuple[int, int]]:
        """Every head as ``(layer, head)``, by normalised score: ``"ascending"`` (least important
        first, the order Michel et al. prune in) or ``"descending"``; ties by layer, then head."""
        check_order(order)
        flat = self.scores.flatten()
        ranking = torch.argsort(flat if order == "ascending" else -flat, stable=True).tolist()
        n_heads = self.scores.shape[1]
        return [divmod(index, n_heads) for index in ranking]

    def heads(self, fraction: float | None = None, *, n: int | None = None, order: str = "ascending") -> HeadSet:
        """The first ``round(fraction · heads)`` (or ``n``) heads of :meth:`heads_ranked`: with
        ``order="ascending"`` the least important ones, those to prune first. The
        :class:`HeadSet` carries the pruning order and the scores."""
        n_layers, n_heads = self.shape
        count = _count(fraction, n, n_layers * n_heads, n_layers, n_heads)
        selected = HeadSet.from_heads(self.heads_ranked(order)[:count], n_layers, n_heads)
        selected.scores, selected.strategy = self.scores.clone(), f"importance ({order})"
        return selected

    def __repr__(self) -> str:
        return f"Importance({self.shape[0]} layers x {self.shape[1]} heads, {self.n_examples} examples, per {self.per})"

    @property
    def table(self) -> Any:
        """One row per head, layer by layer: :attr:`COLUMNS`."""
        n_layers, n_heads = self.shape
        rank = {head: place for place, head in enumerate(self.heads_ranked("ascending"))}
        return frame({
            "layer": [layer for layer in range(n_layers) for _ in range(n_heads)],
            "head": [head for _ in range(n_layers) for head in range(n_heads)],
            "score": self.scores.double().flatten().tolist(), "raw": self.raw.double().flatten().tolist(),
            "rank": [rank[(layer, head)] for layer in range(n_layers) for head in range(n_heads)],
        }, self.COLUMNS)

    def figure(self, *, normalised: bool = True) -> Any:
        """The ``[layer, head]`` grid of ``scores`` (``normalised=False``: of ``raw``)
        (:func:`attnlens.core.plots.head_grid`)."""

        values = self.scores if normalised else self.raw
        return head_grid(values, name="importance", title=f"Head importance (Michel et al. 2019), "
                         f"{'normalised by layer' if normalised else 'raw'}, {self.n_examples} examples")

    def to_dict(self) -> dict[str, Any]:
        return {"scores": plain(self.scores.double()), "raw": plain(self.raw.double()),
                "dtype": str(self.scores.dtype).removeprefix("torch."), "n_examples": self.n_examples,
                "per": self.per, "settings": plain(self.settings)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Importance:
        dtype = {"float32": torch.float32, "float64": torch.float64}[data.get("dtype", "float32")]
        scores = torch.tensor(data["scores"], dtype=torch.float64).to(dtype)
        raw = torch.tensor(data["raw"], dtype=torch.float64).to(dtype)
        if scores.ndim != 2 or scores.shape != raw.shape:
            raise ValueError(f"scores {list(scores.shape)} and raw {list(raw.shape)} must be one [layer, head] shape")
        return cls(scores=scores, raw=raw, n_examples=int(data["n_examples"]), per=str(data["per"]),
                   settings=dict(data.get("settings") or {}))


def check_order(order: Any) -> None:
    """``InputError`` unless ``order`` is one of :data:`ORDERS`."""
    if not isinstance(order, str) or order not in ORDERS:
        raise InputError(
            f"Unknown order {checks.describe(order)}; use 'ascending' (least important first, "
            "Michel et al.) or 'descending' (most important first)."
        )


def _count(fraction: Any, n: Any, total: int, n_layers: int, n_heads: int) -> int:
    if (fraction is None) == (n is None):
        raise InputError("Pass exactly one of fraction= (a float in [0, 1]) and n= (a number of heads).")
    if n is not None:
        count = checks.whole_number(n, "n", " of heads", minimum=0)
        if count > total:
            raise InputError(f"n must lie in [0, {total}], got {count}.")
        return count
    if isinstance(fraction, int) and not isinstance(fraction, bool):
        raise InputTypeError(
            f"fraction={fraction} is ambiguous (a count, or the fraction {float(fraction)}?): pass "
            f"a fraction as a float (fraction={float(fraction)}) or a count as n={fraction}."
        )
    return n_selected(checks.finite(fraction, "fraction", low=0.0, high=1.0), n_layers, n_heads)


def normalize_by_layer(raw: Float[Tensor, "layer head"]) -> Float[Tensor, "layer head"]:
    """``raw`` divided by each layer's ℓ2 norm over its heads (Michel et al. 2019, §4.2); a layer
    whose scores are all 0 stays 0."""
    raw = checks.finite_tensor(checks.shape(checks.tensor(raw, "raw"), "raw", [None, None], "layer, head"), "raw")
    norms = raw.norm(dim=1, keepdim=True)
    return torch.where(norms > 0, raw / norms.clamp_min(torch.finfo(raw.dtype).tiny), torch.zeros_like(raw))
