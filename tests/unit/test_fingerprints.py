"""The weights' fingerprint (:mod:`attnlens.core.fingerprints`): what caches, checkpoints and
PAPA constants tell models apart by.

Before 2026-12-03 it hashed 1,024 evenly spaced elements of each parameter: a head ablated by
hand (MiniLM's layer-0 ``W_O`` columns of head 2 set to zero) touched none of them, and the
ablated model's probe features came back from the cache as the intact model's. The reference for
the checksum is its definition, computed with Python's integers (no rounding, no overflow); for
the cache, the extraction with ``cache=False``.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from transformers import AutoTokenizer

import attnlens
from attnlens import papa
from attnlens.core import fingerprints
from attnlens.core.fingerprints import (
    MODULUS,
    ROW,
    checksum,
    tokenizer_fingerprint,
    weights_dtype,
    weights_fingerprint,
)
from attnlens.core.loading import default_model_path
from attnlens.evaluation import probing
from attnlens.evaluation.probing import features
from tests import tiny
from tests.conftest import DATA, data_file

TEXTS = ["the quick brown fox jumps over the lazy dog .", "a film that is funny , moving and wise ."] * 3


def _definition(values: torch.Tensor, exact: bool = False) -> int:
    """The checksum's definition (:func:`attnlens.core.fingerprints.checksum`) in Python ints:
    the words of every element rounded to float16, or (``exact``) of its bytes, read here with
    Python's ``struct`` from each element's own bytes (little-endian: the low word first)."""
    weights = [(40503 * i + 12345) % 32749 + 1 for i in range(ROW)]
    if exact:
        raw = values.reshape(-1).contiguous().numpy().astype(values.numpy().dtype.newbyteorder("<")).tobytes()
        level = list(struct.unpack(f"<{len(raw) // 2}h", raw))
    else:
        level = values.reshape(-1).to(torch.float16).view(torch.int16).tolist()
    if not level:
        return 0
    while True:
        level = [sum(b * w for b, w in zip(level[start:start + ROW], weights, strict=False)) % MODULUS
                 for start in range(0, len(level), ROW)]
        if len(level) == 1:
            return level[0]


@pytest.mark.parametrize("size", [0, 1, 7, ROW - 1, ROW, ROW + 1, 3 * ROW + 5])
def test_the_checksum_is_its_definition(size):
    """Short, exact and ragged rows, at one and at two levels, against Python's integers, rounded
    to float16 and of every bit (float32: two words an element)."""
    values = torch.randn(size, generator=torch.Generator().manual_seed(size)) * 3
    assert checksum(values).tolist() == [_definition(values)]
    assert checksum(values, exact=True).tolist() == [_definition(values, exact=True)]


def test_the_exact_checksum_reads_every_bit_of_every_dtype():
    """Of every stored bit: an element changed in its last bit of mantissa (below float16's
    rounding, where the rounded checksum is unchanged) changes it; a float16 tensor's is its
    rounded one; float64 and bfloat16 against the definition; an integer of one byte is one word."""
    values = torch.randn(3 * ROW + 5, generator=torch.Generator().manual_seed(3))
    nudged = values.clone()
    nudged[ROW + 2] = torch.nextafter(nudged[ROW + 2], torch.tensor(float("inf")))
    assert torch.equal(checksum(nudged), checksum(values))  # the bug's own blind spot
    assert not torch.equal(checksum(nudged, exact=True), checksum(values, exact=True))
    assert torch.equal(checksum(values.half(), exact=True), checksum(values.half()))
    for dtype in (torch.float64, torch.float16):
        assert checksum(values.to(dtype), exact=True).tolist() == [_definition(values.to(dtype), exact=True)]
    bfloat = values.to(torch.bfloat16)  # numpy has no bfloat16: its words are its int16 view
    assert checksum(bfloat, exact=True).tolist() == [_definition(bfloat.view(torch.int16), exact=True)]
    small = torch.tensor([-3, 0, 7], dtype=torch.int8)
    assert checksum(small, exact=True).tolist() == [_definition(small.to(torch.int16), exact=True)]


def test_the_checksum_does_not_depend_on_blocks_threads_or_dtype(monkeypatch):
    """A parameter widened in blocks has the checksum of it widened at once (the rows are the
    same), at 1 thread as at 4; float16 values have the checksum of their float32 originals
    (the fingerprint rounds to float16); the first level in int64 (MPS) equals it in float64."""
    values = torch.randn(5 * ROW + 3, generator=torch.Generator().manual_seed(1))
    whole = checksum(values)
    monkeypatch.setattr(fingerprints, "BLOCK", 2 * ROW)
    threads = torch.get_num_threads()
    try:
        for count in (1, 4):
            torch.set_num_threads(count)
            assert torch.equal(checksum(values), whole)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(checksum(values.half()), whole)
    assert whole.tolist() == [_definition(values)]
    # MPS's route (no float64 there): the first level in int64, the same integers
    for exact in (False, True):
        words = fingerprints._words(values, exact)
        assert torch.equal(fingerprints._first_level(words, torch.int64), fingerprints._first_level(words))
    assert checksum(values, exact=True).tolist() == [_definition(values, exact=True)]


def test_every_weight_counts_a_head_ablated_by_hand_among_them():
    """MiniLM with head 2 of layer 0 ablated by hand (the 32 columns of ``W_O`` it writes
    through set to zero, as in Michel et al.'s masking) has another fingerprint; so have heads
    swapped in ``W_Q`` alone, and one element changed at a place the old sampling never read.
    The old sampling's indices are recomputed here to show that none of the columns was read."""
    model = attnlens.load(device="cpu")
    before = weights_fingerprint(model)
    output = model.original_model.bert.encoder.layer[0].attention.output.dense.weight
    step = output.numel() // 1024  # the former sampling: every step-th element
    sampled_columns = {index % output.shape[1] for index in range(0, output.numel(), step)}
    assert not sampled_columns & set(range(64, 96))  # the bug: never read
    with torch.no_grad():
        output[:, 64:96] = 0
    ablated = weights_fingerprint(model)
    assert ablated != before
    query = model.original_model.bert.encoder.layer[1].attention.self.query.weight
    with torch.no_grad():
        query[[*range(0, 32), *range(32, 64)]] = query[[*range(32, 64), *range(0, 32)]].clone()
    swapped = weights_fingerprint(model)
    assert swapped != ablated
    with torch.no_grad():
        query.data[5, 7] += 0.01 * query[5, 7].abs() + 1e-3  # through .data: no version counter
    assert weights_fingerprint(model) != swapped


def test_features_of_a_model_edited_in_place_are_not_read_from_the_cache(tmp_path, monkeypatch):
    """The silent wrong answer: features extracted, a head ablated in place, features extracted
    again: they are the ablated model's (equal to an uncached extraction), not the cached ones."""
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    model = attnlens.load(device="cpu")
    intact = features.extract(model, TEXTS, max_len=32, progress=False).vectors
    with torch.no_grad():
        model.original_model.bert.encoder.layer[0].attention.output.dense.weight[:, 64:96] = 0
    ablated = features.extract(model, TEXTS, max_len=32, progress=False).vectors
    assert torch.equal(ablated, features.extract(model, TEXTS, max_len=32, progress=False, cache=False).vectors)
    assert not torch.equal(ablated, intact)
    assert len(list((tmp_path / "features").glob("*.safetensors"))) == 2


def test_features_of_a_model_edited_below_float16s_rounding_are_not_read_from_the_cache(tmp_path, monkeypatch):
    """An edit that float16 rounds away (every weight of a layer replaced by its float16
    rounding, which rounds as before) leaves the rounded fingerprint (what PAPA constants check)
    and changes the exact one (what the cache keys by): the edited model's features are its own,
    equal to an uncached extraction, not the cached ones. The edit moves each weight by up to half
    a float16 step (a relative 2**-12), which the float16 features see; one float32 step (2**-24)
    went unseen by them on an AVX2 machine, so the last comparison could not tell."""
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    model = attnlens.load(tiny.tiny_bert(0), tokenizer=tiny.bert_tokenizer())
    before = weights_fingerprint(model), weights_fingerprint(model, exact=True)
    intact = features.extract(model, TEXTS, max_len=32, progress=False).vectors
    with torch.no_grad():
        for param in model.original_model.bert.encoder.layer[0].parameters():
            param.copy_(param.half().float())
    assert weights_fingerprint(model) == before[0] and weights_fingerprint(model, exact=True) != before[1]
    edited = features.extract(model, TEXTS, max_len=32, progress=False).vectors
    assert torch.equal(edited, features.extract(model, TEXTS, max_len=32, progress=False, cache=False).vectors)
    assert not torch.equal(edited, intact)
    assert len(list((tmp_path / "features").glob("*.safetensors"))) == 2


def test_a_float16_model_shares_the_fingerprint_but_not_the_features_key(tmp_path):
    """A model loaded in float16 has its float32 weights' fingerprint (PAPA constants fitted on
    one apply to the other), but it computes in another dtype: the features cache and the pass
    checkpoints key by :func:`weights_dtype` too."""
    single = attnlens.load(tiny.tiny_bert(0), tokenizer=tiny.bert_tokenizer())
    half = attnlens.load(tiny.tiny_bert(0), tokenizer=tiny.bert_tokenizer(), dtype=torch.float16)
    assert weights_fingerprint(half) == weights_fingerprint(single)
    assert weights_fingerprint(half, exact=True) != weights_fingerprint(single, exact=True)
    assert (weights_dtype(single), weights_dtype(half)) == ("float32", "float16")
    keys = [features.features_key(model, TEXTS, hooks="none", max_len=32, layout="papa") for model in (single, half)]
    assert keys[0] != keys[1]
    checkpoint = tmp_path / "fit.safetensors"
    papa.fit(single, TEXTS[:2], max_len=32, batch_size=2, checkpoint=checkpoint, progress=False)
    with pytest.raises(attnlens.AttnlensError, match=r"dtype 'float32' \(now 'float16'\)"):
        papa.fit(half, TEXTS, max_len=32, batch_size=2, checkpoint=checkpoint, progress=False)


def test_weights_fingerprint_tells_weights_apart_but_not_dtypes_or_lm_heads():
    def bridge(hf_model):
        return attnlens.load(hf_model, tokenizer=tiny.bert_tokenizer())

    reference = weights_fingerprint(bridge(tiny.tiny_bert(0)))
    assert len(reference) == 16 and int(reference, 16) >= 0
    assert weights_fingerprint(bridge(tiny.tiny_bert(0))) == reference, "same weights, same hash"
    assert weights_fingerprint(bridge(tiny.tiny_bert(1))) != reference, "another initialisation"
    # float16 weights are the float32 ones rounded: the same fingerprint
    assert weights_fingerprint(attnlens.load(tiny.tiny_bert(0), tokenizer=tiny.bert_tokenizer(),
                                             dtype=torch.float16)) == reference
    # one attention weight changed (element 0 is always sampled): another fingerprint
    changed = tiny.tiny_bert(0)
    with torch.no_grad():
        changed.bert.encoder.layer[1].attention.self.query.weight[0, 0] += 0.5
    assert weights_fingerprint(bridge(changed)) != reference
    # the LM head does not shape attention (and is random when a checkpoint has none)
    head = tiny.tiny_bert(0)
    with torch.no_grad():
        head.cls.predictions.transform.dense.weight.normal_()
    assert weights_fingerprint(bridge(head)) == reference


def test_compare_and_fit_fingerprint_their_model_once_and_a_later_call_sees_new_weights(monkeypatch):
    """Inside ``fingerprints_kept`` (``compare``: two passes' headers and the constants' checks;
    ``papa.fit``: the constants' start and its pass's header) each model's weights are read
    and hashed once; outside it every call computes again, so
    weights changed between two jobs give another fingerprint."""
    computed = []
    compute = fingerprints._fingerprint
    monkeypatch.setattr(fingerprints, "_fingerprint", lambda bridge: computed.append(1) or compute(bridge))
    model = tiny.bert_bridge()
    texts = ["a short text", "another short one here", "a third"]
    attnlens.compare(model, "papa", "effective", corpus=texts, batch_size=2, progress=False)
    assert len(computed) == 1, computed
    papa.fit(model, texts, batch_size=2, progress=False)  # its constants' start and its pass's header
    assert len(computed) == 2, computed
    before = weights_fingerprint(model)
    with torch.no_grad():
        model.original_model.bert.encoder.layer[0].attention.self.query.weight[0, 0] += 0.5
    assert weights_fingerprint(model) != before and len(computed) == 4
    with fingerprints.fingerprints_kept(), fingerprints.fingerprints_kept():  # nested: the outer block's
        assert weights_fingerprint(model) == weights_fingerprint(model)
    assert len(computed) == 5


def test_a_curve_and_a_probing_run_fingerprint_their_model_once(monkeypatch, tmp_path):
    """``papa.curve`` (a probing run per point: two feature extractions each, their cache keys and
    their passes' headers), ``probing.run`` and ``probing.extract`` read and hash the weights
    once a call, not once an extraction (this curve: 14 computations without the blocks)."""
    data_file("sst2/train.tsv")
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    model = tiny.bert_bridge()
    constants = papa.fit(model, tiny.CORPUS, max_len=16, progress=False)
    computed = []
    compute = fingerprints._fingerprint
    monkeypatch.setattr(fingerprints, "_fingerprint", lambda bridge: computed.append(1) or compute(bridge))
    options = dict(data_dir=DATA, train_limit=24, eval_limit=12, seeds=1, baseline=False,
                   probe=dict(epochs=1), progress=False)
    papa.curve(model, constants, ["sst2"], fractions=(0, 1), baselines=("zeros",), **options)
    assert len(computed) == 1, computed
    probing.run(model, "sst2", max_len=16, cache=False, **options)
    assert len(computed) == 2, computed
    probing.extract(model, ["a short text", "another one"], max_len=16, progress=False)
    assert len(computed) == 3, computed


def test_another_tokenizer_gets_its_own_features(tmp_path, monkeypatch):
    """The same weights with another tokenizer (MiniLM's, cased: ``do_lower_case=False``) run on
    other token ids: their features of a capitalised text are computed (equal to an uncached
    extraction), not the uncased tokenizer's read back. A tokenizer called with another padding
    and truncation (which each call sets on a fast tokenizer) keeps its fingerprint."""
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    texts = ["The Quick Brown Fox jumps over Paris .", "A Film by Agnes Varda ."]
    uncased = attnlens.load(tiny.tiny_bert(0), tokenizer=tiny.bert_tokenizer())
    cased = attnlens.load(tiny.tiny_bert(0), tokenizer=AutoTokenizer.from_pretrained(
        str(default_model_path()), do_lower_case=False))
    before = tokenizer_fingerprint(uncased)
    uncased.tokenizer(["a b c", "d"], padding="max_length", truncation=True, max_length=7)
    assert tokenizer_fingerprint(uncased) == before != tokenizer_fingerprint(cased)
    first = features.extract(uncased, texts, max_len=32, progress=False).vectors
    second = features.extract(cased, texts, max_len=32, progress=False).vectors
    assert torch.equal(second, features.extract(cased, texts, max_len=32, progress=False, cache=False).vectors)
    assert second.shape != first.shape or not torch.equal(second, first)


def test_a_tokenizers_fingerprint_is_its_pipelines_once_computed_and_follows_an_edit(monkeypatch):
    """The fingerprint of a fast tokenizer is its definition: the sha256 of its serialized
    pipeline (``to_str()``) less truncation and padding, as JSON with sorted keys (computed here
    by hand); a second call on the same pipeline does not parse it again (the memo of
    :data:`fingerprints._PIPELINES`); an edit made after a first fingerprint (a token added, the
    lower-casing turned off) gets the edited pipeline's, not the one remembered."""
    bridge = attnlens.load(tiny.tiny_bert(0), tokenizer=tiny.bert_tokenizer())
    backend = bridge.tokenizer.backend_tokenizer
    loads = json.loads

    def by_hand() -> str:
        pipeline = loads(backend.to_str())
        del pipeline["truncation"], pipeline["padding"]
        return hashlib.sha256(json.dumps(pipeline, sort_keys=True, default=str).encode()).hexdigest()[:16]

    first = tokenizer_fingerprint(bridge)
    assert first == by_hand()
    parsed = []
    monkeypatch.setattr(fingerprints.json, "loads", lambda text, **kw: parsed.append(1) or loads(text, **kw))
    assert tokenizer_fingerprint(bridge) == first and parsed == []
    bridge.tokenizer.add_tokens(["zzyzx"])
    added = tokenizer_fingerprint(bridge)
    assert added == by_hand() != first and parsed == [1]
    normalizer = loads(backend.to_str())["normalizer"]
    backend.normalizer = type(backend.normalizer)(lowercase=not normalizer["lowercase"])
    assert tokenizer_fingerprint(bridge) == by_hand() not in (first, added)
