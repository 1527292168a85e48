"""Which heads attend alike? Head clustering (Clark et al. 2019, §6).

Clark, Khandelwal, Levy and Manning (2019), "What does BERT look at? An analysis of BERT's
attention", §6 "Clustering attention heads": two heads are close when, token by token, they
attend alike. The distance between heads ``H_i`` and ``H_j`` over a corpus is

    d(H_i, H_j) = mean over valid query tokens t of  JS(H_i(t), H_j(t)),

where ``H_i(t)`` is head ``i``'s attention row of token ``t`` over the example's valid keys and
``JS`` is the Jensen-Shannon *distance* (:func:`js_distance`: the square root of the
Jensen-Shannon divergence, natural log). Every pair of heads of all layers is compared
(``n = n_layers * n_heads`` heads; head ``layer * n_heads + head``), and the ``[n, n]`` matrix is
embedded in 2-D by metric multidimensional scaling (scikit-learn's ``MDS`` on the precomputed
distances), as in the paper's Figure 6::

    import attnlens
    from attnlens.methods import clustering

    model = attnlens.load()
    standard = clustering.cluster(model, texts)
    effective = clustering.cluster(model, texts, view="effective")
    clustering.figure(standard, effective).show()     # one panel per view

Differences from Clark et al.'s code (``head_distances.py`` of clarkkev/attention-analysis): they
*sum* the Jensen-Shannon *divergence* over tokens, after smoothing every row as
``0.001 / n_keys + 0.999 * a``; here the mean (a sum divided by the token count, so corpora of
any size compare) of the distance (the square root of the divergence, a true metric, which metric
MDS assumes), without smoothing (``0 · log 0 = 0``).

Signed rows (effective attention, :mod:`attnlens.methods.effective`, can be negative) are first made
distributions by ``|a| / Σ|a|`` over the valid keys, exactly as
:func:`attnlens.methods.stats.statistic_sums` does for the entropy.

Views: ``"standard"`` (the model's attention), ``"effective"`` (effective attention) or fitted
:class:`~attnlens.papa.PapaConstants` (every head replaced by its constant through
:func:`attnlens.papa.hooks`, read back from the patterns; the inputs then take the constants'
layout and ``max_len``). The distances are summed by an :class:`attnlens.engine.accumulator.Accumulator`
(:class:`HeadDistances`) whose state adds up, so it merges, checkpoints and runs under
``torchrun``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, SupportsIndex

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core.checks import describe, whole_number
from attnlens.core.loading import require_bridge
from attnlens.core.result import Result, frame_from_json, frame_to_json
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, LayerPatterns, PassBatch
from attnlens.engine.forward import FwdHooks
from attnlens.errors import InputError, InputTypeError, ModelBehaviourError
from attnlens.methods import view_setup, views

#: the rows of one chunk of :class:`HeadDistances` take about this many bytes of temporaries
CHUNK_BYTES = 200 * 2**20
#: the columns of :attr:`HeadClustering.table` before its ``type`` (all of them, with their
#: meanings: :attr:`HeadClustering.COLUMNS`)
COLUMNS: tuple[str, ...] = ("layer", "head", "x", "y")
#: marker symbols of pattern types, in order of first appearance
SYMBOLS: tuple[str, ...] = (
    "circle", "square", "diamond", "triangle-up", "x", "cross", "star", "triangle-down",
    "pentagon", "hexagon", "star-square", "hourglass",
)
#: type shown for a head the ``types`` table does not name
UNKNOWN = "unknown"


# ------------------------------------------------------------------------------------------------
# the distance


def distributions(rows: Float[Tensor, "... key"]) -> Float[Tensor, "... key"]:
    """Rows made distributions by ``|a| / Σ_key |a|`` (as :func:`attnlens.methods.stats.statistic_sums`
    does for the entropy): a softmax row is unchanged, a signed row of effective attention
    becomes the share of its absolute weight on each key. An all-zero row stays all zero."""
    weights = rows.abs()
    return weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)


def _entropy(p: Float[Tensor, "... key"]) -> Float[Tensor, "..."]:
    """Shannon entropy in nats, ``-Σ p log p`` with ``0 · log 0 = 0``."""
    return -torch.special.xlogy(p, p).sum(-1)


def js_distance(p: Float[Tensor, "... key"], q: Float[Tensor, "... key"]) -> Float[Tensor, "..."]:
    """Jensen-Shannon distance between rows ``p`` and ``q`` (the last axis, ``key``, is the
    distribution; the leading axes broadcast): ``sqrt(JSD(P, Q))`` with the natural log,

        JSD(P, Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M) = H(M) − ½ H(P) − ½ H(Q),   M = (P + Q) / 2,

    equal to ``scipy.spatial.distance.jensenshannon(p, q)`` (base e) for non-negative rows.
    ``P = |p| / Σ|p|`` (and likewise ``Q``), as :func:`distributions`: signed rows (effective
    attention) become distributions the way :func:`attnlens.methods.stats.statistic_sums` makes them for
    the entropy; zero entries count ``0 · log 0 = 0``. The distance lies in ``[0, sqrt(ln 2)]``;
    identical rows give exactly 0. Computed in the inputs' dtype (float64 for ~1e-12 agreement
    with SciPy); the rounding below 0 of nearly identical rows is clamped to 0.
    """
    if p.shape[-1] != q.shape[-1]:
        raise InputError(
            f"js_distance compares rows with the same number of keys (the last axis); got "
            f"{p.shape[-1]} and {q.shape[-1]}."
        )
    p, q = torch.broadcast_tensors(distributions(p), distributions(q))
    divergence = _entropy((p + q) / 2) - (_entropy(p) + _entropy(q)) / 2
    return divergence.clamp_min(0).sqrt()


# ------------------------------------------------------------------------------------------------
# the accumulator


class HeadDistances(Accumulator):
    """Sum over valid query tokens of the Jensen-Shannon distance between every pair of heads of
    all layers (:func:`js_distance`), an accumulator of :func:`attnlens.engine.passes.run`.

    Heads are numbered ``layer * n_heads + head`` (``n = n_layers * n_heads``). For every
    example and every valid query token (``key_mask``), the rows of all ``n`` heads over the
    example's valid keys are compared pairwise: ``total[i, j]`` (float64, ``[n, n]``, symmetric,
    0 on the diagonal) sums the distances, ``tokens`` counts the tokens; :meth:`result` is
    ``total / tokens``. Both add up over shards, so the default merge, ``all_reduce`` and
    checkpoint resume apply.

    The comparison needs every layer's rows of a batch at once: :meth:`update` keeps each
    layer's pattern, :meth:`end_batch` compares them example by example (rows made
    distributions over the example's valid keys, in float64) and frees them. The
    work is vectorised over the ``n(n-1)/2`` pairs with ``JSD = H(M) − ½H(P) − ½H(Q)``: the
    entropies ``H(P)`` once per head and token, ``H(M)`` per pair in chunks of query tokens (and
    of pairs, for models with thousands of heads) of about ``chunk_bytes`` of temporaries.

    ``view="standard"`` reads ``layer.pattern``, ``"effective"`` ``layer.effective`` (signed:
    made a distribution by ``|a| / Σ|a|``); any view given by name reads its
    :attr:`~attnlens.methods.views.View.maps`. A registered :class:`~attnlens.methods.views.View`
    value is read as it is, a view given by constants included (its maps are the patterns,
    under the pass's hooks: :attr:`attnlens.methods.view_setup.ViewSetup.hooks`).
    """

    compact = True  # rows compared over each example's valid keys, wherever they sit
    any_order = True  # sums over examples

    def __init__(
        self, n_layers: int, n_heads: int, view: Any = "standard", *, chunk_bytes: int = CHUNK_BYTES
    ) -> None:
        self._view = view if isinstance(view, views.View) else views.get_view(
            view, among=views.names(constants=False), where=" for HeadDistances")
        view = self._view.name
        self.n_layers = whole_number(n_layers, "n_layers", minimum=1)
        self.n_heads = whole_number(n_heads, "n_heads", minimum=1)
        self.chunk_bytes = whole_number(chunk_bytes, "chunk_bytes", " of bytes", minimum=1)
        self.view = view
        self.name = f"clustering.{view}"
        self.needs_values = self._view.needs_values
        n = self.n_layers * self.n_heads
        self.total = torch.zeros(n, n, dtype=torch.float64)
        self.tokens = torch.zeros(1, dtype=torch.float64)
        self._rows: dict[int, Tensor] = {}
        self._pairs = torch.triu_indices(n, n, offset=1)

    def start_batch(self, batch: PassBatch) -> None:
        super().start_batch(batch)
        self._rows = {}  # rows of a batch that was interrupted half-way

    def update(self, layer: LayerPatterns) -> None:
        pattern = self._view.maps(layer)
        self._rows[layer.layer] = pattern.detach()  # [batch, head, query, key], kept to end_batch

    def end_batch(self, batch: PassBatch) -> None:
        rows, self._rows = self._rows, {}
        if sorted(rows) != list(range(self.n_layers)):
            raise ModelBehaviourError(
                f"HeadDistances saw layers {sorted(rows)} of a batch; it needs all {self.n_layers}."
            )
        layers = [rows[layer] for layer in range(self.n_layers)]
        total = torch.zeros(self._pairs.shape[1], dtype=torch.float64, device=layers[0].device)
        tokens = 0
        for example, valid in enumerate(batch.key_mask):
            positions = valid.nonzero().squeeze(-1)
            # [token, head, key]: every head's row of each valid query over the valid keys
            example_rows = torch.cat(
                [pattern[example][:, positions][:, :, positions] for pattern in layers]
            ).transpose(0, 1)
            total += self._pair_sums(distributions(example_rows.double()))
            tokens += positions.numel()
        i, j = self._pairs
        total = total.to(self.total.device)  # where the state is (the pass's device)
        self.total[i, j] += total
        self.total[j, i] += total
        self.tokens += tokens

    def _pair_sums(self, rows: Float[Tensor, "token head key"]) -> Float[Tensor, "pair"]:
        """Sum over tokens of the distance of every pair ``i < j`` of :attr:`_pairs`, in chunks
        of tokens (and of pairs, when one token's pairs alone exceed ``chunk_bytes``)."""
        pairs = self._pairs.to(rows.device)
        entropy = _entropy(rows)  # [token, head]
        per_pair = 3 * rows.shape[-1] * rows.element_size()  # M and two temporaries per key
        pair_step = max(1, min(pairs.shape[1], self.chunk_bytes // per_pair))
        token_step = max(1, self.chunk_bytes // (per_pair * pair_step))
        sums = torch.zeros(pairs.shape[1], dtype=torch.float64, device=rows.device)
        for first in range(0, pairs.shape[1], pair_step):
            i, j = pairs[:, first : first + pair_step]
            for start in range(0, rows.shape[0], token_step):
                chunk = rows[start : start + token_step]
                mixture = chunk[:, i]
                mixture += chunk[:, j]
                mixture *= 0.5
                divergence = _entropy(mixture)  # H(M), [token, pair]
                del mixture
                halves = entropy[start : start + token_step]
                divergence -= (halves[:, i] + halves[:, j]) / 2
                sums[first : first + pair_step] += divergence.clamp_min_(0).sqrt_().sum(0)
        return sums

    def state_dict(self) -> dict[str, Tensor]:
        return {"total": self.total, "tokens": self.tokens}

    def metadata(self) -> dict[str, Any]:
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "view": self.view}

    def result(self) -> Float[Tensor, "heads heads"]:
        """Mean Jensen-Shannon distance per pair of heads, ``[n, n]`` (float64)."""
        if float(self.tokens) == 0:
            raise InputError("HeadDistances has seen no token; run a pass over a non-empty corpus first.")
        return self.total / self.tokens


# ------------------------------------------------------------------------------------------------
# the embedding and its figure


@dataclass
class HeadClustering(Result):
    """Heads embedded in 2-D by their mean Jensen-Shannon distances (:func:`cluster`).

    ``distances``: ``[n, n]`` mean distance between heads (head ``layer * n_heads + head``);
    ``coords``: ``[n, 2]``, the MDS embedding; ``table``: one row per head with
    :attr:`COLUMNS` (``type`` is ``None`` where no pattern types were given); ``view``:
    ``"standard"``, ``"effective"`` or ``"papa"``; ``stress``: Kruskal's Stress-1 of the
    embedding, ``sqrt(Σ_{i<j} (‖x_i − x_j‖ − d_ij)² / Σ_{i<j} d_ij²)`` (0: the 2-D distances
    are the head distances; about 0.1 fair, 0.2 poor); ``n_examples``, ``n_tokens`` and
    ``n_truncated`` of the corpus read. A :class:`~attnlens.core.result.Result`:
    :meth:`figure`, :meth:`to_json` / :meth:`from_json` (all of it).
    """

    COLUMNS: ClassVar[dict[str, str]] = {
        "layer": "layer index, from 0",
        "head": "head index within the layer, from 0",
        "x": "first MDS coordinate",
        "y": "second MDS coordinate",
        "type": "the head's pattern type (cluster(types=)); 'unknown' for a head types does not "
                "name, None without types",
    }
    FORMAT: ClassVar[str] = "attnlens.HeadClustering/1"

    distances: Float[np.ndarray, "heads heads"]
    coords: Float[np.ndarray, "heads 2"]
    table: pd.DataFrame
    view: str
    stress: float
    n_layers: int
    n_heads: int
    n_examples: int = 0
    n_tokens: int = 0
    n_truncated: int = 0

    def __repr__(self) -> str:
        return (
            f"HeadClustering(view={self.view!r}, heads={len(self.coords)} ({self.n_layers} layers "
            f"x {self.n_heads}), examples={self.n_examples}, tokens={self.n_tokens}, "
            f"stress={self.stress:.3f})"
        )

    def figure(self) -> go.Figure:
        """The embedding as a plotly scatter (:func:`figure` with this one view)."""
        return _figure([self])

    def to_dict(self) -> dict[str, Any]:
        return {"distances": self.distances.tolist(), "coords": self.coords.tolist(),
                "table": frame_to_json(self.table), "view": self.view, "stress": self.stress,
                "n_layers": self.n_layers, "n_heads": self.n_heads, "n_examples": self.n_examples,
                "n_tokens": self.n_tokens, "n_truncated": self.n_truncated}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadClustering:
        n = int(data["n_layers"]) * int(data["n_heads"])
        distances = np.asarray(data["distances"], dtype=np.float64).reshape(n, n)
        coords = np.asarray(data["coords"], dtype=np.float64).reshape(n, 2)
        return cls(distances=distances, coords=coords, table=frame_from_json(data["table"]),
                   view=str(data["view"]), stress=float(data["stress"]), n_layers=int(data["n_layers"]),
                   n_heads=int(data["n_heads"]), n_examples=int(data.get("n_examples", 0)),
                   n_tokens=int(data.get("n_tokens", 0)), n_truncated=int(data.get("n_truncated", 0)))


def stress1(
    coords: Float[np.ndarray, "heads dim"], distances: Float[np.ndarray, "heads heads"]
) -> float:
    """Kruskal's Stress-1 of an embedding: ``sqrt(Σ_{i<j} (‖x_i − x_j‖ − d_ij)² / Σ_{i<j} d_ij²)``."""
    from scipy.spatial.distance import pdist, squareform

    embedded = pdist(coords)
    target = squareform(distances, checks=False)
    scale = float((target**2).sum())
    return float(np.sqrt(((embedded - target) ** 2).sum() / scale)) if scale > 0 else 0.0


def embed(
    distances: Float[np.ndarray, "heads heads"], *, seed: int = 0
) -> Float[np.ndarray, "heads 2"]:
    """2-D metric MDS of a precomputed distance matrix (scikit-learn's ``MDS``, SMACOF from 4
    random initialisations, ``random_state=seed``; converged to ``eps=1e-10`` within 1000
    iterations, as Clark et al.'s notebook), with the argument names of the installed version
    (``metric="precomputed"`` from 1.8, ``dissimilarity="precomputed"`` before)."""
    from sklearn.manifold import MDS

    seed = whole_number(seed, "seed", minimum=0)
    if not isinstance(distances, np.ndarray):
        raise InputTypeError(f"distances must be a NumPy array, got {describe(distances)}; use np.asarray(distances).")
    if distances.ndim != 2 or distances.shape[0] != distances.shape[1] or not np.isfinite(distances).all():
        raise InputError(f"distances must be a square matrix of finite numbers, got shape {list(distances.shape)}"
                         f" with {int((~np.isfinite(distances)).sum())} values NaN or infinite.")
    parameters = inspect.signature(MDS).parameters
    if "metric_mds" in parameters:
        options: dict[str, Any] = dict(metric="precomputed", metric_mds=True, init="random")
    else:
        options = dict(dissimilarity="precomputed", metric=True)
    mds = MDS(n_components=2, n_init=4, random_state=seed, eps=1e-10, max_iter=1000, **options)
    return np.asarray(mds.fit_transform(distances), dtype=np.float64)


def _check_types(types: Any, n_layers: int, n_heads: int) -> pd.DataFrame | None:
    """The ``types`` table checked: columns ``layer``, ``head``, ``type``; each head at most once."""
    if types is None:
        return None
    if not isinstance(types, pd.DataFrame):
        raise InputTypeError(
            f"types must be a pandas DataFrame with columns layer, head, type (one pattern type per "
            f"head, e.g. from attnlens.methods.patterns.types), got {describe(types)}."
        )
    missing = [c for c in ("layer", "head", "type") if c not in types.columns]
    if missing:
        raise InputError(
            f"types lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)}: give a "
            "DataFrame with columns layer, head, type (one row per head)."
        )
    try:
        layers = types["layer"].astype(int)
        heads = types["head"].astype(int)
    except (TypeError, ValueError):
        raise InputError("types: the layer and head columns must hold whole numbers.") from None
    outside = (layers < 0) | (layers >= n_layers) | (heads < 0) | (heads >= n_heads)
    if bool(outside.any()):
        row = types[outside].iloc[0]
        raise InputError(
            f"types names layer {row['layer']} head {row['head']}, which the model does not have "
            f"({n_layers} layers of {n_heads} heads, numbered from 0)."
        )
    table = pd.DataFrame({"layer": layers, "head": heads, "type": types["type"].astype(str)})
    if bool(table.duplicated(["layer", "head"]).any()):
        row = table[table.duplicated(["layer", "head"])].iloc[0]
        raise InputError(f"types names layer {row['layer']} head {row['head']} twice; give one row per head.")
    return table


def cluster(
    model: Any,
    corpus: Any,
    *,
    view: Any = "standard",
    max_len: SupportsIndex | None = None,
    layout: str | None = None,
    batch_size: SupportsIndex = 16,
    hooks: FwdHooks = (),
    types: pd.DataFrame | None = None,
    seed: int = 0,
    progress: bool = True,
) -> HeadClustering:
    """Cluster the heads of ``model`` by how alike they attend over ``corpus`` (Clark et al.
    2019, §6): one pass of :class:`HeadDistances`, then 2-D metric MDS (:func:`embed`).

    ``corpus``: strings or ``(str, str)`` pairs (anything :func:`attnlens.engine.passes.run` reads).
    ``view``: ``"standard"``, ``"effective"`` or :class:`~attnlens.papa.PapaConstants` (every
    head replaced by its constant through :func:`attnlens.papa.hooks`; the inputs take the
    constants' layout and ``max_len``, and giving others is an error). ``max_len``: default 128
    (or the constants'); ``layout``: default ``"padded"``, the model's ordinary input, as Clark
    et al. ran BERT (or the constants': :func:`attnlens.methods.view_setup.setup`).
    ``hooks``: further interventions (``fwd_hooks``) during the pass. ``types``: optional
    DataFrame with columns ``layer``, ``head``, ``type`` (a pattern type per head, e.g.
    ``"vertical"``, ``"diagonal"``, ``"block"``, ``"heterogeneous"``; the table of
    :func:`attnlens.methods.patterns.types` has them), shown as marker symbols;
    heads it does not name are ``"unknown"``. ``seed``: MDS's ``random_state``.
    """
    require_bridge(model, "cluster")
    chosen = view_setup.setup(model, view, max_len=max_len, layout=layout, hooks=hooks)
    name, max_len, layout = chosen.name, chosen.max_len, chosen.layout
    seed = whole_number(seed, "seed", minimum=0)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    checked_types = _check_types(types, n_layers, n_heads)

    distances = HeadDistances(n_layers, n_heads, chosen.view)  # a view given by constants: its hooks
    summary = passes.run(
        model, corpus, [distances], max_len=max_len, layout=layout, batch_size=batch_size,
        hooks=chosen.hooks, progress=progress, description="head clustering", settings={"view": name},
    )
    matrix = distances.result().numpy()
    coords = embed(matrix, seed=seed)
    table = pd.DataFrame({
        "layer": np.repeat(np.arange(n_layers), n_heads),
        "head": np.tile(np.arange(n_heads), n_layers),
        "x": coords[:, 0],
        "y": coords[:, 1],
    })
    if checked_types is not None:
        table = table.merge(checked_types, on=["layer", "head"], how="left")
        table["type"] = table["type"].fillna(UNKNOWN)
    else:
        table["type"] = pd.Series([None] * len(table), dtype=object)
    table.attrs.update(view=name, layout=layout, max_len=max_len)
    return HeadClustering(
        distances=matrix, coords=coords, table=table, view=name, stress=stress1(coords, matrix),
        n_layers=n_layers, n_heads=n_heads, n_examples=summary.n_examples, n_tokens=summary.n_tokens,
        n_truncated=summary.n_truncated,
    )


def figure(*clusterings: HeadClustering, titles: Sequence[str] | None = None) -> go.Figure:
    """Several clusterings side by side, one panel per view (e.g. standard and effective).

    Each point is a head: colour = layer (one legend entry per layer, a sequential scale from
    layer 0 to the last), marker symbol = pattern type when the clustering knows types; hover
    names the head (``L3 H7``), its type and its mean distance to the other heads. Panels after
    the first are rotated (or reflected) onto the first by orthogonal Procrustes, which keeps
    every distance, so the same head sits in about the same place when the views agree; MDS
    alone fixes the embedding only up to such a rotation. ``titles``: one per panel (default:
    the view and its stress).
    """
    return _figure(list(clusterings), titles)


def _types(table: pd.DataFrame) -> list[str | None]:
    """Each head's pattern type, None where it has none (no ``type`` column, or not a name)."""
    if "type" not in table:
        return [None] * len(table)
    return [kind if isinstance(kind, str) else None for kind in table["type"]]


def _figure(clusterings: list[HeadClustering], titles: Sequence[str] | None = None) -> go.Figure:
    from plotly.colors import sample_colorscale
    from plotly.subplots import make_subplots
    from scipy.linalg import orthogonal_procrustes

    if not clusterings:
        raise InputError("figure needs at least one HeadClustering (from clustering.cluster).")
    for item in clusterings:
        if not isinstance(item, HeadClustering):
            raise InputTypeError(f"figure takes HeadClustering objects (from clustering.cluster), got {describe(item)}.")
    shapes = {(c.n_layers, c.n_heads) for c in clusterings}
    if len(shapes) > 1:
        raise InputError(f"the clusterings are of models of different shapes {sorted(shapes)}; draw them apart.")
    if titles is None:
        titles = [f"{c.view} (stress {c.stress:.3f})" for c in clusterings]
    titles = list(titles)
    if len(titles) != len(clusterings):
        raise InputError(f"give one title per clustering: {len(titles)} titles for {len(clusterings)}.")
    n_layers = clusterings[0].n_layers
    colours = sample_colorscale("Viridis", [i / max(1, n_layers - 1) for i in range(n_layers)])
    types = [t for c in clusterings for t in _types(c.table) if t is not None]
    symbols = {t: SYMBOLS[i % len(SYMBOLS)] for i, t in enumerate(dict.fromkeys(types))}

    fig = make_subplots(rows=1, cols=len(clusterings), subplot_titles=titles, horizontal_spacing=0.06)
    reference = clusterings[0].coords - clusterings[0].coords.mean(0)
    for column, item in enumerate(clusterings, start=1):
        coords = item.coords - item.coords.mean(0)
        if column > 1:
            rotation, _ = orthogonal_procrustes(coords, reference)
            coords = coords @ rotation
        table = item.table
        n = len(table)
        mean_distance = item.distances.sum(1) / max(1, n - 1)
        kinds = _types(table)
        for layer in range(n_layers):
            rows = np.flatnonzero(table["layer"].to_numpy() == layer)
            text = [
                f"L{layer} H{int(table['head'].iloc[r])}"
                + (f"<br>type: {kinds[r]}" if kinds[r] is not None else "")
                + f"<br>mean distance to others: {mean_distance[r]:.3f}"
                for r in rows
            ]
            fig.add_trace(
                go.Scatter(
                    x=coords[rows, 0], y=coords[rows, 1], mode="markers", name=f"L{layer}",
                    legendgroup=f"L{layer}", showlegend=column == 1, hovertext=text,
                    hoverinfo="text",
                    marker=dict(
                        color=colours[layer], size=10, line=dict(width=0.5, color="#333"),
                        symbol=[symbols[kinds[r]] if kinds[r] is not None else "circle" for r in rows],
                    ),
                ),
                row=1, col=column,
            )
        fig.update_xaxes(showticklabels=False, zeroline=False, title_text="MDS 1", row=1, col=column)
        fig.update_yaxes(
            showticklabels=False, zeroline=False, title_text="MDS 2" if column == 1 else None,
            scaleanchor="x" if column == 1 else f"x{column}", row=1, col=column,
        )
    for kind, symbol in symbols.items():  # legend entries for the symbols, drawn nowhere
        fig.add_trace(go.Scatter(
            x=[None], y=[None], mode="markers", name=kind, legendgroup="types",
            legendgrouptitle_text="pattern type", marker=dict(symbol=symbol, color="#888", size=10),
            hoverinfo="skip",
        ))
    fig.update_layout(
        title="Heads by mean Jensen-Shannon distance (MDS; colour: layer)",
        height=480, width=max(520, 460 * len(clusterings) + 120), plot_bgcolor="white",
        legend=dict(title="layer"),
    )
    fig.layout.meta = dict(kind="head_clusters", views=[c.view for c in clusterings])
    return fig
