"""Sentence pairs on decoders (GPT-2, the Llama family): ``<bos> A <bos> B``.

A decoder's tokenizer has no [CLS]/[SEP]; its pair format starts each sentence with its start
token. The start token at position 0 is the start ([CLS] role, ``to_cls``) and the pair's later
start token is its boundary, a separator ([SEP] role, ``to_sep``), which closes the first segment
as an encoder's middle [SEP] does: the template classifier's segments, its ``block`` type and
compare's kept segments then see two sentences. A tokenizer that would put nothing between the
two sentences (no start token, no separator) is refused at tokenization. Encoders are unchanged:
their values below were computed before decoder pairs had a boundary.
"""

from __future__ import annotations

import tempfile

import pytest
import torch

import attnlens
from attnlens.errors import InputError
from attnlens.methods import patterns
from attnlens.methods.patterns.templates import Positions, is_pair
from attnlens.methods.stats import AttentionStatistics, token_classes
from tests import tiny

S1 = "the quick brown fox jumps over the lazy dog ."
S2 = "it rained all day ; the match was postponed until sunday ."

DECODERS = {"gpt2": tiny.gpt2_bridge, "llama": tiny.llama_bridge}


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request):
    return DECODERS[request.param]()


def _pair(model, max_len: int = 64):
    """The batch of one long pair and one short one, and the first pair's tokens and boundary
    (the column of its second start token: one after the first sentence's tokens)."""
    tokenizer = model.tokenizer
    batch = attnlens.tokenize(model, [(S1, S2), ("dog .", "it rained .")], max_len=max_len)
    first = tokenizer(S1, add_special_tokens=False)["input_ids"]
    ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    return batch, ids, 1 + len(first)


def test_a_decoder_pair_has_its_start_at_0_and_its_separator_at_the_second_start_token(decoder):
    tokenizer = decoder.tokenizer
    batch, ids, boundary = _pair(decoder)
    start = tokenizer.bos_token_id
    assert ids[0] == start and ids[boundary] == start  # <bos> A <bos> B
    assert start not in ids[1:boundary] + ids[boundary + 1 :]
    valid = batch.attention_mask.bool()
    classes = token_classes(tokenizer, batch.input_ids, valid)
    short = len(tokenizer("dog .", add_special_tokens=False)["input_ids"]) + 1
    assert [row[keep].nonzero().flatten().tolist() for row, keep in zip(classes["cls"], valid, strict=True)] == [[0], [0]]
    assert [(row & keep).nonzero().flatten().tolist()
            for row, keep in zip(classes["sep"], valid, strict=True)] == [[boundary], [short]]


def test_to_sep_of_a_head_on_the_boundary_is_1_and_its_to_cls_0(decoder):
    """Head 0 puts every row on the boundary (to_sep 1, to_cls 0); head 1, causal, puts the rows
    before the boundary on the start and the others on the boundary: to_cls = b / n and
    to_sep = (n − b) / n, by hand."""
    batch, ids, boundary = _pair(decoder)
    keep = batch.attention_mask[:1].bool()
    n = int(keep.sum())
    pattern = torch.zeros(1, 2, keep.shape[1], keep.shape[1])
    pattern[0, 0, :n, boundary] = 1.0
    pattern[0, 1, :boundary, 0] = 1.0
    pattern[0, 1, boundary:n, boundary] = 1.0
    statistics = AttentionStatistics(1, 2)
    statistics.update(0, pattern, token_classes(decoder.tokenizer, batch.input_ids[:1], keep), keep)
    means = statistics.means()
    assert means["to_sep"][0].tolist() == pytest.approx([1.0, (n - boundary) / n], abs=1e-6)
    assert means["to_cls"][0].tolist() == pytest.approx([0.0, boundary / n], abs=1e-6)


def _hand_shares(A: torch.Tensor, special: list[bool], segment: list[int]) -> dict[str, float]:
    """The chance-corrected shares of the template regions of a causal map, by loops."""
    n = len(special)
    pair = len({segment[k] for k in range(n) if not special[k]}) > 1
    share = dict.fromkeys(("special", "diagonal", "block"), 0.0)
    chance = dict(share)
    for q in range(n):
        seen = range(q + 1)
        keys = {
            "special": [k for k in seen if special[k]],
            "diagonal": [k for k in seen if not special[k] and abs(k - q) <= 1],
            "block": [k for k in seen if pair and not special[k] and abs(k - q) > 1 and segment[k] == segment[q]],
        }
        for region, chosen in keys.items():
            share[region] += float(A[q, chosen].sum()) / n
            chance[region] += len(chosen) / (q + 1) / n
    return {region: (share[region] - chance[region]) / (1 - chance[region]) for region in share}


def test_a_map_within_each_sentence_of_a_decoder_pair_is_block(decoder):
    """Each row attends uniformly to the words it sees in its own sentence (the second sentence
    from its start token on) beyond its neighbours, or, with none, to all it sees of its sentence;
    the boundary closes the first segment, as a [SEP] does."""
    tokenizer = decoder.tokenizer
    batch = attnlens.tokenize(decoder, [(S1, S2)], max_len=64)
    _, ids, boundary = _pair(decoder)
    n = len(ids)
    sentence = [int(k >= boundary) for k in range(n)]
    special = [k in (0, boundary) for k in range(n)]
    A = torch.zeros(n, n, dtype=torch.float64)
    for q in range(n):
        own = [k for k in range(q + 1) if sentence[k] == sentence[q]]
        far = [k for k in own if not special[k] and abs(k - q) > 1]
        A[q, far or own] = 1.0 / len(far or own)
    segment = [int(k > boundary) for k in range(n)]
    expected = _hand_shares(A, special, segment)
    assert expected["block"] >= 0.5 and expected["special"] < 0.5 and expected["diagonal"] < 0.5
    for given in (dict(batch=batch, tokenizer=tokenizer), dict(tokens=tokenizer.convert_ids_to_tokens(ids))):
        classified = patterns.classify(A[None, None].float(), causal=True, **given)
        assert classified.names.tolist() == [["block"]] and classified.pairs.tolist() == [True]
        for region, value in expected.items():
            assert float(classified.features[region][0, 0]) == pytest.approx(value, abs=1e-5), region
    positions = Positions.from_batch(batch, tokenizer, causal=True)
    assert positions.segment[0].tolist() == segment and is_pair(positions).tolist() == [True]


def test_compare_keeps_two_segments_of_a_decoder_pair(decoder):
    _, ids, boundary = _pair(decoder)
    comparison = attnlens.compare(decoder, corpus=[(S1, S2)], max_len=64, progress=False, report_examples=1)
    kept = comparison.kept_patterns.example(0)
    assert len(kept.tokens) == len(ids)
    assert kept.segments == [0] * (boundary + 1) + [1] * (len(ids) - boundary - 1)


@pytest.mark.slow
def test_smollm2_pair_boundary_is_its_second_im_start(smollm2):
    tokenizer = smollm2.tokenizer
    batch = attnlens.tokenize(smollm2, [("the dog runs .", "it rained .")], max_len=32)
    tokens = tokenizer.convert_ids_to_tokens(batch.input_ids[0])
    boundary = 1 + len(tokenizer("the dog runs .", add_special_tokens=False)["input_ids"])
    assert tokens[0] == tokens[boundary] == "<|im_start|>"
    classes = token_classes(tokenizer, batch.input_ids, batch.attention_mask.bool())
    assert classes["cls"][0].nonzero().flatten().tolist() == [0]
    assert classes["sep"][0].nonzero().flatten().tolist() == [boundary]
    positions = Positions.from_batch(batch, tokenizer, causal=True)
    assert positions.segment[0].tolist() == [0] * (boundary + 1) + [1] * (len(tokens) - boundary - 1)


@pytest.fixture(scope="module")
def no_start_token():
    """A Llama whose tokenizer has no bos token (Qwen2-style) and adds no special token."""
    from transformers import AutoTokenizer, GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM

    folder = tempfile.TemporaryDirectory(prefix="attnlens-nobos-")
    GPT2TokenizerFast(tokenizer_object=tiny.bpe_tokenizer_files(), bos_token=None, eos_token="</s>",
                      unk_token="<unk>").save_pretrained(folder.name)
    tokenizer = AutoTokenizer.from_pretrained(folder.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    model = attnlens.load(LlamaForCausalLM(config).eval(), tokenizer=tokenizer)
    yield model
    folder.cleanup()


def test_a_pair_with_nothing_between_its_sentences_is_refused(no_start_token):
    tokenizer = no_start_token.tokenizer
    single = attnlens.tokenize(no_start_token, ["the quick fox .", "it rained ."], max_len=32)
    assert single.input_ids[0, 0] == tokenizer("the quick fox .", add_special_tokens=False)["input_ids"][0]
    for given in (no_start_token, tokenizer):
        with pytest.raises(InputError, match="nothing between the two sentences") as refused:
            attnlens.tokenize(given, [("the quick fox .", "it rained .")], max_len=32, layout="padded")
        assert "join the two sentences into one text" in str(refused.value)
        assert "bos_token" in str(refused.value)
    with pytest.raises(InputError, match="nothing between the two sentences"):
        attnlens.compare(no_start_token, corpus=[("the quick fox .", "it rained .")], max_len=32, progress=False)


# -- encoders: unchanged ----------------------------------------------------------------------------

#: computed before decoder pairs had a boundary: (cls, sep, segments, pairs, names, features) of the
#: pairs (S1, S2) and ("dog .", "it rained .") and the maps of :func:`_encoder_maps`
ENCODERS = {
    ("bert", "papa"): (
        [[0], [0]], [[20, 39], [20, 39]],
        [[0] * 12 + [1] * 13, [0] * 4 + [1] * 4], [True, True],
        [["block", "diagonal", "block"], ["heterogeneous", "diagonal", "heterogeneous"]],
        {"special": [[-0.00792, 0.000605, -0.01178], [0.094119, -0.010426, -0.087555]],
         "diagonal": [[0.104854, 0.806878, 0.110776], [0.184648, 0.525473, 0.234527]],
         "block": [[0.506275, -0.439093, 0.501964], [0.089189, -0.131999, 0.173823]],
         "entropy": [[0.698594, 0.119236, 0.680004], [0.619493, 0.0473, 0.607873]]},
    ),
    ("bert", "padded"): (
        [[0], [0]], [[11, 24], [3, 7]],
        [[0] * 12 + [1] * 13, [0] * 4 + [1] * 4], [True, True],
        [["block", "diagonal", "heterogeneous"], ["heterogeneous", "diagonal", "heterogeneous"]],
        {"special": [[-0.007052, 0.01213, 0.032215], [0.116849, -0.00131, -0.073111]],
         "diagonal": [[0.094182, 0.787336, 0.08505], [0.253994, 0.506537, 0.24491]],
         "block": [[0.517415, -0.422122, 0.470643], [0.023915, -0.099601, 0.158802]],
         "entropy": [[0.670579, 0.130498, 0.713667], [0.560752, 0.036891, 0.537644]]},
    ),
    ("roberta", "papa"): (
        [[0], [0]], [[20, 39], [20, 39]],
        [[0] * 12 + [1] * 13, [0] * 5 + [1] * 4], [True, True],
        [["block", "diagonal", "block"], ["heterogeneous", "diagonal", "heterogeneous"]],
        {"special": [[-0.00792, 0.000605, -0.01178], [0.013534, -0.017474, -0.053452]],
         "diagonal": [[0.104854, 0.806878, 0.110776], [0.208247, 0.579628, 0.213386]],
         "block": [[0.506275, -0.439093, 0.501964], [0.156542, -0.155792, 0.194804]],
         "entropy": [[0.698594, 0.119236, 0.680004], [0.621767, 0.063628, 0.646969]]},
    ),
    ("roberta", "padded"): (
        [[0], [0]], [[11, 12, 25], [4, 5, 9]],
        [[0] * 12 + [1] + [2] * 13, [0] * 5 + [1] + [2] * 4], [True, True],
        [["heterogeneous", "diagonal", "block"], ["heterogeneous", "diagonal", "heterogeneous"]],
        {"special": [[-0.049148, 0.000639, -0.015096], [-0.138088, -0.012737, -0.020303]],
         "diagonal": [[0.133637, 0.786421, 0.082891], [0.23351, 0.516278, 0.208461]],
         "block": [[0.457429, -0.399389, 0.507903], [0.16994, -0.106817, 0.125427]],
         "entropy": [[0.69284, 0.093953, 0.667757], [0.548544, 0.041946, 0.56756]]},
    ),
}
#: compare's kept segments of the same two pairs (max_len=40), computed before the change
KEPT = {
    "bert": [[0] * 12 + [1] * 13, [0] * 4 + [1] * 4],
    "roberta": [[0] * 12 + [1] * 13, [0] * 5 + [1] * 4],
}
ENCODER_PAIRS = [(S1, S2), ("dog .", "it rained .")]


@pytest.fixture(scope="module")
def encoders():
    return {"bert": tiny.bert_bridge(),
            "roberta": attnlens.load(tiny.tiny_roberta(), tokenizer=tiny.roberta_tokenizer())}


def _encoder_maps(valid: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """Three heads of seeded random scores (heads 0 and 2 leaning within the query's segment,
    head 1 on the diagonal), softmaxed over the valid keys."""
    generator = torch.Generator().manual_seed(0)
    n = valid.shape[1]
    scores = torch.randn(valid.shape[0], 3, n, n, generator=generator, dtype=torch.float64)
    scores = scores + 4.0 * (segment[:, None, :, None] == segment[:, None, None, :])
    scores[:, 1] += 6.0 * torch.eye(n, dtype=torch.float64)
    maps = scores.masked_fill(~valid[:, None, None, :], -torch.inf).softmax(-1)
    return (maps * valid[:, None, :, None]).float()


@pytest.mark.parametrize(("name", "layout"), sorted(ENCODERS))
def test_encoder_pairs_are_unchanged(encoders, name, layout):
    model = encoders[name]
    cls, sep, segments, pairs, names, features = ENCODERS[name, layout]
    batch = attnlens.tokenize(model, ENCODER_PAIRS, max_len=40, layout=layout)
    valid = batch.attention_mask.bool()
    classes = token_classes(model.tokenizer, batch.input_ids, valid)
    assert [row[keep].nonzero().flatten().tolist() for row, keep in zip(classes["cls"], valid, strict=True)] == cls
    assert [(row & keep).nonzero().flatten().tolist() for row, keep in zip(classes["sep"], valid, strict=True)] == sep
    positions = Positions.from_batch(batch, model.tokenizer)
    assert [row[keep].tolist() for row, keep in zip(positions.segment, valid, strict=True)] == segments
    assert is_pair(positions).tolist() == pairs
    classified = patterns.classify(_encoder_maps(valid, positions.segment), batch=batch, tokenizer=model.tokenizer)
    assert classified.names.tolist() == names
    for region, values in features.items():
        for got, expected in zip(classified.features[region].tolist(), values, strict=True):
            assert got == pytest.approx(expected, abs=2e-6), region


@pytest.mark.parametrize("name", sorted(KEPT))
def test_encoder_kept_segments_are_unchanged(encoders, name):
    comparison = attnlens.compare(encoders[name], corpus=ENCODER_PAIRS, max_len=40, progress=False,
                                  report_examples=2)
    assert [example.segments for example in comparison.kept_patterns.examples] == KEPT[name]
