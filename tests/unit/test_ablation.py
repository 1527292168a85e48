"""Head ablation and importance (Michel et al. 2019): each mode against its definition, the
importance against finite differences, and pruning by importance on MiniLM with SST-2.

Tolerances:

- "zero" and "mean" set z exactly, "uniform" computes 1/n_valid as the division the reference
  does: compared with ``torch.equal``;
- zeroing z vs zeroing the pattern rows: both give the head's output exactly 0 (0 · V = 0); the
  logits go through the same float32 operations, so they agree to float32 rounding (≤ 1e-6);
- head means vs a plain loop over single examples: float32 z per token (computed in batches of
  3 vs of 1: each z entry differs by float32 rounding of its dot products, relative ~1e-6), summed
  in float64: ``rtol=1e-5``;
- importance vs finite differences, both in float64 (see :func:`test_importance_is_the_gradient`).
"""

from __future__ import annotations

import math

import pytest
import torch

import attnlens
from attnlens import ablation, papa
from attnlens.core.heads import HeadSet
from attnlens.engine.forward import run_with_hooks, value_hook, values_per_kv_head
from attnlens.evaluation import probing, tasks
from attnlens.evaluation.lm.masks import mlm_masks
from attnlens.evaluation.lm.scorer import UntrainedHead
from tests import tiny
from tests.conftest import DATA, data_file
from tests.typechecks import unchecked

MAX_LEN = 32
U64 = 2.0**-53


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """Probe features of this module in their own cache folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLENS_CACHE", str(tmp_path_factory.mktemp("ablation-cache")))
        yield


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def gpt2():
    return tiny.gpt2_bridge()


def padded(model, texts=tiny.CORPUS[:3]):
    batch = attnlens.tokenize(model, list(texts), max_len=MAX_LEN, layout="padded")
    assert not batch.attention_mask.bool().all(), "the batch must contain padding"
    return batch


def run(model, batch, fwd_hooks=(), record=()):
    """Logits under ``fwd_hooks`` and what the hook points ``record`` carried after them."""
    seen = {}

    def keep(tensor, hook, name=None):
        seen[name] = tensor.detach().clone()

    extra = [(name, lambda tensor, hook, name=name: keep(tensor, hook, name)) for name in record]
    with torch.no_grad():
        logits = run_with_hooks(model, batch, [*fwd_hooks, *extra])
    return logits, seen


def z_names(model):
    return [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]


def pattern_names(model):
    return [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]


HEADS = [(0, 1), (1, 3)]


# ------------------------------------------------------------------------------------------------
# modes


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_zero_mode_zeroes_the_heads_output_only(family, bert, gpt2):
    model = {"bert": bert, "gpt2": gpt2}[family]
    batch = padded(model)
    heads = HeadSet.from_heads(HEADS, 2, 4)
    plain, before = run(model, batch, record=z_names(model))
    ablated, after = run(model, batch, ablation.hooks(heads, "zero", model=model), record=z_names(model))
    for layer, head in HEADS:
        z = after[f"blocks.{layer}.attn.hook_z"]
        assert z.shape[2:] == (4, 8)
        assert torch.equal(z[:, :, head], torch.zeros_like(z[:, :, head]))
    # layer 0's other heads read the unchanged input: exactly the model's
    others = [0, 2, 3]
    assert torch.equal(after["blocks.0.attn.hook_z"][:, :, others], before["blocks.0.attn.hook_z"][:, :, others])
    assert (ablated - plain).abs().max() > 1e-4, "the ablation must reach the logits"


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_zeroing_z_equals_zeroing_the_pattern_rows(family, bert, gpt2):
    model = {"bert": bert, "gpt2": gpt2}[family]
    batch = padded(model)
    heads = HeadSet.from_heads(HEADS, 2, 4)

    def zero_rows(pattern, hook):
        layer = int(hook.name.split(".")[1])
        return pattern.masked_fill(heads.mask[layer][None, :, None, None], 0.0)

    by_z, _ = run(model, batch, ablation.hooks(heads, "zero", model=model))
    by_pattern, _ = run(model, batch, [(name, zero_rows) for name in pattern_names(model)])
    real = batch.attention_mask.bool()
    torch.testing.assert_close(by_z[real], by_pattern[real], atol=1e-6, rtol=0)


def test_uniform_mode_on_an_encoder(bert):
    batch = padded(bert)
    heads = HeadSet.from_heads([(0, 2)], 2, 4)
    names = ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z", value_hook(bert, 0)]
    plain, before = run(bert, batch, record=names)
    ablated, after = run(bert, batch, ablation.hooks(heads, "uniform", model=bert), record=names)
    valid = batch.attention_mask.float()
    expected = (valid / valid.sum(-1, keepdim=True))[:, None, :].expand(-1, valid.shape[1], -1)
    pattern = after["blocks.0.attn.hook_pattern"]
    assert torch.equal(pattern[:, 2], expected)  # exactly 1 / n_valid on every valid key, 0 on padding
    assert torch.equal(pattern[:, [0, 1, 3]], before["blocks.0.attn.hook_pattern"][:, [0, 1, 3]])
    # the edit reaches the computation: the head's output is the mean of its values over real keys
    v = values_per_kv_head(bert, after[names[2]])[:, 2]  # [batch, key, d_head]
    mean_v = (v * valid[..., None]).sum(1) / valid.sum(1)[:, None]
    z = after["blocks.0.attn.hook_z"][:, :, 2]
    torch.testing.assert_close(z, mean_v[:, None].expand_as(z), rtol=1e-5, atol=1e-6)
    assert not torch.equal(ablated, plain)  # a tiny random head is near uniform already: any change


def test_uniform_mode_on_a_decoder_is_causal(gpt2):
    batch = padded(gpt2)
    heads = HeadSet.from_heads([(1, 0)], 2, 4)
    name = "blocks.1.attn.hook_pattern"
    plain, _ = run(gpt2, batch)
    ablated, after = run(gpt2, batch, ablation.hooks(heads, "uniform", model=gpt2), record=[name])
    valid = batch.attention_mask.bool()
    n = valid.shape[1]
    allowed = (valid[:, None, :] & torch.ones(n, n, dtype=torch.bool).tril()).float()
    expected = allowed / allowed.sum(-1, keepdim=True)
    pattern = after[name][:, 0]
    assert torch.equal(pattern, expected)  # 1/(q+1) on keys <= q of real tokens, 0 after the query
    assert torch.equal(pattern.triu(1), torch.zeros_like(pattern))
    # causality read off the patterns (no model=) gives the same hooks' effect
    inferred, _ = run(gpt2, batch, ablation.hooks(heads, "uniform"))
    assert torch.equal(inferred, ablated)
    assert not torch.equal(ablated, plain)  # a tiny random head is near uniform already: any change


def test_mean_mode_uses_the_corpus_mean_of_each_head(bert):
    corpus = tiny.CORPUS[:7]
    means = ablation.head_means(bert, corpus, max_len=MAX_LEN, layout="padded", batch_size=3, progress=False)
    assert means.shape == (2, 4, 8) and means.dtype == torch.float32
    # reference: a plain loop, one example at a time, z of every real token summed in float64
    total, tokens = torch.zeros(2, 4, 8, dtype=torch.float64), 0
    for text in corpus:
        batch = attnlens.tokenize(bert, [text], max_len=MAX_LEN, layout="padded")
        _, seen = run(bert, batch, record=z_names(bert))
        real = batch.attention_mask.bool()
        for layer in range(2):
            total[layer] += seen[f"blocks.{layer}.attn.hook_z"][real].double().sum(0)
        tokens += int(real.sum())
    torch.testing.assert_close(means.double(), total / tokens, rtol=1e-5, atol=1e-7)

    heads = HeadSet.from_heads(HEADS, 2, 4)
    batch = padded(bert)
    _, after = run(bert, batch, ablation.hooks(heads, "mean", model=bert, means=means), record=z_names(bert))
    for layer, head in HEADS:
        z = after[f"blocks.{layer}.attn.hook_z"][:, :, head]
        assert torch.equal(z, means[layer, head].expand_as(z))


def test_papa_mode_is_papa_hooks(bert):
    constants = papa.fit(bert, tiny.CORPUS, max_len=MAX_LEN, progress=False)
    batch = attnlens.tokenize(bert, tiny.CORPUS[:4], max_len=MAX_LEN)  # the constants' layout
    heads = HeadSet.from_heads(HEADS, 2, 4)
    ours = ablation.hooks(heads, "papa", model=bert, constants=constants)
    expected, _ = run(bert, batch, papa.hooks(constants, heads=heads))
    got, _ = run(bert, batch, ours)
    plain, _ = run(bert, batch)
    assert torch.equal(got, expected) and not torch.equal(got, plain)
    assert ours.key() == f"ablation:papa:{papa.hooks(constants, heads=heads).key()}"


def test_keys_tell_interventions_apart(bert):
    heads = HeadSet.from_heads(HEADS, 2, 4)
    zero = ablation.hooks(heads, "zero", model=bert)
    assert zero.key() == ablation.hooks(heads, "zero", model=bert).key()
    assert zero.key() != ablation.hooks(HeadSet.from_heads([(0, 1)], 2, 4), "zero", model=bert).key()
    assert zero.key() != ablation.hooks(heads, "uniform", model=bert).key()
    means = torch.zeros(2, 4, 8)
    assert ablation.hooks(heads, "mean", means=means).key() != ablation.hooks(heads, "mean", means=means + 1).key()
    assert ablation.hooks(HeadSet.none(2, 4), "zero", model=bert) == []
    assert probing.hooks_key(zero) == zero.key()
    # (layer, head) pairs are their HeadSet, shaped by the model or by the means
    assert ablation.hooks(list(HEADS), "zero", model=bert).key() == zero.key()
    assert ablation.hooks(list(HEADS), "mean", means=means).key() == ablation.hooks(heads, "mean", means=means).key()


# ------------------------------------------------------------------------------------------------
# importance


def gated_loss(model, batch, layer, head, gate, reference_loss):
    """The reference loss with head ``(layer, head)``'s output z multiplied by ``gate``."""

    def scale(z, hook):
        z = z.clone()
        z[:, :, head] = z[:, :, head] * gate
        return z

    with torch.no_grad():
        return float(reference_loss(run(model, batch, [(f"blocks.{layer}.attn.hook_z", scale)])[0]))


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_importance_is_the_gradient(family):
    """Michel et al.'s I_h for one example is |∂L/∂ξ_h| at ξ = 1. Reference: central differences
    D(ε) = (L(1 + ε) − L(1 − ε)) / 2ε of the model's own loss, written out here (decoder: next-
    token NLL; encoder: MLM on mlm_masks), both in float64.

    Tolerance, derived: D(ε) = L' + c ε² + O(ε⁴), so D(2ε) − D(ε) = 3 c ε² and the truncation
    error of D(ε) is |D(2ε) − D(ε)| / 3 (allowed twice that). Rounding: each L is computed in
    float64 with relative error below n·u (n ≤ 10⁵ operations along any path of this tiny model
    is generous; u = 2⁻⁵³), so it moves D(ε) by at most 2·n·u·|L| / 2ε. The float64 gradient
    itself is exact to the same order."""
    make, tokenizer = {"gpt2": (tiny.tiny_gpt2, tiny.gpt2_tokenizer), "bert": (tiny.tiny_bert, tiny.bert_tokenizer)}[family]
    model = attnlens.load(make(), tokenizer=tokenizer(), dtype=torch.float64)
    text = tiny.CORPUS[1]
    found = ablation.importance(model, [text], max_len=MAX_LEN, layout="padded", progress=False)
    assert found.raw.shape == (2, 4) and found.per == "example" and found.n_examples == 1
    batch = attnlens.tokenize(model, [text], max_len=MAX_LEN, layout="padded")
    ids = batch.input_ids
    if family == "gpt2":
        inputs = batch

        def reference_loss(logits):
            return torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    else:
        inputs, targets = mlm_masks(batch, model.tokenizer, rate=0.15, seed=0)

        def reference_loss(logits):
            return torch.nn.functional.cross_entropy(logits[targets], ids[targets])

    eps = 1e-2
    base = gated_loss(model, inputs, 0, 0, 1.0, reference_loss)
    rounding = 2 * 1e5 * U64 * abs(base) / (2 * eps)
    largest, loosest = 0.0, 0.0
    for layer in range(2):
        for head in range(4):
            def derivative(step, layer=layer, head=head):
                up = gated_loss(model, inputs, layer, head, 1 + step, reference_loss)
                down = gated_loss(model, inputs, layer, head, 1 - step, reference_loss)
                return (up - down) / (2 * step)

            d1, d2 = derivative(eps), derivative(2 * eps)
            tolerance = 2 * abs(d2 - d1) / 3 + rounding
            # raw is stored in float32: allow its rounding too (relative 2⁻²⁴)
            tolerance += abs(d1) * 2.0**-24
            largest, loosest = max(largest, abs(d1)), max(loosest, tolerance)
            assert abs(float(found.raw[layer, head]) - abs(d1)) <= tolerance, (
                f"head {(layer, head)}: importance {float(found.raw[layer, head]):.6e}, "
                f"finite difference {abs(d1):.6e} ± {tolerance:.1e}")
    assert loosest < 1e-3 * largest, f"tolerance {loosest:.1e} too loose for gradients up to {largest:.1e}"
    norms = found.raw.double().norm(dim=1, keepdim=True)
    torch.testing.assert_close(found.scores.double(), found.raw.double() / norms, rtol=1e-6, atol=0)


def test_importance_is_a_mean_over_examples(gpt2):
    """Per-example gates: a padded batch of three gives the mean of the three single-example
    importances (float32: relative 1e-4 covers the batched vs single float32 forward/backward)."""
    texts = tiny.CORPUS[:3]
    together = ablation.importance(gpt2, texts, max_len=MAX_LEN, batch_size=3, progress=False)
    alone = [ablation.importance(gpt2, [text], max_len=MAX_LEN, progress=False).raw for text in texts]
    assert together.n_examples == 3
    torch.testing.assert_close(together.raw, torch.stack(alone).mean(0), rtol=1e-4, atol=1e-7)
    # a scalar loss (one per batch): |dL(batch)/dξ|; on a batch of one example, the same
    def scalar(output, batch):
        real = batch.key_mask
        scored = real[:, 1:] & real[:, :-1]
        nll = torch.nn.functional.cross_entropy(output[:, :-1].flatten(0, 1), batch.batch.input_ids[:, 1:].flatten(),
                                                reduction="none").view(scored.shape)
        return (nll * scored).sum() / scored.sum()

    per_batch = ablation.importance(gpt2, texts[:1], loss=scalar, max_len=MAX_LEN, progress=False)
    assert per_batch.per == "batch"
    torch.testing.assert_close(per_batch.raw, alone[0], rtol=1e-5, atol=1e-9)
    assert all(p.grad is None for p in gpt2.parameters()), "the weights get no gradient"


def test_a_loss_that_ignores_the_gates_is_refused(bert, minilm):
    texts = tiny.CORPUS[:2]
    with pytest.raises(ablation.GatesUnused, match="does not depend on the heads' gates"):
        ablation.importance(bert, texts, loss=lambda output, batch: (output * 0).sum(), max_len=MAX_LEN,
                            progress=False)
    with pytest.raises(ablation.GatesUnused, match="does not depend on the heads' gates"):
        ablation.importance(bert, texts, loss=lambda output, batch: torch.ones(()), max_len=MAX_LEN,
                            progress=False)
    # reading the embeddings only: computed before every head
    kept = {}
    embeddings = [("blocks.0.hook_in", lambda residual, hook: kept.update(x=residual))]
    with pytest.raises(ablation.GatesUnused):
        ablation.importance(bert, texts, loss=lambda output, batch: kept["x"].square().sum(),
                            hooks=embeddings, max_len=MAX_LEN, progress=False)
    with pytest.raises(UntrainedHead, match="loss="):
        ablation.importance(minilm, texts, max_len=MAX_LEN, progress=False)
    assert all(p.requires_grad for p in bert.parameters()), "the weights' requires_grad is restored"


# ------------------------------------------------------------------------------------------------
# pruning


def test_prune_curve_prunes_in_order_and_scores_each_set_once(bert):
    scores = torch.arange(8, dtype=torch.float32).flip(0).view(2, 4)  # (1, 3) least, (0, 0) most
    calls = []

    def score_fn(hooks):
        calls.append(set(hooks.heads))
        return float(len(hooks.heads))

    table, figure = ablation.prune_curve(bert, scores, score_fn, fractions=(0.0, 0.25, 0.5),
                                         order=("ascending", "descending"))
    assert list(table.columns) == ["fraction_pruned", "heads_pruned", "score", "order"]
    assert table["heads_pruned"].tolist() == [0, 2, 4, 0, 2, 4]
    assert calls[1] == {(1, 3), (1, 2)} and calls[-1] == {(0, 0), (0, 1), (0, 2), (0, 3)}
    assert len(calls) == 5, "the empty set is scored once"
    assert len(figure.data) == 2


@pytest.mark.slow
def test_pruning_the_least_important_heads_costs_less_on_sst2(minilm):
    """Importance on MiniLM from a task loss: a fixed logistic read-out of the mean-pooled last
    layer, fitted on SST-2 train features; then the SST-2 probe with the least / most important
    half of the heads zeroed."""
    from sklearn.linear_model import LogisticRegression

    data_file("sst2/train.tsv")
    train = tasks.load("sst2", "train", data_dir=DATA, limit=300, seed=0)
    features = probing.extract(minilm, train.inputs(), max_len=64, progress=False)
    offsets = features.offsets
    pooled = torch.stack([features.vectors[offsets[i]:offsets[i + 1], -1].float().mean(0) for i in range(len(features))])
    labels = torch.tensor(train.labels())
    readout = LogisticRegression(max_iter=2000).fit(pooled.numpy(), labels.numpy())
    weight = torch.tensor(readout.coef_, dtype=torch.float32)  # [1, d_model]
    bias = torch.tensor(readout.intercept_, dtype=torch.float32)
    last = f"blocks.{minilm.cfg.n_layers - 1}.hook_out"
    kept = {}

    def task_loss(output, batch):
        real = batch.key_mask[..., None].float()
        mean = (kept["residual"] * real).sum(1) / real.sum(1)
        logit = (mean @ weight.T + bias)[:, 0]
        target = labels[batch.start:batch.start + len(batch)].float()
        return torch.nn.functional.binary_cross_entropy_with_logits(logit, target, reduction="none")

    scores = ablation.importance(minilm, train.inputs()[:96], loss=task_loss, max_len=64,
                                 hooks=[(last, lambda residual, hook: kept.update(residual=residual))],
                                 progress=False)
    assert scores.shape == (6, 12) and bool((scores.raw > 0).all())
    assert torch.allclose(scores.scores.norm(dim=1), torch.ones(6))

    def score_fn(hooks):
        # the probe alone, trained for the recipe's epochs: its score is what pruning moves
        return probing.run(minilm, "sst2", data_dir=DATA, train_limit=300, eval_limit=200, hooks=hooks,
                           max_len=64, baseline=False, select_epochs=False, progress=False).score

    table, _ = ablation.prune_curve(minilm, scores, score_fn, fractions=(0.0, 0.5),
                                    order=("ascending", "descending"))
    full = float(table.loc[table["heads_pruned"] == 0, "score"].iloc[0])
    least = float(table.loc[(table["order"] == "ascending") & (table["heads_pruned"] == 36), "score"].iloc[0])
    most = float(table.loc[(table["order"] == "descending") & (table["heads_pruned"] == 36), "score"].iloc[0])
    print(f"SST-2 probe accuracy: all heads {full:.3f}, least important half pruned {least:.3f}, "
          f"most important half pruned {most:.3f}")
    assert abs(full - least) < abs(full - most)


# ------------------------------------------------------------------------------------------------
# bad input


def test_bad_inputs(bert):
    heads = HeadSet.from_heads(HEADS, 2, 4)
    with pytest.raises(ValueError, match="'zero'.*'uniform'.*'mean'.*'papa'"):
        ablation.hooks(heads, "drop")
    with pytest.raises(ValueError, match=r"HeadSet is \[6, 12\].*\[2, 4\]"):
        ablation.hooks(HeadSet.none(6, 12), "zero", model=bert)
    with pytest.raises(ValueError, match=r"HeadSet is \[2, 4\].*means has \[6, 12\]"):
        ablation.hooks(heads, "mean", means=torch.zeros(6, 12, 32))
    with pytest.raises(ValueError, match="d_head"):
        ablation.hooks(heads, "mean", model=bert, means=torch.zeros(2, 4, 16))
    with pytest.raises(ValueError, match="means="):
        ablation.hooks(heads, "mean", model=bert)
    with pytest.raises(ValueError, match="constants="):
        ablation.hooks(heads, "papa", model=bert)
    with pytest.raises(ValueError, match="only used with mode='mean'"):
        ablation.hooks(heads, "zero", means=torch.zeros(2, 4, 8))
    constants = papa.uniform(papa.fit(bert, tiny.CORPUS[:2], max_len=MAX_LEN, progress=False))
    with pytest.raises(ValueError, match=r"HeadSet is \[6, 12\].*PAPA constants has \[2, 4\]"):
        ablation.hooks(HeadSet.none(6, 12), "papa", constants=constants)
    # without model=, the head count is checked when the hooks run
    with pytest.raises(ValueError, match="3 heads|4 heads"):
        run(bert, padded(bert), ablation.hooks(HeadSet.from_heads([(0, 1)], 2, 3), "zero"))
    with unchecked():  # a set of pairs has no order: refused, naming the forms taken
        with pytest.raises(TypeError, match=r"HeadSet.*\(layer, head\) pairs"):
            ablation.hooks({(0, 1)}, "zero", model=bert)
    with pytest.raises(ValueError, match="order"):
        ablation.prune_curve(bert, torch.zeros(2, 4), lambda hooks: 0.0, order="random")
    with pytest.raises(ValueError, match=r"\[2, 4\]"):
        ablation.prune_curve(bert, torch.zeros(6, 12), lambda hooks: 0.0)
    with pytest.raises(ValueError, match="one value per example"):
        ablation.importance(bert, tiny.CORPUS[:2], loss=lambda output, batch: output.sum(-1), max_len=MAX_LEN,
                            progress=False)
    scores = ablation.Importance(scores=torch.rand(2, 4), raw=torch.rand(2, 4))
    with pytest.raises(TypeError, match="ambiguous"):
        with unchecked():
            scores.heads(1)
    assert len(scores.heads(0.5)) == 4 and len(scores.heads(n=3)) == 3
    assert not math.isnan(float(scores.scores.sum()))


@pytest.mark.parametrize("task", ["sst2", "ner"])
def test_probe_loss_is_the_probe_on_the_models_hidden_states(bert, task):
    """ProbeLoss in the importance pass gives each example the cross-entropy of the probe on the
    model's own hidden states: the same as the probe on probing.extract's features of those
    examples. Features are stored in float16 (each entry rounded to 2^-11 relative): the
    cross-entropies agree to 1e-2 absolute, which is far above float32 rounding and far below
    the spread of the losses themselves."""
    train = tasks.load(task, "train", data_dir=DATA, limit=48, seed=0)
    dev = tasks.load(task, "dev", data_dir=DATA, limit=12, seed=0)
    features = probing.extract(bert, train.inputs(), max_len=MAX_LEN, cache=False, progress=False)
    probe = probing.PapaProbe(seed=0, epochs=2).fit(features, train.labels())
    loss = ablation.ProbeLoss(bert, probe, dev.labels(), dev.inputs())
    seen = []

    def recording(output, batch):
        value = loss(output, batch)
        seen.append(value.detach())
        return value

    importance = ablation.importance(bert, dev.inputs(), loss=recording, hooks=loss.hooks(),
                                     max_len=MAX_LEN, batch_size=5, progress=False)
    assert importance.raw.abs().sum() > 0
    evaluation = probing.extract(bert, dev.inputs(), max_len=MAX_LEN, cache=False, progress=False)
    with torch.no_grad():
        logits, rows, _ = probe._logits(evaluation, torch.arange(len(evaluation)))
    if task == "sst2":
        expected = torch.nn.functional.cross_entropy(logits, torch.tensor(dev.labels()), reduction="none")
    else:
        targets = probing.probe.targets_of(probing.probe.label_targets(evaluation, dev.labels()), evaluation,
                                           torch.arange(len(evaluation)), rows)
        counted = targets < probe.n_labels  # classes missing from the small training subset
        each = torch.nn.functional.cross_entropy(logits, targets.masked_fill(~counted, -100), reduction="none")
        example = torch.repeat_interleave(torch.arange(len(evaluation)), evaluation.lengths)
        words = torch.zeros(len(evaluation)).index_add_(0, example, counted.float())
        expected = torch.zeros(len(evaluation)).index_add_(0, example, each) / words.clamp_min(1)
    torch.testing.assert_close(torch.cat(seen), expected, atol=1e-2, rtol=0)


def test_a_tasks_importance_is_chosen_on_training_data(bert, monkeypatch):
    """The ranking of heads is a choice (which to prune): task_loss differentiates the probe's
    loss on training examples held out from those the probe is fitted on, never on the dev
    split that a pruned model's scores are reported on (it used dev examples)."""
    fitted = []
    fit = probing.PapaProbe.fit
    monkeypatch.setattr(probing.PapaProbe, "fit",
                        lambda self, features, labels: fitted.append(list(labels)) or fit(self, features, labels))
    examples, loss = ablation.task_loss(bert, "sst2", data_dir=DATA, train_limit=48, limit=16,
                                        max_len=MAX_LEN, progress=False)
    pool = tasks.load("sst2", "train", data_dir=DATA, limit=64, seed=0).inputs()
    dev = set(tasks.load("sst2", "dev", data_dir=DATA).inputs())
    assert len(examples) == 16 and set(examples) <= set(pool) and not set(examples) & dev
    assert len(fitted) == 1 and len(fitted[0]) == 48  # the probe: the other 48 of the 64 drawn
    train = tasks.load("sst2", "train", data_dir=DATA).inputs()
    assert len(set(pool) - set(examples)) == 48 and set(examples) <= set(train)


def test_importance_of_a_task_uses_its_probe(bert):
    importance = ablation.importance(bert, "sst2", data_dir=DATA, train_limit=48, limit=16,
                                     max_len=MAX_LEN, progress=False)
    assert importance.settings["loss"] == "task probe" and importance.n_examples == 16
    assert importance.scores.shape == (bert.cfg.n_layers, bert.cfg.n_heads)
    assert (importance.raw > 0).all()
    with pytest.raises(ValueError, match="pass the texts as the corpus"):
        ablation.importance(bert, "sst2", loss=lambda output, batch: output.sum(), data_dir=DATA)
    with pytest.raises(ValueError, match="fitted PapaProbe"):
        ablation.ProbeLoss(bert, probing.PapaProbe(), [0], ["a text"])
