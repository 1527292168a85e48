"""attnlens.methods.clustering: heads clustered by their Jensen-Shannon distances (Clark et al. 2019, §6)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import jensenshannon, pdist

from attnlens import papa
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator
from attnlens.methods import clustering
from tests import tiny
from tests.typechecks import unchecked

#: unit roundoffs of float64 and float32
U64, U32 = 2.0**-53, 2.0**-24
CORPUS = tiny.CORPUS[:8]
MAX_LEN = 24
#: float64 sums of the same numbers added in another order (merge vs one pass)
MERGE_ATOL = 1e-12


def js_tolerance(u: float, keys: int, reference: np.ndarray) -> np.ndarray:
    """A bound on |js_distance - exact| for rows of ``keys`` entries in a dtype of unit roundoff
    ``u`` (first order). The divergence ``H(M) - H(P)/2 - H(Q)/2`` is a sum of ``3 * keys``
    terms ``x log x`` with ``x <= 1``; each entry carries the normalization's error (a sum of
    ``keys`` numbers and a division: ``(keys + 1) u`` relative), which moves ``x log x`` by at
    most ``(keys + 1) u * x * |log x + 1|``, plus a few roundings of the log, the product and the
    sum (``(keys + 4) u * |x log x|``). Summed over the three rows: ``e <= (2 keys + 5) u *
    (3 + H(M) + H(P) + H(Q)) <= (2 keys + 5) u * (3 + 3 ln keys)``. The square root turns an
    error ``e`` of the divergence into at most ``min(sqrt(e), e / d)`` of the distance ``d``."""
    e = (2 * keys + 5) * u * (3 + 3 * math.log(keys))
    return np.minimum(math.sqrt(e), e / np.maximum(reference, 1e-300))


# ------------------------------------------------------------------------------------------------
# js_distance


def random_rows(generator: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    rows = torch.rand(shape, generator=generator, dtype=torch.float64)
    rows[rows < 0.25] = 0  # zero-probability entries
    rows[..., 0] += 0.01  # no all-zero row
    return (rows / rows.sum(-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("dtype, u", [(torch.float64, U64), (torch.float32, U32)])
def test_js_distance_equals_scipy(dtype, u):
    generator = torch.Generator().manual_seed(0)
    p, q = random_rows(generator, (40, 9), dtype), random_rows(generator, (40, 9), dtype)
    got = clustering.js_distance(p, q)
    assert got.dtype == dtype and got.shape == (40,)
    reference = np.array([jensenshannon(a, b) for a, b in zip(p.double().numpy(), q.double().numpy(), strict=True)])
    tolerance = js_tolerance(u, 9, reference)
    assert tolerance.max() < (1e-12 if dtype == torch.float64 else 1e-4)
    assert np.all(np.abs(got.double().numpy() - reference) <= tolerance)
    # symmetric, exactly 0 for identical rows, broadcast over leading axes
    torch.testing.assert_close(clustering.js_distance(q, p), got, atol=0, rtol=0)
    assert torch.equal(clustering.js_distance(p, p), torch.zeros(40, dtype=dtype))
    pairwise = clustering.js_distance(p[:, None, :], q[None, :5, :])
    assert pairwise.shape == (40, 5)
    torch.testing.assert_close(pairwise[:, 0], clustering.js_distance(p, q[:1].expand(40, 9)))


def test_js_distance_of_disjoint_rows_is_sqrt_ln2_and_signed_rows_use_abs():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.0, 0.3, 0.7], dtype=torch.float64)
    assert abs(float(clustering.js_distance(p, q)) - math.sqrt(math.log(2))) <= 1e-15
    assert abs(float(clustering.js_distance(p, q)) - jensenshannon(p, q)) <= 1e-15
    # effective attention is signed: |a| / sum|a|, as stats.statistic_sums does for the entropy
    signed = torch.tensor([[0.9, -0.3, 0.2, 0.2], [-1.0, 0.5, 0.0, 1.5]], dtype=torch.float64)
    other = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    got = clustering.js_distance(signed, other)
    reference = [jensenshannon(np.abs(row), other[0].numpy()) for row in signed.numpy()]
    np.testing.assert_allclose(got.numpy(), reference, rtol=0, atol=1e-12)
    # unnormalised rows are normalised, like scipy
    np.testing.assert_allclose(
        float(clustering.js_distance(3 * other[0], p)), jensenshannon(3 * other[0].numpy(), p.numpy()),
        rtol=0, atol=1e-12,
    )


# ------------------------------------------------------------------------------------------------
# HeadDistances


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


class Capture(Accumulator):
    """Keeps every layer's pattern (or effective attention) of every batch, with its mask."""

    def __init__(self, view: str) -> None:
        self.name, self.view = f"capture.{view}", view
        self.needs_values = view == "effective"
        self.batches: list[tuple[torch.Tensor, dict[int, torch.Tensor]]] = []

    def start_batch(self, batch):
        super().start_batch(batch)
        self.batches.append((batch.key_mask.clone(), {}))

    def update(self, layer):
        pattern = layer.effective if self.needs_values else layer.pattern
        self.batches[-1][1][layer.layer] = pattern.detach().double().clone()


def loop_distances(captured, n_layers, n_heads):
    """The mean JS distance of every pair of heads, token by token, with scipy; and the derived
    tolerance (twice the mean per-token bound of :func:`js_tolerance`, for both sides)."""
    n = n_layers * n_heads
    sums, bounds, tokens = np.zeros((n, n)), np.zeros((n, n)), 0
    for key_mask, layers in captured:
        for example, valid in enumerate(key_mask.numpy()):
            keys = np.flatnonzero(valid)
            heads = np.concatenate([layers[layer][example].numpy() for layer in range(n_layers)])
            for query in keys:
                rows = np.abs(heads[:, query, keys])  # signed rows: |a|, normalised by scipy
                tokens += 1
                for i in range(n):
                    for j in range(i + 1, n):
                        d = jensenshannon(rows[i], rows[j])
                        sums[i, j] += d
                        bounds[i, j] += 2 * js_tolerance(U64, len(keys), np.array(d))
    sums, bounds = sums + sums.T, bounds + bounds.T
    return sums / tokens, bounds / tokens, tokens


@pytest.mark.parametrize(
    "view, chunk_bytes",
    [("standard", clustering.CHUNK_BYTES), ("standard", 1), ("standard", 2000), ("effective", 30000)],
)
def test_head_distances_equal_a_scipy_loop(bert, view, chunk_bytes):
    """Every pair of heads of all layers, for every valid query token, against scipy's
    ``jensenshannon`` on the captured rows. The examples have 12 to 17 tokens, so a pair of rows
    takes 3 * 8 * (12..17) = 288..408 bytes of temporaries: chunk_bytes=1 gives one token and one
    pair per chunk, 2000 four to six pairs, 30000 all 28 pairs and two or three tokens."""
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads
    distances = clustering.HeadDistances(n_layers, n_heads, view, chunk_bytes=chunk_bytes)
    capture = Capture(view)
    summary = passes.run(bert, CORPUS, [distances, capture], max_len=MAX_LEN, batch_size=3, progress=False)
    reference, tolerance, tokens = loop_distances(capture.batches, n_layers, n_heads)
    got = distances.result().numpy()
    assert tokens == summary.n_tokens == int(distances.tokens)
    assert got.shape == (n_layers * n_heads,) * 2 and got.dtype == np.float64
    assert tolerance.max() < 1e-10
    assert np.all(np.abs(got - reference) <= tolerance), np.abs(got - reference).max()
    np.testing.assert_array_equal(got, got.T)
    np.testing.assert_array_equal(np.diag(got), 0)
    assert (got[~np.eye(len(got), dtype=bool)] > 0).all()


def test_merge_of_two_halves_equals_one_pass(bert):
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads

    def run(corpus):
        accumulator = clustering.HeadDistances(n_layers, n_heads)
        # in corpus order, so that the halves run the whole pass's batches (by length, each half
        # would be ordered on its own)
        passes.run(bert, corpus, [accumulator], max_len=MAX_LEN, batch_size=4, progress=False, by_length=False)
        return accumulator

    whole = run(CORPUS)
    merged = run(CORPUS[:4]).merge(run(CORPUS[4:]))
    assert float(merged.tokens) == float(whole.tokens)
    np.testing.assert_allclose(merged.total.numpy(), whole.total.numpy(), rtol=0, atol=MERGE_ATOL)
    np.testing.assert_allclose(merged.result().numpy(), whole.result().numpy(), rtol=0, atol=MERGE_ATOL)


def test_interrupted_pass_resumes_from_its_checkpoint(bert, tmp_path):
    """The state adds up, so the engine's checkpoint and resume need nothing more."""
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads
    kwargs = dict(max_len=MAX_LEN, batch_size=4, progress=False, by_length=False)  # a prefix, then the rest
    whole = clustering.HeadDistances(n_layers, n_heads)
    passes.run(bert, CORPUS, [whole], **kwargs)
    path = tmp_path / "distances.safetensors"
    first = clustering.HeadDistances(n_layers, n_heads)
    passes.run(bert, CORPUS[:4], [first], checkpoint=path, **kwargs)
    resumed = clustering.HeadDistances(n_layers, n_heads)
    summary = passes.run(bert, CORPUS, [resumed], checkpoint=path, **kwargs)
    assert summary.resumed == 4
    torch.testing.assert_close(resumed.result(), whole.result(), atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------
# cluster and its figure


def test_embed_recovers_points_in_the_plane():
    """Distances of points in the plane are embedded exactly (up to rotation): stress 0."""
    points = np.random.default_rng(0).normal(size=(12, 2))
    distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    coords = clustering.embed(distances, seed=0)
    assert clustering.stress1(coords, distances) < 1e-3
    np.testing.assert_allclose(pdist(coords), pdist(points), atol=1e-2)


def points_of(fig):
    """The traces that draw heads (not the legend entries of the pattern types)."""
    return [trace for trace in fig.data if trace.legendgroup != "types"]


TYPES = pd.DataFrame({
    "layer": [0, 0, 1], "head": [0, 1, 3], "type": ["vertical", "diagonal", "vertical"],
})


@pytest.fixture(scope="module")
def standard(bert):
    return clustering.cluster(bert, CORPUS, max_len=MAX_LEN, batch_size=4, types=TYPES, progress=False)


def test_cluster_gives_coords_table_and_a_figure(bert, standard):
    n = bert.cfg.n_layers * bert.cfg.n_heads
    assert standard.coords.shape == (n, 2) and standard.distances.shape == (n, n)
    assert list(standard.table.columns) == [*clustering.COLUMNS, "type"]
    assert standard.table["layer"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert standard.table["head"].tolist() == [0, 1, 2, 3] * 2
    assert standard.table["type"].tolist() == ["vertical", "diagonal", *["unknown"] * 5, "vertical"]
    np.testing.assert_array_equal(standard.table[["x", "y"]].to_numpy(), standard.coords)
    assert standard.stress == pytest.approx(clustering.stress1(standard.coords, standard.distances))
    assert standard.view == "standard" and standard.n_examples == len(CORPUS)
    assert repr(standard).startswith("HeadClustering(view='standard', heads=8 (2 layers x 4)")
    # the same corpus through the accumulator alone gives the same distances
    alone = clustering.HeadDistances(bert.cfg.n_layers, bert.cfg.n_heads)
    passes.run(bert, CORPUS, [alone], max_len=MAX_LEN, layout="padded", batch_size=4, progress=False)
    np.testing.assert_array_equal(standard.distances, alone.result().numpy())

    fig = standard.figure()
    points = points_of(fig)
    assert sum(len(trace.x) for trace in points) == n
    hover = [text for trace in points for text in trace.hovertext]
    assert sorted(text.split("<br>")[0] for text in hover) == sorted(
        f"L{layer} H{head}" for layer in range(2) for head in range(4)
    )
    assert any("type: diagonal" in text for text in hover)
    assert all("mean distance to others" in text for text in hover)
    assert {trace.name for trace in fig.data} >= {"L0", "L1", "vertical", "diagonal", "unknown"}
    l0 = next(trace for trace in points if trace.name == "L0")
    assert list(l0.marker.symbol)[:2] == ["circle", "square"]  # vertical, diagonal


def test_effective_and_papa_views_run_and_draw_side_by_side(bert, standard):
    effective = clustering.cluster(bert, CORPUS, view="effective", max_len=MAX_LEN, progress=False)
    assert effective.view == "effective" and effective.coords.shape == (8, 2)
    assert not np.allclose(effective.distances, standard.distances)
    constants = papa.fit(bert, CORPUS, max_len=16, progress=False)
    constant = clustering.cluster(bert, CORPUS, view=constants, progress=False)
    assert constant.view == "papa" and constant.table.attrs["max_len"] == 16
    assert np.isfinite(constant.distances).all() and (constant.distances >= 0).all()
    with pytest.raises(ValueError, match="PAPA constants are fitted with max_len=16, not 24"):
        clustering.cluster(bert, CORPUS, view=constants, max_len=24, progress=False)

    fig = clustering.figure(standard, effective, constant)
    assert [a.text for a in fig.layout.annotations][1].startswith("effective (stress")
    assert sum(len(t.x) for t in points_of(fig)) == 3 * 8
    # panels after the first are only rotated onto it: every distance between heads is kept
    for column, item in ((2, effective), (3, constant)):
        traces = [t for t in points_of(fig) if t.xaxis == f"x{column}"]
        plotted = np.concatenate([np.stack([t.x, t.y], 1) for t in traces])
        order = [int(i) for t in traces for i in np.flatnonzero(item.table["layer"] == int(t.name[1:]))]
        np.testing.assert_allclose(pdist(plotted), pdist(item.coords[order]), atol=1e-9)


def test_bad_inputs_are_clear_errors(bert, standard):
    with pytest.raises(ValueError, match="corpus is empty"):
        clustering.cluster(bert, [], max_len=MAX_LEN, progress=False)
    with pytest.raises(ValueError, match="Unknown view 'papa'.*'standard'.*'effective'.*PAPA constants"):
        clustering.cluster(bert, CORPUS, view="papa", progress=False)
    with pytest.raises(ValueError, match="Unknown view 'papa' for HeadDistances"):
        clustering.HeadDistances(2, 4, "papa")
    with pytest.raises(ValueError, match="types lacks column type"):
        clustering.cluster(bert, CORPUS, types=TYPES[["layer", "head"]], progress=False)
    with pytest.raises(ValueError, match="layer 2 head 0, which the model does not have"):
        clustering.cluster(bert, CORPUS, types=pd.DataFrame({"layer": [2], "head": [0], "type": ["x"]}), progress=False)
    with pytest.raises(ValueError, match="twice"):
        clustering.cluster(bert, CORPUS, types=pd.concat([TYPES, TYPES]), progress=False)
    with unchecked():
        with pytest.raises(TypeError, match="types must be a pandas DataFrame"):
            clustering.cluster(bert, CORPUS, types={"layer": [0]}, progress=False)
        with pytest.raises(ValueError, match="same number of keys"):
            clustering.js_distance(torch.rand(3, 4), torch.rand(3, 5))
        with pytest.raises(TypeError, match="HeadClustering"):
            clustering.figure(standard, "effective")
    with pytest.raises(ValueError, match="seen no token"):
        clustering.HeadDistances(2, 4).result()
    with pytest.raises(ValueError, match="at least one HeadClustering"):
        clustering.figure()
