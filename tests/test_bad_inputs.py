"""No silent wrong answer: damaged files, bad arguments and bad texts get one clear error.

One case per item of the reliability issue's list (and a few more), each asserting the error type
and the key words of its message; hypothesis injects NaN/inf into constants at random places.
Calls that pass values outside a function's annotations run inside ``unchecked()``, so they test
what a user without run-time type checks sees.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import attnlens
from attnlens import effective, papa
from tests import tiny
from tests.typechecks import unchecked


@pytest.fixture(scope="module")
def bert():
    return attnlens.load(tiny.tiny_bert(), tokenizer=tiny.bert_tokenizer())


@pytest.fixture(scope="module")
def fitted(bert):
    return papa.fit(bert, tiny.CORPUS, max_len=16, progress=False)


def rewrite(path, out, *, tensors=None, metadata=None, drop_checksum=False):
    """A copy of the constants file ``path`` with some tensors or metadata changed (written with
    safetensors directly, as a damaged or hand-edited file would be)."""
    with safe_open(str(path), framework="pt") as handle:
        meta = dict(handle.metadata())
        values = {name: handle.get_tensor(name) for name in handle.keys()}
    values.update(tensors or {})
    meta.update({key: json.dumps(value) for key, value in (metadata or {}).items()})
    if drop_checksum:
        meta.pop("checksum")
    elif tensors:  # keep the checksum right, so that the value checks are what refuses it
        from attnlens.files import tensor_checksum

        meta["checksum"] = tensor_checksum(values)
    save_file(values, str(out), metadata=meta)
    return out


# ---- damaged constants files --------------------------------------------------------------


def edited(tensor, index, value):
    out = tensor.clone()
    out[index] = value
    return out


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda c: {"sums": edited(c.sums, (0, 0, 3, 3), float("nan"))}, "sums: 1 of .* not finite"),
        (lambda c: {"sums": edited(c.sums, (1, 2, 0, 0), float("inf"))}, "sums: 1 of .* not finite"),
        (lambda c: {"pair_counts": edited(c.pair_counts, (2, 2), -3)}, "pair_counts: 1 of .* below 0"),
        (lambda c: {"sums": -c.sums}, "sums: .* below"),
        (lambda c: {"sums": c.sums * 1000}, "means above 1"),
        (lambda c: {"squares": c.squares + 1.0}, "a² above a"),
    ],
    ids=["nan", "inf", "negative-counts", "negative-sums", "means-above-1", "squares"],
)
def test_damaged_values_are_refused(fitted, tmp_path, change, words):
    path = fitted.save(tmp_path / "ok.safetensors")
    bad = rewrite(path, tmp_path / "bad.safetensors", tensors=change(papa.load(path)))
    with pytest.raises(ValueError, match=f"constants file .*bad.safetensors is damaged: .*{words}"):
        papa.load(bad)


def test_a_flipped_bit_is_caught_by_the_checksum(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x04  # one bit of the last tensor's data
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is damaged: its tensors do not match the checksum"):
        papa.load(path)


def test_metadata_of_the_wrong_type_is_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    for key, value, words in [
        ("examples", "many", "metadata 'examples' must be int, got 'many'"),
        ("pairs", 1, "metadata 'pairs' must be bool or null, got 1"),
        ("tokens", -5, "metadata 'tokens' must be >= 0"),
    ]:
        bad = rewrite(path, tmp_path / f"{key}.safetensors", metadata={key: value})
        with pytest.raises(ValueError, match=words):
            papa.load(bad)


def test_counts_that_disagree_with_the_metadata_are_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    bad = rewrite(path, tmp_path / "bad.safetensors", metadata={"tokens": fitted.tokens + 1})
    with pytest.raises(ValueError, match="diagonal of pair_counts adds up to .* the metadata says"):
        papa.load(bad)


def test_files_without_a_checksum_load_with_a_warning(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    old = rewrite(path, tmp_path / "old.safetensors", drop_checksum=True)
    with pytest.warns(UserWarning, match="has no checksum"):
        loaded = papa.load(old)
    assert torch.equal(loaded.sums, fitted.sums)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        papa.load(path)  # a file with its checksum: no warning


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tensor=st.sampled_from(["sums", "squares"]),
    value=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    where=st.tuples(*(st.integers(0, n - 1) for n in (2, 4, 16, 16))),
)
def test_any_non_finite_cell_is_refused(fitted, tmp_path_factory, tensor, value, where):
    folder = tmp_path_factory.mktemp("hypothesis")
    path = fitted.save(folder / "ok.safetensors")
    damaged = getattr(fitted, tensor).clone()
    damaged[where] = value
    bad = rewrite(path, folder / "bad.safetensors", tensors={tensor: damaged})
    with pytest.raises(ValueError, match=f"{tensor}: 1 of .* not finite .*first at index \\{where}"[:-1]):
        papa.load(bad)


# ---- arguments ------------------------------------------------------------------------------


def test_blend_lambda_must_be_a_finite_number_in_0_1(fitted):
    for lam, words in [
        (float("nan"), "not finite"),
        (1.5, "above 1"),
        (-0.1, "below 0"),
        (torch.full((2, 4), float("nan")), "not finite"),
    ]:
        with pytest.raises(ValueError, match=f"lam .*{words}"):
            papa.hooks(fitted, mode="blend", lam=lam)
    with pytest.raises(ValueError, match=r"lam has shape \[3, 4\]; expected \[2, 4\] \(layer, head"):
        papa.hooks(fitted, mode="blend", lam=torch.full((3, 4), 0.5))


def test_batch_size_must_be_a_whole_number(bert):
    for call in (
        lambda: papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=2.5, progress=False),
        lambda: effective.statistics(bert, tiny.CORPUS, max_len=16, batch_size=2.5, progress=False),
        lambda: attnlens.compare(bert, "standard", corpus=tiny.CORPUS, max_len=16, batch_size=2.5, progress=False),
    ):
        with unchecked(), pytest.raises((TypeError, ValueError), match="batch_size must be a whole number.*2.5"):
            call()


def test_heads_outside_the_model_are_named():
    with pytest.raises(ValueError, match=r"head \(6, 0\) is outside the model's 6 layers x 12 heads"):
        papa.HeadSet.from_heads([(6, 0)], 6, 12)


def test_compare_with_arguments_swapped_says_the_model_goes_first(bert):
    with unchecked(), pytest.raises((TypeError, ValueError), match="first argument is the model") as error:
        attnlens.compare("papa", bert, corpus=tiny.CORPUS)
    assert len(str(error.value)) < 300
    with unchecked(), pytest.raises(ValueError, match="views are names, got a TransformerBridge") as error:
        attnlens.compare(bert, bert, corpus=tiny.CORPUS)
    assert len(str(error.value)) < 300


def test_compare_takes_a_constants_file(bert, fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    comparison = attnlens.compare(bert, "papa", corpus=tiny.CORPUS, constants=str(path), progress=False)
    assert comparison.max_len == 16


# ---- texts ----------------------------------------------------------------------------------


def test_blank_texts_are_refused_with_their_index_in_the_corpus(bert):
    corpus = [*tiny.CORPUS[:5], "   "]
    with pytest.raises(ValueError, match="text 5 is blank"):
        papa.fit(bert, corpus, max_len=16, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="text 0 is blank"):
        attnlens.compare(bert, "standard", corpus=["   ", ""], max_len=16, progress=False)
    with pytest.raises(ValueError, match="text 1 is blank"):
        attnlens.tokenize(bert, ["fine", ""], max_len=16)


def test_texts_of_control_characters_are_refused(bert):
    for layout in ("papa", "padded"):
        with pytest.raises(ValueError, match="text 0 has no token: it is made only of characters the tokenizer drops"):
            attnlens.tokenize(bert, ["\x01" * 3000], max_len=16, layout=layout)


@pytest.mark.parametrize("layout", ["papa", "padded"])
def test_literal_special_tokens_in_a_text_are_text(bert, layout):
    """"[SEP]", "[CLS]" and "[PAD]" written in a text are read as text: they never become the
    special tokens, so a text cannot move the layout's separators or mask itself as padding."""
    tokenizer = bert.tokenizer
    batch = attnlens.tokenize(bert, ["a [SEP] b [CLS] c [PAD] d"], max_len=32, layout=layout)
    ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    assert ids.count(tokenizer.sep_token_id) == 1 and ids.count(tokenizer.cls_token_id) == 1
    assert tokenizer.pad_token_id not in ids
