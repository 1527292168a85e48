"""``papa.intervention(..., fast=True)``: replaced heads skip Q, K, QKᵀ and softmax
(:func:`attnlens.core.fast_heads.constant_heads`), and give what the hook path gives.

Reference: the hook path (:func:`attnlens.papa.hooks`: the full softmax computed, then the
selected heads' patterns replaced in ``hook_pattern``), on the same batch in the PAPA layout.

Tolerance: the replaced heads' patterns come from the same function on the same key mask, so they
are equal bit for bit. The computed heads' query and key projections use only their rows of the
weights: each output is the same ``d_model``-term dot product, whose summation order a BLAS may
change, so it is within ``γ_{d_model} · Σ|w x|`` (:func:`tests.precision.float32_sum_error`) of
the full projection's. To first order every layer passes such a relative error on, so the logits
agree to ``n_layers · γ_{d_model}`` of their magnitude (with MKL on a CPU they are bitwise equal).
"""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core import fast_heads, seam
from tests import tiny
from tests.precision import float32_sum_error

MAX_LEN = 32
HEAD_SETS = {"none": 0.0, "half": 0.5, "all": 1.0}


def is_pattern(name: str) -> bool:
    return name.endswith("hook_pattern")


def run(model, batch, constants, heads, fast):
    """Logits and every layer's pattern as ``hook_pattern`` sees it last."""
    seen = {}

    def keep(pattern, hook):
        seen[hook.layer()] = pattern.detach().clone()

    with torch.no_grad(), papa.intervention(model, constants, heads=heads, fast=fast) as installed:
        logits = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=[(is_pattern, keep)])
    return logits, seen, installed.heads.mask


@pytest.fixture(scope="module", params=["tiny_bert", "minilm"])
def setup(request, sst2_sentences):
    model = tiny.bert_bridge() if request.param == "tiny_bert" else request.getfixturevalue("minilm")
    constants = papa.fit(model, sst2_sentences[:32], max_len=MAX_LEN, layout="papa", progress=False)
    batch = attnlens.tokenize(model, sst2_sentences[100:108], max_len=MAX_LEN, layout="papa")
    assert not bool(batch.attention_mask.bool().all()), "the batch must hold padding"
    return model, constants, batch


@pytest.mark.parametrize("heads", list(HEAD_SETS), ids=list(HEAD_SETS))
def test_fast_path_equals_the_hook_path(setup, heads):
    model, constants, batch = setup
    hooked, hooked_patterns, mask = run(model, batch, constants, HEAD_SETS[heads], fast=False)
    fast, fast_patterns, _ = run(model, batch, constants, HEAD_SETS[heads], fast=True)
    for layer, pattern in hooked_patterns.items():
        replaced = mask[layer]
        assert torch.equal(fast_patterns[layer][:, replaced], pattern[:, replaced]), layer
    d_model, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    atol = n_layers * float32_sum_error(d_model) * float(hooked.abs().max())
    torch.testing.assert_close(fast, hooked, atol=atol, rtol=0)
    if heads != "none":
        with torch.no_grad():
            plain = model(batch.input_ids, **batch.model_kwargs())
        assert float((plain - hooked).abs().max()) > 10 * atol  # the heads were replaced


def test_the_fast_path_skips_the_query_and_key_of_replaced_heads(setup):
    """With no hook reading them, a fully replaced layer runs no query projection (its weights'
    own module, inside TransformerLens's bridge, is never called)."""
    model, constants, batch = setup
    runs, handle = count_query_runs(model, 0)
    try:
        with torch.no_grad(), papa.intervention(model, constants, heads=1.0, fast=True):
            model(batch.input_ids, **batch.model_kwargs())
    finally:
        handle.remove()
    assert not runs  # the query projection of a fully replaced layer never ran
    assert "forward" not in vars(model.blocks[0].attn.original_component.self)  # restored


def test_fast_path_is_for_full_replacement_only(setup):
    model, constants, _ = setup
    with pytest.raises(ValueError, match="full replacement"):
        with papa.intervention(model, constants, mode="blend", fast=True):
            pass


def test_fast_path_refuses_a_decoder():
    model = tiny.gpt2_bridge()
    with pytest.raises(ValueError, match="encoders"):
        with fast_heads.constant_heads(model, {}, lambda valid, dtype: {}):
            pass


def test_fast_path_refuses_a_patched_layer_and_says_whose_patch(setup):
    """Nested constant heads, and a self-attention whose ``forward`` a user assigned (the patch
    would replace it and then delete it), are refused, each by its own message; the user's forward
    is left in place."""
    model, constants, _ = setup
    with papa.intervention(model, constants, heads="all", fast=True):
        with pytest.raises(ValueError, match="already patched"):
            with papa.intervention(model, constants, heads="all", fast=True):
                pass
    module = seam.self_attention(model.blocks[0].attn.original_component)
    module.forward = lambda *args, **kwargs: type(module).forward(module, *args, **kwargs)
    try:
        with pytest.raises(ValueError, match=r"layer 0's self-attention has a forward of a user's .* pass fast=False"):
            with papa.intervention(model, constants, heads="all", fast=True):
                pass
        assert "forward" in vars(module)
    finally:
        del module.forward
    assert fast_heads.patched_layers(model) == []


@pytest.mark.parametrize("heads", ["half", "all"])
def test_fast_path_on_a_compact_batch_equals_the_hook_path_on_the_padded_one(setup, heads, sst2_sentences):
    """A compact PAPA batch (real tokens packed, layout positions passed) under the fast path
    gives, at every real token, the padded batch's hook-path logits: the constant is gathered
    at the same layout positions (same tolerance as above)."""
    from attnlens.core.inputs import compact_batch
    from attnlens.engine.forward import run_with_hooks

    model, constants, _ = setup
    short = [text for text in sst2_sentences[100:300] if len(text.split()) < 12][:8]
    batch = attnlens.tokenize(model, short, max_len=MAX_LEN, layout="papa")
    hooked, _, _ = run(model, batch, constants, HEAD_SETS[heads], fast=False)
    compact = compact_batch(batch)
    assert compact.input_ids.shape[1] < batch.input_ids.shape[1]
    with torch.no_grad(), papa.intervention(model, constants, heads=HEAD_SETS[heads], fast=True):
        fast = run_with_hooks(model, compact, [])
    fast = getattr(fast, "logits", fast)
    d_model, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    atol = n_layers * float32_sum_error(d_model) * float(hooked.abs().max())
    torch.testing.assert_close(fast[compact.attention_mask.bool()], hooked[batch.attention_mask.bool()],
                               atol=max(atol, 1e-5 * float(hooked.abs().max())), rtol=0)


def count_split_forwards(monkeypatch) -> list[int]:
    """Count the fast path's forwards that weigh the constant heads' values without assembling
    the pattern (:func:`attnlens.core.fast_heads._weigh`), recording each constant's leading axis."""
    calls: list[int] = []
    weigh = fast_heads._weigh

    def counted(pattern, value):
        calls.append(pattern.shape[0])
        return weigh(pattern, value)

    monkeypatch.setattr(fast_heads, "_weigh", counted)
    return calls


def tolerance(model, reference):
    d_model, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    return n_layers * float32_sum_error(d_model) * float(reference.abs().max())


@pytest.mark.parametrize("heads", ["half", "all"])
def test_without_a_pattern_hook_the_pattern_is_not_assembled(setup, heads, monkeypatch):
    """No hook reads ``hook_pattern``: each head group's output goes straight into the attention
    output (no ``[batch, head, n, n]`` pattern), and the logits are the hook path's."""
    model, constants, batch = setup
    hooked, _, mask = run(model, batch, constants, HEAD_SETS[heads], fast=False)
    calls = count_split_forwards(monkeypatch)
    with torch.no_grad(), papa.intervention(model, constants, heads=HEAD_SETS[heads], fast=True):
        fast = model(batch.input_ids, **batch.model_kwargs())
    assert len(calls) == int(mask.any(dim=1).sum())  # every patched layer took the split path
    assert set(calls) == {batch.input_ids.shape[0]}  # the batch holds padding: one pattern each
    torch.testing.assert_close(fast, hooked, atol=tolerance(model, hooked), rtol=0)


@pytest.mark.parametrize("hooked_pattern", [False, True], ids=["no_pattern_hook", "pattern_hook"])
@pytest.mark.parametrize("heads", ["half", "all"])
def test_a_hook_on_the_scores_sees_every_heads_scores(setup, heads, hooked_pattern, monkeypatch):
    """A hook on ``hook_attn_scores`` under the fast path sees every head's scores, as on the
    hook path (the layer computes them all), and its edits reach the computed heads alone (a
    replaced head's pattern is its constant): the scores it sees, the patterns ``hook_pattern``
    sees and the logits are the hook path's. Scores and patterns come from the same products
    and functions on both paths (bit for bit); the logits within :func:`tolerance`."""
    model, constants, batch = setup
    seen: dict[tuple[bool, str], torch.Tensor] = {}

    def edit(scores, hook):
        seen[fast, hook.name] = scores.clone()
        edited = scores.clone()
        edited[:, :, :, 1] += 2.0  # every head's, the replaced ones' too
        return edited

    def keep(pattern, hook):
        seen[fast, hook.name] = pattern.clone()

    hooks = [(lambda name: name.endswith("hook_attn_scores"), edit)]
    if hooked_pattern:
        hooks.append((is_pattern, keep))
    logits = {}
    for fast in (False, True):
        calls = count_split_forwards(monkeypatch)
        with torch.no_grad(), papa.intervention(model, constants, heads=HEAD_SETS[heads], fast=fast):
            logits[fast] = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=hooks)
        assert not calls  # every layer computed its scores: none weighed its constant heads apart
    names = {name for _, name in seen}
    assert len(names) == int(model.cfg.n_layers) * (1 + hooked_pattern)
    for name in names:
        assert torch.equal(seen[True, name], seen[False, name]), name
    torch.testing.assert_close(logits[True], logits[False], atol=tolerance(model, logits[False]), rtol=0)
    with torch.no_grad(), papa.intervention(model, constants, heads=HEAD_SETS[heads], fast=False):
        unedited = model(batch.input_ids, **batch.model_kwargs())
    if heads == "all":  # every pattern constant: an edit of the scores reaches nothing
        torch.testing.assert_close(logits[False], unedited, atol=0, rtol=0)
    else:
        assert float((logits[False] - unedited).abs().max()) > 1e-3


@pytest.mark.parametrize("point", ["hook_q", "hook_k", "q.hook_in", "module"])
def test_a_hook_on_the_queries_or_keys_sees_every_heads(setup, point):
    """A hook on a patched layer's queries or keys (``hook_q``, ``hook_k``, the projection's
    ``hook_in`` or a forward hook on the projection's bridge) runs under the fast path as on the
    hook path, with every head's, and its edit reaches the output as there (bit for bit the
    same queries; the logits within :func:`tolerance`)."""
    model, constants, batch = setup
    seen: dict[bool, torch.Tensor] = {}
    with papa.intervention(model, constants, heads=0.5) as installed:
        replaced = installed.heads.mask.sum(dim=1)
    layer = int(torch.where(replaced < replaced.max(), replaced, -1).argmax())  # heads of both kinds
    assert 0 < int(replaced[layer]) < int(model.cfg.n_heads)
    attention = model.blocks[layer].attn

    def edit(tensor):
        seen[fast] = tensor.clone()
        return tensor * 10.0  # every score ten times larger: sharper patterns (a tiny random BERT's are flat)

    logits = {}
    for fast in (False, True):
        with torch.no_grad(), papa.intervention(model, constants, heads=0.5, fast=fast):
            if point == "module":
                handle = attention.original_component.self.query.register_forward_hook(
                    lambda module, inputs, output: edit(output))
                try:
                    logits[fast] = model(batch.input_ids, **batch.model_kwargs())
                finally:
                    handle.remove()
            else:
                logits[fast] = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=[
                    (f"blocks.{layer}.attn.{point}", lambda tensor, hook: edit(tensor))])
    assert torch.equal(seen[True], seen[False])
    torch.testing.assert_close(logits[True], logits[False], atol=tolerance(model, logits[False]), rtol=0)
    with torch.no_grad(), papa.intervention(model, constants, heads=0.5, fast=True):
        unedited = model(batch.input_ids, **batch.model_kwargs())
    assert float((logits[True] - unedited).abs().max()) > 10 * tolerance(model, unedited)


@pytest.mark.parametrize("assembled", [True, False], ids=["assembled", "by_group"])
@pytest.mark.parametrize("heads", ["half", "all"])
def test_off_the_cpu_a_layer_of_both_kinds_weighs_its_assembled_pattern(setup, heads, assembled, monkeypatch):
    """The routes of a GPU (forced here): a layer with constant and computed heads assembles
    their pattern and weighs the values in one product (fewer kernels than a product per group
    and its writes), or with ``fast_heads.ASSEMBLED_OFF_THE_CPU`` off weighs each group apart, as on
    the CPU; a layer of constant heads alone weighs their shared pattern either way. The logits
    are the hook path's."""
    from attnlens.core import devices

    model, constants, batch = setup
    hooked, _, mask = run(model, batch, constants, HEAD_SETS[heads], fast=False)
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    monkeypatch.setattr(fast_heads, "ASSEMBLED_OFF_THE_CPU", assembled)
    calls = count_split_forwards(monkeypatch)
    with torch.no_grad(), papa.intervention(model, constants, heads=HEAD_SETS[heads], fast=True):
        fast = model(batch.input_ids, **batch.model_kwargs())
    # assembled: only the layers whose every head is constant weigh apart; by group: every patched layer
    assert len(calls) == int((mask.all(dim=1) if assembled else mask.any(dim=1)).sum())
    torch.testing.assert_close(fast, hooked, atol=tolerance(model, hooked), rtol=0)


@pytest.mark.parametrize("hooked_pattern", [False, True], ids=["no_hook", "pattern_hook"])
def test_a_batch_without_padding_shares_one_constant(setup, sst2_sentences, monkeypatch, hooked_pattern):
    """Every example of a batch with no padding gets the same constant pattern: it is made once
    (``[1, head, n, n]``) and broadcast; the patterns ``hook_pattern`` sees and the logits are the
    hook path's."""
    model, constants, _ = setup
    long = [text for text in sst2_sentences if len(text.split()) > 40][:4]
    batch = attnlens.tokenize(model, long, max_len=MAX_LEN, layout="papa")
    assert len(long) == 4 and bool(batch.attention_mask.bool().all()), "the batch must hold no padding"
    hooked, hooked_patterns, mask = run(model, batch, constants, 0.5, fast=False)
    shapes: list[int] = []
    heads_pattern = type(constants).heads_pattern

    def recorded(self, selected, key_mask, **kwargs):
        pattern = heads_pattern(self, selected, key_mask, **kwargs)
        shapes.append(pattern.shape[0])
        return pattern

    monkeypatch.setattr(type(constants), "heads_pattern", recorded)
    calls = count_split_forwards(monkeypatch)
    if hooked_pattern:
        fast, fast_patterns, _ = run(model, batch, constants, 0.5, fast=True)
        for layer, pattern in hooked_patterns.items():
            assert torch.equal(fast_patterns[layer][:, mask[layer]], pattern[:, mask[layer]]), layer
        assert not calls
    else:
        with torch.no_grad(), papa.intervention(model, constants, heads=0.5, fast=True):
            fast = model(batch.input_ids, **batch.model_kwargs())
        assert calls and set(calls) == {1}
    assert shapes == [1]  # one constant for the forward: every patched layer's heads in one call
    torch.testing.assert_close(fast, hooked, atol=tolerance(model, hooked), rtol=0)


def test_layer_pattern_of_some_heads_is_theirs_of_the_whole_layer(setup):
    """``layer_pattern(..., heads=index)`` gives exactly those heads of the whole layer's pattern,
    for fitted and trainable constants; a head that does not exist is an InputError."""
    model, constants, batch = setup
    valid = batch.attention_mask.bool()
    index = torch.tensor([2, 0]) if constants.n_heads > 2 else torch.tensor([1, 0])
    for made in (constants, papa.TrainableConstants.from_average(constants)):
        whole = made.layer_pattern(1, valid, dtype=torch.float32)
        some = made.layer_pattern(1, valid, dtype=torch.float32, heads=index)
        assert torch.equal(some, whole[:, index])
        with pytest.raises(attnlens.errors.InputError, match="head indices"):
            made.layer_pattern(1, valid, dtype=torch.float32, heads=torch.tensor([constants.n_heads]))
        # several layers' heads side by side, made in one call (the fast path's, per forward):
        # each layer's own pattern of those heads, bit for bit
        selected = {1: tuple(index.tolist()), 0: (1,)}
        together = made.heads_pattern(selected, valid, dtype=torch.float32)
        assert torch.equal(together, torch.cat([made.layer_pattern(layer, valid, dtype=torch.float32, heads=heads)
                                                for layer, heads in selected.items()], dim=1))


def test_input_dependence_is_cached_until_the_sums_change(setup):
    """``heads=k`` ranks the heads by :attr:`input_dependence` at every intervention: it is
    computed once, and again after the statistics change in place."""
    _, constants, _ = setup
    constants = constants.replace(squares=constants.squares.clone())  # the fixture stays as it is
    first = constants.input_dependence
    assert torch.equal(constants.input_dependence, first)
    first.zero_()  # a copy: the cache is not the caller's
    assert not torch.equal(constants.input_dependence, first)
    before = constants.input_dependence
    constants.squares.mul_(2)
    assert not torch.equal(constants.input_dependence, before)


def test_trainable_constants_get_the_hook_paths_gradient_through_the_split_path(setup):
    """With no pattern hook the constant heads' ``C·V`` is written into the output in place; the
    gradient still reaches trainable constants' logits, as on the hook path."""
    model, constants, batch = setup
    grads = []
    half = papa.hooks(constants, heads=0.5).heads  # ranked by the fitted constants
    for fast in (False, True):
        trainable = papa.TrainableConstants.from_average(constants)
        with papa.intervention(model, trainable, heads=half, fast=fast):
            model(batch.input_ids, **batch.model_kwargs()).float().square().mean().backward()
        grads.append(trainable.logits.grad)
    model.zero_grad(set_to_none=True)  # the shared model keeps no gradient
    assert bool(grads[1].abs().sum() > 0)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-6 * float(grads[0].abs().max()))


def count_query_runs(model, layer: int):
    """A forward hook counting the runs of ``layer``'s query projection (the fast path skips it
    in a layer whose heads are all replaced). Returns ``(runs, handle)``."""
    runs = []
    query = model.blocks[layer].attn.original_component.self.query  # the weights' own module: a
    query = getattr(query, "original_component", query)  # hook on its bridge would make it run
    return runs, query.register_forward_hook(lambda module, inputs, output: runs.append(1))


@pytest.mark.parametrize("heads", ["half", "all"])
def test_fast_hooks_in_the_pass_engine_give_the_hook_paths_features(setup, heads, sst2_sentences):
    """``papa.hooks(..., fast=True)`` handed to the engine (probe features, the curve): the pass
    runs inside :meth:`PapaHooks.patched`, so a fully replaced layer's query projection never
    runs, and the features are the hook path's.

    Tolerance: the residual stream carries the logits' error (``n_layers · γ_{d_model}`` of its
    magnitude, see the module docstring), then both are rounded to float16 (half an ulp each,
    ``2⁻¹¹`` relative): ``rtol = 2⁻¹⁰`` plus that ``atol``."""
    from attnlens.evaluation import probing

    model, constants, _ = setup
    texts = sst2_sentences[100:124]
    features = {}
    for fast in (False, True):
        hooks = papa.hooks(constants, heads=HEAD_SETS[heads], fast=fast)
        runs, handle = count_query_runs(model, 0)
        try:
            features[fast] = probing.extract(model, texts, hooks=hooks, max_len=MAX_LEN, layout="papa",
                                             cache=False, progress=False, batch_size=8)
        finally:
            handle.remove()
        if heads == "all":
            assert (len(runs) == 0) == fast, (fast, len(runs))
        assert "forward" not in vars(model.blocks[0].attn.original_component.self)  # restored
    hooked, fast = features[False].vectors.float(), features[True].vectors.float()
    torch.testing.assert_close(fast, hooked, rtol=2**-10, atol=tolerance(model, hooked))
    plain = probing.extract(model, texts, max_len=MAX_LEN, layout="papa", cache=False, progress=False,
                            batch_size=8).vectors.float()
    assert float((plain - hooked).abs().max()) > 10 * tolerance(model, hooked)  # the heads were replaced


def test_fast_hooks_in_run_with_hooks_and_apply_skip_the_replaced_heads(setup):
    """:func:`attnlens.engine.forward.run_with_hooks` and :meth:`PapaHooks.apply` honour ``fast``; the
    same hooks handed straight to TransformerLens run the hook path: the same logits."""
    from attnlens.engine.forward import run_with_hooks

    model, constants, batch = setup
    fast_hooks = papa.hooks(constants, heads="all", fast=True)
    hooked, _, _ = run(model, batch, constants, 1.0, fast=False)
    outputs, counts = [], []
    for way in ("passes", "apply", "transformer_lens"):
        runs, handle = count_query_runs(model, 0)
        try:
            with torch.no_grad():
                if way == "passes":
                    output = run_with_hooks(model, batch, fast_hooks)
                elif way == "apply":
                    with fast_hooks.apply(model):
                        output = model(batch.input_ids, **batch.model_kwargs())
                else:
                    output = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(),
                                                  fwd_hooks=list(fast_hooks))
        finally:
            handle.remove()
        outputs.append(getattr(output, "logits", output))
        counts.append(len(runs))
    assert counts[0] == counts[1] == 0 and counts[2] > 0
    for output in outputs:
        torch.testing.assert_close(output, hooked, atol=tolerance(model, hooked), rtol=0)
    assert papa.hooks(constants, heads="all").key() == fast_hooks.key()  # the same intervention


def test_the_curve_runs_its_points_fast_where_the_model_allows(setup, monkeypatch, tmp_path):
    """``papa.curve`` (``fast=None``) makes its replaced heads skip their work on an encoder,
    records it in ``settings``, and scores what ``fast=False`` scores (features equal within the
    tolerance above; here the float16 features, and so every score, are the same). Each run has
    its own feature cache: the second would otherwise read the first's features."""
    from attnlens.evaluation import tasks
    from tests.conftest import DATA

    model, constants, _ = setup
    entered = []
    original = fast_heads.constant_heads

    def counted(bridge, replaced, constant):
        entered.append(sorted(replaced))
        return original(bridge, replaced, constant)

    monkeypatch.setattr(fast_heads, "constant_heads", counted)
    train = tasks.load("sst2", "train", data_dir=DATA, limit=32, seed=0)
    tables = {}
    for fast in (None, False):
        entered.clear()
        monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / str(fast)))
        curve = papa.curve(model, constants, [train], fractions=(0, 0.5), baselines=("uniform",), data_dir=DATA,
                           eval_limit=16, seeds=1, baseline=False, probe=dict(epochs=1), fast=fast,
                           progress=False)
        assert curve.settings["fast"] is (fast is None)
        # fraction 0.5 and uniform, train and dev features each: 4 fast passes (none without)
        assert len(entered) == (4 if fast is None else 0), entered
        tables[fast] = curve.table
    assert tables[None]["score"].tolist() == tables[False]["score"].tolist()
