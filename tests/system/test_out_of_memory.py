"""A pass survives running out of device memory (issue 61, item 5): a batch whose forward raises
``torch.OutOfMemoryError`` is split in halves and run again, down to one example; the result is
the unsplit pass's, up to float32 rounding of per-batch sums; a warning names the batch size
that fitted; a batch that failed half-way leaves no partial state; one example that does not fit
stops the pass after writing its checkpoint. The error is injected on the CPU, for every batch
of more than 4 examples, half-way through the forward (after 4 of the 6 layers were read)."""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.engine import forward, passes
from attnlens.engine.checkpoints import read_checkpoint
from tests.precision import float32_sum_error

LIMIT = 4


def inject(monkeypatch, limit: int = LIMIT) -> list[int]:
    """Batches of more than ``limit`` examples raise torch.OutOfMemoryError at layer 3's
    pattern, after the accumulators read layers 0 to 3; the sizes of the batches run."""
    original, sizes = forward.run_patterns, []

    def run_patterns(model, batch, fwd_hooks, **options):
        sizes.append(len(batch))
        if len(batch) > limit:
            def fail(pattern, hook):
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")

            fwd_hooks = [*fwd_hooks, ("blocks.3.attn.hook_pattern", fail)]
        return original(model, batch, fwd_hooks, **options)

    monkeypatch.setattr(passes, "run_patterns", run_patterns)
    return sizes


def close(got: torch.Tensor, expected: torch.Tensor, batch_size: int) -> None:
    """Float32 per-batch sums of ``batch_size`` rows (or of its halves), added into float64:
    each batch sum is within float32_sum_error(batch_size) of its exact value relatively (all
    terms are non-negative), so the totals are within twice that of each other; a forward at
    another padded length rounds each attention weight differently, within a few float32 ulps
    (2⁻²² relative), which the absolute part covers."""
    rtol = 2 * float32_sum_error(batch_size) + 2.0**-22
    torch.testing.assert_close(got, expected, rtol=rtol, atol=rtol * float(expected.abs().max()))


@pytest.mark.slow
def test_papa_fit_splits_batches_that_run_out_of_memory(minilm, sst2_sentences, monkeypatch, tmp_path):
    texts = sst2_sentences[:48]
    fresh = papa.fit(minilm, texts, max_len=32, batch_size=16, progress=False)
    sizes = inject(monkeypatch)
    with pytest.warns(UserWarning, match=r"a batch of 4 examples fitted, and the pass goes on with "
                                         r"batches of at most 4 examples .* pass batch_size=4"):
        split = papa.fit(minilm, texts, max_len=32, batch_size=16, progress=False,
                         checkpoint=tmp_path / "fit.safetensors")
    assert sizes[:3] == [16, 8, 4] and max(sizes[3:]) == 4  # later batches: parts of 4 at once
    assert (split.n_examples, split.n_tokens) == (fresh.n_examples, fresh.n_tokens)
    assert torch.equal(split.pair_counts, fresh.pair_counts)
    for name in ("sums", "squares"):
        close(getattr(split, name), getattr(fresh, name), 16)


@pytest.mark.slow
def test_compare_splits_batches_and_keeps_no_partial_state(minilm, sst2_sentences, monkeypatch):
    """compare's statistics add each layer in ``update``: the layers 0 to 3 read before the
    failure must not count."""
    texts = sst2_sentences[:40]
    constants = papa.fit(minilm, texts, max_len=32, batch_size=16, progress=False)
    fresh = attnlens.compare(minilm, "papa", "effective", constants=constants, corpus=texts, max_len=32, batch_size=16,
                             progress=False)
    inject(monkeypatch)
    with pytest.warns(UserWarning, match=r"batches of at most 4 examples"):
        split = attnlens.compare(minilm, "papa", "effective", constants=constants, corpus=texts, max_len=32, batch_size=16,
                                 progress=False)
    numbers = fresh.table.select_dtypes("number").columns
    assert list(split.table.columns) == list(fresh.table.columns)
    for column in numbers:
        close(torch.tensor(split.table[column].to_numpy()), torch.tensor(fresh.table[column].to_numpy()), 16)


@pytest.mark.slow
def test_one_example_that_does_not_fit_stops_after_the_checkpoint(minilm, sst2_sentences, monkeypatch, tmp_path):
    texts = sst2_sentences[:12]
    checkpoint = tmp_path / "fit.safetensors"
    papa.fit(minilm, texts[:8], max_len=32, batch_size=4, progress=False, checkpoint=checkpoint, by_length=False)
    inject(monkeypatch, limit=0)  # nothing fits
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False, checkpoint=checkpoint, by_length=False)
    meta, _ = read_checkpoint(checkpoint)
    assert meta["counts"]["examples"] == 8  # the state as before the batch that failed
    monkeypatch.undo()
    resumed = papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False, checkpoint=checkpoint,
                       by_length=False)
    whole = papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False, by_length=False)
    assert torch.equal(resumed.sums, whole.sums) and torch.equal(resumed.squares, whole.squares)


def test_a_pass_inside_inference_mode_keeps_working(minilm):
    """State made under ``torch.inference_mode`` has no version counter: the pass copies it
    before each batch instead of reading one (it used to raise "Inference tensors do not track
    version counter")."""
    texts = attnlens.core.corpus.default_corpus(12)
    with torch.inference_mode():
        inside = papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False)
    outside = papa.fit(minilm, texts, max_len=32, batch_size=4, progress=False)
    assert torch.equal(inside.sums, outside.sums)


@pytest.mark.slow
@pytest.mark.parametrize("views", [("papa", "effective"), ("standard",)])
def test_compare_off_the_cpu_survives_running_out_of_memory_at_the_batchs_end(minilm, sst2_sentences,
                                                                             monkeypatch, views):
    """Off the CPU (the device routes, forced here), compare runs every part for a batch's
    layers at its end (the views' maps, statistics, pattern types, distances and kept rows), in
    one call that holds all their maps: the likeliest place to run out of memory. It computes
    everything before it adds anything, so a batch that fails there is split like one that
    fails in the forward, and the tables are the unsplit pass's (up to float32 rounding of
    per-batch sums, :func:`close`; the pattern types exactly: a count of maps), with three views
    and with the standard view alone."""
    from attnlens.comparison import accumulator
    from attnlens.core import devices

    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    texts = sst2_sentences[:24]
    constants = papa.fit(minilm, texts, max_len=32, batch_size=8, progress=False)

    def job():
        return attnlens.compare(minilm, *views, constants=constants if "papa" in views else None, corpus=texts,
                                max_len=32, batch_size=8, progress=False)

    fresh = job()
    real_labels = accumulator.template_labels

    def labels(pattern, positions, *, signed=False):  # a batch of more than LIMIT examples runs out here
        if pattern.shape[-4] > LIMIT:  # [view, layer, example, head, query, key]
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real_labels(pattern, positions, signed=signed)

    monkeypatch.setattr(accumulator, "template_labels", labels)
    with pytest.warns(UserWarning, match=r"batches of at most 4 examples"):
        split = job()
    assert split.pattern_types.equals(fresh.pattern_types)
    for column in fresh.table.select_dtypes("number").columns:
        close(torch.tensor(split.table[column].to_numpy()), torch.tensor(fresh.table[column].to_numpy()), 8)


def test_running_out_of_memory_after_an_accumulator_added_its_batch_says_so(minilm, sst2_sentences, monkeypatch):
    """A batch is split when its forward runs out of memory; at its end, after an accumulator
    that adds its batch there (PAPA's sums) has added it, the state cannot be put back: the pass
    stops and says where it ran out (it said the accumulator 'changed its state where no earlier
    batch did', which every earlier batch had)."""
    from attnlens.errors import ModelBehaviourError
    from attnlens.methods import clustering
    from attnlens.methods.papa.constants import PapaConstants
    from attnlens.methods.papa.fitting import PatternSums

    real = clustering.HeadDistances._pair_sums

    def pair_sums(self, rows):  # the second batch runs out here
        if pair_sums.calls:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        pair_sums.calls += 1
        return real(self, rows)

    pair_sums.calls = 0
    monkeypatch.setattr(clustering.HeadDistances, "_pair_sums", pair_sums)
    accumulators = [PatternSums(PapaConstants.empty(minilm, max_len=32, layout="papa")),
                    clustering.HeadDistances(minilm.cfg.n_layers, minilm.cfg.n_heads)]
    with pytest.raises(ModelBehaviourError, match="at the batch's end .* 'papa' had already added the batch"):
        passes.run(minilm, sst2_sentences[:16], accumulators, max_len=32, batch_size=8, progress=False)
