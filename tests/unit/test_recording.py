"""A pass replaying another pass's recording (attnlens.engine.recording) gives the live pass's
result exactly and runs no forward for the batches it holds; it runs the forward for any other
batch (beyond the budget, another batch size, a recording made under interventions, a batch split
after running out of memory); a pass that needs more than patterns and values refuses a replay.

The reference is always a live pass (the forward run again): a forward on the same inputs is
deterministic, so "exactly" is bit for bit (``torch.equal``, ``check_exact``)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core import devices
from attnlens.engine import passes, recording
from attnlens.engine.recording import Recording
from attnlens.errors import InputError
from attnlens.evaluation.lm.scorer import LMScorer
from attnlens.methods.stats import Statistics
from tests import tiny

MAX_LEN = 24
#: texts longer than the tiny model's d_head (8), so that effective attention differs from standard
TEXTS = [*tiny.CORPUS, "the dog , the fox and the match were all funny at times ; wise , though ?"]


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


def forwards(monkeypatch) -> list[int]:
    """The sizes of the batches whose forward runs (the pass's run_patterns)."""
    original, sizes = passes.run_patterns, []

    def counted(model, batch, fwd_hooks, **options):
        sizes.append(len(batch))
        return original(model, batch, fwd_hooks, **options)

    monkeypatch.setattr(passes, "run_patterns", counted)
    return sizes


def live(monkeypatch) -> None:
    """Every pass runs its forward (no recording is ever found)."""
    monkeypatch.setattr(Recording, "find", lambda self, header, start, inputs: None)


def assert_same_comparison(a, b) -> None:
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    assert a.example_patterns.keys() == b.example_patterns.keys()
    for view in a.example_patterns:
        assert torch.equal(torch.as_tensor(a.example_patterns[view]), torch.as_tensor(b.example_patterns[view])), view
    assert a.kept_patterns.to_dict() == b.kept_patterns.to_dict()


@pytest.mark.parametrize("device_route", [False, True], ids=["cpu-route", "device-route"])
def test_compare_replays_the_fit_and_equals_the_live_passes(bert, monkeypatch, device_route):
    if device_route:  # the routes of a GPU: layers handed in stacks, nothing read back
        monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    options = dict(corpus=TEXTS, max_len=MAX_LEN, batch_size=2, progress=False)
    sizes = forwards(monkeypatch)
    replayed = attnlens.compare(bert, "papa", "effective", "norm", **options)
    n_batches = -(-len(TEXTS) // 2)
    assert len(sizes) == n_batches  # the fit's forwards only: the comparison replayed every batch
    with monkeypatch.context() as patch:
        live(patch)
        sizes.clear()
        reference = attnlens.compare(bert, "papa", "effective", "norm", **options)
        assert len(sizes) == 2 * n_batches
    assert_same_comparison(replayed, reference)


def test_a_recording_within_its_budget_replays_what_it_holds(bert, monkeypatch):
    """The budget is a share of the free memory when the first batch is kept: with room for
    two batches' tensors, two are kept and the others run their forward."""
    options = dict(max_len=MAX_LEN, batch_size=2, progress=False, by_length=False)
    probe = Recording()
    passes.run(bert, TEXTS[:2], [Statistics(2, 4, "standard")], record=probe, **options)
    one_batch = probe.n_bytes
    monkeypatch.setattr(devices, "free_bytes", lambda where: 2 * one_batch * recording.RECORD_SHARE + 1)
    kept = Recording()
    recorded = Statistics(2, 4, "effective")
    passes.run(bert, TEXTS, [recorded], record=kept, **options)
    assert kept.n_batches == 2 and not kept.complete  # the first two batches (their texts are short)
    sizes = forwards(monkeypatch)
    replayed = Statistics(2, 4, "effective")
    passes.run(bert, TEXTS, [replayed], replay=kept, **options)
    assert len(sizes) == -(-len(TEXTS) // 2) - 2
    for mine, theirs in zip(replayed.state_dict().values(), recorded.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("change", ["batch_size", "max_len", "interventions"])
def test_another_pass_runs_its_own_forward(bert, monkeypatch, change):
    options = dict(max_len=MAX_LEN, batch_size=2, progress=False)
    kept = Recording()
    hooks = papa.hooks(papa.uniform(bert, max_len=MAX_LEN)) if change == "interventions" else ()
    passes.run(bert, TEXTS, [Statistics(2, 4, "standard")], record=kept, hooks=hooks, **options)
    assert kept.n_batches == -(-len(TEXTS) // 2)
    if change == "batch_size":
        options["batch_size"] = 3
    elif change == "max_len":
        options["max_len"] = MAX_LEN + 8
    sizes = forwards(monkeypatch)
    replayed = Statistics(2, 4, "standard")
    passes.run(bert, TEXTS, [replayed], replay=kept, **options)
    assert sum(sizes) == len(TEXTS)  # every batch ran its forward
    reference = Statistics(2, 4, "standard")
    passes.run(bert, TEXTS, [reference], **options)
    for mine, theirs in zip(replayed.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)


def test_the_batches_split_after_running_out_of_memory_are_replayed_as_split(bert, monkeypatch):
    """Batches of more than 2 texts run out of memory at the last layer: the fit keeps the halves
    it ran, and the comparison, split the same way, replays them."""
    original, sizes = passes.run_patterns, []

    def run_patterns(model, batch, fwd_hooks, **options):
        sizes.append(len(batch))
        if len(batch) > 2:
            def fail(pattern, hook):
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")

            fwd_hooks = [*fwd_hooks, ("blocks.1.attn.hook_pattern", fail)]
        return original(model, batch, fwd_hooks, **options)

    monkeypatch.setattr(passes, "run_patterns", run_patterns)
    options = dict(corpus=TEXTS, max_len=MAX_LEN, batch_size=4, progress=False)
    with pytest.warns(UserWarning, match="batches of at most 2 examples"):
        replayed = attnlens.compare(bert, "papa", "effective", **options)
    fit_forwards = sizes.index(4, 1)  # the comparison's first batch: 4 texts again
    assert sizes[fit_forwards:] == [4]  # then every part of 2 replayed
    with monkeypatch.context() as patch, pytest.warns(UserWarning, match="batches of at most 2 examples"):
        live(patch)
        reference = attnlens.compare(bert, "papa", "effective", **options)
    assert_same_comparison(replayed, reference)


def test_a_replay_is_refused_where_the_pass_needs_more(bert):
    kept = Recording(values=False)
    options = dict(max_len=MAX_LEN, batch_size=2, progress=False)
    passes.run(bert, TEXTS, [Statistics(2, 4, "standard")], record=kept, **options)
    with pytest.raises(InputError, match=r"interventions \(hooks=\) cannot replay"):
        passes.run(bert, TEXTS, [Statistics(2, 4, "standard")], replay=kept,
                   hooks=papa.hooks(papa.uniform(bert, max_len=MAX_LEN)), **options)
    with pytest.raises(InputError, match="needs the values, which a recording does not hold"):
        passes.run(bert, TEXTS, [Statistics(2, 4, "effective")], replay=kept, **options)
    with pytest.raises(InputError, match="needs the model's output, .*run its pass without replay="):
        passes.run(bert, TEXTS, [LMScorer(bert, "mlm", mask_rate=0.3)], replay=kept, **options)


def test_recognises_only_the_same_inputs(bert):
    batch = attnlens.tokenize(bert, TEXTS[:2], max_len=MAX_LEN, layout="papa")
    same = attnlens.tokenize(bert, TEXTS[:2], max_len=MAX_LEN, layout="papa")
    assert recording.same_inputs(batch, same)
    assert not recording.same_inputs(batch, attnlens.tokenize(bert, TEXTS[1:3], max_len=MAX_LEN, layout="papa"))
    assert not recording.same_inputs(batch, attnlens.tokenize(bert, TEXTS[:2], max_len=MAX_LEN, layout="padded"))
    changed = attnlens.tokenize(bert, TEXTS[:2], max_len=MAX_LEN, layout="papa")
    changed.token_type_ids[0, 0] = 1
    assert not recording.same_inputs(batch, changed)
