"""attnlens.effective_attention against a per-head NumPy float64 SVD loop, on real MiniLM activations.

Tolerances: 1e-5 absolute against the float64 reference for float32 activations (observed ~2e-7);
1e-10 for float64 activations (QR route); A⊥V = AV to 1e-5 relative per (example, head).
"""

from __future__ import annotations

import einops
import numpy as np
import pytest
import torch

import attnlens
from attnlens.core import devices
from attnlens.engine import bases
from attnlens.engine import effective as core
from attnlens.methods.effective import effective_attention
from attnlens.methods.effective.reference import effective_attention_loop
from tests.typechecks import unchecked

ATOL = 1e-5
D_HEAD = 32
#: token lengths (specials included) of the SST-2 dev sentences used: below, at, above d_head
LENGTHS = (9, 20, 31, 32, 33, 40, 55)


pytestmark = pytest.mark.usefixtures("single_blas_thread")


def sentences_of_lengths(model, sentences, lengths):
    """The first SST-2 sentence of each token length in ``lengths``."""
    chosen = {}
    for sentence in sentences:
        n = len(model.tokenizer(sentence)["input_ids"])
        if n in lengths and n not in chosen:
            chosen[n] = sentence
    return [chosen[n] for n in lengths]


@pytest.fixture(scope="module")
def activations(minilm, sst2_sentences):
    """Patterns and values ``[batch, head, key, d_head]`` of every layer on a padded SST-2 batch."""
    batch = attnlens.tokenize(
        minilm, sentences_of_lengths(minilm, sst2_sentences, LENGTHS), max_len=64, layout="padded"
    )
    assert batch.attention_mask.sum(-1).tolist() == list(LENGTHS)
    names = [f"blocks.{layer}.attn.{hook}" for layer in range(6) for hook in ("hook_pattern", "hook_v")]
    with torch.no_grad():
        _, cache = minilm.run_with_cache(batch.input_ids, **batch.model_kwargs(), names_filter=names)
    layers = [
        (
            cache[f"blocks.{layer}.attn.hook_pattern"],
            einops.rearrange(cache[f"blocks.{layer}.attn.hook_v"], "b k h d -> b h k d"),
        )
        for layer in range(minilm.cfg.n_layers)
    ]
    return layers, batch.attention_mask.bool()


def valid_block(valid):
    """``[batch, 1, query, key]`` mask of the (valid query, valid key) entries."""
    return valid[:, None, :, None] & valid[:, None, None, :]


def test_matches_numpy_svd_loop_below_at_and_above_d_head(activations):
    layers, valid = activations
    lengths = valid.sum(-1)
    short, long = lengths <= D_HEAD, lengths > D_HEAD
    assert {int(n) for n in lengths} >= {20, 32, 33} and short.any() and long.any()
    block = valid_block(valid)
    for pattern, v in layers:
        got = effective_attention(pattern, v, key_mask=valid)
        assert got.dtype == pattern.dtype and got.shape == pattern.shape
        expected = torch.from_numpy(effective_attention_loop(pattern, v, valid))
        error = (got.double() - expected).abs()[block.expand_as(got)]
        assert error.max() <= ATOL, f"max abs error {error.max():.2e}"
        # valid length <= d_head: exactly A, bit for bit
        assert torch.equal(got[short], pattern[short])
        # above d_head the null-space part is substantial, and padded keys get nothing
        assert (got[long] - pattern[long]).abs().max() > 0.1
        assert torch.all(got.transpose(1, 3)[long][~valid[long]] == 0)
        # the default key mask (inferred from the pattern) gives the same answer
        torch.testing.assert_close(effective_attention(pattern, v), got, atol=0, rtol=0)


def test_float64_activations_match_the_loop_to_working_precision(activations):
    layers, valid = activations
    block = valid_block(valid)
    for pattern, v in layers[::2]:
        got = effective_attention(pattern.double(), v.double(), key_mask=valid)
        assert got.dtype == torch.float64
        expected = effective_attention_loop(pattern, v, valid, eps=float(np.finfo(np.float64).eps))
        error = (got - torch.from_numpy(expected)).abs()[block.expand_as(got)]
        assert error.max() <= 1e-10


def test_rank_tolerance_is_relative_to_each_heads_largest_singular_value(activations):
    layers, valid = activations
    pattern, v = layers[3]
    block = valid_block(valid).expand_as(pattern)
    # rank-deficient values (rank 20 < d_head), with heads of very different scales
    generator = torch.Generator().manual_seed(0)
    mixing = torch.randn(20, D_HEAD, generator=generator)
    scales = torch.logspace(-3, 3, v.shape[1])[None, :, None, None]
    low_rank = (v[..., :20] @ mixing) * scales
    got = effective_attention(pattern, low_rank, key_mask=valid)
    expected = effective_attention_loop(pattern, low_rank, valid)
    lengths = valid.sum(-1)
    long = lengths > D_HEAD
    error = (got.double() - torch.from_numpy(expected)).abs() * block
    assert error.max() <= ATOL
    # a sequence of more than 20 keys has a left null space whatever its length (it was
    # returned as A when at most d_head long); the one of 9 keys does not, and keeps A
    rank_deficient = lengths > 20
    assert (got[rank_deficient & ~long] - pattern[rank_deficient & ~long]).abs().max() > 1e-2
    assert torch.equal(got[lengths <= 20], pattern[lengths <= 20])
    # an explicit rtol cuts real directions (same rule as the loop), and a tiny one keeps all
    for rtol in (0.05, 1e-9):
        got = effective_attention(pattern, v, key_mask=valid, rtol=rtol)
        expected = effective_attention_loop(pattern, v, valid, rtol=rtol)
        assert ((got.double() - torch.from_numpy(expected)).abs() * block)[long].max() <= ATOL
    cut = effective_attention(pattern, v, key_mask=valid, rtol=0.05)[long]
    assert (cut - effective_attention(pattern, v, key_mask=valid)[long]).abs().max() > 1e-3


@pytest.mark.parametrize("condition", [10.0, 1e3, 1e5])
def test_badly_conditioned_values_take_the_float64_route_and_still_match(activations, condition, monkeypatch):
    """Values with condition number ``condition`` (the real ones are below 60): the float32 refined
    route serves well-conditioned heads; the others must go to the float64 exact route, since the
    float32 route's error grows like eps · κ (measured 1.7e-4 at κ = 3000 without the fallback)."""
    layers, valid = activations
    long = valid.sum(-1) > D_HEAD
    pattern, v = (x[long] for x in layers[4])
    valid = valid[long]
    left, sigma, right = torch.linalg.svd(v.double() * valid[:, None, :, None], full_matrices=False)
    spread = torch.logspace(0, -np.log10(condition), D_HEAD, dtype=torch.float64)
    conditioned = ((left * (sigma[..., :1] * spread)[..., None, :]) @ right).float()
    routed = []
    original = bases.basis_exact
    monkeypatch.setattr(bases, "basis_exact", lambda v64, tol: routed.append(len(v64)) or original(v64, tol))
    got = effective_attention(pattern, conditioned, key_mask=valid)
    expected = torch.from_numpy(effective_attention_loop(pattern, conditioned, valid))
    error = (got.double() - expected).abs()[valid_block(valid).expand_as(got)]
    assert error.max() <= ATOL, f"max abs error {error.max():.2e} at condition number {condition:g}"
    n_matrices = pattern.shape[0] * pattern.shape[1]
    assert sum(routed) == (0 if condition <= 10 else n_matrices)


def test_real_heads_take_the_float32_route(activations, monkeypatch):
    """Real values of sequences well above d_head are well conditioned (κ < 60 on MiniLM), so the
    fast route serves them all; nearly square ones (33 keys: κ up to ~3000) may need float64."""
    layers, valid = activations
    roomy = valid.sum(-1) >= 40
    assert roomy.sum() >= 2
    monkeypatch.setattr(bases, "basis_exact", lambda *args: pytest.fail("a real head needed float64"))
    for pattern, v in layers:
        effective_attention(pattern[roomy], v[roomy], key_mask=valid[roomy])


@pytest.mark.parametrize("padded", [False, True], ids=["valid-keys", "padded"])
def test_effective_attention_times_v_equals_attention_times_v(activations, padded):
    layers, valid = activations
    for pattern, v in layers:
        effective = effective_attention(pattern, v, key_mask=valid, padded=padded)
        expected = pattern.double() @ v.double()
        got = effective.double() @ v.double()
        relative = (got - expected).norm(dim=(-2, -1)) / expected.norm(dim=(-2, -1))
        assert relative.max() <= 1e-5, f"max relative error {relative.max():.2e}"


def test_padded_semantics_depend_on_padding(activations):
    """padded=True (the original code) differs from the per-sequence answer; the default does not."""
    layers, valid = activations
    block = valid_block(valid)
    errors = []
    for pattern, v in layers:
        expected = torch.from_numpy(effective_attention_loop(pattern, v, valid))
        padded = effective_attention(pattern, v, key_mask=valid, padded=True)
        errors.append((padded.double() - expected).abs()[block.expand_as(padded)].max())
        # with padding, effective attention leaks onto padded keys
        assert padded.transpose(1, 3)[~valid].abs().max() > 1e-3
    assert max(errors) > 0.05


def test_short_sequences_skip_the_decomposition(activations, monkeypatch):
    layers, valid = activations
    pattern, v = layers[0]
    lengths = valid.sum(-1)
    seen = []
    original = core._column_space_basis

    def spy(v, valid, tolerance, **kwargs):
        seen.append(v.shape[0])
        return original(v, valid, tolerance, **kwargs)

    monkeypatch.setattr(core, "_column_space_basis", spy)
    effective_attention(pattern, v, key_mask=valid)
    assert seen == [int((lengths > D_HEAD).sum())]
    short = lengths <= D_HEAD
    seen.clear()
    got = effective_attention(pattern[short], v[short], key_mask=valid[short])
    assert seen == [] and torch.equal(got, pattern[short])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(activations, dtype):
    """Half inputs: computed in float64/float32 and returned in their dtype, rounding aside exact."""
    layers, valid = activations
    pattern, v = (x.to(dtype) for x in layers[2])
    got = effective_attention(pattern, v, key_mask=valid)
    assert got.dtype == dtype and got.device == pattern.device
    expected = torch.from_numpy(effective_attention_loop(pattern.float(), v.float(), valid))
    block = valid_block(valid).expand_as(pattern)
    error = (got.double() - expected).abs()[block]
    assert error.max() <= 2 * torch.finfo(dtype).eps * expected.abs().max()


def test_value_layout_is_checked(activations):
    layers, valid = activations
    pattern, v = layers[0]
    with unchecked(), pytest.raises(ValueError, match="rearrange"):
        effective_attention(pattern, einops.rearrange(v, "b h k d -> b k h d"))
    for padded in (False, True):  # padded=True ignores the mask's values, not a wrong shape
        with unchecked(), pytest.raises(ValueError, match="key_mask"):
            effective_attention(pattern, v, key_mask=valid[:, :10], padded=padded)


def test_pattern_layout_and_rtol_are_checked(activations):
    layers, valid = activations
    pattern, v = layers[0]
    with unchecked(), pytest.raises(ValueError, match=r"\[batch, head, query, key\]"):
        effective_attention(pattern[0], v[0])
    for bad in (float("nan"), float("inf"), -1e-3):
        with pytest.raises(ValueError, match="rtol"):
            effective_attention(pattern, v, key_mask=valid, rtol=bad)


def test_an_explicit_rtol_applies_to_short_sequences_too(activations):
    """A large tolerance drops directions of a short sequence's V as well (the loop applies it)."""
    layers, valid = activations
    pattern, v = layers[1]
    for rtol in (0.05, 0.5):
        got = effective_attention(pattern, v, key_mask=valid, rtol=rtol)
        expected = torch.from_numpy(effective_attention_loop(pattern, v, valid, rtol=rtol))
        block = valid_block(valid).expand_as(pattern)
        assert (got.double() - expected).abs()[block].max() <= ATOL
        short = valid.sum(-1) <= D_HEAD
        assert (got[short] - pattern[short]).abs().max() > 0.05  # the shortcut was not taken


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_padded_keys_columns_are_zero_even_where_the_pattern_puts_mass_there(activations, dtype):
    """Attention on padded keys is dropped for short and long sequences, on every route; float64
    (QR route) with the padding first, where Householder vectors touch the zeroed rows."""
    layers, valid = activations
    right = (*(x.to(dtype) for x in layers[3]), valid)
    left = (right[0].flip(-1).flip(-2), right[1].flip(-2), valid.flip(-1))  # padding first
    for pattern, v, mask in (right, left):
        smeared = pattern + 0.01 * (~mask)[:, None, None, :].to(dtype)  # mass on padded keys
        got = effective_attention(smeared, v, key_mask=mask)
        assert torch.all(got.transpose(1, 3)[~mask] == 0)
        expected = torch.from_numpy(effective_attention_loop(pattern, v, mask))
        assert (got.double() - expected).abs()[valid_block(mask).expand_as(got)].max() <= ATOL


def test_reference_loop_handles_an_all_padding_example(activations):
    layers, valid = activations
    pattern, v = layers[0]
    valid = valid.clone()
    valid[0] = False
    expected = effective_attention_loop(pattern, v, valid)
    got = effective_attention(pattern, v, key_mask=valid)
    assert np.all(expected[0] == 0) and torch.all(got[0] == 0)
    block = valid_block(valid).expand_as(pattern)
    assert (got.double() - torch.from_numpy(expected)).abs()[block].max() <= ATOL


@pytest.mark.parametrize(
    "dtype, rtol", [(torch.float64, 1e-3), (torch.float32, 1e-8)], ids=["float64", "tiny-rtol"]
)
def test_qr_route_takes_fewer_keys_than_d_head(activations, dtype, rtol):
    """The QR route (float64 values, or an rtol below GRAM_MIN_RTOL) on a batch whose padded
    length (9) is below d_head: reduced QR then gives fewer than d_head columns."""
    layers, valid = activations
    n = int(valid[0].sum())
    assert n < D_HEAD
    pattern, v = layers[2][0][:1, :, :n, :n].to(dtype), layers[2][1][:1, :, :n].to(dtype)
    got = effective_attention(pattern, v, rtol=rtol)
    expected = torch.from_numpy(effective_attention_loop(pattern, v, valid[:1, :n], rtol=rtol))
    assert got.shape == pattern.shape
    assert (got.double() - expected).abs().max() <= ATOL


@pytest.mark.parametrize("route", ["cpu", "device"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_short_sequences_with_dependent_values_are_decomposed(activations, route, dtype, monkeypatch):
    """A sequence of at most d_head keys keeps ``A`` only when its value vectors are independent:
    a repeated value row (a repeated token at the first layer of a model without positions in
    its residual stream, e.g. RoPE), a linear combination of others, or a head with no values
    leave a left null space, as a longer sequence has, which the loop's SVD finds. On both
    routes (the device's forced: every sequence decomposed, the short independent ones keeping
    ``A``), padding last and first; the untouched short sequence keeps ``A`` bit for bit.
    Tolerance: ATOL against the float64 loop (float32 values), 1e-10 for float64 ones."""
    layers, valid = activations
    pattern, v = (x.to(dtype).clone() for x in layers[1])
    lengths = valid.sum(-1).tolist()
    assert lengths[:4] == [9, 20, 31, 32]  # the short sequences
    v[0, :, 3] = v[0, :, 1]  # every head: key 3's values repeat key 1's
    v[1, 0, 5] = 2 * v[1, 0, 0] - v[1, 0, 2]  # head 0: key 5's are a combination
    v[2, 4] = 0  # head 4: no values at all
    if route == "device":
        monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    eps, atol = (np.finfo(np.float32).eps, ATOL) if dtype == torch.float32 else (np.finfo(np.float64).eps, 1e-10)
    right = (pattern, v, valid)
    left = (pattern.flip(-1).flip(-2), v.flip(-2), valid.flip(-1))  # padding first
    for pat, values, mask in (right, left):
        got = effective_attention(pat, values, key_mask=mask)
        expected = torch.from_numpy(effective_attention_loop(pat, values, mask, eps=float(eps)))
        block = valid_block(mask).expand_as(got)
        assert (got.double() - expected).abs()[block].max() <= atol
        for example, heads in ((0, slice(None)), (1, 0), (2, 4)):
            assert (got[example, heads] - pat[example, heads]).abs().max() > 1e-2, (example, heads)
        assert torch.equal(got[3], pat[3].masked_fill(~mask[3, None, None, :], 0))
        # the part that reaches the output is unchanged
        torch.testing.assert_close(got @ values, pat @ values, atol=atol * 10, rtol=1e-5)
