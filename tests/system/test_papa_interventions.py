"""PAPA interventions (replace, blend, context manager) and head selection, on MiniLM."""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core import devices
from attnlens.errors import InputError
from tests import tiny
from tests.precision import U32, renormalized_row_error
from tests.typechecks import unchecked

MAX_LEN = 32
LAM_ATOL = 2e-7  # lam=0 / lam=1 are clamped to 1e-7 / 1 - 1e-7 (float32)
BLEND_ATOL = 1e-5  # logits of a blend at lam=1 (lam=0) vs the model (replacement)
CAUSAL_ATOL = 1e-6  # GPT-2 logits before the last position when only the last token changes


def is_pattern(name: str) -> bool:
    return name.endswith("hook_pattern")


@pytest.fixture(scope="module")
def constants(minilm, sst2_sentences):
    return papa.fit(minilm, sst2_sentences[:32], max_len=MAX_LEN, progress=False)


@pytest.fixture(scope="module")
def batch(minilm, sst2_sentences):
    return attnlens.tokenize(minilm, sst2_sentences[100:108], max_len=MAX_LEN)


@pytest.fixture(scope="module")
def original(minilm, batch):
    with torch.no_grad():
        return minilm(batch.input_ids, **batch.model_kwargs())


def run(model, batch, fwd_hooks, record=False):
    """Logits with ``fwd_hooks``; with ``record``, also every layer's pattern after the hooks."""
    seen = {}

    def keep(pattern, hook):
        seen[hook.layer()] = pattern.detach().clone()

    extra = [(is_pattern, keep)] if record else []
    with torch.no_grad():
        logits = model.run_with_hooks(
            batch.input_ids, **batch.model_kwargs(), fwd_hooks=list(fwd_hooks) + extra
        )
    return (logits, seen) if record else logits


def test_blend_with_lambda_one_is_the_model_and_lambda_zero_is_replace(minilm, batch, constants, original):
    replaced = run(minilm, batch, papa.hooks(constants))
    assert (replaced - original).abs().max() > 1.0
    blend_one = papa.hooks(constants, mode="blend", lam=1.0)
    # θ is kept finite (λ = 1 − 1.2e-7) so that it stays trainable; the blend is the model to 1e-5
    torch.testing.assert_close(blend_one.lam, torch.ones(6, 12), atol=LAM_ATOL, rtol=0)
    torch.testing.assert_close(run(minilm, batch, blend_one), original, atol=BLEND_ATOL, rtol=0)
    blend_zero = papa.hooks(constants, mode="blend", lam=0.0)
    torch.testing.assert_close(run(minilm, batch, blend_zero), replaced, atol=BLEND_ATOL, rtol=0)
    halfway = papa.hooks(constants, mode="blend")
    assert isinstance(halfway.theta, torch.nn.Parameter) and halfway.theta.shape == (6, 12)
    assert torch.equal(halfway.theta, torch.zeros(6, 12)) and torch.equal(halfway.lam, torch.full((6, 12), 0.5))
    logits = run(minilm, batch, halfway)
    assert not torch.equal(logits, original) and not torch.equal(logits, replaced)


def test_constants_of_a_single_example_reproduce_the_model_on_it(minilm, sst2_sentences):
    for layout in ("papa", "padded"):
        text = sst2_sentences[200]
        single = papa.fit(minilm, [text], max_len=MAX_LEN, layout=layout, progress=False)
        batch = attnlens.tokenize(minilm, [text], max_len=MAX_LEN, layout=layout)
        with torch.no_grad():
            expected = minilm(batch.input_ids, **batch.model_kwargs())
        got = run(minilm, batch, papa.hooks(single))
        valid = batch.attention_mask.bool()
        torch.testing.assert_close(got[valid], expected[valid], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("layout", ["papa", "padded"])
def test_replaced_rows_sum_to_one_over_valid_keys_and_are_zero_on_padding(minilm, sst2_sentences, layout):
    constants = papa.fit(minilm, sst2_sentences[:16], max_len=MAX_LEN, layout=layout, progress=False)
    batch = attnlens.tokenize(minilm, sst2_sentences[300:306], max_len=MAX_LEN, layout=layout)
    padded = ~batch.attention_mask.bool()
    assert padded.any()
    _, patterns = run(minilm, batch, papa.hooks(constants), record=True)
    assert sorted(patterns) == list(range(6))
    for layer, pattern in patterns.items():
        # float32 rows renormalized over <= n keys, summed exactly (float64): see tests.precision
        row_atol = renormalized_row_error(pattern.shape[-1])
        sums = pattern.double().sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=row_atol, rtol=0)
        assert torch.all(pattern.transpose(1, 3)[padded] == 0), "padded keys must get exactly 0"
        # valid rows are the constant restricted to valid pairs and renormalized
        valid = ~padded
        c = constants.mean[layer].float()[:, : pattern.shape[-1], : pattern.shape[-1]]
        pairs = (valid[:, None, :, None] & valid[:, None, None, :]).float()
        expected = c * pairs / (c * pairs).sum(-1, keepdim=True)
        rows = valid[:, None, :].expand(-1, 12, -1)
        torch.testing.assert_close(pattern[rows], expected[rows], atol=1e-6, rtol=1e-5)


def test_constant_pattern_falls_back_to_uniform_and_zeros_contribute_nothing():
    constant = torch.tensor([[[0.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0] * 4]])
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    pattern = papa.constant_pattern(constant, mask)
    assert pattern.shape == (2, 1, 4, 4)
    # example 0: row 0 had mass only on a padded key -> uniform over the two valid keys
    assert torch.equal(pattern[0, 0, 0], torch.tensor([0.5, 0.5, 0.0, 0.0]))
    assert torch.equal(pattern[0, 0, 1], torch.tensor([0.5, 0.5, 0.0, 0.0]))
    assert torch.equal(pattern[0, 0, 3], torch.tensor([0.5, 0.5, 0.0, 0.0]))  # padded query
    assert torch.equal(pattern[1, 0, 0], torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert torch.equal(pattern[1, 0, 3], torch.full((4,), 0.25))  # never-seen row
    raw = papa.constant_pattern(constant, mask, renormalize=False)  # restricted, not renormalized
    assert torch.equal(raw[0, 0, :, :2], torch.tensor([[0.0, 0.0], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0]]))
    assert torch.equal(raw[0, 0, :, 2:], torch.zeros(4, 2)) and torch.equal(raw[1, 0], constant[0])
    # right-padded inputs may be shorter than the constants
    assert papa.constant_pattern(constant, mask[:, :3]).shape == (2, 1, 3, 3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("compact", [False, True])
def test_constant_pattern_equals_the_papers_definition_and_its_gradient(causal, compact):
    """Restrict, renormalise, uniform where no mass is left (footnote 8), written out with
    advanced indexing and ``where``, against :func:`papa.constant_pattern` (gathered in place,
    renormalised in place, uniform rows written by index): the same float64 operations in the
    same order, so equal bit for bit, values and gradients, with and without autograd."""
    torch.manual_seed(0)
    n_heads, size, n_batch, n = 3, 10, 4, 7
    constant = torch.rand(n_heads, size, size, dtype=torch.float64)
    constant[0, 2] = 0.0  # a position whose row has no mass
    positions = torch.cat([torch.arange(n - 1), torch.tensor([size - 1])]).expand(n_batch, n)
    mask = torch.ones(n_batch, n, dtype=torch.bool)
    mask[1, 3:-1] = False
    mask[2, 5:-1] = False

    def reference(matrix):
        cut = (matrix[:, positions[:, :, None], positions[:, None, :]].transpose(0, 1) if compact
               else matrix[None, :, :n, :n])
        allowed = mask[:, None, None, :].expand(-1, 1, n, -1)
        if causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
        masked = cut * (mask[:, None, :, None] & allowed).to(matrix.dtype)
        total = masked.sum(-1, keepdim=True)
        uniform = allowed.to(matrix.dtype) / allowed.sum(-1, keepdim=True).clamp_min(1)
        return torch.where(total > 0, masked / torch.where(total > 0, total, torch.ones_like(total)), uniform)

    given = positions if compact else None
    mine, theirs = constant.clone().requires_grad_(True), constant.clone().requires_grad_(True)
    pattern = papa.constant_pattern(mine, mask, positions=given, causal=causal)
    expected = reference(theirs)
    assert torch.equal(pattern, expected)
    weights = torch.rand_like(expected)
    (pattern * weights).sum().backward()
    (expected * weights).sum().backward()
    assert torch.equal(mine.grad, theirs.grad)
    with torch.no_grad():
        assert torch.equal(papa.constant_pattern(constant, mask, positions=given, causal=causal), expected)


def test_zeros_constants_make_heads_contribute_nothing(minilm, batch):
    _, patterns = run(minilm, batch, papa.hooks(papa.zeros(minilm, max_len=MAX_LEN)), record=True)
    assert all(torch.all(p == 0) for p in patterns.values())


def test_replacing_all_half_or_no_heads_changes_the_logits_accordingly(minilm, batch, constants, original):
    valid = batch.attention_mask.bool()
    _, plain = run(minilm, batch, [], record=True)
    change = {}
    for heads in ("all", 0.5, 0.0):
        hooks = papa.hooks(constants, heads=heads)
        logits, patterns = run(minilm, batch, hooks, record=True)
        change[heads] = (logits - original)[valid].abs().mean().item()
        assert len(hooks.heads) == {"all": 72, 0.5: 36, 0.0: 0}[heads]
        assert len(hooks) == int(hooks.heads.mask.any(-1).sum()), "one hook per layer with a selected head"
        for layer in range(6):
            selected = hooks.heads.mask[layer]
            replaced = papa.constant_pattern(constants.mean[layer].float(), valid)
            torch.testing.assert_close(patterns[layer][:, selected], replaced[:, selected], atol=0, rtol=0)
        # layer 0 sees the original inputs: its other heads keep their own attention
        assert torch.equal(patterns[0][:, ~hooks.heads.mask[0]], plain[0][:, ~hooks.heads.mask[0]])
    assert change[0.0] == 0.0
    assert 0.0 < change[0.5] < change["all"], change
    # the heads replaced are the least input-dependent ones
    ranking = torch.argsort(constants.input_dependence.flatten(), stable=True)[:36]
    assert set(papa.hooks(constants, heads=0.5).heads) == {divmod(int(i), 12) for i in ranking}
    # (layer, head) pairs name the same heads as their HeadSet, in their order
    pairs = [(5, 11), (0, 3)]
    listed = papa.hooks(constants, heads=pairs)
    assert torch.equal(listed.heads.mask, papa.HeadSet.from_heads(pairs, 6, 12).mask) and list(listed.heads) == pairs
    assert listed.key() == papa.hooks(constants, heads=papa.HeadSet.from_heads(pairs, 6, 12)).key()


@pytest.mark.parametrize("device_route", [False, True])
def test_mismatched_inputs_raise_errors_naming_both(minilm, sst2_sentences, constants, device_route, monkeypatch):
    if device_route:  # off the CPU the layout's values are checked once per batch, on the host,
        # by attnlens.run_with_hooks (and the pass): a bare TransformerLens call checks shapes only
        monkeypatch.setattr(devices, "reads_are_free", lambda where: False)

        def run(model, batch, fwd_hooks):
            with torch.no_grad():
                return attnlens.run_with_hooks(model, batch, fwd_hooks)
    else:
        run = globals()["run"]
    padded = attnlens.tokenize(minilm, sst2_sentences[:4], max_len=MAX_LEN, layout="padded")
    longer = attnlens.tokenize(minilm, sst2_sentences[:4], max_len=48)
    with pytest.raises(ValueError, match="layout='papa', max_len=32; the inputs have length"):
        run(minilm, padded, papa.hooks(constants))
    with pytest.raises(ValueError, match="max_len=32; the inputs have length 48"):
        run(minilm, longer, papa.hooks(constants))
    with pytest.raises(ValueError, match="layout='papa', max_len=32; the batch has layout='padded'"):
        constants.check_compatible(minilm, padded)
    # right-padded to exactly max_len: the length fits, the padding does not
    uneven = attnlens.tokenize(minilm, ["word " * 40, "short ."], max_len=MAX_LEN, layout="padded")
    assert uneven.input_ids.shape[1] == MAX_LEN
    with pytest.raises(ValueError, match="not in the 'papa' layout"):
        run(minilm, uneven, papa.hooks(constants))
    padded_constants = papa.fit(minilm, sst2_sentences[:4], max_len=MAX_LEN, layout="padded", progress=False)
    papa_batch = attnlens.tokenize(minilm, sst2_sentences[:4], max_len=MAX_LEN)
    with pytest.raises(ValueError, match="layout='padded', max_len=32; the inputs are not right-padded"):
        run(minilm, papa_batch, papa.hooks(padded_constants))
    with pytest.raises(ValueError, match="Unknown mode 'mix'"):
        papa.hooks(constants, mode="mix")
    with pytest.raises(ValueError, match="lam= is only used with mode='blend'"):
        papa.hooks(constants, lam=0.3)
    with pytest.raises(ValueError, match="pass heads=select_heads"):
        papa.hooks(papa.toeplitz(constants), heads=0.5)


def test_intervention_context_manager(minilm, batch, constants, original):
    expected = run(minilm, batch, papa.hooks(constants, heads=0.25))
    with papa.intervention(minilm, constants, heads=0.25) as hooks, torch.no_grad():
        assert len(hooks.heads) == 18
        got = minilm(batch.input_ids, **batch.model_kwargs())
    assert torch.equal(got, expected)
    with torch.no_grad():
        assert torch.equal(minilm(batch.input_ids, **batch.model_kwargs()), original), "hooks removed"
    with pytest.raises(ValueError, match="constants were fitted on 'other/model', model is"):
        with papa.intervention(minilm, constants.replace(model_id="other/model", fingerprint=None)):
            pass


# ---- head selection -------------------------------------------------------------------------


def test_layer_order_strategies(constants):
    first = papa.select_heads("first_to_last", fraction=0.25, constants=constants)
    assert first.order == [(0, h) for h in range(12)] + [(1, h) for h in range(6)]
    last = papa.select_heads("last_to_first", fraction=0.25, constants=constants)
    assert last.order == [(5, h) for h in range(12)] + [(4, h) for h in range(6)]
    assert len(papa.select_heads("first_to_last", fraction=0.3, n_layers=6, n_heads=12)) == 22  # 21.6
    assert len(papa.select_heads("last_to_first", n=5, n_layers=6, n_heads=12)) == 5
    assert len(papa.select_heads("first_to_last", fraction=1.0, constants=constants)) == 72
    assert len(papa.select_heads("first_to_last", fraction=0.0, constants=constants)) == 0
    mask = first.mask
    assert mask.shape == (6, 12) and mask.dtype == torch.bool and int(mask.sum()) == 18


def test_random_strategy_is_seeded(constants):
    a = papa.select_heads("random", fraction=0.5, constants=constants, seed=1)
    b = papa.select_heads("random", fraction=0.5, constants=constants, seed=1)
    c = papa.select_heads("random", fraction=0.5, constants=constants, seed=2)
    assert a.order == b.order and a.order != c.order
    assert len(a) == 36 and len(set(a.order)) == 36


def test_input_dependence_and_lambda_strategies_rank_by_their_scores(constants):
    dependence = constants.input_dependence
    chosen = papa.select_heads("input_dependence", fraction=0.5, constants=constants)
    expected = [divmod(int(i), 12) for i in torch.argsort(dependence.flatten(), stable=True)[:36]]
    assert chosen.order == expected
    assert [dependence[h] for h in chosen.order] == sorted(dependence[h] for h in chosen.order)

    lam = torch.rand(6, 12, generator=torch.Generator().manual_seed(0))
    low = papa.select_heads("lambda", fraction=0.25, lam=lam, n_layers=6, n_heads=12)
    high = papa.select_heads("reversed_lambda", fraction=0.25, lam=lam, n_layers=6, n_heads=12)
    assert low.order == [divmod(int(i), 12) for i in torch.argsort(lam.flatten())[:18]]
    assert high.order == [divmod(int(i), 12) for i in torch.argsort(lam.flatten(), descending=True)[:18]]
    assert torch.equal(low.scores, lam)
    with pytest.raises(ValueError, match="Unknown strategy 'best'"):
        papa.select_heads("best", fraction=0.5, constants=constants)
    with pytest.raises(ValueError, match="needs lam="):
        papa.select_heads("lambda", fraction=0.5, constants=constants)


@pytest.mark.parametrize(
    ("fraction", "total", "expected"),
    [
        # the paper's fractions of MiniLM's 72 heads (1/16 of 72 is 4.5: up)
        (1.0, 72, 72), (0.5, 72, 36), (1 / 8, 72, 9), (1 / 16, 72, 5), (0.0, 72, 0),
        # decimal halves that the float product puts just below .5
        (0.145, 100, 15), (0.285, 100, 29), (0.575, 100, 58), (0.29, 50, 15),
        # other halves and non-halves
        (0.25, 10, 3), (0.125, 12, 2), (0.3, 72, 22), (0.1, 72, 7), (1 / 3, 72, 24), (2 / 3, 3, 2),
    ],
)
def test_fraction_of_heads_rounds_exact_halves_up(fraction, total, expected):
    """``round(k · heads)`` with halves up, on the decimal ``k`` the user wrote; expected counts
    worked out by hand (exact integers, no tolerance)."""
    from attnlens.methods.papa.selection import n_selected

    assert n_selected(fraction, 1, total) == expected
    assert len(papa.select_heads("first_to_last", fraction=fraction, n_layers=1, n_heads=total)) == expected


def test_lam_of_another_shape_is_refused():
    """A ``lam=`` transposed ([head, layer]) or flat is not silently reshaped."""
    for lam in (torch.rand(12, 6), torch.rand(72), torch.rand(6, 12, 1)):
        shape = ", ".join(map(str, lam.shape))
        with unchecked(), pytest.raises(ValueError, match=rf"lam= is \[{shape}\], not \[n_layers, n_heads\] = \[6, 12\]"):
            papa.select_heads("lambda", fraction=0.25, n_layers=6, n_heads=12, lam=lam)


def test_a_lambda_table_alone_gives_the_shape():
    lam = torch.rand(6, 12, generator=torch.Generator().manual_seed(0))
    chosen = papa.select_heads("lambda", fraction=0.125, lam=lam)
    lowest = set(torch.argsort(lam.flatten())[:9].tolist())  # round(0.125 * 72) = 9 smallest λ
    assert {layer * 12 + head for layer, head in chosen.order} == lowest


def test_input_dependence_needs_fitted_constants(minilm):
    """Trainable constants (and no constants) have no measured input dependence: a ValueError
    that says so, like data-free constants give."""
    trainable = papa.TrainableConstants.from_toeplitz(minilm, max_len=MAX_LEN)
    for given, name in ((trainable, "TrainableConstants"), (None, "none")):
        with pytest.raises(ValueError, match=rf"measured in papa.fit.*\(got {name}\)"):
            papa.select_heads("input_dependence", fraction=0.5, constants=given, n_layers=6, n_heads=12)
    with pytest.raises(ValueError, match="input_dependence is measured during papa.fit"):
        papa.select_heads("input_dependence", fraction=0.5, constants=papa.uniform(minilm, max_len=MAX_LEN))


def test_learned_lambda_trains_theta_with_a_user_loss(minilm, sst2_sentences, constants):
    batches = []
    for start in (400, 404):
        b = attnlens.tokenize(minilm, sst2_sentences[start : start + 4], max_len=MAX_LEN)
        with torch.no_grad():
            b.extra["target"] = minilm(b.input_ids, **b.model_kwargs())
        batches.append(b)

    def loss_fn(logits, batch):  # stay close to the original model's logits
        valid = batch.attention_mask.bool()
        return (logits - batch.extra["target"])[valid].square().mean()

    lam = papa.learn_lambda(minilm, constants, loss_fn=loss_fn, batches=batches, steps=3, lr=0.1)
    assert lam.shape == (6, 12) and not torch.equal(lam, torch.full((6, 12), 0.5))
    assert all(not p.requires_grad or p.grad is None for p in minilm.parameters())
    assert all(p.requires_grad for p in minilm.parameters()), "model weights are unfrozen again"

    chosen = papa.select_heads(
        "lambda", fraction=0.5, model=minilm, constants=constants, loss_fn=loss_fn,
        batches=batches, steps=3, lr=0.1,
    )
    assert len(chosen) == 36
    assert chosen.order == [divmod(int(i), 12) for i in torch.argsort(chosen.scores.flatten(), stable=True)[:36]]
    assert (chosen.scores != 0.5).any()


# ---- causal models (GPT-2) ------------------------------------------------------------------


def causal_reference(constant: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Causal replacement by its definition, one row at a time in float64: the allowed keys of
    query ``q`` are the valid keys ``k <= q``; a valid row is the constant over them,
    renormalized, or uniform over them when it has no mass there; a padded row is uniform."""
    n_batch, n = valid.shape
    out = torch.zeros(n_batch, constant.shape[0], n, n, dtype=torch.float64)
    for b in range(n_batch):
        for h in range(constant.shape[0]):
            for q in range(n):
                allowed = [k for k in range(q + 1) if valid[b, k]]
                if not allowed:
                    continue
                weights = constant[h, q, allowed].double() if valid[b, q] else torch.zeros(len(allowed))
                total = float(weights.sum())
                out[b, h, q, allowed] = weights / total if total > 0 else 1.0 / len(allowed)
    return out


def test_constant_and_softmax_patterns_are_causal_on_request():
    generator = torch.Generator().manual_seed(0)
    constant = torch.rand(3, 6, 6, generator=generator, dtype=torch.float64)
    constant[:, 4] = 0.0  # a row never seen in the fit: the uniform fallback
    constant[1, 2, :3] = 0.0  # mass only on later keys: nothing left at or before the query
    valid = torch.tensor([[True] * 6, [True, True, True, True, False, False]])
    expected = causal_reference(constant, valid)
    got = papa.constant_pattern(constant, valid, causal=True)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    assert torch.all(got.triu(1) == 0), "keys after the query get exactly 0"
    # trainable constants: a softmax over the allowed keys is exp(logits) renormalized over them
    logits = torch.randn(3, 6, 6, generator=generator, dtype=torch.float64)
    soft = papa.softmax_pattern(logits, valid, causal=True)
    torch.testing.assert_close(soft, causal_reference(logits.exp(), valid), atol=1e-12, rtol=0)
    assert torch.all(soft.triu(1) == 0)
    # causal=False (the default) is unchanged: later keys keep their weight
    assert papa.constant_pattern(constant, valid).triu(1).sum() > 0


@pytest.fixture(scope="module")
def gpt2():
    return tiny.gpt2_bridge()


def test_data_free_constants_of_a_decoder_are_causal(gpt2):
    n = 12
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    harmonic = torch.where(j <= i, 1.0 / ((i - j).abs() + 1).double(), 0.0)
    expected = {
        "toeplitz": harmonic / harmonic.sum(-1, keepdim=True),
        "uniform": torch.where(j <= i, 1.0 / (i + 1).double(), 0.0),
        "identity": torch.eye(n, dtype=torch.float64),
    }
    for kind, matrix in expected.items():
        constants = getattr(papa, kind)(gpt2, max_len=n, layout="padded")
        assert constants.causal is True
        torch.testing.assert_close(constants.mean[1, 3], matrix, atol=1e-12, rtol=0)
    trainable = papa.TrainableConstants.from_toeplitz(gpt2, max_len=n, layout="padded")
    # trainable logits are float32 log(toeplitz): each is off by <= u * |log p|, and a softmax
    # (taken in float64) moves by at most twice the largest logit change, relatively
    allowed = expected["toeplitz"] > 0
    atol = 2 * U32 * float(expected["toeplitz"][allowed].log().abs().max()) + 1e-12
    torch.testing.assert_close(trainable.mean[0, 2], expected["toeplitz"], atol=atol, rtol=0)


def gpt2_constants(model, kind: str):
    if kind == "fitted":  # fitted on 4-token sentences: later rows were never seen -> uniform fallback
        return papa.fit(model, ["the fox ."] * 4, max_len=MAX_LEN, layout="padded", progress=False)
    if kind == "trainable":
        return papa.TrainableConstants.from_toeplitz(model, max_len=MAX_LEN, layout="padded")
    return getattr(papa, kind)(model, max_len=MAX_LEN, layout="padded")


@pytest.mark.parametrize("how", ["hooks", "intervention", "unrecorded"])
@pytest.mark.parametrize("kind", ["fitted", "toeplitz", "uniform", "trainable"])
def test_replacement_on_gpt2_never_sees_the_future(gpt2, kind, how):
    """Changing the last token must not change the logits of earlier positions (a causal model
    stays causal), and the replaced patterns are the causal reference. ``unrecorded``: constants
    that do not record whether the model is causal (saved before it was), used via hooks."""
    constants = gpt2_constants(gpt2, kind)
    if how == "unrecorded":
        constants.causal = None
    batch = attnlens.tokenize(gpt2, [tiny.CORPUS[0]], max_len=MAX_LEN, layout="padded")
    changed = batch.input_ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % gpt2.cfg.d_vocab
    seen = {}

    def keep(pattern, hook):
        seen[hook.layer()] = pattern.detach().clone()

    def logits(ids):
        with torch.no_grad():
            if how == "intervention":
                with papa.intervention(gpt2, constants), gpt2.hooks(fwd_hooks=[(is_pattern, keep)]):
                    return gpt2(ids, **batch.model_kwargs())
            hooks = list(papa.hooks(constants)) + [(is_pattern, keep)]
            return gpt2.run_with_hooks(ids, **batch.model_kwargs(), fwd_hooks=hooks)

    first, second = logits(batch.input_ids), logits(changed)
    assert (first[0, -1] - second[0, -1]).abs().max() > 0, "the last position does see its token"
    torch.testing.assert_close(first[0, :-1], second[0, :-1], atol=CAUSAL_ATOL, rtol=0)
    valid = batch.attention_mask.bool()
    n = valid.shape[-1]
    # float32 rows vs the float64 reference, compared in float64: trainable rows are a float32
    # softmax, whose error grows with the spread of the logits over a row
    spread = 0.0
    if kind == "trainable":
        logits = constants.logits.detach()[..., :n, :n]
        allowed = torch.ones(n, n, dtype=torch.bool).tril()
        spread = float((logits.masked_fill(~allowed, -torch.inf).amax(-1)
                        - logits.masked_fill(~allowed, torch.inf).amin(-1)).max())
    atol = renormalized_row_error(n, spread)
    for layer, pattern in seen.items():
        constant = constants.mean[layer][:, :n, :n]
        expected = causal_reference(constant, valid)
        torch.testing.assert_close(pattern.double(), expected, atol=atol, rtol=0)


# ---- blend endpoints and learn_lambda ----------------------------------------------------------


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_blend_at_lambda_zero_or_one_can_still_be_trained(minilm, batch, constants, original, lam):
    blend = papa.hooks(constants, mode="blend", lam=lam)
    # θ = logit(clamp(λ, 1e-7, 1 - 1e-7)): finite, where sigmoid has a gradient
    expected = torch.logit(torch.tensor(lam), eps=1e-7).expand(6, 12)  # LAM_EPS, as documented
    assert torch.isfinite(blend.theta).all()
    torch.testing.assert_close(blend.theta.detach(), expected, atol=1e-4, rtol=0)
    valid = batch.attention_mask.bool()
    replaced = run(minilm, batch, papa.hooks(constants))
    target = replaced if lam == 1.0 else original  # a loss pulling λ away from where it starts
    logits = minilm.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=blend)
    loss = (logits - target)[valid].square().mean()
    (grad,) = torch.autograd.grad(loss, [blend.theta])
    assert torch.isfinite(grad).all() and (grad != 0).all(), "every head's λ gets a gradient"
    before = blend.theta.detach().clone()
    blend.theta.grad = grad
    torch.optim.Adam([blend.theta], lr=0.5).step()
    assert (blend.theta.detach() != before).all(), "one Adam step moves every θ"


def test_learn_lambda_leaves_other_gradients_alone_and_shows_progress(capsys):
    model = tiny.bert_bridge()
    fitted = papa.fit(model, tiny.CORPUS, max_len=16, progress=False)
    trainable = papa.TrainableConstants.from_average(fitted)
    earlier = torch.full_like(trainable.logits, 0.25)
    trainable.logits.grad = earlier.clone()  # a user's gradient from their own training
    scale = torch.nn.Parameter(torch.ones(()))  # a user's probe, used in the loss
    frozen_before = next(model.parameters())
    frozen_before.requires_grad_(False)  # a user's frozen weight stays frozen
    batches = [attnlens.tokenize(model, tiny.CORPUS[:4], max_len=16)]

    def loss_fn(logits, batch):
        return (scale * logits[batch.attention_mask.bool()]).logsumexp(-1).mean()

    capsys.readouterr()
    lam = papa.learn_lambda(model, trainable, loss_fn=loss_fn, batches=batches, steps=3, lr=0.1)
    err = capsys.readouterr().err
    assert "papa.learn_lambda" in err and "3/3" in err
    assert lam.shape == (2, 4) and not torch.equal(lam, torch.full((2, 4), 0.5))
    assert torch.equal(trainable.logits.grad, earlier), "the constants' gradient is unchanged"
    assert trainable.logits.requires_grad
    assert scale.grad is None, "the probe's gradient is unchanged"
    assert all(p.grad is None for p in model.parameters())
    assert not frozen_before.requires_grad
    assert all(p.requires_grad for p in model.parameters() if p is not frozen_before)
    papa.learn_lambda(model, fitted, loss_fn=loss_fn, batches=batches, steps=1, progress=False)
    assert "papa.learn_lambda" not in capsys.readouterr().err


def test_train_constants_lowers_the_loss_with_the_model_frozen(capsys):
    """papa.train_constants: Adam steps on the logits (and a probe's parameters, jointly) lower
    the loss, measured independently of the training loop (plain replacement hooks with the
    returned snapshot); the model's weights and requires_grad are as before; refused inputs."""
    model = tiny.bert_bridge()
    fitted = papa.fit(model, tiny.CORPUS, max_len=16, progress=False)
    trainable = papa.TrainableConstants.from_toeplitz(fitted)
    start = trainable.to_constants()
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    scale = torch.nn.Parameter(torch.ones(()))  # a probe's parameter, trained with the logits
    batch = attnlens.tokenize(model, tiny.CORPUS[:4], max_len=16)
    valid = batch.attention_mask.bool()
    target = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(),
                                  fwd_hooks=papa.hooks(fitted)).detach()  # under the average

    def loss_fn(logits, batch):
        return (scale * logits - target)[valid].square().mean()

    def loss_under(constants):
        with torch.no_grad():
            logits = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=papa.hooks(constants))
        return float((logits - target)[valid].square().mean())

    capsys.readouterr()
    trained = papa.train_constants(model, trainable, loss_fn=loss_fn, batches=[batch], steps=20, lr=0.1,
                                   jointly=[scale], jointly_lr=0.01)
    assert "papa.train_constants" in capsys.readouterr().err
    assert trained.kind == "trained" and scale.grad is not None and float(scale.detach()) != 1.0
    assert loss_under(trained) < 0.5 * loss_under(start), "20 steps pull Toeplitz towards the target"
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters()) and all(p.grad is None for p in model.parameters())
    with unchecked(), pytest.raises(attnlens.AttnlensError, match="TrainableConstants"):
        papa.train_constants(model, fitted, loss_fn=loss_fn, batches=[batch], steps=1)
    with pytest.raises(attnlens.AttnlensError, match="does not depend on the constants"):
        papa.train_constants(model, trainable, loss_fn=lambda logits, batch: scale * 1.0, batches=[batch], steps=1,
                             progress=False)


def test_hooks_refuse_a_model_of_another_kind_or_shape_at_every_call():
    """papa.hooks of a decoder's constants ran on an encoder through attnlens.run_with_hooks and
    every pass (probing.extract, ...), letting a token see later ones, where
    papa.intervention, compare and maps refuse them: the hooks now check the model they run on,
    once a call or a pass, reading nothing of the device (whether it is a decoder, its layers
    and heads)."""
    from attnlens.evaluation import probing

    bert, gpt = tiny.bert_bridge(), tiny.gpt2_bridge()
    decoder_constants = papa.fit(gpt, tiny.CORPUS[:4], max_len=16, progress=False)
    batch = attnlens.tokenize(bert, tiny.CORPUS[:2], max_len=16, layout="padded")
    with pytest.raises(InputError, match="fitted on a decoder"):
        attnlens.run_with_hooks(bert, batch, papa.hooks(decoder_constants))
    with pytest.raises(InputError, match="fitted on a decoder"):
        probing.extract(bert, tiny.CORPUS[:2], hooks=papa.hooks(decoder_constants), max_len=16, layout="padded",
                        cache=False, progress=False)
    other_shape = papa.fit(tiny.llama_bridge(), tiny.CORPUS[:4], max_len=16, progress=False)
    with pytest.raises(InputError, match="layers x"):
        attnlens.run_with_hooks(gpt, attnlens.tokenize(gpt, tiny.CORPUS[:2], max_len=16), papa.hooks(other_shape))


@pytest.mark.parametrize("kind", ["fitted", "toeplitz"])
def test_maps_of_constants_refuse_a_left_padded_batch(gpt2, kind):
    """A constant is looked up by position: ``attnlens.maps(model, batch, constants)`` of a
    left-padded batch (built by hand: attnlens.tokenize pads on the right) read each row's
    constants at its columns, not at its tokens' positions (up to 0.50 from the constants at the
    right positions on SmolLM2, with no word), while ``papa.hooks`` refused the same batch. Both
    now refuse it, by the same check; the right-padded batch's maps are the renormalised constants
    at their positions (the reference)."""
    constants = gpt2_constants(gpt2, kind)
    right = attnlens.tokenize(gpt2, ["the quick brown fox jumps .", "a dog ."], max_len=MAX_LEN)
    n, width = right.attention_mask.sum(-1), right.input_ids.shape[1]
    ids, mask = torch.zeros_like(right.input_ids), torch.zeros_like(right.attention_mask)
    for row in range(2):
        ids[row, width - n[row]:], mask[row, width - n[row]:] = right.input_ids[row, :n[row]], 1
    left = attnlens.Batch(ids, mask, torch.zeros_like(ids), 0, "padded", MAX_LEN, token_types=False,
                          positions_from_mask=True, counts_positions=True)
    for call in (lambda: attnlens.maps(gpt2, left, constants),
                 lambda: attnlens.run_with_hooks(gpt2, left, papa.hooks(constants))):
        with pytest.raises(InputError, match="the inputs are not right-padded .*left padding"):
            call()
    maps = attnlens.maps(gpt2, right, constants)
    short = int(n[1])
    reference = constants.mean[:, :, :short, :short].double()
    reference = reference / reference.sum(-1, keepdim=True)
    # float32 rows of at most 32 entries renormalised: a few units of 6e-8 each; 1e-6 is loose
    torch.testing.assert_close(maps[:, 1, :, :short, :short].double(), reference, atol=1e-6, rtol=0)
