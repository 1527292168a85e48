"""A pass by length (issue 25): :func:`attnlens.engine.passes.run` runs each window of
:data:`~attnlens.engine.passes.BY_LENGTH_BATCHES` batches of consecutive examples from the shortest to
the longest, when every accumulator allows it (``any_order``) and batches are not all padded to
``max_len``, and tells each accumulator the corpus index of every row.

The reference is the definition: the stable order of the tokenizer's lengths within each window
(a plain ``sorted``), the batches' widths that of their longest text plus [CLS] and [SEP], and
the same pass in corpus order (``by_length=False``). Whether results agree up to float32
rounding is the contract of every ``any_order`` accumulator (``tests/contract``, property 4);
here the batches themselves are checked, and the resume bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator
from attnlens.engine.checkpoints import read_checkpoint, save_checkpoint
from attnlens.methods.stats import Statistics
from tests import interrupts, tiny
from tests.typechecks import unchecked

#: word counts of the texts, in corpus order: not sorted in any window of 6 or 12
WORDS = [9, 2, 7, 1, 12, 4, 3, 11, 5, 8, 6, 10]
TEXTS = [" ".join(["fox"] * n) for n in WORDS]  # "fox" is one token of the tiny tokenizer


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


class Batches(Accumulator):
    """Records each batch's corpus indices and width; allows any order unless told not to."""

    compact = True
    any_order = True

    def __init__(self, name: str = "batches", any_order: bool = True) -> None:
        self.name, self.any_order = name, any_order
        self.indices: list[list[int]] = []
        self.widths: list[int] = []

    def start_batch(self, batch):
        self.indices.append(list(batch.indices))
        self.widths.append(int(batch.batch.input_ids.shape[1]))

    def result(self):
        return self.indices, self.widths


def run(bert, corpus, *accumulators, **kwargs):
    kwargs = dict(max_len=32, batch_size=3, progress=False) | kwargs
    passes.run(bert, corpus, list(accumulators), **kwargs)
    return accumulators[0].result()


def test_each_window_runs_from_the_shortest_text_to_the_longest(bert, monkeypatch):
    monkeypatch.setattr(passes, "BY_LENGTH_BATCHES", 2)  # windows of 6 examples
    indices, widths = run(bert, TEXTS, Batches())
    first, second = sorted(range(6), key=WORDS.__getitem__), sorted(range(6, 12), key=WORDS.__getitem__)
    assert [index for batch in indices for index in batch] == first + second
    assert widths == [max(WORDS[index] for index in batch) + 2 for batch in indices]  # [CLS] … [SEP]

    ordered, ordered_widths = run(bert, TEXTS, Batches(), by_length=False)
    assert ordered == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert sum(widths) < sum(ordered_widths)  # 39 positions a row against 45

    # the order is the sequence's, not the container's: a generator runs the same batches
    assert run(bert, iter(TEXTS), Batches()) == (indices, widths)


def test_the_whole_corpus_is_one_window_at_the_default_size(bert):
    indices, _ = run(bert, TEXTS, Batches())
    assert [index for batch in indices for index in batch] == sorted(range(12), key=WORDS.__getitem__)


def test_the_corpus_order_is_kept_when_the_order_would_matter_or_not_pay(bert):
    # an accumulator that finds data by position in the corpus (labels, sentences)
    indices, _ = run(bert, TEXTS, Batches(), Batches("positional", any_order=False))
    assert indices == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    # every batch padded to max_len anyway: nothing to save
    indices, widths = run(bert, TEXTS, Batches(), compact=False)
    assert indices[0] == [0, 1, 2] and set(widths) == {32}
    # a corpus mixing sentences and pairs: the pass refuses it in the corpus's order, with the
    # tokenizer's clear error, not one from measuring lengths
    with pytest.raises(ValueError, match="Mix of single sentences and pairs in one batch"):
        run(bert, ["a text .", ("a", "pair")], Batches())
    with pytest.raises(TypeError, match="by_length must be True or False"), unchecked():
        run(bert, TEXTS, Batches(), by_length="yes")


def test_a_blank_text_is_named_by_its_index_in_the_corpus(bert):
    with pytest.raises(ValueError, match="text 7 is blank"):
        run(bert, [*TEXTS[:7], "  ", *TEXTS[7:]], Batches())  # sorted first, named as text 7


def test_an_interrupted_pass_by_length_resumes_bit_for_bit(bert, tmp_path, monkeypatch):
    whole = Statistics(2, 4, "standard")
    run(bert, TEXTS, whole)
    checkpoint = tmp_path / "pass.safetensors"
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        interrupts.at_batch(patch, 3)
        run(bert, iter(TEXTS), Statistics(2, 4, "standard"), checkpoint=checkpoint, checkpoint_every=1)
    meta, _ = read_checkpoint(checkpoint)
    assert meta["counts"]["examples"] == 6  # the two shortest batches of the window

    with pytest.raises(ValueError, match=r"order 'by length, 192 examples at a time' \(now 'corpus'\)"):
        run(bert, TEXTS, Statistics(2, 4, "standard"), checkpoint=checkpoint, by_length=False)
    resumed = Statistics(2, 4, "standard")
    summary = passes.run(bert, TEXTS, [resumed], max_len=32, batch_size=3, progress=False, checkpoint=checkpoint)
    assert summary.resumed == 6
    for key, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_a_checkpoint_written_before_the_order_was_recorded_resumes_in_corpus_order(bert, tmp_path):
    """Checkpoints of earlier versions have no ``order`` in their header: they ran in corpus
    order, and resume so; a pass by length is refused with the order named."""
    checkpoint = tmp_path / "old.safetensors"
    first = Statistics(2, 4, "standard")
    run(bert, TEXTS[:6], first, checkpoint=checkpoint, by_length=False)
    meta, _ = read_checkpoint(checkpoint)
    old = {key: value for key, value in meta["header"].items() if key != "order"}
    save_checkpoint(checkpoint, [first], meta["counts"], old)
    assert "order" not in read_checkpoint(checkpoint)[0]["header"]

    with pytest.raises(ValueError, match=r"order 'corpus' \(now 'by length, 192 examples at a time'\).*"
                                         r"by_length=False runs the corpus in its order"):
        run(bert, TEXTS, Statistics(2, 4, "standard"), checkpoint=checkpoint)
    whole, resumed = Statistics(2, 4, "standard"), Statistics(2, 4, "standard")
    run(bert, TEXTS, whole, by_length=False)
    summary = passes.run(bert, TEXTS, [resumed], max_len=32, batch_size=3, progress=False,
                         checkpoint=checkpoint, by_length=False)
    assert summary.resumed == 6
    for key, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_a_checkpoint_records_the_interventions_inputs_and_constants(bert, tmp_path):
    """A checkpoint is resumed only by the same pass: other interventions (hooks), compact
    against padded batches, or other PAPA constants read by an accumulator are refused (they
    were accepted and mixed into a result neither pass gives); hooks without a key are named
    by their hook points and a resume warns that it cannot check them."""
    from attnlens import ablation, papa
    from attnlens.core.heads import HeadSet

    heads = HeadSet.from_heads([(0, 1)], n_layers=2, n_heads=4)
    uniform = ablation.hooks(heads, mode="uniform")
    checkpoint = tmp_path / "pass.safetensors"
    run(bert, TEXTS[:6], Statistics(2, 4, "standard"), checkpoint=checkpoint, hooks=uniform, by_length=False)
    with pytest.raises(ValueError, match=r"hooks '.*uniform.*' \(now 'none'\)"):
        run(bert, TEXTS, Statistics(2, 4, "standard"), checkpoint=checkpoint, by_length=False)
    with pytest.raises(ValueError, match=r"compact True \(now False\)"):
        run(bert, TEXTS, Statistics(2, 4, "standard"), checkpoint=checkpoint, hooks=uniform, by_length=False,
            compact=False)
    run(bert, TEXTS, Statistics(2, 4, "standard"), checkpoint=checkpoint, hooks=uniform, by_length=False)

    first, second = (papa.fit(bert, part, max_len=32, progress=False) for part in (TEXTS[:6], TEXTS[6:]))
    constants = tmp_path / "constants.safetensors"
    run(bert, TEXTS[:6], Statistics(2, 4, "papa", constants=first), checkpoint=constants, by_length=False)
    with pytest.raises(ValueError, match="accumulator_settings"):
        run(bert, TEXTS, Statistics(2, 4, "papa", constants=second), checkpoint=constants, by_length=False)

    mine = [("blocks.0.attn.hook_pattern", lambda pattern, hook: pattern)]
    unknown = tmp_path / "unknown.safetensors"
    run(bert, TEXTS[:6], Statistics(2, 4, "standard"), checkpoint=unknown, hooks=mine, by_length=False)
    with pytest.warns(UserWarning, match="cannot identify"):
        run(bert, TEXTS, Statistics(2, 4, "standard"), checkpoint=unknown, hooks=mine, by_length=False)
