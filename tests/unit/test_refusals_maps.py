"""A standard or PAPA map given to classify / classify_batch must be a distribution over its
visible keys in every way the definition says (issue 61, item 2); effective maps need only be
finite. One function checks it: attnlens.methods.patterns.maps_check.check_maps."""

from __future__ import annotations

import pytest
import torch

from attnlens.errors import InputError
from attnlens.methods import patterns
from attnlens.methods.patterns.maps_check import row_tolerance

TOKENS = [["[CLS]", "a", "b", "c", "[SEP]", "[PAD]"], ["[CLS]", "a", "b", "c", "d", "[SEP]"]]
MASK = torch.tensor([[True] * 5 + [False], [True] * 6])


def maps(causal: bool = False) -> torch.Tensor:
    """[2, 3, 6, 6] valid maps: softmax over the visible keys of random scores."""
    scores = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    visible = MASK[:, None, None, :].expand(2, 3, 6, 6)
    if causal:
        visible = visible & torch.ones(6, 6, dtype=torch.bool).tril()
    return scores.masked_fill(~visible, -torch.inf).softmax(-1)


def positions(causal: bool = False) -> patterns.Positions:
    from attnlens.methods.patterns.templates import Positions

    made = Positions.from_tokens([t[:5] for t in TOKENS[:1]] + TOKENS[1:], causal=causal, length=6)
    assert torch.equal(made.key_mask, MASK)
    return made


def refusal(pattern, *, view="standard", causal=False) -> str:
    with pytest.raises(InputError) as error:
        patterns.classify(pattern, positions=positions(causal), view=view)
    return str(error.value)


FIX = ("For signed maps (effective attention) pass view='effective'; check that tokens / key_mask "
       "match the map (padding, causal).")


def test_valid_maps_pass_in_every_view():
    for view in ("standard", "papa", "effective"):
        assert patterns.classify(maps(), positions=positions(), view=view).labels.shape == (2, 3)
    assert patterns.classify(maps(True), positions=positions(True)).labels.shape == (2, 3)


def test_negative_entries_are_refused_even_when_rows_sum_to_1():
    pattern = maps()
    pattern[1, 2, 3, 0] += 0.3  # the row still sums to 1: the old check let it through
    pattern[1, 2, 3, 1] -= pattern[1, 2, 3, 1] + 0.1
    pattern[1, 2, 3, 2] += 1.0 - float(pattern[1, 2, 3].double().sum())
    assert abs(float(pattern[1, 2, 3].double().sum()) - 1) < 1e-6 and float(pattern[1, 2, 3, 1]) < 0
    for view in ("standard", "papa"):
        assert refusal(pattern, view=view) == (
            f"pattern: example 1, head 2, row 3 has weight -0.1 on key 1, below 0 (1 negative "
            f"entry): a {view} map's rows are distributions over their visible keys, never "
            f"negative. {FIX}")
    patterns.classify(pattern, positions=positions(), view="effective")  # signed: finite is enough


def test_weight_on_padding_is_refused():
    pattern = maps()
    pattern[0, 1, 2, 1] -= 0.25
    pattern[0, 1, 2, 5] = 0.25  # key 5 of example 0 is padding; the row still sums to 1
    assert refusal(pattern) == (
        "pattern: example 0, head 1, row 2 has weight 0.25 on key 5, which it cannot see (a padding "
        "position (beyond the example's tokens); 1 such entry): a standard map is 0 on masked "
        f"keys, as a masked softmax gives. {FIX}")
    padded_row = maps()
    padded_row[0, :, 5] = 7.0  # a padded query row is not part of the map
    patterns.classify(padded_row, positions=positions())


def test_weight_on_a_later_key_of_a_decoder_is_refused():
    pattern = maps(causal=True)
    pattern[1, 0, 2, 4] = 0.5
    pattern[1, 0, 2, :3] *= 0.5  # sums to 1 still
    assert refusal(pattern, causal=True) == (
        "pattern: example 1, head 0, row 2 has weight 0.5 on key 4, which it cannot see (after the "
        "query (causal); 1 such entry): a standard map is 0 on masked keys, as a masked softmax "
        f"gives. {FIX}")
    patterns.classify(maps(True), positions=positions(False))  # an encoder may see every key


def test_row_sums_use_a_float32_tolerance():
    tolerance = row_tolerance(torch.float32, 6)
    assert tolerance == pytest.approx(7 * 2.0**-23 + 2.0**-23)
    pattern = maps().double()
    pattern[1, 1, 4] *= 1 + 0.5 * tolerance  # inside the tolerance
    patterns.classify(pattern, positions=positions())
    pattern[1, 1, 4] *= 1 + 4 * tolerance
    message = refusal(pattern)
    total = float(pattern[1, 1, 4].sum())
    assert f"{total:.7g}" == "1.000004"
    assert message.startswith("pattern: row 4 of head 1 of example 1 sums to 1.000004 over its "
                              "visible keys, not 1 (tolerance 9.5e-07, from float32 rounding; 1 such row)")
    half = maps()
    half[0, 0, 0] *= 0.5
    assert refusal(half).startswith("pattern: row 0 of head 0 of example 0 sums to 0.5 over its visible")


def test_non_finite_maps_are_refused_in_every_view():
    pattern = maps()
    pattern[1, 2, 0, 3] = torch.nan
    for view in ("standard", "papa", "effective"):
        assert refusal(pattern, view=view) == (
            "pattern: the maps hold NaN or infinite values (1 entry; the first at example 1, head 2, "
            f"row 0, key 3: nan); a {view} map must be finite.")


def test_classify_batch_checks_the_same_way():
    """PatternCNN.classify_batch, the other public entry taking maps of a view."""
    cnn = patterns.PatternCNN(size=8, epochs=1, augment=False)
    synthetic = patterns.synthetic("all", 1, 8, seed=0)
    cnn.fit(synthetic.maps, synthetic.labels)
    pattern = maps()
    assert cnn.classify_batch(pattern, MASK).shape == (2, 3)
    pattern[0, 1, 2, 1] -= 0.25
    pattern[0, 1, 2, 5] = 0.25
    with pytest.raises(InputError, match=r"example 0, head 1, row 2 has weight 0.25 on key 5, which it cannot see"):
        cnn.classify_batch(pattern, MASK)
    assert cnn.classify_batch(pattern, MASK, "effective").shape == (2, 3)
    causal = maps(True)
    causal[1, 0, 2, 4] = 0.5
    causal[1, 0, 2, :3] *= 0.5
    with pytest.raises(InputError, match=r"after the query \(causal\)"):
        cnn.classify_batch(causal, MASK, "papa", causal=True)
