"""attnlens.methods.stats against a plain Python loop written from the definitions (Clark et al. 2019)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlens.methods.stats import LINEAR, STATISTICS, AttentionStatistics, token_classes
from tests import tiny

TEXTS = ["the film , though slow , is wise .", "a charming portrait !", "it rained ; the match was off ."]


def loop_means(pattern, input_ids, valid, tokenizer):
    """Per head, each statistic averaged over valid query tokens, one row at a time."""
    batch, heads, n, _ = pattern.shape
    tokens = [tokenizer.convert_ids_to_tokens(row.tolist()) for row in input_ids]
    punctuation = set(",.;:!?")
    sums = {name: [0.0] * heads for name in STATISTICS}
    count = 0
    for b in range(batch):
        keys = [k for k in range(n) if valid[b, k]]
        for q in keys:
            count += 1
            for h in range(heads):
                row = {k: float(pattern[b, h, q, k]) for k in keys}
                sums["to_cls"][h] += sum(a for k, a in row.items() if tokens[b][k] == "[CLS]")
                sums["to_sep"][h] += sum(a for k, a in row.items() if tokens[b][k] == "[SEP]")
                sums["to_punct"][h] += sum(a for k, a in row.items() if tokens[b][k] in punctuation)
                sums["to_self"][h] += row[q]
                sums["to_prev"][h] += row.get(q - 1, 0.0)
                sums["to_next"][h] += row.get(q + 1, 0.0)
                total = sum(abs(a) for a in row.values())
                sums["entropy"][h] -= sum(
                    abs(a) / total * math.log(abs(a) / total) for a in row.values() if a != 0
                )
                sums["sink"][h] += 1.0 if row[keys[0]] > 0.3 else 0.0  # Gu et al.'s ε, per row
    return {name: torch.tensor(values, dtype=torch.float64) / count for name, values in sums.items()}


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("signed", [False, True], ids=["softmax", "signed"])
def test_statistics_equal_a_plain_loop(signed, left):
    """Left padded, the examples' first real tokens lie in different columns (the sink reads
    each one's own; right padded, the shared column 0)."""
    tokenizer = tiny.bert_tokenizer()
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    input_ids, valid = encoded["input_ids"], encoded["attention_mask"].bool()
    if left:
        input_ids, valid = input_ids.flip(-1), valid.flip(-1)
    assert (~valid).any(), "the batch must contain padding"
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(len(TEXTS), 3, *input_ids.shape[1:2] * 2, generator=generator)
    pattern = scores.masked_fill(~valid[:, None, None, :], -torch.inf).softmax(-1)
    if signed:  # effective attention can be negative or above 1
        pattern = pattern * 1.5 - 0.2 * valid[:, None, None, :]
    stats = AttentionStatistics(n_layers=1, n_heads=3)
    stats.update(0, pattern, token_classes(tokenizer, input_ids), valid)
    expected = loop_means(pattern.double(), input_ids, valid, tokenizer)
    got = stats.means()
    assert 0 < float(expected["sink"].max()) and float(expected["sink"].min()) < 1, "rows on both sides of ε"
    for name in STATISTICS:
        torch.testing.assert_close(got[name][0].double(), expected[name], atol=1e-5, rtol=1e-5)


def test_sink_counts_valid_rows_above_the_threshold_on_the_first_token():
    """Rows built on either side of ε = 0.3 (equal to it is not above), padding rows left out."""
    valid = torch.tensor([[True, True, True, False]])
    first = torch.tensor([0.9, 0.3, 0.31, 1.0])  # query 3 is padding: not counted
    pattern = torch.zeros(1, 1, 4, 4)
    pattern[0, 0, :, 0] = first
    pattern[0, 0, :, 1] = 1 - first
    stats = AttentionStatistics(n_layers=1, n_heads=1)
    none = torch.zeros(1, 4, dtype=torch.bool)
    stats.update(0, pattern, {"cls": none, "sep": none, "punct": none}, valid)
    torch.testing.assert_close(stats.means()["sink"], torch.tensor([[2 / 3]]))


def test_means_without_any_batch_are_refused():
    with pytest.raises(ValueError, match="No tokens"):
        AttentionStatistics(2, 3).means()


@pytest.mark.parametrize("make_tokenizer", [tiny.gpt2_tokenizer, tiny.roberta_tokenizer, tiny.bert_tokenizer])
def test_punctuation_is_judged_on_the_decoded_text(make_tokenizer):
    """Byte-level BPE writes '—' as 'âĢĶ' (its UTF-8 bytes as stand-in characters): the table must
    classify the text an entry decodes to (Unicode category P*), not the stand-ins."""
    from attnlens.methods.stats import _punctuation_flags, token_texts

    tokenizer = make_tokenizer()
    byte_level = make_tokenizer is not tiny.bert_tokenizer
    punctuation = ["ĠâĢĶ", "âĢĿ", "ĠâĢ¦", "Ġ,"] if byte_level else ["—", "”", "##,", ","]
    words = ["Ġthe", "âĢ", "Ġ"] if byte_level else ["the", "##s", "[UNK]x"]
    for token, flag in zip(punctuation, _punctuation_flags(token_texts(tokenizer, punctuation)), strict=True):
        assert flag, token
    for token, flag in zip(words, _punctuation_flags(token_texts(tokenizer, words)), strict=True):
        assert not flag, token


def test_a_shared_bos_eos_token_is_the_start_once_and_a_separator_elsewhere():
    """GPT-2's bos and eos are one token, <|endoftext|>: as both start and separator every head's
    to_cls would equal its to_sep. Only the first real token is the start (left padding too)."""
    import copy

    tokenizer = copy.deepcopy(tiny.gpt2_tokenizer())
    tokenizer.bos_token = tokenizer.eos_token
    eos, a, b = tokenizer.eos_token_id, 10, 11
    ids = torch.tensor([[eos, a, eos, b, eos], [eos, eos, a, eos, b]])
    valid = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)  # padding is eos too
    classes = token_classes(tokenizer, ids, valid)
    assert classes["cls"].tolist() == [[True, False, False, False, False], [False, True, False, False, False]]
    assert (classes["sep"] & valid).tolist() == [[False, False, True, False, False], [False, False, False, True, False]]
    other = token_classes(tiny.roberta_tokenizer(), ids)  # distinct <s> and </s>: unchanged rule
    assert torch.equal(other["cls"], ids == tiny.roberta_tokenizer().cls_token_id)


#: float32's unit roundoff
U32 = 2.0**-24


def test_float32_batch_sums_are_within_the_float32_bound_of_float64():
    """The statistics and compare's distance are summed in float32 per batch (into float64
    totals). A float32 sum of ``n`` terms is within ``(n − 1) · u · Σ|terms|`` of the exact sum
    (``u = 2⁻²⁴``, the worst case; about ``√n · u`` typically). The six statistics that sum a
    row over keys are one contraction per example (``Q · K`` terms) summed over ``B`` examples,
    so ``n = Q · K + B``; entropy and sink nest a row sum of ``K`` keys in a sum of ``B · Q``
    rows, so ``n = K + B · Q`` (entropy adds a log and a division per row: a few ``u`` more,
    covered by ``+ 8``); the distance is a row sum in a sum of rows too. The reference is the
    same formula in float64, on the same (float32) patterns."""
    from attnlens.methods.stats import total_variation as _total_variation

    generator = torch.Generator().manual_seed(1)
    batch, heads, n = 16, 4, 96
    lengths = torch.randint(n // 4, n + 1, (batch,), generator=generator)
    valid = torch.arange(n)[None, :] < lengths[:, None]
    classes = {
        "cls": torch.zeros(batch, n, dtype=torch.bool).index_fill_(1, torch.tensor([0]), True),
        "sep": torch.arange(n)[None, :] == (lengths[:, None] - 1),
        "punct": torch.rand(batch, n, generator=generator) < 0.2,
    }
    scores = torch.randn(batch, heads, n, n, generator=generator) * 3
    pattern = scores.masked_fill(~valid[:, None, None, :], -torch.inf).softmax(-1)
    other = torch.randn(batch, heads, n, n, generator=generator).masked_fill(
        ~valid[:, None, None, :], -torch.inf).softmax(-1)
    stats = AttentionStatistics(n_layers=1, n_heads=heads)
    stats.update(0, pattern, classes, valid)

    p64, keys, rows = pattern.double(), valid[:, None, None, :].double(), valid[:, None, :].double()
    reference = {f"to_{name}": (p64 * mask[:, None, None, :].double()).sum(-1) for name, mask in classes.items()}
    reference["to_self"] = torch.diagonal(p64, dim1=-2, dim2=-1)
    reference["to_prev"] = torch.nn.functional.pad(torch.diagonal(p64, -1, -2, -1), (1, 0))
    reference["to_next"] = torch.nn.functional.pad(torch.diagonal(p64, 1, -2, -1), (0, 1))
    probs = p64 * keys / (p64 * keys).sum(-1, keepdim=True)
    reference["entropy"] = -torch.special.xlogy(probs, probs).sum(-1)
    reference["sink"] = (p64[..., 0] > 0.3).double()  # column 0: every example's first real token
    bound = (n + batch * n + 8) * U32
    for name in STATISTICS:
        limit = (n * n + batch) * U32 if name in LINEAR else bound
        exact = (reference[name] * rows).sum(dim=(0, 2))
        magnitude = (reference[name].abs() * rows).sum(dim=(0, 2))
        error = (stats.sums[name][0] - exact).abs()
        assert bool((error <= limit * magnitude).all()), (name, float((error / magnitude).max()), limit)

    distance = _total_variation(pattern, other, valid).double()
    terms = (p64 - other.double()).abs() * keys * rows[..., None]
    exact = 0.5 * terms.sum(dim=(0, 2, 3))
    assert bool(((distance - exact).abs() <= bound * exact).all())
