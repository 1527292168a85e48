"""The contract of every accumulator of :func:`attnlens.engine.passes.run`, run over all of them (as
torchmetrics' ``MetricTester`` runs one set of properties over every metric).

Every class of attnlens with ``update``, ``merge`` and ``result`` is found by a walk over the
package's modules (:func:`accumulator_classes`; attnlens has no registry of accumulators yet) and
must have a case in :data:`CASES`: a new accumulator without one fails
:func:`test_every_accumulator_has_a_contract_case`. Each case builds the accumulator for the
contiguous shard ``corpus[start:stop]`` of a corpus; the shard's passes see corpus indices (its
:attr:`~attnlens.engine.accumulator.PassBatch.start` is shifted by ``start``, which is what a rank of
``torch.distributed`` sees: :func:`attnlens.engine.distributed.shard`).

The properties, on a tiny random BERT, ``N_TEXTS`` texts of different lengths in batches of
``BATCH`` (3 batches ``b1, b2, b3``):

1. **split and merge = whole**: the shards ``[b1 b2]`` and ``[b3]`` updated apart and merged equal
   the whole corpus updated at once, *exactly* (``torch.equal``). Derivation: a shard runs the very
   batches the whole pass runs (same texts, same padding: the split is batch-aligned), so every
   batch's contribution is the same bits; additive state is ``((0 + b1) + b2) + b3`` in the whole
   pass and ``((0 + b1) + b2) + (0 + b3)`` merged, the same operations (``0 + x`` is exact).
2. **merge order**: ``A.merge(B)`` and ``B.merge(A)`` hold the same state and result, exactly
   (IEEE addition is commutative). With three shards, ``(p1 + p2) + p3`` and ``p1 + (p2 + p3)``
   associate differently: each is within ``gamma_2 * sum |p_i|`` of the exact sum (Higham,
   ch. 4; ``gamma_2 = 2u / (1 - 2u)``, ``u`` the unit roundoff of the state's dtype), so they
   differ by at most ``2 * gamma_2 * sum |p_i|``, element by element; integer state is exact.
   An accumulator whose state is a sequence (``ordered``: HiddenStates, whose ``merge`` appends a
   later shard) is checked for association only, exactly.
4. **any order**: an accumulator that declares ``any_order`` gives the same state, result and
   kept values over the corpus run by length (the default) as over the corpus in its order, up
   to float32 rounding: the batches group other texts, so each is computed at another width (the
   tolerance of ``tests/unit/test_compact_layout.py``, ``RTOL = 1e-4`` and ``ATOL = 1e-5`` times
   the largest value); integer state is exact. Maps kept 8-bit (compare's report) are compared
   decoded, within one code step (``max / 127``): a value next to a rounding boundary may round
   the other way.
3. **state round trip**: an accumulator with a state (``state_dict``) restored into a fresh one
   with ``load_state_dict`` (metadata through JSON, as a checkpoint stores it) gives the same
   state and result, exactly.
5. **stacks**: an accumulator that takes stacks of layers (``stacks``: :data:`STACKING`), handed
   one stack of each batch's layers (off the CPU: the device routes, forced here), holds the
   same state, result and kept values as in the same pass handed one layer at a time, exactly:
   every quantity is a function of one map, computed by the same arithmetic in calls over more
   maps.

6. **replay**: an accumulator that reads no more than each layer's patterns and values (no
   output, residual stream, gradients or hook points of its own) holds the same state, result
   and kept values after a pass replaying another pass's recording (:mod:`attnlens.engine.recording`:
   no forward run) as after the live pass that recorded it, exactly (the same tensors reach it),
   and leaves the recorded tensors as they were (a replayed pass hands them to every
   accumulator, as a live one hands each layer's); any other accumulator refuses a replay.

The views', interventions' and learners' contracts are beside this file (``test_views.py``,
``test_interventions.py``, ``test_estimators.py``).

Found by this contract and fixed since: ``HiddenStates`` had no ``merge`` (the default one added
an empty state, dropping the other shard's vectors) and ``Gates`` lost ``per`` through
``load_state_dict``. ``Case.breaches`` is where a known breach goes, as a strict xfail.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import attnlens
from attnlens import Words
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator
from attnlens.errors import InputError
from tests import tiny

MAX_LEN = 24
BATCH = 2
#: texts of different lengths, so that batches hold padding
TEXTS = [
    *tiny.CORPUS[:4],
    "slow .",
    "the dog , the fox and the match were all funny at times ; wise , though ?",
]
N_TEXTS = len(TEXTS)
#: the split of property 1: batch-aligned, the second shard one batch
SPLIT = 4

# ------------------------------------------------------------------------------------------------
# discovery


def _modules() -> list[Any]:
    """Every module of attnlens, imported (an optional dependency that is missing skips its
    module; any other import error fails)."""
    found = [attnlens]
    for info in pkgutil.walk_packages(attnlens.__path__, "attnlens."):
        if info.name.endswith("__main__"):
            continue
        try:
            found.append(importlib.import_module(info.name))
        except ModuleNotFoundError as error:
            if (error.name or "").startswith("attnlens"):
                raise
    return found


def accumulator_classes() -> set[type]:
    """Classes defined in attnlens with ``update``, ``merge`` and ``result`` (the base
    :class:`attnlens.engine.accumulator.Accumulator`, which only declares them, aside)."""
    found = set()
    for module in _modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not cls.__module__.startswith("attnlens") or cls is Accumulator:
                continue
            if all(callable(getattr(cls, name, None)) for name in ("update", "merge", "result")):
                found.add(cls)
    return found


# ------------------------------------------------------------------------------------------------
# the cases: how to build each accumulator for the shard corpus[start:stop]


@dataclass(frozen=True)
class Case:
    """``make(model, start, stop)``: the accumulator of the shard ``corpus[start:stop]`` (its
    batches carry corpus indices: it is given what concerns the whole corpus); ``corpus``: the
    whole corpus; ``run``: extra keyword arguments of :func:`passes.run`; ``kept``: what the
    accumulator holds beside its state and result (compared too); ``ordered``: its state is
    a sequence and ``merge`` appends a later shard (HiddenStates), so merge order means
    association there, not commutation; ``breaches``: known
    breaches of a property (``"merge"``, ``"round trip"``) and why, each a strict xfail (an
    AssertionError), so that the test says so once the breach is fixed."""

    cls: type
    make: Callable[[Any, int, int], Accumulator]
    corpus: Callable[[], list] = lambda: list(TEXTS)
    run: Callable[[Any], dict] = lambda model: {}
    kept: Callable[[Any], Any] = lambda accumulator: None
    ordered: bool = False
    breaches: dict[str, str] = dataclasses.field(default_factory=dict)


def _sentences():
    from attnlens.methods.conllu import Sentence

    # a right-branching chain per text: word i's head is word i + 1, the last word is the root
    sentences = []
    for text in TEXTS:
        words = tuple(text.split())
        relations = tuple("dep" if i % 2 else "mod" for i in range(len(words) - 1)) + ("root",)
        sentences.append(Sentence(words, tuple(range(1, len(words))) + (-1,), relations))
    return sentences


def _views(model, start, stop):
    from attnlens import papa
    from attnlens.comparison.accumulator import ViewsAccumulator

    constants = papa.uniform(model, max_len=MAX_LEN)
    return ViewsAccumulator(model, ("standard", "papa", "effective"), constants, example=1,
                            causal=False, report_examples=N_TEXTS)


def _sampled(model, start, stop):
    from attnlens.methods.patterns.labelling import _Sampled

    # (example, layer) -> [(slot, head)]: one map of every example of the corpus (every rank is
    # given all of them, as by sample_maps), layer 1, head example % 4
    wanted = {(example, 1): [(example, example % 4)] for example in range(N_TEXTS)}
    return _Sampled(wanted, "standard")


def _cases() -> list[Case]:
    from attnlens import ablation, papa
    from attnlens.comparison.accumulator import ViewsAccumulator
    from attnlens.evaluation.lm.scorer import LMScorer
    from attnlens.evaluation.probing.features import HiddenStates
    from attnlens.evaluation.probing.mlm import MaskedStates
    from attnlens.methods import clustering, stats, syntax
    from attnlens.methods.papa.fitting import PatternSums
    from attnlens.methods.patterns.counts import PatternTypes
    from attnlens.methods.patterns.labelling import _Sampled
    from attnlens.papa import PapaConstants

    shape = (2, 4)  # tiny.SIZES: layers, heads
    words = lambda: [Words(tuple(text.split())) for text in TEXTS]  # noqa: E731
    return [
        Case(stats.Statistics, lambda m, a, b: stats.Statistics(*shape, view="effective")),
        Case(stats.Distance, lambda m, a, b: stats.Distance(
            *shape, view="papa", constants=papa.uniform(m, max_len=MAX_LEN), causal=False)),
        Case(PatternTypes, lambda m, a, b: PatternTypes(*shape)),
        Case(clustering.HeadDistances, lambda m, a, b: clustering.HeadDistances(*shape)),
        Case(ablation.HeadMeans, lambda m, a, b: ablation.HeadMeans(m)),
        Case(ablation.Gates, lambda m, a, b: ablation.Gates(m, None)),
        Case(LMScorer, lambda m, a, b: LMScorer(m, "mlm", mask_rate=0.3)),
        Case(PatternSums, lambda m, a, b: PatternSums(PapaConstants.empty(m, max_len=MAX_LEN, layout="papa"))),
        Case(ViewsAccumulator, _views,
             kept=lambda a: (a.kept, a.kept_tokens, a.kept_patterns.to_dict())),
        Case(_Sampled, _sampled),
        Case(syntax.DependencyCounts,
             lambda m, a, b: syntax.DependencyCounts(_sentences(), *shape, relations=("dep", "mod")),
             corpus=words),
        Case(HiddenStates, lambda m, a, b: HiddenStates(2, words()), corpus=words, ordered=True),
        Case(MaskedStates, lambda m, a, b: MaskedStates(m, rate=0.3, seed=0), ordered=True),
    ]


CASES = {case.cls: case for case in _cases()}


def _params(prop: str, select: Callable[[Case], bool] = lambda case: True) -> list:
    return [
        pytest.param(case, id=case.cls.__name__, marks=[
            pytest.mark.xfail(reason=case.breaches[prop], raises=AssertionError, strict=True)] if prop in case.breaches else [])
        for case in CASES.values() if select(case)
    ]


def _has_state(case: Case) -> bool:
    """Whether the accumulator keeps state: a state_dict of its own, or declared state
    (Accumulator.add_state / add_child, which the default state_dict returns)."""
    source = inspect.getsource(case.cls)
    return case.cls.state_dict is not Accumulator.state_dict or "add_state(" in source or "add_child(" in source


# ------------------------------------------------------------------------------------------------
# running shards and comparing what they hold


@pytest.fixture(scope="module")
def model():
    return tiny.bert_bridge()


def shard(case: Case, model, start: int, stop: int) -> Accumulator:
    """The accumulator updated on ``corpus[start:stop]``, its batches numbered from ``start``."""
    accumulator = case.make(model, start, stop)
    own = accumulator.start_batch

    def start_batch(batch):
        batch.start += start
        batch.indices = [index + start for index in batch.indices]
        own(batch)

    accumulator.start_batch = start_batch
    try:  # in corpus order: a rank runs its shard of the order the whole pass runs
        passes.run(model, case.corpus()[start:stop], [accumulator], max_len=MAX_LEN,
                   batch_size=BATCH, progress=False, by_length=False, **case.run(model))
    finally:
        del accumulator.start_batch
    return accumulator


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """``value`` (a result: tensors, arrays, tables, dicts, sequences, dataclasses, plain
    objects of attnlens) as ``{path: tensor, array or plain value}``."""
    if isinstance(value, torch.Tensor):
        return {path: value.detach().cpu()}
    if isinstance(value, np.ndarray | int | float | str | bool | type(None)):
        return {path: value}
    if isinstance(value, pd.DataFrame):
        out = {f"{path}.columns": list(value.columns), f"{path}.index": list(value.index)}
        out.update(leaves(dict(value.attrs), f"{path}.attrs"))
        for column in value.columns:
            out[f"{path}[{column}]"] = value[column].to_numpy()
        return out
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in leaves(item, f"{path}[{key!r}]").items()}
    if isinstance(value, list | tuple):
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{path}[{i}]").items()}
    if isinstance(value, torch.nn.Module):
        return {}
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if not f.name.startswith("_")}
        return leaves(fields, path)
    if type(value).__module__.startswith("attnlens"):
        return leaves({k: v for k, v in vars(value).items() if not k.startswith("_")}, path)
    raise TypeError(f"{path}: cannot compare a {type(value).__name__}")


def assert_same(actual: Any, expected: Any, what: str) -> None:
    """The same leaves, bit for bit (NaN equal to NaN)."""
    mine, theirs = leaves(actual), leaves(expected)
    assert mine.keys() == theirs.keys(), what
    for path, value in theirs.items():
        other = mine[path]
        if isinstance(value, torch.Tensor):
            assert other.dtype == value.dtype and other.shape == value.shape, f"{what}{path}"
            assert torch.equal(other, value) or (
                value.is_floating_point() and torch.equal(other.nan_to_num(7.0), value.nan_to_num(7.0))
                and torch.equal(other.isnan(), value.isnan())
            ), f"{what}{path}"
        elif isinstance(value, np.ndarray):
            assert other.dtype == value.dtype and other.shape == value.shape, f"{what}{path}"
            equal_nan = value.dtype.kind in "fc"
            assert np.array_equal(other, value, equal_nan=equal_nan), f"{what}{path}"
        else:
            assert other == value or (value != value and other != other), f"{what}{path}: {other!r} != {value!r}"


def state(case: Case, accumulator: Accumulator) -> dict[str, Any]:
    return {"state": accumulator.state_dict(), "metadata": accumulator.metadata(),
            "kept": case.kept(accumulator)}


def gamma(n: int, dtype: torch.dtype) -> float:
    u = torch.finfo(dtype).eps / 2
    return n * u / (1 - n * u)


# ------------------------------------------------------------------------------------------------
# the properties


def test_every_accumulator_has_a_contract_case():
    found = accumulator_classes()
    missing = sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in found - CASES.keys())
    assert not missing, f"accumulators without a case in tests/contract/test_accumulators.py: {missing}"
    assert len(found) >= 11, sorted(cls.__name__ for cls in found)
    stale = sorted(cls.__name__ for cls in CASES.keys() - found)
    assert not stale, f"cases of classes the walk no longer finds: {stale}"


@pytest.mark.parametrize("case", _params("merge"))
def test_split_and_merged_equals_whole(case, model):
    whole = shard(case, model, 0, N_TEXTS)
    merged = shard(case, model, 0, SPLIT).merge(shard(case, model, SPLIT, N_TEXTS))
    assert_same(state(case, merged), state(case, whole), "state")
    assert_same(merged.result(), whole.result(), "result")


@pytest.mark.parametrize("case", _params("merge"))
def test_merge_order_does_not_change_the_result(case, model):
    if not case.ordered:
        first = shard(case, model, 0, SPLIT).merge(shard(case, model, SPLIT, N_TEXTS))
        second = shard(case, model, SPLIT, N_TEXTS).merge(shard(case, model, 0, SPLIT))
        assert_same(state(case, second), state(case, first), "state")
        assert_same(second.result(), first.result(), "result")

    # three shards, associated both ways: within 2 gamma_2 sum |p_i| (module docstring)
    bounds = [(0, BATCH), (BATCH, 2 * BATCH), (2 * BATCH, N_TEXTS)]
    parts = [shard(case, model, a, b).state_dict() for a, b in bounds]
    left = shard(case, model, *bounds[0]).merge(shard(case, model, *bounds[1])).merge(shard(case, model, *bounds[2]))
    right = shard(case, model, *bounds[0]).merge(shard(case, model, *bounds[1]).merge(shard(case, model, *bounds[2])))
    assert_same(left.metadata(), right.metadata(), "metadata")
    if not _has_state(case):
        assert_same(right.result(), left.result(), "result")
        return
    for key, value in left.state_dict().items():
        other = right.state_dict()[key]
        if value.is_floating_point():
            magnitude = sum(part[key].abs() for part in parts)
            bound = 2 * gamma(2, value.dtype) * magnitude
            assert bool(((other - value).abs() <= bound).all()), key
        else:
            assert torch.equal(other, value), key


def assert_close(actual: Any, expected: Any, what: str) -> None:
    """The same leaves up to float32 rounding (property 4)."""
    mine, theirs = leaves(actual), leaves(expected)
    assert mine.keys() == theirs.keys(), what
    for path, value in theirs.items():
        other = mine[path]
        if isinstance(value, np.ndarray) and value.dtype.kind == "O":  # a table's text column
            assert list(other) == list(value), f"{what}{path}"
            continue
        if isinstance(value, float):
            value, other = torch.tensor(value), torch.tensor(other)
        if isinstance(value, np.ndarray):
            value, other = torch.from_numpy(value.copy()), torch.from_numpy(other.copy())
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            scale = float(value.abs().nan_to_num(0.0).max()) if value.numel() else 1.0
            step = "8-bit" in path  # decoded 8-bit maps: one code step
            torch.testing.assert_close(other, value, rtol=0 if step else 1e-4,
                                       atol=(1.01 / 127 if step else 1e-5) * (scale or 1.0), equal_nan=True,
                                       msg=lambda message, path=path: f"{what}{path}: {message}")
        elif isinstance(value, torch.Tensor):
            assert torch.equal(other, value), f"{what}{path}"
        else:
            assert other == value or (value != value and other != other), f"{what}{path}: {other!r} != {value!r}"


@pytest.mark.parametrize("case", _params("any order", lambda case: case.cls.any_order))
def test_any_order_accumulators_give_the_same_result_by_length(case, model):
    corpus = case.corpus()
    order = attnlens.core.inputs.by_length(model.tokenizer, corpus)
    assert order != sorted(order)  # the pass by length runs another order
    results = {}
    for by_length in (False, True):
        accumulator = case.make(model, 0, N_TEXTS)
        seen = []
        own = accumulator.start_batch
        accumulator.start_batch = lambda batch, own=own, seen=seen: (seen.extend(batch.indices), own(batch))
        # batches padded to the longest text (padded layout) unless compact PAPA ones
        layout = {} if accumulator.compact else {"layout": "padded"}
        passes.run(model, corpus, [accumulator], max_len=MAX_LEN, batch_size=BATCH, progress=False,
                   by_length=by_length, **layout, **case.run(model))
        del accumulator.start_batch
        assert seen == (order if by_length else list(range(N_TEXTS)))  # rows carry corpus indices
        results[by_length] = (accumulator.state_dict(), accumulator.metadata(), accumulator.result(),
                              _kept_decoded(accumulator))
    assert_close(results[True], results[False], "by length")


def _kept_decoded(accumulator: Accumulator) -> dict[str, Any] | None:
    """What compare's accumulator keeps for its figures and report, the 8-bit maps decoded."""
    from attnlens.comparison.accumulator import ViewsAccumulator

    if not isinstance(accumulator, ViewsAccumulator):
        return None
    kept = accumulator.kept_patterns
    return {"example": (accumulator.kept, accumulator.kept_tokens), "indices": kept.indices,
            "tokens": [example.tokens for example in kept.examples],
            "8-bit": {f"{index}.{view}": kept.pattern(index, view) for index in kept.indices for view in kept.views}}


def test_the_accumulators_that_run_in_any_order():
    """Those whose state is a sum over examples, finding what they need of an example (its
    sentence, its sampled maps) by its corpus index; not the importance gates (the MLM masks are
    drawn per batch), the LM scorers (likewise) or the hidden states (kept in order)."""
    assert {cls.__name__ for cls in CASES if cls.any_order} == {
        "Statistics", "Distance", "PatternTypes", "HeadDistances", "HeadMeans", "PatternSums",
        "ViewsAccumulator", "DependencyCounts", "_Sampled",
    }


#: the accumulators whose cases take stacks of layers (Accumulator.stacks: an instance's, by its views)
STACKING = {"Statistics", "Distance", "PatternTypes", "ViewsAccumulator", "PatternSums"}


def test_the_accumulators_that_stack(model):
    """Those that read a batch's maps one (example, layer) at a time through views that stack
    (View.stacks), and PAPA's fit (sums of the patterns); not those that read the layer's own
    weights or hooks, or keep it in order."""
    assert {cls.__name__ for cls, case in CASES.items() if case.make(model, 0, N_TEXTS).stacks} == STACKING


@pytest.mark.parametrize("case", _params("stacks", lambda case: case.cls.__name__ in STACKING))
def test_a_stack_of_layers_adds_what_each_layer_adds(case, model, monkeypatch):
    from attnlens.core import devices

    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)  # the routes of a GPU
    results = {}
    for stacked in (True, False):
        accumulator = case.make(model, 0, N_TEXTS)
        accumulator.stacks = stacked
        handed: list = []
        own = accumulator.update
        accumulator.update = lambda layer, own=own, handed=handed: (handed.append(layer.layers), own(layer))
        passes.run(model, case.corpus(), [accumulator], max_len=MAX_LEN, batch_size=BATCH, progress=False,
                   **case.run(model))
        del accumulator.update
        n_layers = model.cfg.n_layers
        assert handed == ([tuple(range(n_layers))] * 3 if stacked else [()] * (3 * n_layers))  # 3 batches
        results[stacked] = (accumulator.state_dict(), accumulator.metadata(), accumulator.result(),
                            _kept_decoded(accumulator))
    assert_same(results[True], results[False], "stacked")


@pytest.mark.parametrize("case", _params("replay"))
def test_a_replayed_pass_gives_the_live_passs_result(case, model, monkeypatch):
    from attnlens.engine.recording import Recording

    live = case.make(model, 0, N_TEXTS)
    options = dict(max_len=MAX_LEN, batch_size=BATCH, progress=False, **case.run(model))
    recording, copies = Recording(), []
    add = Recording.add
    monkeypatch.setattr(Recording, "add", lambda self, pattern, values: (
        copies.append([t.clone() for t in (pattern, values)]), add(self, pattern, values)))
    passes.run(model, case.corpus(), [live], record=recording, **options)
    assert recording.complete and recording.n_batches == 3
    replayed = case.make(model, 0, N_TEXTS)
    if live.needs_output or live.needs_residual or live.needs_grad or live.hooks(model):
        with pytest.raises(InputError, match="which a recording does not hold"):
            passes.run(model, case.corpus(), [replayed], replay=recording, **options)
        return

    def no_forward(*args, **kwargs):
        raise AssertionError("a replayed pass ran a forward")

    monkeypatch.setattr(passes, "run_patterns", no_forward)
    monkeypatch.setattr(passes, "forward_batch", no_forward)
    passes.run(model, case.corpus(), [replayed], replay=recording, **options)
    assert_same(state(case, replayed), state(case, live), "state")
    assert_same(replayed.result(), live.result(), "result")
    kept = [list(layer) for batch in recording.kept.values() for layer in batch.layers]
    assert len(kept) == len(copies)
    for (pattern, values), (pattern_before, values_before) in zip(kept, copies, strict=True):
        assert torch.equal(pattern, pattern_before) and torch.equal(values, values_before)


@pytest.mark.parametrize("case", _params("round trip", _has_state))
def test_state_round_trips(case, model):
    ran = shard(case, model, 0, N_TEXTS)
    saved = {key: value.detach().clone() for key, value in ran.state_dict().items()}
    metadata = json.loads(json.dumps(ran.metadata()))
    fresh = case.make(model, 0, N_TEXTS)
    fresh.load_state_dict(saved, metadata)
    assert_same(fresh.state_dict(), ran.state_dict(), "state")
    assert_same(fresh.metadata(), ran.metadata(), "metadata")
    assert_same(fresh.result(), ran.result(), "result")
