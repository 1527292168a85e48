"""No read of a device tensor per batch: the jobs of a pass read values back once per pass.

On a GPU each read of a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``,
``.numpy()``, ``bool()``, ``float()``, ``int()``, ``nonzero()``) makes the host wait for the
device. These tests count those calls on the CPU, with every branch that would read a device
tensor forced onto its device route (:func:`attnlens.core.devices.reads_are_free` patched to
False), for each job on ``n`` and on ``2n`` batches: the count may grow by at most one read per
extra batch: none for an encoder's forward behind the seam, one for a decoder's own mask code
(it tests whether the mask has padding; a hand-written loop pays it too), and one for the jobs
that compute effective attention, whose device route reads whether any head needs the float64
exact basis (:data:`attnlens.engine.effective.NO_READ_WIDTH`: cheaper on a GPU than that
basis for every head), once for every layer of a batch.

Reads of host tensors are not counted: those inside the pass's host stage
(:func:`attnlens.engine.batches.stage_batch` and ``_inputs``: tokenizing, counting, checking and
preparing a batch, on the tokenizer's output before the batch is copied to the device), and
reads of tensors made only from the pass's host copy of the inputs
(:attr:`attnlens.engine.accumulator.PassBatch.on_host`; here a :class:`HostTensor`, whose results stay
host tensors only when every tensor an operation takes is one). They cost no synchronisation.
``tests/system/test_cuda.py`` checks the same jobs on a real GPU with CUDA's own
synchronisation detector.

The device routes must also give the CPU routes' results: the routes differ only in which
cases they compute (every sequence, every head's float64 fallback, chosen by ``torch.where``)
and in kernels of the same float32 arithmetic, so results agree exactly or to float32 rounding
(``FLOAT32``: a few ulps of values at most 1, summed over at most a few thousand terms).
"""

from __future__ import annotations

import collections
import functools
import inspect
import sys

import pandas as pd
import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core import devices, seam
from attnlens.engine import passes
from attnlens.engine.batches import stage_batch
from attnlens.evaluation import probing
from attnlens.evaluation.lm import scorer
from attnlens.methods import effective
from tests import tiny

#: batches of the shorter run; the longer runs twice as many
N_BATCHES = 4
BATCH = 8
MAX_LEN = 32
#: host reads of the model's own forward per batch: none for an encoder behind the seam, whose
#: mask is always made (attnlens.core.seam.made_mask: transformers' code would read whether a
#: batch has padding, to skip it); a decoder's own mask code may read once
FORWARD_READS = 0
DECODER_FORWARD_READS = 1
#: host reads per batch of a job that computes effective attention: whether any head of the
#: batch's layers needs the exact basis (attnlens.engine.effective.NO_READ_WIDTH)
EFFECTIVE_READS = 1
#: results of the device and CPU routes: float32 sums of up to ~10^4 terms of size <= 1
FLOAT32 = 1e-4

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "nonzero")
#: the code of the host stage's functions themselves (under the run-time type checks a function
#: is a wrapper, whose code every checked function shares: unwrapped, or every frame would match)
HOST_STAGE = {inspect.unwrap(stage_batch).__code__, inspect.unwrap(passes._inputs).__code__}


class HostTensor(torch.Tensor):
    """A tensor of the host's copy of a batch, and what is computed from such tensors alone."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        given = [value for value in torch.utils._pytree.tree_leaves((args, kwargs))
                 if isinstance(value, torch.Tensor)]
        if all(isinstance(value, HostTensor) for value in given):
            return result
        return torch.utils._pytree.tree_map(
            lambda value: value.as_subclass(torch.Tensor) if isinstance(value, HostTensor) else value, result)


class DeviceTensor(torch.Tensor):
    """A tensor standing for one on a GPU, and whatever is computed from it or written with its
    values (a probe's features' vectors, the pooled vectors, logits and losses made of them): the
    tensors a probe's reads are counted of. (The network's parameters and gradients are not
    marked: a read of them is not counted.)"""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        name = getattr(func, "__name__", "")
        target = args[0] if args else None
        written = name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))
        if written and type(target) is torch.Tensor:  # a buffer filled in place: a device tensor now
            target.__class__ = cls
        return result


class Counter:
    """Counts host reads of tensors outside the pass's host stage, by call site: of every tensor
    but a :class:`HostTensor` (``device_only``: of :class:`DeviceTensor`\ s alone)."""

    def __init__(self, device_only: bool = False) -> None:
        self.active = False
        self.device_only = device_only
        self.sites: collections.Counter = collections.Counter()

    def counts(self, tensor) -> bool:
        return isinstance(tensor, DeviceTensor) if self.device_only else not isinstance(tensor, HostTensor)

    def wrap(self, name: str):
        original = getattr(torch.Tensor, name)

        @functools.wraps(original)
        def counted(tensor, *args, **kwargs):
            if self.active and self.counts(tensor):
                self.record(name)
            return original(tensor, *args, **kwargs)

        return counted

    def record(self, name: str) -> None:
        frame = sys._getframe(2)
        site = None
        while frame is not None:
            if frame.f_code in HOST_STAGE:
                return
            if site is None and "attnlens" in frame.f_code.co_filename:
                site = f"{frame.f_code.co_filename.rsplit('attnlens/', 1)[-1]}:{frame.f_lineno}"
            frame = frame.f_back
        self.sites[f"{name} at {site}"] += 1

    def count(self, job) -> tuple[int, collections.Counter]:
        self.sites.clear()
        self.active = True
        try:
            result = job()
        finally:
            self.active = False
        return result, collections.Counter(self.sites)


@pytest.fixture
def counter(monkeypatch):
    counting = Counter()
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counting.wrap(name))
    original = passes._inputs

    def tagged(*args, **kwargs):  # the host's copy as HostTensors, the "device" copy a plain one
        host, inputs, unpadded = original(*args, **kwargs)
        return host._apply(lambda value: value.as_subclass(HostTensor)), inputs._apply(torch.clone), unpadded

    monkeypatch.setattr(passes, "_inputs", tagged)
    return counting


@pytest.fixture
def device_routes(monkeypatch):
    """Every branch that would read a device tensor takes its device route, here on the CPU,
    and compact widths are rounded up as off the CPU."""
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    monkeypatch.setattr(devices, "width_multiple", lambda where: 16)


def growth(counter, job, texts):
    """``(reads per extra batch, sites that grew, results)`` of ``job`` on N and 2N batches."""
    short, few = counter.count(lambda: job(texts[: N_BATCHES * BATCH]))
    long, many = counter.count(lambda: job(texts[: 2 * N_BATCHES * BATCH]))
    grew = {site: many[site] - few[site] for site in many if many[site] > few[site]}
    return (sum(many.values()) - sum(few.values())) / N_BATCHES, grew, (short, long)


def texts_for(minilm):
    return attnlens.core.corpus.default_corpus(2 * N_BATCHES * BATCH)


@pytest.mark.slow
def test_papa_fit_reads_nothing_per_batch(minilm, counter, device_routes):
    texts = texts_for(minilm)
    per_batch, grew, (_, fitted) = growth(
        counter, lambda t: papa.fit(minilm, t, max_len=MAX_LEN, batch_size=BATCH, progress=False), texts)
    assert per_batch <= FORWARD_READS, grew
    assert fitted.mean.device.type == "cpu"  # the result is read back once, at the end
    devices.reads_are_free = lambda where: True  # the CPU route: the same sums, bit for bit
    on_cpu = papa.fit(minilm, texts, max_len=MAX_LEN, batch_size=BATCH, progress=False)
    assert torch.equal(fitted.sums, on_cpu.sums) and torch.equal(fitted.pair_counts, on_cpu.pair_counts)


@pytest.mark.slow
def test_compare_reads_once_per_batch(minilm, counter, device_routes, monkeypatch):
    texts = texts_for(minilm)
    constants = papa.fit(minilm, texts, max_len=MAX_LEN, progress=False)

    def job(t):
        return attnlens.compare(minilm, "papa", "effective", corpus=t, constants=constants,
                                batch_size=BATCH, progress=False)

    per_batch, grew, (_, on_device) = growth(counter, job, texts)
    assert per_batch <= FORWARD_READS + EFFECTIVE_READS, grew
    # the device routes give the CPU routes' statistics
    monkeypatch.setattr(devices, "reads_are_free", lambda where: True)
    on_cpu = job(texts[: 2 * N_BATCHES * BATCH])
    for view in ("standard", "papa", "effective"):
        for column in ("to_cls", "to_sep", "entropy", "to_self", "distance_from_standard"):
            if column == "distance_from_standard" and view == "standard":
                continue
            difference = abs(on_device.grid(column, view) - on_cpu.grid(column, view)).max()
            assert difference <= FLOAT32, (view, column, difference)
    # the pattern types (template rules on every view's maps at once, on the device route)
    assert on_device.pattern_types.equals(on_cpu.pattern_types)
    assert on_device.meta["longer_than_d_head"] == on_cpu.meta["longer_than_d_head"]  # counted on the host
    # the report's kept maps, coded on the device and read once at the end, are the same codes
    device_kept, cpu_kept = on_device.kept_patterns.examples, on_cpu.kept_patterns.examples
    assert [e.index for e in device_kept] == [e.index for e in cpu_kept] and len(cpu_kept) > 8
    for mine, theirs in zip(device_kept, cpu_kept, strict=True):
        for view in ("standard", "papa", "effective"):
            # 8-bit codes of equal maps; an entry at a rounding boundary may move by one step
            assert abs(mine.codes(view).astype(int) - theirs.codes(view).astype(int)).max() <= 1


def test_off_the_cpu_the_tables_are_the_same_whatever_the_stacks_of_layers(minilm, device_routes, monkeypatch):
    """Off the CPU the engine keeps a batch's layers and hands the accumulators that stack
    (compare's, and effective.statistics') one stack after the forward, or sooner when the
    layers fill 1 / STACK_SHARE of the free memory: with a share so small that every layer is a
    stack of its own, the tables are the same (every statistic, template share and distance is a
    function of one map, the same arithmetic either way: compared exactly)."""
    from attnlens.comparison.accumulator import ViewsAccumulator

    texts = texts_for(minilm)[: 2 * BATCH]
    constants = papa.fit(minilm, texts, max_len=MAX_LEN, progress=False)

    def jobs():
        return (attnlens.compare(minilm, "papa", "effective", corpus=texts, constants=constants,
                                 batch_size=BATCH, progress=False),
                effective.statistics(minilm, texts, max_len=MAX_LEN, batch_size=BATCH, progress=False))

    stacks = []
    real = ViewsAccumulator._update_stack
    monkeypatch.setattr(ViewsAccumulator, "_update_stack", lambda self, stack: stacks.append(stack.layers) or real(self, stack))
    whole, whole_statistics = jobs()
    layers = tuple(range(minilm.cfg.n_layers))
    assert stacks == [layers] * 2  # one stack a batch: every layer
    stacks.clear()
    monkeypatch.setattr(passes, "STACK_SHARE", 2**62)  # a limit of one byte: a stack per layer
    apart, apart_statistics = jobs()
    assert stacks == [(layer,) for layer in layers] * 2
    pd.testing.assert_frame_equal(apart.table, whole.table, check_exact=True)
    assert apart.pattern_types.equals(whole.pattern_types)
    pd.testing.assert_frame_equal(apart_statistics.table, whole_statistics.table, check_exact=True)


@pytest.mark.slow
def test_feature_extraction_reads_nothing_per_batch(minilm, counter, device_routes):
    texts = texts_for(minilm)
    per_batch, grew, (_, features) = growth(
        counter, lambda t: probing.extract(minilm, t, max_len=MAX_LEN, batch_size=BATCH, cache=False,
                                           progress=False), texts)
    assert per_batch <= FORWARD_READS, grew
    assert features.vectors.device.type == "cpu"
    devices.reads_are_free = lambda where: True  # the CPU route: the same vectors, bit for bit
    on_cpu = probing.extract(minilm, texts, max_len=MAX_LEN, batch_size=BATCH, cache=False, progress=False)
    assert torch.equal(features.vectors, on_cpu.vectors) and torch.equal(features.lengths, on_cpu.lengths)
    assert torch.equal(features.positions, on_cpu.positions)


def test_the_device_routes_keep_the_mask_off_a_batch_without_padding(minilm, device_routes, monkeypatch):
    """A pass learns whether a batch has padding from its host copy, on the host on any machine,
    so the device routes too run a batch without padding with no attention mask (what
    transformers' skip gave after a read of the device): the seam is told its shape, and a
    padded batch's is not."""
    told = []
    original = seam.batch_unpadded
    monkeypatch.setattr(seam, "batch_unpadded", lambda shape: (told.append(shape), original(shape))[1])
    same = ["the cat sat on the mat ."] * BATCH  # one length: no padding in the padded layout
    probing.extract(minilm, same, max_len=MAX_LEN, batch_size=BATCH, cache=False, progress=False, layout="padded")
    assert told and all(shape is not None and shape[0] == BATCH for shape in told)
    told.clear()
    probing.extract(minilm, same[:-1] + ["a much longer sentence than the others , with many more tokens ."],
                    max_len=MAX_LEN, batch_size=BATCH, cache=False, progress=False, layout="padded")
    assert told == [None]


@pytest.mark.slow
def test_features_under_fast_constant_heads_read_nothing_per_batch(minilm, counter, device_routes):
    """The curve's feature passes: half the heads replaced by PAPA constants, skipping their work
    (fast=True), each layer's constant made from the replaced heads' indices on the host."""
    texts = texts_for(minilm)
    constants = papa.fit(minilm, texts, max_len=MAX_LEN, progress=False)
    hooks = papa.hooks(constants, heads=0.5, fast=True)

    def job(t):
        return probing.extract(minilm, t, hooks=hooks, max_len=MAX_LEN, batch_size=BATCH, cache=False,
                               progress=False)

    per_batch, grew, (_, features) = growth(counter, job, texts)
    assert per_batch <= FORWARD_READS, grew
    devices.reads_are_free = lambda where: True  # the CPU route: the same vectors
    on_cpu = job(texts)
    torch.testing.assert_close(features.vectors, on_cpu.vectors, rtol=0, atol=FLOAT32)


@pytest.mark.slow
def test_effective_statistics_read_once_per_batch(minilm, counter, device_routes):
    texts = texts_for(minilm)
    per_batch, grew, (_, on_device) = growth(
        counter, lambda t: effective.statistics(minilm, t, max_len=MAX_LEN, batch_size=BATCH, progress=False),
        texts)
    assert per_batch <= FORWARD_READS + EFFECTIVE_READS, grew
    # the device routes (a stack of each batch's layers) give the CPU routes' (layer by layer)
    devices.reads_are_free = lambda where: True
    on_cpu = effective.statistics(minilm, texts, max_len=MAX_LEN, batch_size=BATCH, progress=False)
    numbers = on_cpu.table.select_dtypes("number").columns
    difference = (on_device.table[numbers] - on_cpu.table[numbers]).abs().max().max()
    assert difference <= FLOAT32, difference


def test_effective_run_reads_do_not_grow_with_the_batch(minilm, counter, device_routes):
    texts = [text for text in texts_for(minilm) if len(minilm.tokenizer(text)["input_ids"]) > 40][:4]
    batches = {n: attnlens.tokenize(minilm, texts * n, max_len=48) for n in (2, 4)}
    _, few = counter.count(lambda: effective.run(minilm, batches[2]))
    _, many = counter.count(lambda: effective.run(minilm, batches[4]))
    assert sum(many.values()) == sum(few.values()), (few, many)


@pytest.mark.slow
def test_head_importance_reads_nothing_per_batch(minilm, counter, device_routes):
    """Michel et al.'s importance pass (a backward per batch): the loss's finiteness is noted on
    the device and read with the result, not per batch."""
    from attnlens import ablation

    texts = texts_for(minilm)
    per_batch, grew, _ = growth(counter, lambda t: ablation.importance(
        minilm, t, loss=lambda output, batch: output.float().logsumexp(-1).mean(-1), max_len=MAX_LEN,
        batch_size=BATCH, progress=False), texts)
    assert per_batch <= FORWARD_READS, grew


@pytest.mark.slow
def test_syntactic_heads_read_nothing_per_batch(minilm, counter, device_routes):
    """Clark et al.'s dependency pass: each batch's gold arcs and their counts are found on the
    host's copy of its tokens (the UD English EWT dev sentences, as many as the texts given)."""
    from attnlens.methods import syntax
    from tests.conftest import data_file

    path = data_file("ud_english_ewt/en_ewt-ud-dev.conllu")
    per_batch, grew, _ = growth(counter, lambda t: syntax.dependency_heads(
        minilm, path, limit=len(t), max_len=64, batch_size=BATCH, progress=False), texts_for(minilm))
    assert per_batch <= FORWARD_READS, grew


@pytest.mark.parametrize("kind", ["causal", "mlm"])
def test_lm_score_reads_nothing_per_batch(counter, device_routes, kind):
    bridge = tiny.gpt2_bridge() if kind == "causal" else tiny.bert_bridge()
    texts = attnlens.core.corpus.default_corpus(2 * N_BATCHES * BATCH)
    per_batch, grew, _ = growth(
        counter, lambda t: scorer.score(bridge, t, kind=kind, max_len=MAX_LEN, batch_size=BATCH, progress=False),
        texts)
    assert per_batch <= (DECODER_FORWARD_READS if kind == "causal" else FORWARD_READS), grew


@pytest.fixture
def device_reads(monkeypatch):
    """A :class:`Counter` of reads of :class:`DeviceTensor`\\ s alone: a probe's index metadata
    (lengths, positions, targets, the examples' order) is the host's, and read there freely."""
    counting = Counter(device_only=True)
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counting.wrap(name))
    return counting


def _probe_features(kind: str, n: int) -> tuple[probing.Features, list]:
    """``n`` examples of random features of ``kind`` (3 layers × 8, ``max_len`` 12), their
    vectors a :class:`DeviceTensor`, and labels."""
    generator = torch.Generator().manual_seed(n)
    n_words = torch.randint(1, 9, (n,), generator=generator)
    lengths = torch.minimum(n_words, torch.randint(1, 9, (n,), generator=generator))
    positions = torch.cat([torch.arange(int(k)) for k in lengths])
    if kind == "masked":
        positions = torch.randint(0, 50, positions.shape, generator=generator)  # the masked tokens' ids
    labels = (torch.randint(0, 3, (n,), generator=generator).tolist() if kind == "sequence"
              else [torch.randint(0, 3, (int(k),), generator=generator).tolist() for k in n_words])
    vectors = torch.randn(int(lengths.sum()), 3, 8, generator=generator).half().as_subclass(DeviceTensor)
    return probing.Features(vectors, lengths, positions, n_words if kind == "words" else torch.zeros(0, dtype=torch.long),
                            kind, 12), labels


@pytest.mark.parametrize("job", ["probe", "probe, words", "stacked probes", "MLM head"])
def test_probe_training_reads_nothing_per_step(device_reads, job):
    """A probe's training steps (a single :class:`PapaProbe`, the stacked probes of the curve and
    of ``compare --task``, the MLM probe's head) read nothing of the device: the same reads on
    2n examples as on n (twice the steps, 2 epochs of batches of 8), none per step. Their index
    arithmetic is the host's (:class:`probing.Features` keeps its metadata there) and each step's
    indices reach the device in one copy that does not wait (:func:`attnlens.core.devices.to_device`);
    early stopping's judging reads once per 256 held-out examples an epoch, and is off here."""
    from attnlens.evaluation.probing.mlm import MLMHead
    from attnlens.evaluation.probing.stacked import fit_many

    kind = {"probe, words": "words", "MLM head": "masked"}.get(job, "sequence")
    settings = dict(hidden=16, epochs=2, batch_size=8, lr=1e-2)

    def fit(n: int):
        features, labels = _probe_features(kind, n)
        if job == "MLM head":
            return MLMHead(epochs=2, batch_size=8).fit(features, 50)
        if job == "stacked probes":
            return fit_many([probing.PapaProbe(seed=seed, **settings) for seed in range(3)], features, labels)
        return probing.PapaProbe(**settings).fit(features, labels)

    few = device_reads.count(lambda: fit(64))[1]
    many = device_reads.count(lambda: fit(128))[1]
    grew = {site: many[site] - few[site] for site in many if many[site] > few[site]}
    assert not grew, grew


@pytest.mark.parametrize("no_read_width", [0, 64])
def test_effective_device_route_equals_the_cpu_route(monkeypatch, no_read_width):
    """The device route of effective attention (every sequence decomposed; the float64 fallback
    of the heads that need it after one read, or, for heads up to NO_READ_WIDTH wide, of every
    head, chosen by ``torch.where``) gives the CPU route's maps exactly: each matrix goes through
    the same kernels; only which ones are kept differs."""
    from attnlens.engine import effective as engine

    monkeypatch.setattr(engine, "NO_READ_WIDTH", no_read_width)
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for n_keys, lengths, d_head in ((40, [40, 20, 33, 0], 32), (12, [12, 5, 9, 1], 8), (56, [56, 20, 41, 0], 40)):
            v = torch.randn(4, 3, n_keys, d_head, generator=generator, dtype=dtype)
            mask = torch.arange(n_keys)[None] < torch.tensor(lengths)[:, None]
            logits = torch.randn(4, 3, n_keys, n_keys, generator=generator, dtype=dtype)
            pattern = logits.masked_fill(~mask[:, None, None], -torch.inf).softmax(-1).nan_to_num(0.0)
            for rtol in (None, 1e-3, 1e-7):
                cpu = engine.effective_attention(pattern, v, key_mask=mask, rtol=rtol)
                use_qr = dtype == torch.float64 or (rtol is not None and rtol < engine.GRAM_MIN_RTOL)
                device = engine._on_device(pattern, v, mask, mask.sum(-1), rtol, use_qr)
                assert torch.equal(device, cpu), (dtype, n_keys, rtol)
    # a rank-deficient V (its last 20 keys repeat the first 20): the float64 fallback is taken
    v = torch.randn(2, 2, 40, 32, generator=generator)
    v[:, :, 20:] = v[:, :, :20]
    pattern = torch.randn(2, 2, 40, 40, generator=generator).softmax(-1)
    mask = torch.ones(2, 40, dtype=torch.bool)
    cpu = engine.effective_attention(pattern, v, key_mask=mask)
    assert torch.equal(engine._on_device(pattern, v, mask, mask.sum(-1), None, False), cpu)


def test_effective_device_route_reads_once_unless_every_head_gets_the_exact_basis(counter, monkeypatch):
    """By default (NO_READ_WIDTH 0) the device route reads once whether any head needs the exact
    basis, and computes it for none of the heads that do not; heads up to NO_READ_WIDTH wide
    read nothing (every head's exact basis computed, taken by ``torch.where``)."""
    from attnlens.engine import bases
    from attnlens.engine import effective as engine

    generator = torch.Generator().manual_seed(2)
    exact = []
    original = bases.basis_exact
    monkeypatch.setattr(bases, "basis_exact", lambda v64, tolerance: exact.append(len(v64)) or original(v64, tolerance))
    for no_read_width, d_head, reads in ((0, 32, 1), (32, 32, 0), (32, 40, 1)):
        monkeypatch.setattr(engine, "NO_READ_WIDTH", no_read_width)
        exact.clear()
        n_keys = 2 * d_head
        v = torch.randn(2, 3, n_keys, d_head, generator=generator)
        pattern = torch.randn(2, 3, n_keys, n_keys, generator=generator).softmax(-1)
        mask = torch.ones(2, n_keys, dtype=torch.bool)
        arguments = (pattern, v, mask, mask.sum(-1), None, False)
        _, counted = counter.count(lambda arguments=arguments: engine._on_device(*arguments))
        assert sum(counted.values()) == reads, (no_read_width, d_head, counted)
        assert exact == ([] if reads else [6]), exact  # well-conditioned heads: none needs it


def test_compact_widths_in_buckets_change_no_result(minilm, monkeypatch):
    """Off the CPU a pass rounds compact widths up to a multiple of 16 (few distinct shapes):
    padding columns, which every accumulator masks, so the same sums up to float32 rounding of
    the batch sums (``FLOAT32``) and the same counts."""
    texts = texts_for(minilm)[:48]
    plain = papa.fit(minilm, texts, max_len=MAX_LEN, batch_size=BATCH, progress=False)
    widths = []
    original = stage_batch

    def seen(*args, **kwargs):
        staged = original(*args, **kwargs)
        widths.append(staged.batch.input_ids.shape[1])
        return staged

    monkeypatch.setattr(passes, "stage_batch", seen)
    monkeypatch.setattr(devices, "width_multiple", lambda where: 16)
    bucketed = papa.fit(minilm, texts, max_len=MAX_LEN, batch_size=BATCH, progress=False)
    assert set(widths) <= {16, MAX_LEN} and len(widths) == len(texts) // BATCH
    assert torch.equal(plain.pair_counts, bucketed.pair_counts) and plain.n_tokens == bucketed.n_tokens
    assert torch.allclose(plain.sums, bucketed.sums, rtol=0, atol=FLOAT32)


def test_the_weights_fingerprint_reads_the_device_once(minilm, counter, device_routes, monkeypatch):
    """The fingerprint of a model's weights (checked by every pass and by PAPA constants at each
    use) samples every parameter on its device and reads the samples in one copy, not one a
    parameter; the same digest as the CPU route's."""
    from attnlens.core.fingerprints import weights_fingerprint

    fingerprint, sites = counter.count(lambda: weights_fingerprint(minilm))
    assert sum(sites.values()) <= 2, sites  # one packed copy: its .cpu() and .numpy()
    monkeypatch.setattr(devices, "reads_are_free", lambda where: True)
    assert weights_fingerprint(minilm) == fingerprint
