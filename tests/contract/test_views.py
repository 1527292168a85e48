"""One property set over every registered view (attnlens.methods.views.REGISTRY) on a tiny random
BERT, the one "Unknown view" error, and a walk of the package that finds any view table or view
check outside the registry: adding a view without registering it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator
from attnlens.errors import InputError
from attnlens.methods import view_setup, views
from attnlens.methods.views import View
from tests import tiny

PACKAGE = Path(__file__).resolve().parents[2] / "attnlens"
MAX_LEN = 24


class Record(Accumulator):
    """Keeps a view's maps of every layer with the batch's key mask."""

    def __init__(self, view: View) -> None:
        self.view, self.name, self.needs_values = view, f"record.{view.name}", view.needs_values
        self.seen: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def update(self, layer):
        self.seen.append((layer.layer, self.view.maps(layer).detach().clone(), layer.key_mask.clone(),
                          layer.pattern.detach().clone()))

    def state_dict(self):
        return {}

    def result(self):
        return self.seen


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def constants(bert):
    from attnlens.methods import papa

    return papa.fit(bert, tiny.CORPUS, max_len=MAX_LEN, layout="papa", progress=False)


def value_of(view: View, constants):
    return constants if view.takes_constants else view.name


@pytest.mark.parametrize("name", list(views.REGISTRY))
def test_view_contract(bert, constants, name):
    view = views.get_view(name)
    assert isinstance(view, View) and view.name == name and views.get_view(view) is view
    assert isinstance(view.signed, bool) and view.description
    chosen = view_setup.setup(bert, value_of(view, constants), max_len=None if view.takes_constants else MAX_LEN)
    assert chosen.name == name
    record = Record(view)
    passes.run(bert, tiny.CORPUS[:5], [record], max_len=chosen.max_len, layout=chosen.layout,
               hooks=chosen.hooks, batch_size=2, progress=False, compact=False)
    seen = record.result()
    assert sorted({layer for layer, *_ in seen}) == list(range(bert.cfg.n_layers))
    for _, maps, key_mask, pattern in seen:
        batch, n_heads, n_query, n_key = maps.shape
        assert maps.shape == pattern.shape and n_heads == bert.cfg.n_heads and n_query == n_key
        assert maps.dtype == torch.float32 and torch.isfinite(maps).all()
        valid = key_mask[:, None, None, :].to(maps.dtype)
        rows = maps * valid
        sums = rows.sum(-1)[key_mask[:, None, :].expand(batch, n_heads, n_query)]
        # float32 softmax rows of at most n_key terms: each sum is 1 within n_key rounding errors
        tolerance = 4 * n_key * torch.finfo(torch.float32).eps
        if not view.signed:
            assert (rows >= 0).all()
            torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=tolerance)
            assert (maps * (1 - valid)).abs().max() <= tolerance, "no mass on padding keys"


class Layers(Accumulator):
    """Keeps every layer the pass hands over (a compact pass: PAPA's constants are gathered by
    position)."""

    name, compact = "layers", True

    def __init__(self, needs_values: bool) -> None:
        self.needs_values = needs_values
        self.seen: list = []

    def update(self, layer):
        self.seen.append(layer)

    def state_dict(self):
        return {}


@pytest.mark.parametrize("name", list(views.REGISTRY))
def test_a_view_that_stacks_reads_a_stack_of_layers_as_each_layer_on_its_own(bert, constants, name):
    """View.stacks: the maps of LayerPatterns.stack(layers), one call for a batch's layers (as
    compare makes them off the CPU), are each layer's maps one after the other along the batch
    axis: the same per-example float32 arithmetic, in calls of another size (compared to
    FLOAT32_STEPS steps of float32 at 1, since a kernel may group a sum's terms differently for
    another batch size). A view that does not stack (it reads a layer's own weights) is refused
    them on a stack."""
    from attnlens.engine.accumulator import LayerPatterns
    from attnlens.errors import ModelBehaviourError
    from attnlens.methods.papa import TrainableConstants

    view = views.get_view(name)
    record = Layers(view.needs_values)
    chosen = view_setup.setup(bert, value_of(view, constants), max_len=None if view.takes_constants else MAX_LEN)
    passes.run(bert, tiny.CORPUS[:5], [record], max_len=chosen.max_len, layout=chosen.layout,
               batch_size=3, progress=False)
    batches: dict[int, list] = {}
    for layer in record.seen:
        batches.setdefault(id(layer.batch), []).append(layer)
    assert len(batches) == 2 and all(len(layers) == bert.cfg.n_layers for layers in batches.values())
    values = [constants, TrainableConstants.from_average(constants)] if view.takes_constants else [None]
    for layers in batches.values():
        chosen_layers = layers[::-1]  # any order: the last layer first
        stack = LayerPatterns.stack(chosen_layers)
        n_layers = bert.cfg.n_layers
        assert stack.layers == tuple(reversed(range(n_layers))) and stack.pattern.shape[0] == n_layers * len(layers[0].batch)
        if not view.stacks:
            with pytest.raises(ModelBehaviourError, match="no one output projection"):
                view.read(stack)
            continue
        for value in values:
            with torch.no_grad():
                together = view.read(LayerPatterns.stack(chosen_layers), value)
                apart = torch.cat([view.read(layer, value) for layer in chosen_layers])
            torch.testing.assert_close(together, apart, rtol=0, atol=FLOAT32_STEPS * torch.finfo(torch.float32).eps)


#: how far a stack's maps may be from each layer's, in float32 steps at 1 (a float32 sum of at
#: most MAX_LEN terms grouped differently: a few steps)
FLOAT32_STEPS = 8


def test_unknown_view_is_one_error_naming_the_registered_views():
    listing = ", ".join(repr(name) for name in views.REGISTRY)
    with pytest.raises(InputError, match=f"Unknown view 'attn'; use {listing}"):
        views.get_view("attn")
    with pytest.raises(InputError, match="Unknown view 'papa' for HeadDistances; use 'standard', 'effective'"):
        views.get_view("papa", among=views.names(constants=False), where=" for HeadDistances")
    with pytest.raises(InputError, match="already registered"):
        views.register_view(View("standard", "another", signed=False))


def test_constants_are_the_papa_view(constants):
    assert views.get_view(constants).takes_constants
    assert views.resolve(constants) == ("papa", constants)
    with pytest.raises(InputError, match="'papa' needs the PAPA constants themselves"):
        views.resolve("papa")


# ------------------------------------------------------------------------------------------------
# the walk: no view table, check or View outside the registry


def _strings(node: ast.AST) -> list[str]:
    elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def unregistered_views(package: Path = PACKAGE) -> list[str]:
    """Where the package defines views outside :mod:`attnlens.methods.views`: a literal table
    (tuple, list, set, dict keys) of two or more view names, an "Unknown view" message of its
    own, or a :class:`View` not handed straight to ``register_view``."""
    names = set(views.REGISTRY)
    found = []
    for file in sorted(package.rglob("*.py")):
        if file == package / "methods" / "views.py":
            continue
        tree = ast.parse(file.read_text(encoding="utf-8"))
        where = file.relative_to(package.parent)
        registered = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call)
                      and getattr(call.func, "id", getattr(call.func, "attr", None)) == "register_view"
                      and call.args}
        docstrings = {id(body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and (body := node.body) and isinstance(body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
                strings = _strings(node)
                named = [s for s in strings if s in names]
                if len(named) >= 2 and 2 * len(named) >= len(strings):  # not a list of modules
                    found.append(f"{where}:{node.lineno}: a table of view names")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "nknown view" in node.value \
                    and id(node) not in docstrings:
                found.append(f"{where}:{node.lineno}: an 'Unknown view' message of its own")
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "View"
                  and id(node) not in registered):
                found.append(f"{where}:{node.lineno}: a View not registered")
    return found


def test_every_view_is_in_the_one_registry():
    assert unregistered_views() == []


def test_the_walk_finds_a_view_added_without_registering(tmp_path):
    package = tmp_path / "attnlens"
    (package / "methods").mkdir(parents=True)
    (package / "methods" / "rollout.py").write_text(
        'VIEWS = ("standard", "effective", "rollout")\n'
        'ROLLOUT = View("rollout", "attention rollout", signed=False)\n'
        'def check(view):\n'
        '    if view != "rollout":\n'
        '        raise ValueError(f"Unknown view {view}")\n'
        'register_view(View("fine", "registered", signed=False))\n',
        encoding="utf-8",
    )
    found = unregistered_views(package)
    assert len(found) == 3, found
