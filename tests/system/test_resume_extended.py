"""A checkpoint taken on a prefix of a corpus resumes on the longer corpus, and the result equals
a fresh pass over the whole longer corpus bit for bit (issue 61, item 4). A pass by length used to
refuse: "the first 8 examples given now differ from those it consumed", since a longer corpus
sorts the window the checkpoint ended in differently."""

from __future__ import annotations

import pytest
import torch

from attnlens import papa
from attnlens.engine import passes
from attnlens.engine.checkpoints import read_checkpoint
from attnlens.methods.stats import Statistics

STATE = ("sums", "squares", "pair_counts")


def assert_same(resumed, fresh) -> None:
    for name in STATE:
        assert torch.equal(getattr(resumed, name), getattr(fresh, name)), name
    assert (resumed.n_examples, resumed.n_tokens) == (fresh.n_examples, fresh.n_tokens)


@pytest.mark.slow
@pytest.mark.parametrize("by_length", [True, False])
def test_papa_fit_resumes_on_an_extended_corpus(minilm, sst2_sentences, tmp_path, by_length):
    texts = sst2_sentences[:40]
    checkpoint = tmp_path / f"fit-{by_length}.safetensors"
    prefix = papa.fit(minilm, texts[:10], max_len=32, batch_size=4, progress=False,
                      checkpoint=checkpoint, by_length=by_length)
    assert prefix.n_examples == 10
    resumed = papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False, checkpoint=checkpoint,
                       by_length=by_length)
    fresh = papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False, by_length=by_length)
    assert_same(resumed, fresh)
    # and the checkpoint of the longer fit is a finished fit of it: resuming changes nothing
    again = papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False, checkpoint=checkpoint,
                     by_length=by_length)
    assert_same(again, fresh)


@pytest.mark.slow
def test_a_prefix_that_ends_in_its_second_window(minilm, sst2_sentences, tmp_path, monkeypatch):
    """Windows of 8 examples (BY_LENGTH_BATCHES = 4, batch_size = 2): the prefix ends 3 examples
    into its third window; the whole windows before it are kept, the third is run again as the
    longer corpus orders it. A prefix that is interrupted there resumes the same way."""
    monkeypatch.setattr(passes, "BY_LENGTH_BATCHES", 4)
    texts = sst2_sentences[:30]
    fresh = papa.fit(minilm, texts, max_len=32, batch_size=2, progress=False)
    checkpoint = tmp_path / "fit.safetensors"
    papa.fit(minilm, texts[:19], max_len=32, batch_size=2, progress=False, checkpoint=checkpoint)
    meta, _ = read_checkpoint(checkpoint)
    assert meta["counts"]["examples"] == 19 and meta["tail"]["counts"]["examples"] == 16
    assert meta["tail"]["size"] == 3
    assert_same(papa.fit(minilm, texts, max_len=32, batch_size=2, progress=False, checkpoint=checkpoint), fresh)


@pytest.mark.slow
def test_statistics_resume_on_an_extended_corpus_and_another_corpus_is_refused(minilm, sst2_sentences, tmp_path):
    texts = sst2_sentences[:24]
    whole = Statistics(minilm.cfg.n_layers, minilm.cfg.n_heads, "standard")
    passes.run(minilm, texts, [whole], max_len=32, batch_size=4, progress=False)
    checkpoint = tmp_path / "pass.safetensors"
    first = Statistics(minilm.cfg.n_layers, minilm.cfg.n_heads, "standard")
    passes.run(minilm, texts[:9], [first], max_len=32, batch_size=4, progress=False, checkpoint=checkpoint)
    resumed = Statistics(minilm.cfg.n_layers, minilm.cfg.n_heads, "standard")
    summary = passes.run(minilm, texts, [resumed], max_len=32, batch_size=4, progress=False, checkpoint=checkpoint)
    assert summary.resumed == 0  # the prefix was one short window: run again as the longer corpus orders it
    for key, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key

    # a corpus that does not start with the examples consumed before the short unit is refused
    other = tmp_path / "other.safetensors"
    passes.run(minilm, texts[:9], [Statistics(minilm.cfg.n_layers, minilm.cfg.n_heads, "standard")],
               max_len=32, batch_size=4, progress=False, checkpoint=other, by_length=False)
    with pytest.raises(ValueError) as error:
        passes.run(minilm, texts[1:], [Statistics(minilm.cfg.n_layers, minilm.cfg.n_heads, "standard")],
                   max_len=32, batch_size=4, progress=False, checkpoint=other, by_length=False)
    assert str(error.value) == (
        f"checkpoint {other} was written for another corpus: the first 9 examples given now differ "
        "from those it consumed. Resume it with the same corpus, or give another checkpoint path.")
