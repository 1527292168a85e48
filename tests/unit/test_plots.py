"""Figures: shapes, axes, labels, hover text, colour scales, causal masking (6 x 12 heads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens.core import plots
from tests.typechecks import unchecked

N_LAYERS, N_HEADS = 6, 12
TOKENS = ["[CLS]", "the", "film", "is", "charming", ",", "funny", ".", "[SEP]"]
N_TOKENS = len(TOKENS)


def _attention(n_layers=N_LAYERS, n_heads=N_HEADS, n=N_TOKENS, seed=0) -> np.ndarray:
    generator = np.random.default_rng(seed)
    scores = generator.normal(size=(n_layers, n_heads, n, n))
    weights = np.exp(scores)
    return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


def _ticktext(axis) -> list[str]:
    return list(axis.ticktext)


# -- head_grid -----------------------------------------------------------------------------------


def test_head_grid_shape_axes_and_hover():
    values = torch.rand(N_LAYERS, N_HEADS)
    fig = plots.head_grid(values, title="to_sep", name="to_sep")
    assert len(fig.data) == 1
    trace = fig.data[0]
    assert np.asarray(trace.z).shape == (N_LAYERS, N_HEADS)
    np.testing.assert_allclose(np.asarray(trace.z), values.numpy(), rtol=1e-6)
    assert fig.layout.xaxis.title.text == "head"
    assert fig.layout.yaxis.title.text == "layer"
    assert _ticktext(fig.layout.xaxis) == [f"H{h}" for h in range(N_HEADS)]
    assert _ticktext(fig.layout.yaxis) == [f"L{layer}" for layer in range(N_LAYERS)]
    assert fig.layout.yaxis.autorange == "reversed"  # layer 0 on top
    assert "L%{y}H%{x}" in trace.hovertemplate and "%{z" in trace.hovertemplate
    assert "to_sep" in trace.hovertemplate
    assert fig.layout.title.text == "to_sep"


def test_head_grid_panels_share_one_colour_scale():
    fig = plots.head_grid(
        {"papa": np.full((N_LAYERS, N_HEADS), 0.2), "effective": np.full((N_LAYERS, N_HEADS), 0.6)},
        name="distance",
    )
    assert [trace.name for trace in fig.data] == ["papa", "effective"]
    assert {trace.coloraxis for trace in fig.data} == {"coloraxis"}
    assert [a.text for a in fig.layout.annotations] == ["papa", "effective"]
    assert fig.layout.coloraxis.cmin == 0.0 and fig.layout.coloraxis.cmax == pytest.approx(0.6)
    assert "papa" in fig.data[0].hovertemplate and "effective" in fig.data[1].hovertemplate


def test_head_grid_diverging_is_centred_on_zero():
    values = np.linspace(-0.5, 1.5, N_LAYERS * N_HEADS).reshape(N_LAYERS, N_HEADS)
    fig = plots.head_grid(values, diverging=True)
    axis = fig.layout.coloraxis
    assert axis.cmid == 0.0 and axis.cmin == -axis.cmax
    assert axis.colorscale[0][1] != axis.colorscale[-1][1]


def test_head_grid_turns_diverging_by_itself_only_for_negative_values():
    """A negative value on a sequential scale from 0 would look like 0; values above 1 (entropy
    in nats) are not signed."""
    signed = np.linspace(-0.6, 0.4, N_LAYERS * N_HEADS).reshape(N_LAYERS, N_HEADS)
    axis = plots.head_grid(signed).layout.coloraxis
    assert axis.cmid == 0.0 and axis.cmin == pytest.approx(-0.6)
    axis = plots.head_grid(signed + 1.0).layout.coloraxis  # 0.4 .. 1.4
    assert axis.cmid is None and axis.cmin == 0.0 and axis.cmax == pytest.approx(1.4)


def test_head_grid_categorical():
    labels = np.array([["[CLS]", "[SEP]", "self"] * 4] * N_LAYERS, dtype=object)
    fig = plots.head_grid(labels, name="target", categories=["[CLS]", "[SEP]", "self", "broad"])
    trace = fig.data[0]
    assert np.asarray(trace.z).shape == (N_LAYERS, N_HEADS)
    assert list(np.asarray(trace.z)[0, :3]) == [0, 1, 2]
    colorbar = fig.layout.coloraxis.colorbar
    assert list(colorbar.ticktext) == ["[CLS]", "[SEP]", "self", "broad"]
    assert list(colorbar.tickvals) == [0, 1, 2, 3]
    assert np.asarray(trace.customdata)[0, 1] == "[SEP]"  # hover names the category
    assert "%{customdata}" in trace.hovertemplate
    with pytest.raises(ValueError, match="not among categories"):
        plots.head_grid(labels, categories=["[CLS]"])


def test_head_grid_rejects_wrong_shape():
    with unchecked(), pytest.raises(ValueError, match="layer, head"):
        plots.head_grid(np.zeros(12))


# -- patterns (tiled) ----------------------------------------------------------------------------


def test_patterns_tiles_all_heads_in_one_trace():
    attention = _attention()
    n = len(TOKENS)
    fig = plots.patterns(attention, TOKENS, title="standard")
    assert len(fig.data) == 1 and fig.data[0].type == "heatmap"
    z = np.asarray(fig.data[0].z)
    assert z.shape == (N_LAYERS * (n + 1) - 1, N_HEADS * (n + 1) - 1)
    # tile (layer 2, head 5) sits at rows 2*(n+1).., columns 5*(n+1)..
    np.testing.assert_allclose(z[2 * (n + 1) : 2 * (n + 1) + n, 5 * (n + 1) : 5 * (n + 1) + n], attention[2, 5])
    assert np.isnan(z[n, :]).all() and np.isnan(z[:, n]).all()  # gaps between tiles
    assert _ticktext(fig.layout.xaxis) == [f"H{h}" for h in range(N_HEADS)]
    assert _ticktext(fig.layout.yaxis) == [f"L{layer}" for layer in range(N_LAYERS)]
    assert fig.layout.yaxis.autorange == "reversed"
    assert len(fig.data[0].x) == z.shape[1] and len(fig.data[0].y) == z.shape[0]


def test_patterns_hover_names_layer_head_tokens_and_value():
    fig = plots.patterns(_attention(), TOKENS)
    trace = fig.data[0]
    n = len(TOKENS)
    assert trace.hovertemplate.startswith("%{y}<br>%{x}<br>attention: %{z:.3f}")
    assert trace.hoverongaps is False
    # row label of layer 3, query 2 ('film'); column label of head 7, key 4 ('charming')
    assert trace.y[3 * (n + 1) + 2] == "L3 query 2 'film'"
    assert trace.x[7 * (n + 1) + 4] == "H7 key 4 'charming'"
    assert len(set(trace.x)) == len(trace.x) and len(set(trace.y)) == len(trace.y)


def test_patterns_stays_one_trace_at_384_heads():
    attention = _attention(n_layers=24, n_heads=16, n=32, seed=1)
    tokens = [f"t{i}" for i in range(32)]
    fig = plots.patterns(attention, tokens)
    assert len(fig.data) == 1
    assert np.asarray(fig.data[0].z).shape == (24 * 33 - 1, 16 * 33 - 1)
    assert len(fig.layout.xaxis.ticktext) == 16 and len(fig.layout.yaxis.ticktext) == 24
    assert not fig.layout.annotations  # no subplots, no per-tile annotations


def test_patterns_encoder_full_decoder_masked_above_diagonal():
    attention = _attention()
    n = len(TOKENS)
    encoder = np.asarray(plots.patterns(attention, TOKENS).data[0].z)
    decoder = np.asarray(plots.patterns(attention, TOKENS, causal=True).data[0].z)
    tile_encoder = encoder[:n, :n]
    tile_decoder = decoder[(n + 1) : (n + 1) + n, (n + 1) : (n + 1) + n]  # layer 1, head 1
    assert not np.isnan(tile_encoder).any()
    above = np.triu(np.ones((n, n), dtype=bool), k=1)
    assert np.isnan(tile_decoder[above]).all()
    np.testing.assert_allclose(tile_decoder[~above], attention[1, 1][~above])


def test_patterns_colour_scales():
    attention = _attention()
    sequential = plots.patterns(attention, TOKENS).data[0]
    assert sequential.zmin == 0.0 and sequential.zmid is None
    signed = attention * 2.0 - 0.5  # like effective attention: negative and above 1
    diverging = plots.patterns(signed, TOKENS).data[0]  # detected
    assert diverging.zmid == 0.0 and diverging.zmin == -diverging.zmax
    forced = plots.patterns(attention, TOKENS, diverging=True).data[0]
    assert forced.zmid == 0.0
    assert diverging.colorscale != sequential.colorscale


def test_patterns_valid_mask_drops_padding():
    attention = _attention(n=len(TOKENS) + 3)
    valid = np.array([True] * len(TOKENS) + [False] * 3)
    fig = plots.patterns(attention, [*TOKENS, "[PAD]", "[PAD]", "[PAD]"], valid=valid)
    n = len(TOKENS)
    assert np.asarray(fig.data[0].z).shape == (N_LAYERS * (n + 1) - 1, N_HEADS * (n + 1) - 1)
    assert not any("[PAD]" in label for label in fig.data[0].x)


def test_patterns_single_layer_and_errors():
    fig = plots.patterns(_attention()[4], TOKENS, layers=[4])
    assert _ticktext(fig.layout.yaxis) == ["L4"]
    with pytest.raises(ValueError, match="tokens"):
        plots.patterns(_attention(), TOKENS[:-1])


def test_tile_shape():
    assert plots.tile(np.zeros((2, 3, 4, 4))).shape == (2 * 5 - 1, 3 * 5 - 1)
    assert plots.tile(np.zeros((2, 3, 4, 4)), gap=0).shape == (8, 12)


# -- side_by_side --------------------------------------------------------------------------------


def test_side_by_side_standard_papa_effective():
    attention = _attention()
    views = {
        "standard": attention[3, 7],
        "papa": attention[0, 0],
        "effective": attention[3, 7] - 0.2,  # signed
    }
    fig = plots.side_by_side(views, TOKENS, layer=3, head=7)
    assert [trace.name for trace in fig.data] == ["standard", "papa", "effective"]
    assert [a.text for a in fig.layout.annotations] == ["standard", "papa", "effective"]
    assert "Layer 3, head 7" in fig.layout.title.text
    standard, papa, effective = fig.data
    assert standard.zmid is None and papa.zmid is None
    assert effective.zmid == 0.0 and effective.zmin == -effective.zmax
    assert list(fig.layout.xaxis.ticktext) == TOKENS and list(fig.layout.yaxis.ticktext) == TOKENS
    assert fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.xaxis.title.text == "key" and fig.layout.yaxis.title.text == "query"
    assert np.asarray(standard.text)[2, 4] == "L3H7 query 2 'film' → key 4 'charming'"
    assert "%{text}" in effective.hovertemplate and "effective: %{z" in effective.hovertemplate
    # colour bars do not overlap
    assert len({round(trace.colorbar.x, 3) for trace in fig.data}) == 3


def test_side_by_side_diverging_by_name_and_causal():
    attention = _attention()[0, 0]
    fig = plots.side_by_side(
        {"standard": attention, "effective": attention},
        TOKENS, layer=0, head=0, diverging={"effective": True}, causal=True,
    )
    assert fig.data[1].zmid == 0.0 and fig.data[0].zmid is None
    z = np.asarray(fig.data[0].z)
    assert np.isnan(z[0, 1:]).all() and not np.isnan(np.tril(z)).any()


def test_side_by_side_long_input_thins_tick_labels():
    n = 100
    tokens = [f"w{i}" for i in range(n)]
    attention = np.full((n, n), 1.0 / n)
    fig = plots.side_by_side({"standard": attention}, tokens, layer=0, head=0)
    assert len(fig.layout.xaxis.ticktext) <= plots.MAX_TICK_LABELS
    assert np.asarray(fig.data[0].z).shape == (n, n)
