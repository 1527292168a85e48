"""Hooks a model carries when attnlens is called (:func:`attnlens.engine.hooks.on_model`).

A TransformerLens user puts hooks on the model itself: ``model.add_hook(...)``, the block of
``model.hooks(...)``, attnlens's own ``Hooks.apply``, ``papa.intervention(...)``. Every forward runs
them, so attnlens computes the hooked model's numbers; but the keys that name what a result was
computed under (the features cache, a pass's checkpoint, a curve's points) named only the hooks
given as ``hooks=``. Before, probe features extracted inside ``papa.intervention(model, constants,
heads="all")`` came back from the cache as the unhooked model's, identical to them, so a probe
scored the unmodified model and PAPA cost nothing; and a checkpoint of an unhooked pass resumed
under hooks, mixing both.

The reference is the same extraction with ``cache=False`` (computed, never read back): features
from the cache must equal it exactly, and differ from the unhooked model's, so that a cache
read of the wrong entry fails. A model as loaded carries nothing (TransformerLens's own wiring
of BERT's ``hook_mlp_in`` is not a user's hook), and its features are cached as before.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.nn.utils import prune

from attnlens import papa
from attnlens.engine.hooks import Hooks, on_model
from attnlens.errors import InputError
from attnlens.evaluation import points, probing
from attnlens.evaluation.probing import features
from attnlens.evaluation.probing.features import HooksOnModel
from tests import tiny
from tests.conftest import DATA, data_file

MAX_LEN = 32
TEXTS = tiny.CORPUS[:6]


def _uniform(pattern, hook):
    """A user's edit: every row of every head uniform over all keys."""
    return torch.full_like(pattern, 1.0 / pattern.shape[-1])


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    return tmp_path / "features"


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def constants(bert):
    return papa.fit(bert, TEXTS, max_len=MAX_LEN, progress=False)


def _extract(model, **kwargs):
    return features.extract(model, TEXTS, max_len=MAX_LEN, progress=False, **kwargs).vectors


def _carrying(model, how, constants):
    """A context inside which ``model`` carries hooks in one of the ways a user puts them there."""
    @contextlib.contextmanager
    def added(**options):
        model.add_hook("blocks.0.attn.hook_pattern", _uniform, **options)
        try:
            yield
        finally:
            model.reset_hooks(including_permanent=False)
            model.blocks[0].attn.hook_pattern.remove_hooks(including_permanent=True)

    @contextlib.contextmanager
    def registered(register, hook):
        """A plain PyTorch hook (``register_forward_hook`` and the like), removed on exit."""
        handle = register(hook)
        try:
            yield
        finally:
            handle.remove()

    @contextlib.contextmanager
    def pruned():
        """torch's pruning of half the first layer's query weights (a pre-hook applying a mask
        buffer), then the weights as they were."""
        linear = model.blocks[0].attn.q._original_component
        kept = linear.weight.detach().clone()
        prune.l1_unstructured(linear, "weight", amount=0.5)
        try:
            yield
        finally:
            prune.remove(linear, "weight")
            with torch.no_grad():
                linear.weight.copy_(kept)

    @contextlib.contextmanager
    def assigned(module, make):
        """A user's ``module.forward = ...`` (``make`` builds it from the original), undone on exit."""
        module.forward = make(module.forward)
        try:
            yield
        finally:
            del module.forward

    @contextlib.contextmanager
    def class_replaced(cls):
        """A user's ``cls.forward = ...`` on a transformers class (its output halved), undone on exit."""
        original = cls.forward

        def halved(self, *args, **kwargs):
            return original(self, *args, **kwargs) * 0.5

        cls.forward = halved
        try:
            yield
        finally:
            cls.forward = original

    def wrapped(original):
        """A wrapper made with ``functools.wraps``: its ``__module__`` is transformers', copied."""
        @functools.wraps(original)
        def halved(*args, **kwargs):
            return original(*args, **kwargs) * 0.5
        return halved

    point = model.blocks[0].attn.hook_pattern
    output = model.blocks[1].attn.original_component.output  # transformers' BertSelfOutput
    return {
        "add_hook": lambda: added(),
        "add_hook permanent": lambda: added(is_permanent=True),
        "model.hooks": lambda: model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", _uniform)]),
        "Hooks.apply": lambda: Hooks([("blocks.1.attn.hook_pattern", _uniform)]).apply(model),
        "papa.intervention": lambda: papa.intervention(model, constants, heads="all"),
        "papa.intervention fast": lambda: papa.intervention(model, constants, heads="all", fast=True),
        # PyTorch's own hooks: on a module (the first block's output halved), on a hook point
        # bypassing TransformerLens, on every module (only the hook point's call edits)
        "register_forward_hook": lambda: registered(
            model.blocks[0].register_forward_hook, lambda module, args, output: output * 0.5),
        "register_forward_pre_hook": lambda: registered(
            point.register_forward_pre_hook, lambda module, args: (_uniform(args[0], None),)),
        "register_module_forward_hook": lambda: registered(
            torch.nn.modules.module.register_module_forward_hook,
            lambda module, args, output: _uniform(output, None) if module is point else None),
        "torch.nn.utils.prune": pruned,
        # a forward replaced: on a module, by a lambda or a functools.wraps wrapper; on its class
        "forward assigned": lambda: assigned(output, lambda original: lambda *args: original(*args) * 0.5),
        "forward assigned, wrapped": lambda: assigned(output, wrapped),
        "class forward replaced": lambda: class_replaced(type(output)),
    }[how]()


WAYS = ["add_hook", "add_hook permanent", "model.hooks", "Hooks.apply", "papa.intervention",
        "papa.intervention fast", "register_forward_hook", "register_forward_pre_hook",
        "register_module_forward_hook", "torch.nn.utils.prune", "forward assigned", "forward assigned, wrapped",
        "class forward replaced"]


@pytest.mark.parametrize("how", WAYS)
def test_features_under_hooks_on_the_model_are_the_hooked_models(bert, constants, cache_folder, how):
    """The features cached for the model as loaded are not read back for the model carrying hooks:
    they equal the uncached extraction under the same hooks, exactly, and differ from the
    unhooked ones; one :class:`HooksOnModel` warning names a hook point; nothing is written."""
    plain = _extract(bert)
    assert len(list(cache_folder.glob("*.safetensors"))) == 1  # the unhooked features, cached
    with _carrying(bert, how, constants):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hooked = _extract(bert)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            reference = _extract(bert, cache=False)
    assert torch.equal(hooked, reference)
    assert not torch.equal(hooked, plain)  # a cache read of the unhooked entry: equal, bit for bit
    told = [str(w.message) for w in caught if issubclass(w.category, HooksOnModel)]
    assert len(told) == 1 and re.search(r"carries hooks of its own \((blocks\.[01]|every (module|BertSelfOutput))",
                                        told[0]), told
    assert len(list(cache_folder.glob("*.safetensors"))) == 1
    assert on_model(bert) == []
    assert torch.equal(_extract(bert), plain)  # hooks gone: the cached entry again


def test_a_cache_key_names_what_the_model_carries(bert, cache_folder):
    """``cache_key=`` names the hooks on the model too: cached under it, read back under it, and
    another key's entry (the model as loaded, ``"none"``) is not."""
    plain = _extract(bert)
    with bert.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", _uniform)]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first = _extract(bert, cache_key="uniform layer 0")
            again = _extract(bert, cache_key="uniform layer 0")
        reference = _extract(bert, cache=False)
    assert torch.equal(first, reference) and torch.equal(again, reference)
    assert not torch.equal(first, plain)
    assert len(list(cache_folder.glob("*.safetensors"))) == 2


@pytest.mark.parametrize("make", [tiny.bert_bridge, tiny.roberta_bridge, tiny.gpt2_bridge, tiny.llama_bridge],
                         ids=["bert", "roberta", "gpt2", "llama"])
def test_a_model_as_loaded_carries_nothing(make, cache_folder):
    """No false alarm: BERT's and RoBERTa's bridges carry TransformerLens's permanent wiring of
    ``hook_mlp_in``/``hook_mlp_out`` (seen in ``list_hooks()``), which is not a user's hook; after
    a forward and after attnlens's own hooks leave, still nothing; features are cached, silently."""
    model = make()
    assert on_model(model) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", HooksOnModel)
        first = _extract(model)
        assert on_model(model) == []
        assert torch.equal(_extract(model), first)
    assert len(list(cache_folder.glob("*.safetensors"))) == 1


def test_the_wiring_is_what_list_hooks_shows_on_bert():
    """The exclusion is not vacuous: TransformerLens's ``list_hooks()`` does list permanent hooks on
    a BERT bridge as loaded, all of them its wiring; a permanent hook of a user's on one of those
    hook points is listed by :func:`on_model`, by the shortest of the point's names."""
    model = tiny.bert_bridge()  # its own: a permanent hook stays
    listed = model.list_hooks()
    assert listed and all(handle.is_permanent for handles in listed.values() for handle in handles)
    model.add_hook("blocks.0.mlp.in.hook_in", lambda tensor, hook: tensor, is_permanent=True)
    assert on_model(model) == ["blocks.0.hook_mlp_in"]


@pytest.mark.parametrize("which", ["minilm", "tiny bert"])
def test_the_libraries_own_pytorch_hooks_are_not_a_users(which, minilm):
    """The exclusion is not vacuous either: after a forward, the modules of a BERT bridge hold
    PyTorch hooks of TransformerLens's (its hook points, its blocks' capture of normalized
    inputs) and, on MiniLM as attnlens loads it, of transformers' (``output_capturing_hook``),
    none of them listed; a user's on the same module is, by the module's shortest path among its
    aliases, and is gone once removed."""
    model = minilm if which == "minilm" else tiny.bert_bridge()
    model(TEXTS[0])
    tables = ("_forward_hooks", "_forward_pre_hooks")
    owners = {hook.__module__.split(".")[0] for module in model.modules() for table in tables
              for hook in getattr(module, table).values()}
    assert owners == ({"transformers", "transformer_lens"} if which == "minilm" else {"transformer_lens"})
    assert on_model(model) == []
    handle = model.blocks[1].attn.register_forward_hook(lambda module, args, output: None)
    try:
        assert on_model(model) == ["blocks.1.attn (a PyTorch forward hook)"]
    finally:
        handle.remove()
    assert on_model(model) == []


def test_a_replaced_forward_is_named_by_its_module_or_its_class():
    """A ``forward`` assigned to a module is named by the module's shortest path, and beside a
    hook on it; one assigned to a transformers class once, by the class; a forward that is the
    library's own (a ``functools.partial`` of it, accelerate's wrapper of it) is none; undone,
    nothing is left."""
    model = tiny.bert_bridge()
    output = model.blocks[1].attn.original_component.output
    cls, original = type(output), type(output).forward
    output.forward = lambda *args: original(output, *args)
    handle = output.register_forward_hook(lambda module, args, result: None)
    assert on_model(model) == ["blocks.1.attn._original_component.output (a PyTorch forward hook, its forward replaced)"]
    handle.remove()
    output.forward = functools.partial(original, output)
    assert on_model(model) == []
    del output.forward
    accelerate = pytest.importorskip("accelerate.hooks")  # TransformerLens requires accelerate
    accelerate.add_hook_to_module(output, accelerate.ModelHook())  # its wrapper: a partial in the instance's forward
    assert isinstance(vars(output)["forward"], functools.partial) and on_model(model) == []
    accelerate.remove_hook_from_module(output)
    cls.forward = lambda self, *args: original(self, *args)
    try:
        assert on_model(model) == [
            "every BertSelfOutput (its class's forward replaced, transformers.models.bert.modeling_bert.BertSelfOutput.forward)"]
    finally:
        cls.forward = original
    assert on_model(model) == []


def test_a_checkpoint_of_the_unhooked_pass_is_not_resumed_under_hooks(bert, tmp_path):
    """A pass's checkpoint records the hooks the model carries: the unhooked ``papa.fit``'s
    checkpoint is refused by one under hooks on the model (before, it resumed on the longer corpus:
    the constants would have summed the patterns of both models), and a checkpoint written under
    them resumes with the warning that their functions cannot be checked, to the uninterrupted
    fit's constants."""
    checkpoint = tmp_path / "fit.safetensors"

    def fit(texts):
        return papa.fit(bert, texts, max_len=MAX_LEN, batch_size=2, checkpoint=checkpoint, progress=False)

    fit(TEXTS[:2])
    with bert.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", _uniform)]):
        with pytest.raises(InputError, match=r"written by another run: hooks 'none' \(now 'hooks without a key at "
                                             r"blocks\.0\.attn\.hook_pattern \(on the model\)'\)"):
            fit(TEXTS)
        checkpoint.unlink()
        fit(TEXTS[:2])
        with pytest.warns(UserWarning, match="cannot identify"):
            resumed = fit(TEXTS)
        whole = papa.fit(bert, TEXTS, max_len=MAX_LEN, batch_size=2, progress=False)
    assert torch.equal(resumed.sums, whole.sums)


def test_a_curve_points_key_names_the_hooks_on_the_model(bert):
    """A curve's finished point is not found again for the model carrying hooks (its key holds
    their names), and is once they are gone."""
    train = SimpleNamespace(name="sst2", inputs=lambda: ["a film", "a dull film"], labels=lambda: [1, 0])
    evaluation = SimpleNamespace(split="dev", inputs=lambda: ["a fine film"], labels=lambda: [1])

    def key():
        return points.key(bert, train, evaluation, hooks="none", settings={}, first=None)

    plain = key()
    with bert.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", _uniform)]):
        hooked = key()
    assert hooked != plain and key() == plain


@pytest.mark.filterwarnings("ignore:the probe's accuracy")  # 16 training examples: the score is not the point
def test_a_probe_result_records_the_hooks_on_the_model(bert):
    """``probing.run`` under hooks on the model says so in its result's settings (``on_model``,
    kept by its JSON), beside ``hooks`` (the key of those given, here none); a run without them has
    no such entry."""
    data_file("sst2/train.tsv")
    options = dict(data_dir=DATA, train_limit=16, eval_limit=8, max_len=MAX_LEN, cache=False,
                   progress=False, baseline=False, select_epochs=False, resamples=10,
                   probe={"epochs": 1})
    assert "on_model" not in probing.run(bert, "sst2", **options).settings
    with bert.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", _uniform)]):
        hooked = probing.run(bert, "sst2", **options)
    assert hooked.settings["hooks"] == "none" and hooked.settings["on_model"] == ["blocks.0.attn.hook_pattern"]
    assert probing.ProbeResult.from_dict(hooked.to_dict()).settings["on_model"] == ["blocks.0.attn.hook_pattern"]
