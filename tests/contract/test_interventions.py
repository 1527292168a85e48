"""One property set over every registered intervention (attnlens.methods.interventions.REGISTRY),
on a tiny random BERT: the one hook-list type, hook points that exist, no heads = the model,
nothing changed outside the heads (or layers) it targets, a stable and telling key(), and
apply() that removes its hooks. A registered kind with no case here fails."""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens.core.heads import HeadSet
from attnlens.engine.forward import run_with_hooks
from attnlens.engine.hooks import Hooks
from attnlens.errors import InputError
from attnlens.methods import interventions
from attnlens.methods.ablation import AblationHooks
from attnlens.methods.effective.model import EffectiveHooks
from attnlens.methods.papa.intervene import PapaHooks
from tests import tiny

MAX_LEN = 24
LAYER = 1  # the targeted layer: the last of the tiny BERT's two


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def batch(bert):
    batch = attnlens.tokenize(bert, tiny.CORPUS[:3], max_len=MAX_LEN, layout="papa")
    assert not batch.attention_mask.bool().all(), "the batch must contain padding"
    return batch


@pytest.fixture(scope="module")
def options(bert):
    """What each registered kind is built with: one case per kind."""
    from attnlens.methods import ablation, papa

    constants = papa.fit(bert, tiny.CORPUS, max_len=MAX_LEN, layout="papa", progress=False)
    other = papa.uniform(constants)
    means = ablation.head_means(bert, tiny.CORPUS, max_len=MAX_LEN, progress=False)
    return {
        "papa": ({"constants": constants}, {"constants": other}),
        "papa.blend": ({"constants": constants, "lam": 0.3}, {"constants": constants, "lam": 0.7}),
        "effective": ({}, {"rtol": 1e-3}),
        "effective.null": ({}, {"rtol": 1e-3}),
        "ablation.zero": ({}, None),
        "ablation.uniform": ({}, None),
        "ablation.mean": ({"means": means}, {"means": means + 1.0}),
        "ablation.papa": ({"constants": constants}, {"constants": other}),
    }


CASES = ("papa", "papa.blend", "effective", "effective.null", "ablation.zero", "ablation.uniform",
         "ablation.mean", "ablation.papa")


def test_every_registered_intervention_has_a_case():
    assert set(interventions.REGISTRY) == set(CASES), (
        "every registered intervention needs a contract case in tests/contract/test_interventions.py"
    )


def test_unknown_intervention_is_one_error_listing_the_names():
    with pytest.raises(InputError, match="Unknown intervention 'nope'; use one of ablation.mean"):
        interventions.build("nope", None)


def test_the_three_hook_lists_are_the_one_type():
    for cls in (PapaHooks, EffectiveHooks, AblationHooks):
        assert issubclass(cls, Hooks) and issubclass(cls, list)


def heads_of(bert, pairs):
    return HeadSet.from_heads(pairs, bert.cfg.n_layers, bert.cfg.n_heads)


def run(model, batch, fwd_hooks=(), record=()):
    seen = {}

    def keep(tensor, hook, name):
        seen[name] = tensor.detach().clone()

    extra = [(name, lambda tensor, hook, name=name: keep(tensor, hook, name)) for name in record]
    with torch.no_grad():
        logits = run_with_hooks(model, batch, [*fwd_hooks, *extra])
    return logits, seen


def n_model_hooks(model):
    points = {id(point): point for point in model.hook_dict.values()}  # a bridge aliases some names
    return sum(len(point._forward_hooks) for point in points.values())


@pytest.mark.parametrize("name", CASES)
def test_contract(bert, batch, options, name):
    kind = interventions.get_intervention(name)
    given, different = options[name]
    targets = heads_of(bert, [(LAYER, 1), (LAYER, 2)])
    hooks = interventions.build(name, bert, targets, **given)

    # the one hook-list type, on hook points the model has, at the point the kind names
    assert isinstance(hooks, Hooks) and len(hooks) > 0
    for hook_name, fn in hooks:
        assert hook_name in bert.hook_dict and callable(fn)
    assert any(hook_name.endswith(kind.point) for hook_name, _ in hooks), (hooks.hook_names, kind.point)
    assert all(f"blocks.{LAYER}." in hook_name for hook_name, _ in hooks)

    # no heads: no hook, the model's own logits exactly
    baseline, base_seen = run(bert, batch, record=[f"blocks.{layer}.attn.hook_z" for layer in range(2)])
    none = interventions.build(name, bert, heads_of(bert, []), **given)
    assert isinstance(none, Hooks) and len(none) == 0
    assert torch.equal(run(bert, batch, none)[0], baseline)

    # nothing changes outside its targets: the layers before, and the other heads of the layer
    logits, seen = run(bert, batch, hooks, record=[f"blocks.{layer}.attn.hook_z" for layer in range(2)])
    assert torch.equal(seen["blocks.0.attn.hook_z"], base_seen["blocks.0.attn.hook_z"])
    z, z0 = seen[f"blocks.{LAYER}.attn.hook_z"], base_seen[f"blocks.{LAYER}.attn.hook_z"]
    others = [head for head in range(bert.cfg.n_heads) if head not in (1, 2)]
    if kind.per_head:
        torch.testing.assert_close(z[:, :, others], z0[:, :, others], rtol=0, atol=1e-6)
    if kind.preserves_output:
        torch.testing.assert_close(logits, baseline, rtol=1e-4, atol=1e-4)
    else:
        assert not torch.allclose(z[:, :, [1, 2]], z0[:, :, [1, 2]], atol=1e-4), "the targeted heads must change"

    # key(): stable across two builds with the same arguments, different for other ones
    again = interventions.build(name, bert, targets, **given)
    assert hooks.key() is not None and hooks.key() == again.key()
    assert interventions.build(name, bert, heads_of(bert, [(LAYER, 1)]) if kind.per_head
                               else heads_of(bert, [(0, 1)]), **given).key() != hooks.key()
    if different is not None:
        assert interventions.build(name, bert, targets, **different).key() != hooks.key()

    # + stays the one type; apply() installs the hooks and removes them on exit
    both = none + hooks
    assert isinstance(both, Hooks) and both.key() == hooks.key() and list(both) == list(hooks)
    before = n_model_hooks(bert)
    with hooks.apply(bert):
        assert n_model_hooks(bert) >= before + len(hooks)
        inside = run(bert, batch)[0]
    assert n_model_hooks(bert) == before
    torch.testing.assert_close(inside, logits, rtol=0, atol=0)
    assert torch.equal(run(bert, batch)[0], baseline)
    with pytest.raises(RuntimeError, match="boom"), hooks.apply(bert):
        raise RuntimeError("boom")
    assert n_model_hooks(bert) == before


def test_hooks_concatenation_and_keys():
    a = Hooks([("blocks.0.attn.hook_z", print)], key="a")
    b = Hooks([("blocks.1.attn.hook_z", print)], key="b")
    assert (a + b).key() == "a+b" and isinstance(a + b, Hooks) and len(a + b) == 2
    assert (a + [("x", print)]).key() is None  # a plain list cannot be told apart
    assert (Hooks() + a).key() == "a"
    assert Hooks().key() == "none" and Hooks([("x", print)]).key() is None
