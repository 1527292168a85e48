"""The same analyses on CPU and on CUDA agree (skipped without a CUDA GPU).

``pytest.mark.skipif`` skips these tests on a machine without CUDA, also under ``CI=true``:
:func:`tests.conftest.required` (which fails a missing requirement in CI) is not involved, since
a CI machine without a GPU lacks nothing the project promises it.

Tolerance: both devices run the same float32 computation in other summation orders (cuBLAS and
CPU BLAS block differently; TF32 is off for matmuls by default). A dot product of ``k`` terms may
then differ by ``γ_k · Σ|terms|`` (:func:`tests.precision.float32_sum_error`); to first order each
layer passes on such a relative error, the widest being the MLP's (``k = d_mlp``), so activations
agree to ``n_layers · γ_{d_mlp}`` of their magnitude. Pattern entries are at most 1 in magnitude,
so statistics that average them (and the PAPA constants, averages of patterns) agree to that
absolutely; entropies (at most ``log n``) to ``log n`` times that.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core.fingerprints import checksum, weights_fingerprint
from attnlens.evaluation.probing import LinearBaseline
from attnlens.evaluation.probing.baseline import design
from attnlens.evaluation.probing.features import Features
from tests.precision import float32_sum_error
from tests.unit.test_torch_baseline import _features as random_features

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

MAX_LEN = 32


@pytest.fixture(scope="module")
def cuda_minilm():
    return attnlens.load(device="cuda")


def tolerance(model) -> float:
    return int(model.cfg.n_layers) * float32_sum_error(int(model.cfg.d_mlp))


def test_compare_agrees_on_cpu_and_cuda(minilm, cuda_minilm, sst2_sentences):
    texts = sst2_sentences[:24]
    cpu = attnlens.compare(minilm, "papa", "effective", corpus=texts, max_len=MAX_LEN, progress=False)
    gpu = attnlens.compare(cuda_minilm, "papa", "effective", corpus=texts, max_len=MAX_LEN, progress=False)
    atol = tolerance(minilm)
    for column in ("to_cls", "to_sep", "to_punct", "to_self", "to_prev", "to_next", "distance_from_standard"):
        for view in ("standard", "papa"):
            assert abs(cpu.grid(column, view) - gpu.grid(column, view)).max() <= atol, (column, view)
    entropy = abs(cpu.grid("entropy") - gpu.grid("entropy")).max()
    assert entropy <= atol * math.log(MAX_LEN)


def test_papa_constants_agree_on_cpu_and_cuda(minilm, cuda_minilm, sst2_sentences):
    cpu = papa.fit(minilm, sst2_sentences[:32], max_len=MAX_LEN, progress=False)
    gpu = papa.fit(cuda_minilm, sst2_sentences[:32], max_len=MAX_LEN, progress=False)
    torch.testing.assert_close(gpu.mean.cpu().double(), cpu.mean.double(), atol=tolerance(minilm), rtol=0)


@pytest.mark.parametrize("heads", [0.5, 1.0])
def test_fast_constant_heads_agree_on_cpu_and_cuda(minilm, cuda_minilm, sst2_sentences, heads):
    constants = papa.fit(minilm, sst2_sentences[:32], max_len=MAX_LEN, progress=False)
    batch = attnlens.tokenize(minilm, sst2_sentences[100:108], max_len=MAX_LEN)
    outputs = {}
    for name, model in (("cpu", minilm), ("cuda", cuda_minilm)):
        for fast in (False, True):
            on = batch.to(model.cfg.device)
            with torch.no_grad(), papa.intervention(model, constants, heads=heads, fast=fast):
                outputs[name, fast] = model(on.input_ids, **on.model_kwargs()).cpu()
    scale = float(outputs["cpu", False].abs().max())
    atol = tolerance(minilm) * scale
    torch.testing.assert_close(outputs["cuda", True], outputs["cuda", False], atol=atol, rtol=0)
    torch.testing.assert_close(outputs["cuda", True], outputs["cpu", True], atol=atol, rtol=0)


def test_load_puts_the_model_on_cuda_by_default():
    model = attnlens.load()
    assert next(model.parameters()).device.type == "cuda"


def _synchronisations(job) -> list[str]:
    """The messages of CUDA's synchronisation detector (``torch.cuda.set_sync_debug_mode``) while
    ``job`` runs: one per call that made the host wait for the device."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            job()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{item.filename.rsplit('site-packages/', 1)[-1]}:{item.lineno}"
            for item in caught if "synchroniz" in str(item.message).lower()]


@pytest.mark.parametrize("job", ["papa.fit", "compare", "compare, fitting its constants", "features",
                                 "features, fast constant heads", "effective.statistics"])
def test_a_pass_synchronises_no_more_per_batch_than_its_forward(cuda_minilm, job):
    """On n and 2n batches of 8 texts, the synchronisations may grow by one per batch, or by as
    many as a plain forward of the same batches makes if that is more (on an encoder behind the
    seam the forward waits for nothing: its mask is always made); the sites that grew are named."""
    from attnlens.core.corpus import default_corpus
    from attnlens.evaluation import probing
    from attnlens.methods import effective

    texts = default_corpus(128)
    constants = papa.fit(cuda_minilm, texts, max_len=MAX_LEN, progress=False)

    def forward(t):
        for start in range(0, len(t), 8):
            batch = attnlens.tokenize(cuda_minilm, t[start : start + 8], max_len=MAX_LEN).to("cuda")
            with torch.inference_mode():
                cuda_minilm(batch.input_ids, **batch.model_kwargs())

    jobs = {
        "papa.fit": lambda t: papa.fit(cuda_minilm, t, max_len=MAX_LEN, batch_size=8, progress=False),
        "compare": lambda t: attnlens.compare(cuda_minilm, "papa", "effective", corpus=t, constants=constants,
                                              batch_size=8, progress=False),
        # the fit's pass recorded on the GPU, the comparison's replayed (attnlens.engine.recording)
        "compare, fitting its constants": lambda t: attnlens.compare(cuda_minilm, "papa", "effective", corpus=t,
                                                                     max_len=MAX_LEN, batch_size=8, progress=False),
        "features": lambda t: probing.extract(cuda_minilm, t, max_len=MAX_LEN, batch_size=8, cache=False,
                                              progress=False),
        "features, fast constant heads": lambda t: probing.extract(
            cuda_minilm, t, hooks=papa.hooks(constants, heads=0.5, fast=True), max_len=MAX_LEN, batch_size=8,
            cache=False, progress=False),
        "effective.statistics": lambda t: effective.statistics(cuda_minilm, t, max_len=MAX_LEN, batch_size=8,
                                                               progress=False),
    }

    def growth(function):
        few = collections.Counter(_synchronisations(lambda: function(texts[:64])))
        many = collections.Counter(_synchronisations(lambda: function(texts[:128])))
        return many.total() - few.total(), {site: many[site] - few[site] for site in many if many[site] > few[site]}

    allowed, _ = growth(forward)
    grew, sites = growth(jobs[job])
    assert grew <= max(allowed, 8), (grew, allowed, sites)


def test_probes_train_where_the_model_is(cuda_minilm, sst2_sentences):
    """Features come back with their vectors on the model's device (the index metadata on the
    host), and every learner trains there: a single probe, the stacked probes of run_many (points
    and seeds), the epoch selector, the linear baseline (the torch solver) and the MLM probe."""
    from attnlens.evaluation import probing
    from attnlens.evaluation.lm import scorer
    from attnlens.evaluation.probing import PapaProbe
    from attnlens.methods import interventions
    from tests.conftest import DATA

    features = probing.extract(cuda_minilm, sst2_sentences[:40], max_len=MAX_LEN, cache=False, progress=False)
    assert features.vectors.device.type == "cuda" and features.lengths.device.type == "cpu"
    labels = [index % 2 for index in range(40)]
    probe = PapaProbe(epochs=2, early_stopping=True, progress=False).fit(features, labels)
    assert probe.network.dense.weight.device.type == "cuda" and len(probe.predict(features)) == 40
    constants = papa.fit(cuda_minilm, sst2_sentences[:64], max_len=64, progress=False)
    hooks = [(), interventions.build("papa", cuda_minilm, "all", constants=constants)]
    results = probing.run_many(cuda_minilm, "sst2", hooks, data_dir=DATA, train_limit=300, eval_limit=200,
                               max_len=64, layout=constants.layout, seeds=2, resamples=100, progress=False)
    assert results[0].score > results[0].majority and results[0].linear.solver_ == "torch"
    paragraphs = [line for line in sst2_sentences if len(line) > 80][:60]
    score = scorer.evaluate(cuda_minilm, paragraphs[:40], eval_texts=paragraphs[40:], max_len=MAX_LEN, progress=False)
    assert score.kind == "probe" and math.isfinite(score.value)


def test_host_tensors_reach_the_gpu_in_one_copy():
    """devices.to_device: the token-derived tensors a pass computes on the host arrive on the
    GPU as views of one buffer, with their values (bytes copied: equal bit for bit)."""
    from attnlens.core import devices

    tree = {"mask": torch.tensor([[True, False]]), "ids": [torch.arange(5)], "chance": torch.rand(3, dtype=torch.float64)}
    moved = devices.to_device(tree, torch.device("cuda"))
    leaves: list = []
    devices._leaves(moved, leaves)
    assert {leaf.device.type for leaf in leaves} == {"cuda"}
    assert len({leaf.untyped_storage().data_ptr() for leaf in leaves}) == 1
    assert torch.equal(moved["mask"].cpu(), tree["mask"]) and torch.equal(moved["ids"][0].cpu(), tree["ids"][0])
    assert torch.equal(moved["chance"].cpu(), tree["chance"])


def test_features_on_a_gpu_are_fitted_there_by_default():
    """The linear baseline of features on a GPU: the torch solver there, the choice and the
    predictions of the same fit on the CPU (tests/unit/test_torch_baseline.py has the rest)."""
    features, labels = random_features("words")
    on_gpu = Features(features.vectors.cuda(), features.lengths.cuda(), features.positions.cuda(),
                      features.n_words.cuda(), features.kind, features.max_len)
    baseline = LinearBaseline(grid=[0.01, 0.1, 1.0]).fit(on_gpu, labels)
    assert baseline.solver_ == "torch" and baseline.model.coef.device.type == "cuda"
    assert design(on_gpu, tensor=True).device.type == "cuda"
    on_cpu = LinearBaseline(grid=[0.01, 0.1, 1.0], solver="torch").fit(features, labels)
    assert baseline.C == on_cpu.C
    assert baseline.predict(on_gpu) == on_cpu.predict(features) == baseline.predict(features)


def test_the_weights_fingerprint_is_the_same_on_cuda(minilm, cuda_minilm):
    """The fingerprint is exact integer arithmetic (:func:`attnlens.core.fingerprints.checksum`):
    the same digest on both devices, so constants fitted on one are accepted on the other and
    the features cache is shared; every parameter's checksum too, equal to the CPU's, rounded to
    float16 and of every bit."""
    assert weights_fingerprint(cuda_minilm) == weights_fingerprint(minilm)
    assert weights_fingerprint(cuda_minilm, exact=True) == weights_fingerprint(minilm, exact=True)
    for (name, cpu), (_, gpu) in zip(minilm.original_model.named_parameters(),
                                     cuda_minilm.original_model.named_parameters(), strict=True):
        assert checksum(gpu).cpu().tolist() == checksum(cpu).tolist(), name
        assert checksum(gpu, exact=True).cpu().tolist() == checksum(cpu, exact=True).tolist(), name
