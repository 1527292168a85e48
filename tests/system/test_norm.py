"""Norm-based attention (Kobayashi et al. 2020) through ``attnlens.maps``, against a per-head loop
over ``run_with_cache``'s value vectors and the weights ``W_O``, on tiny random encoders and
decoders (a Llama with 6 query heads sharing 2 key-value heads among them); and the view in
``attnlens.compare`` and its HTML report."""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens.core import devices
from attnlens.core.inputs import default_layout
from attnlens.errors import InputError
from tests import tiny
from tests.system import test_host_reads as host_reads
from tests.typechecks import unchecked

U32 = 2.0**-24  # float32's unit roundoff
MAX_LEN = 24
#: tests/system/test_host_reads.py's fixtures: host reads counted, device routes on the CPU
counter, device_routes = host_reads.counter, host_reads.device_routes


MODELS = {
    "bert": tiny.bert_bridge,
    "roberta": lambda: attnlens.load(tiny.tiny_roberta(), tokenizer=tiny.roberta_tokenizer()),
    "gpt2": tiny.gpt2_bridge,
    "llama-gqa": tiny.llama_bridge,
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


def loop_reference(model, batch):
    """Per layer and query head, in float64: ``α_h[i, j] · ‖v_j,g(h) W_O,h‖`` on the valid keys,
    from ``run_with_cache``'s ``hook_v`` (``x W_V + b_V``, ``[batch, key, kv_head, d_head]``) and
    ``model.blocks[l].attn.W_O``; and an elementwise bound on the float32 error of each entry.

    The bound: attnlens computes ``‖W_O,hᵀ v‖`` as ``‖R_h v‖`` from a float32 Householder QR
    ``W_O,hᵀ = Q_h R_h``. Its backward error, the product ``R_h v`` and the norm each add at most
    about ``n · u · ‖W_O,h‖₂ · ‖v‖`` (``n`` the length of the sums: ``d_model`` in the QR,
    ``d_head`` in the product and the norm; ``u = 2⁻²⁴``), and the product with ``α`` one ``u``
    relatively: ``|error| ≤ α · (d_model + 2 · d_head + 2) · u · ‖W_O,h‖₂ · ‖v‖``."""
    _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
    keys = batch.attention_mask.double()  # [batch, key]
    raw, bound = [], []
    for layer in range(model.cfg.n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        values = cache[f"blocks.{layer}.attn.hook_v"].double()
        weights = model.blocks[layer].attn.W_O.double()
        n_heads, d_head, d_model = weights.shape
        group = n_heads // values.shape[2]
        heads_raw, heads_bound = [], []
        for head in range(n_heads):
            v = values[:, :, head // group]  # [batch, key, d_head]: query head h reads kv head h // group
            norms = torch.linalg.vector_norm(v @ weights[head], dim=-1)  # [batch, key]
            spread = (d_model + 2 * d_head + 2) * U32 * torch.linalg.matrix_norm(weights[head], ord=2)
            heads_raw.append(pattern[:, head] * (norms * keys)[:, None, :])
            heads_bound.append(pattern[:, head].abs() * (spread * torch.linalg.vector_norm(v, dim=-1) * keys)[:, None, :])
        raw.append(torch.stack(heads_raw, 1))
        bound.append(torch.stack(heads_bound, 1))
    return torch.stack(raw), torch.stack(bound)


def normalised(raw, bound):
    """Rows of ``raw`` divided by their sums, and the bound carried through the division:
    ``δ(r/S) ≤ (δr + (r/S) · Σ δr) / S``, plus the float32 rounding of the sum of ``key`` terms
    and of the division (``(key + 1) · u`` relatively)."""
    total = raw.sum(-1, keepdim=True)
    rows = torch.where(total > 0, raw / total, torch.zeros_like(raw))
    spread = (bound + rows * bound.sum(-1, keepdim=True)) / total.clamp_min(1e-300)
    return rows, spread + (raw.shape[-1] + 1) * U32 * rows


def test_maps_equal_the_per_head_loop(model):
    batch = attnlens.tokenize(model, tiny.CORPUS[:4], max_len=MAX_LEN, layout=default_layout(model))
    assert not batch.attention_mask.bool().all(), "the batch must hold padding"
    got_raw = attnlens.maps(model, batch, "norm", raw=True)
    got = attnlens.maps(model, batch, "norm")
    raw, bound = loop_reference(model, batch)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    assert got.shape == got_raw.shape == (n_layers, len(batch), n_heads, batch.input_ids.shape[1], batch.input_ids.shape[1])
    assert got.dtype == got_raw.dtype == torch.float32
    assert bool(((got_raw.double() - raw).abs() <= bound).all()), float(((got_raw.double() - raw).abs() - bound).max())
    rows, spread = normalised(raw, bound)
    assert bool(((got.double() - rows).abs() <= spread).all()), float(((got.double() - rows).abs() - spread).max())
    valid = batch.attention_mask.bool()
    sums = got.sum(-1)[valid[None, :, None, :].expand(n_layers, -1, n_heads, -1)]  # the valid query rows
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=(valid.shape[1] + 1) * U32 * 4)


def test_other_views_through_maps(model):
    """``maps`` reads every registered view the same way: the standard view is the cached pattern,
    effective attention is attnlens.methods.effective.run's."""
    from attnlens.methods import effective

    batch = attnlens.tokenize(model, tiny.CORPUS[:3], max_len=MAX_LEN, layout=default_layout(model))
    _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
    standard = attnlens.maps(model, batch, "standard")
    expected = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(model.cfg.n_layers)])
    torch.testing.assert_close(standard, expected, rtol=0, atol=0)
    torch.testing.assert_close(attnlens.maps(model, batch, "effective"), effective.run(model, batch).effective,
                               rtol=0, atol=0)


def test_maps_refuses_what_it_cannot_read():
    model = tiny.bert_bridge()
    batch = attnlens.tokenize(model, tiny.CORPUS[:2], max_len=MAX_LEN)
    with pytest.raises(InputError, match="the view 'standard' has no raw maps.*raw=True is for 'norm'"):
        attnlens.maps(model, batch, "standard", raw=True)
    with pytest.raises(InputError, match="Unknown view 'rollout'"):
        attnlens.maps(model, batch, "rollout")
    with pytest.raises(InputError, match=r"the 'papa' view is given to maps by its value, not its name: pass "
                                         r"the PAPA constants themselves"):
        attnlens.maps(model, batch, "papa")  # the constants themselves are the view
    with unchecked(), pytest.raises(TypeError, match="attnlens.maps takes a Batch"):
        attnlens.maps(model, ["a text"], "norm")


@pytest.mark.slow
def test_compare_draws_norm_beside_papa_and_effective(tmp_path):
    model = tiny.bert_bridge()
    comparison = attnlens.compare(model, "papa", "effective", "norm", corpus=tiny.CORPUS[:8], max_len=MAX_LEN,
                                  progress=False)
    assert comparison.views == ("standard", "papa", "effective", "norm")
    table = comparison.table
    assert table["view"].value_counts().to_dict() == {view: 2 * 4 for view in comparison.views}
    norm = table[table["view"] == "norm"]
    assert not norm.isna().any().any() and ((norm["sink"] >= 0) & (norm["sink"] <= 1)).all()
    assert "patterns_norm" in comparison.figures
    assert [trace.name for trace in comparison.figures["to_cls"].data] == list(comparison.views)
    text = comparison.save_html(tmp_path / "report.html").read_text(encoding="utf-8")
    assert "norm attention of every head" in text and text.count("Plotly.newPlot") == len(comparison.figures)


@pytest.mark.slow
def test_a_pass_over_norm_reads_nothing_per_batch(minilm, counter, device_routes):
    """The statistics of the norm view (sink included) over a corpus, with every branch on its
    device route: no host read per batch beyond the model's own forward (tests/system/test_host_reads.py's
    harness); and the device routes give the CPU routes' means."""
    from attnlens.engine import passes
    from attnlens.methods.stats import Statistics

    def job(texts):
        statistics = Statistics(minilm.cfg.n_layers, minilm.cfg.n_heads, "norm")
        passes.run(minilm, texts, [statistics], max_len=host_reads.MAX_LEN, batch_size=host_reads.BATCH,
                   progress=False)
        return statistics.result()

    texts = host_reads.texts_for(minilm)
    per_batch, grew, (_, on_device) = host_reads.growth(counter, job, texts)
    assert per_batch <= host_reads.FORWARD_READS, grew
    devices.reads_are_free = lambda where: True  # restored by device_routes' monkeypatch
    on_cpu = job(texts[: 2 * host_reads.N_BATCHES * host_reads.BATCH])
    for name, means in on_device.items():
        assert (means - on_cpu[name]).abs().max() <= host_reads.FLOAT32, name


def test_the_docs_page_runs():
    """docs/norm.md's example, as written."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "norm.md"
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        exec(compile(block, "docs/norm.md", "exec"), namespace)
    norm, raw, weights = namespace["norm"], namespace["raw"], namespace["weights"]
    assert norm.shape == raw.shape == weights.shape and norm.shape[:3] == (6, 2, 12)
    keys = namespace["batch"].attention_mask.bool()[None, :, None, None, :]
    assert torch.equal(raw > 0, (weights > 0) & keys)  # α·‖f‖: the weights' support on the real keys
