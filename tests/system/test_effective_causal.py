"""Effective attention on causal decoders: each query row projected onto the values of the keys it
reads (``causal=True``, threaded from :func:`attnlens.core.loading.is_causal`), on tiny GPT-2,
tiny Llama (grouped key-value heads) and SmolLM2-135M.

Tolerances: 1e-5 absolute against the float64 per-row SVD loop
(:func:`attnlens.methods.effective.reference.effective_attention_loop` with ``causal=True``) for
float32 activations (observed ~1e-8), the tolerance the module's own tests allow; A⊥ V = A V per
row, with A⊥ cut to the keys the query reads, 1e-5 absolute and relative (float32 products over
at most 64 keys); a text alone, in a padded batch and as a prefix of a longer text 1e-5 absolute;
logits with every pattern replaced 1e-4 absolute (as ``test_effective_model.py``). Keys after
the query are exactly 0.
"""

from __future__ import annotations

import copy

import einops
import pytest
import torch

import attnlens
from attnlens.core.loading import is_causal
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator
from attnlens.methods import effective
from attnlens.methods.effective import effective_attention
from attnlens.methods.effective.reference import effective_attention_loop
from tests import tiny

ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("single_blas_thread")

#: tiny texts of 13 to 39 GPT-2 tokens (d_head = 8): every row past the eighth has a null space
TEXTS = [" ".join(tiny.CORPUS[:3]), tiny.CORPUS[0], " ".join(tiny.CORPUS[1:3])]
DECODERS = {"gpt2": tiny.gpt2_bridge, "llama": tiny.llama_bridge}


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request):
    model = DECODERS[request.param]()
    assert is_causal(model) and int(model.cfg.d_head) == 8
    return model


def values_of(model, batch) -> list[torch.Tensor]:
    """Every layer's values per query head ``[batch, head, key, d_head]`` (grouped key-value
    heads repeated for their query heads)."""
    names = [f"blocks.{layer}.attn.hook_v" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs(), names_filter=names)
    out = []
    for name in names:
        v = einops.rearrange(cache[name], "b k h d -> b h k d")
        out.append(v.repeat_interleave(model.cfg.n_heads // v.shape[1], dim=1))
    return out


def valid_block(valid: torch.Tensor) -> torch.Tensor:
    return valid[:, None, :, None] & valid[:, None, None, :]


def padded_gpt2():
    """Tiny GPT-2 with a pad token (a copy: the cached tokenizer stays without one)."""
    tokenizer = copy.deepcopy(tiny.gpt2_tokenizer())
    tokenizer.pad_token = tokenizer.eos_token
    return attnlens.load(tiny.tiny_gpt2(), tokenizer=tokenizer)


def left_padded(batch: attnlens.Batch) -> attnlens.Batch:
    """The same texts with the padding moved before them (``tokenize`` pads on the right)."""
    shifts = (~batch.attention_mask.bool()).sum(-1).tolist()
    ids = torch.stack([torch.roll(x, s, dims=-1) for x, s in zip(batch.input_ids, shifts, strict=True)])
    mask = torch.stack([torch.roll(x, s, dims=-1) for x, s in zip(batch.attention_mask, shifts, strict=True)])
    return attnlens.Batch(ids, mask, torch.zeros_like(ids), 0, "padded", batch.max_len,
                          token_types=False, positions_from_mask=True)


def test_matches_the_per_row_svd_loop(decoder):
    """(1) ``effective.run`` on a right-padded batch, every layer, against the float64 loop: for
    each row q, the SVD of V_≤q (the valid keys up to q) with the same tolerance, a_q projected
    on it; within ATOL on the valid block, and far from the old, non-causal projection."""
    batch = attnlens.tokenize(decoder, TEXTS, max_len=64, layout="padded")
    valid = batch.attention_mask.bool()
    assert not bool(valid.all()) and int(valid.sum(-1).max()) > 4 * decoder.cfg.d_head
    run = effective.run(decoder, batch)
    for layer, v in enumerate(values_of(decoder, batch)):
        expected = torch.from_numpy(effective_attention_loop(run.standard[layer], v, valid, causal=True))
        got = run.effective[layer].double()
        block = valid_block(valid).expand_as(got)
        assert (got - expected).abs()[block].max() <= ATOL, layer
        assert bool((got.permute(0, 3, 1, 2)[~valid] == 0).all())  # padded keys' columns
        whole = effective_attention(run.standard[layer], v, key_mask=valid)  # the non-causal projection
        assert (whole.double() - expected).abs()[block].max() > 0.05, layer


def test_keys_after_the_query_get_exactly_zero(decoder):
    """(2) A⊥[q, k > q] == 0 exactly, from ``effective.run``, from the hooks
    (``effective.pattern_hooks``) and from a pass's shared maps (``LayerPatterns.effective``,
    which the statistics, ``compare`` and the effective view read); and the three agree."""

    class Keep(Accumulator):
        name = "keep"
        needs_values = True

        def __init__(self) -> None:
            self.maps: dict[int, torch.Tensor] = {}

        def update(self, layer) -> None:
            self.maps[layer.layer] = layer.effective.clone()

        def state_dict(self) -> dict:
            return {}

        def result(self) -> dict:
            return self.maps

    batch = attnlens.tokenize(decoder, TEXTS, max_len=64, layout="padded")
    run = effective.run(decoder, batch)
    hooked: dict[int, torch.Tensor] = {}

    def record(layer, pattern, eff, valid) -> None:
        hooked[layer] = eff.clone()

    with torch.no_grad():
        attnlens.run_with_hooks(decoder, batch, effective.pattern_hooks(decoder, record))
    keep = Keep()
    passes.run(decoder, TEXTS, [keep], max_len=64, layout="padded", batch_size=len(TEXTS), progress=False,
               by_length=False)
    upper = torch.ones(batch.input_ids.shape[1], batch.input_ids.shape[1], dtype=torch.bool).triu(1)
    for layer in range(decoder.cfg.n_layers):
        for maps in (run.effective[layer], hooked[layer], keep.maps[layer]):
            assert maps.shape == run.standard[layer].shape
            assert bool((maps[..., upper] == 0).all()), layer
        torch.testing.assert_close(hooked[layer], run.effective[layer], atol=ATOL, rtol=0)
        torch.testing.assert_close(keep.maps[layer], run.effective[layer], atol=ATOL, rtol=0)
    assert (run.effective - run.standard).abs().max() > 0.05  # effective attention does differ


def test_each_row_reproduces_its_output_from_the_keys_it_reads(decoder):
    """(3) (A⊥ cut to k ≤ q) V = A V, row by row: the output of each query comes from the keys
    it reads. (The non-causal projection also gives A⊥ V = A V, but only with later keys' values.)"""
    batch = attnlens.tokenize(decoder, TEXTS, max_len=64, layout="padded")
    valid = batch.attention_mask.bool()
    run = effective.run(decoder, batch)
    causal = torch.ones(valid.shape[1], valid.shape[1], dtype=torch.bool).tril()
    rows = valid[:, None, :, None]
    for layer, v in enumerate(values_of(decoder, batch)):
        seen = run.effective[layer] * causal
        got, expected = seen @ v, run.standard[layer] @ v
        torch.testing.assert_close(got * rows, expected * rows, atol=ATOL, rtol=ATOL)


def test_a_text_alone_padded_and_as_a_prefix_gives_the_same_map():
    """(4) A text's map on its valid part is the same alone, in a batch with longer texts (right
    padding and left padding) and as the leading block of a longer text that starts with it: a
    row reads no later key, so what follows the text changes nothing. (The non-causal projection
    fails the last: its rows depend on the later tokens' values.)"""
    model = padded_gpt2()
    text, longer = tiny.CORPUS[0], " ".join(tiny.CORPUS[:3])
    assert longer.startswith(text)
    alone = effective.run(model, attnlens.tokenize(model, [text], max_len=64, layout="padded"))
    n = alone.effective.shape[-1]
    assert n > model.cfg.d_head
    right = attnlens.tokenize(model, [text, longer], max_len=64, layout="padded")
    assert int(right.attention_mask[0].sum()) == n < right.input_ids.shape[1]
    together = effective.run(model, right)
    torch.testing.assert_close(together.effective[:, 0, :, :n, :n], alone.effective[:, 0], atol=ATOL, rtol=0)
    # the longer text starts with the same tokens: its leading block is the text's map
    assert torch.equal(right.input_ids[1, :n], right.input_ids[0, :n])
    torch.testing.assert_close(together.effective[:, 1, :, :n, :n], alone.effective[:, 0], atol=ATOL, rtol=0)
    left = left_padded(right)
    assert not bool(left.attention_mask[0, 0])
    shifted = effective.run(model, left)
    torch.testing.assert_close(shifted.effective[:, 0, :, -n:, -n:], alone.effective[:, 0], atol=ATOL, rtol=0)
    assert bool((shifted.effective[:, 0, :, :, :-n] == 0).all())  # padded keys' columns


def test_repeated_values_on_a_rope_decoders_first_layer():
    """(5) Rank-deficient prefixes: a RoPE decoder's first layer gives a repeated token the same
    values, so even a row that reads fewer than d_head keys has a null space. Tiny Llama on
    "fox fox fox fox ...", every layer, against the causal loop; rows before the first repeat
    keep their row exactly."""
    model = tiny.llama_bridge()
    texts = ["fox fox fox fox the quick brown fox fox", "the quick brown fox"]
    batch = attnlens.tokenize(model, texts, max_len=32, layout="padded")
    valid = batch.attention_mask.bool()
    run = effective.run(model, batch)
    for layer, v in enumerate(values_of(model, batch)):
        expected = torch.from_numpy(effective_attention_loop(run.standard[layer], v, valid, causal=True))
        got = run.effective[layer]
        assert (got.double() - expected).abs()[valid_block(valid).expand_as(got)].max() <= ATOL, layer
    ids = batch.input_ids[0].tolist()
    repeat = next(q for q in range(len(ids)) if ids[q] in ids[:q])
    earlier = ids.index(ids[repeat])
    first, pattern = run.effective[0, 0], run.standard[0, 0]
    assert torch.equal(first[:, :repeat], pattern[:, :repeat])  # independent prefixes: A itself
    # a row that reads both copies: their equal values make the difference of their weights a
    # null-space direction, which A⊥ removes (A does not)
    rows = slice(repeat, model.cfg.d_head)
    assert (first[:, rows, earlier] - first[:, rows, repeat]).abs().max() <= ATOL
    assert (pattern[:, rows, earlier] - pattern[:, rows, repeat]).abs().max() > 1e-4


def test_smollm2_on_a_repeated_word(smollm2):
    """(5) SmolLM2-135M's first layer on "no, no, no, no, I said no.": 13 tokens (d_head = 64)
    whose values are of rank 7; layers 0 and 1 against the causal loop."""
    batch = attnlens.tokenize(smollm2, ["no, no, no, no, I said no."], max_len=32, layout="padded")
    valid = batch.attention_mask.bool()
    run = effective.run(smollm2, batch)
    values = values_of(smollm2, batch)
    for layer in (0, 1):
        expected = torch.from_numpy(effective_attention_loop(run.standard[layer], values[layer], valid, causal=True))
        assert (run.effective[layer].double() - expected).abs().max() <= ATOL, layer
    assert (run.effective[0] - run.standard[0]).abs().max() > 0.1  # the repeats' null space
    assert bool((run.effective.triu(1) == 0).all())


def test_hooks_leave_a_decoders_logits_unchanged(decoder):
    """(6) Replacing every pattern by its effective attention (``effective.hooks``) leaves the
    logits unchanged, and so does cutting the replaced patterns after the query (they put nothing
    there); the patterns the model then runs with are lower-triangular."""
    batch = attnlens.tokenize(decoder, TEXTS, max_len=64, layout="padded")
    valid = batch.attention_mask.bool()
    used: dict[str, torch.Tensor] = {}

    def cut(pattern, hook):
        used[hook.name] = pattern.clone()
        return pattern.tril()

    with torch.no_grad():
        plain = attnlens.run_with_hooks(decoder, batch)
        replaced = attnlens.run_with_hooks(decoder, batch, effective.hooks(decoder))
        cut_after = attnlens.run_with_hooks(
            decoder, batch, [*effective.hooks(decoder), (lambda name: name.endswith("hook_pattern"), cut)])
    torch.testing.assert_close(replaced[valid], plain[valid], atol=1e-4, rtol=0)
    torch.testing.assert_close(cut_after[valid], plain[valid], atol=1e-4, rtol=0)
    assert len(used) == decoder.cfg.n_layers
    for pattern in used.values():
        assert bool((pattern.triu(1) == 0).all())
    assert "causal" in effective.hooks(decoder).key()


def test_encoders_are_unchanged(minilm):
    """(7) On an encoder nothing is causal: ``effective.run`` and a pass give exactly what
    ``effective_attention`` gives with ``causal=False`` (the default), bit for bit, and the
    causal rule differs there (rows read later keys)."""
    assert not is_causal(minilm)
    texts = [" ".join(["word"] * 50), "a short text ."]
    batch = attnlens.tokenize(minilm, texts, max_len=64)
    valid = batch.attention_mask.bool()
    run = effective.run(minilm, batch)
    values = values_of(minilm, batch)
    stacked = effective_attention(run.standard.flatten(0, 1), torch.cat(values),
                                  key_mask=valid.repeat(minilm.cfg.n_layers, 1), check=False, causal=False)
    assert torch.equal(run.effective.flatten(0, 1), stacked)  # effective.run's one call
    maps = {}

    class Keep(Accumulator):
        name = "keep"
        needs_values = True

        def update(self, layer) -> None:
            maps[layer.layer] = (layer.pattern.clone(), layer.values.clone(), layer.key_mask.clone(),
                                 layer.effective.clone())

        def state_dict(self) -> dict:
            return {}

    passes.run(minilm, texts, [Keep()], max_len=64, batch_size=len(texts), progress=False, by_length=False)
    for layer, v in enumerate(values):
        plain = effective_attention(run.standard[layer], v, key_mask=valid)
        assert torch.equal(effective_attention(run.standard[layer], v, key_mask=valid, causal=False), plain)
        pattern, seen, mask, shared = maps[layer]  # a pass's shared maps (of its own batch)
        assert torch.equal(shared, effective_attention(pattern, seen, key_mask=mask, check=False))
        assert (effective_attention(run.standard[layer], v, key_mask=valid, causal=True) - plain).abs().max() > 1e-3
    assert "causal" not in effective.hooks(minilm).key()


def test_padded_semantics_and_shapes_on_a_decoder():
    """``padded=True`` on a decoder: V_≤q over every position up to q, padding included (the
    causal form of Sun & Marasović's padded length), against the loop given an all-True mask;
    a pattern that is not square is refused with causal=True."""
    model = padded_gpt2()
    batch = attnlens.tokenize(model, TEXTS, max_len=64, layout="padded")
    everything = torch.ones_like(batch.attention_mask, dtype=torch.bool)
    run = effective.run(model, batch, padded=True)
    for layer, v in enumerate(values_of(model, batch)):
        expected = torch.from_numpy(effective_attention_loop(run.standard[layer], v, everything, causal=True))
        assert (run.effective[layer].double() - expected).abs().max() <= ATOL, layer
    pattern, v = run.standard[0], values_of(model, batch)[0]
    with pytest.raises(ValueError, match="square"):
        effective_attention(pattern[:, :, :-1], v, causal=True)


@pytest.mark.parametrize("condition", [10.0, 1e3, 1e5, 1e7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_badly_conditioned_and_repeated_values_match_the_loop(condition, dtype):
    """Values of a given condition number (their singular values spread from 1 to 1 / condition),
    over three blocks of rows solved from one factorisation each (``CAUSAL_BLOCK`` rows), with a
    repeated value at the first row past ``d_head`` (a rank-deficient start: those rows' prefixes
    are rank-deficient or nearly so, and take the exact rule) and right padding: every row within
    ATOL of the per-row float64 SVD loop (float32 values; 1e-9 for float64 ones), exactly 0 after
    the query and on padded keys."""
    from attnlens.engine import effective_causal

    generator = torch.Generator().manual_seed(int(condition))
    batch, heads, d_head = 2, 3, 16
    n_keys = d_head + 2 * effective_causal.CAUSAL_BLOCK + 5
    left, _, right = torch.linalg.svd(torch.randn(batch, heads, n_keys, d_head, generator=generator,
                                                  dtype=torch.float64), full_matrices=False)
    spread = torch.logspace(0, -float(torch.tensor(condition).log10()), d_head, dtype=torch.float64)
    v = (left * spread) @ right
    v[0, :, d_head] = v[0, :, d_head - 1]  # a repeated value where the first block starts
    v = v.to(dtype)
    scores = torch.randn(batch, heads, n_keys, n_keys, generator=generator, dtype=torch.float64)
    later = torch.ones(n_keys, n_keys, dtype=torch.bool).triu(1)
    valid = torch.ones(batch, n_keys, dtype=torch.bool)
    valid[1, -7:] = False  # right padding
    scores = scores.masked_fill(later | ~valid[:, None, None, :], float("-inf"))
    pattern = scores.softmax(-1).nan_to_num(0.0).to(dtype)
    got = effective_attention(pattern, v, key_mask=valid, causal=True)
    eps = torch.finfo(dtype).eps  # the tolerance's epsilon: v's dtype, at least float32
    expected = torch.from_numpy(effective_attention_loop(pattern, v, valid, causal=True, eps=eps))
    block = valid_block(valid).expand_as(got)
    # float64: the exact rule's QR and SVD, about eps64 · κ (measured 6e-11 at κ = 1e7)
    atol = ATOL if dtype == torch.float32 else 1e-9
    assert (got.double() - expected).abs()[block].max() <= atol
    assert torch.all(got.masked_select(later) == 0)
    assert torch.all(got[1][..., -7:] == 0)


def test_a_comparison_written_before_causal_effective_attention_is_refused():
    """A decoder's Comparison JSON of format /1 holds effective maps with weight after the query,
    which the figures now blank: reading it is refused by its format, naming it, not misread."""
    import json

    from attnlens.comparison.result import Comparison
    from attnlens.errors import FileFormatError

    comparison = attnlens.compare(tiny.gpt2_bridge(), "effective", corpus=TEXTS, max_len=48, progress=False)
    data = json.loads(comparison.to_json())
    assert data["format"] == "attnlens.Comparison/2"
    assert Comparison.from_json(json.dumps(data)).causal
    data["format"] = "attnlens.Comparison/1"
    with pytest.raises(FileFormatError, match="its format is 'attnlens.Comparison/1', not 'attnlens.Comparison/2'"):
        Comparison.from_json(json.dumps(data))


def test_a_decoder_checkpoint_of_the_former_rule_is_not_resumed(tmp_path, monkeypatch):
    """A pass over a decoder records that its effective maps are causal (``effective`` in the
    checkpoint's header); a checkpoint written without it (by the former rule, every row onto
    the whole sequence's values) is refused, naming the setting, not resumed into causal maps.
    An encoder's header is unchanged, and so is a decoder's pass that reads no values."""
    from attnlens.errors import InputError

    class Mass(Accumulator):
        name = "mass"
        needs_values = True

        def __init__(self) -> None:
            self.total = torch.zeros((), dtype=torch.float64)

        def update(self, layer) -> None:
            self.total += layer.effective.double().abs().sum().to(self.total.device)

        def state_dict(self) -> dict:
            return {"total": self.total}

    gpt2, path = tiny.gpt2_bridge(), tmp_path / "mass.safetensors"
    real = passes._header
    headers = []

    def former(*args):
        header = real(*args)
        headers.append(dict(header["effective"]))
        header["effective"] = {key: value for key, value in header["effective"].items() if key != "causal"}
        return header

    monkeypatch.setattr(passes, "_header", former)
    passes.run(gpt2, TEXTS, [Mass()], max_len=48, progress=False, checkpoint=path)
    assert headers == [{"causal": True}]
    monkeypatch.setattr(passes, "_header", real)
    with pytest.raises(InputError, match=r"written by another run: effective \{\} \(now \{'causal': True\}\)"):
        passes.run(gpt2, TEXTS, [Mass()], max_len=48, progress=False, checkpoint=path)
    bert = tiny.bert_bridge()
    monkeypatch.setattr(passes, "_header", former)
    passes.run(bert, TEXTS, [Mass()], max_len=48, progress=False)
    assert headers[-1] == {}

    class Patterns(Mass):  # a decoder's pass that reads no values (papa.fit's kind): nothing recorded
        needs_values = False

        def update(self, layer) -> None:
            self.total += layer.pattern.double().sum().to(self.total.device)

    passes.run(gpt2, TEXTS, [Patterns()], max_len=48, progress=False)
    assert headers[-1] == {}


def _causal_case(values: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random causal pattern for ``values`` ``[batch, head, key, d_head]`` and an all-True mask."""
    batch, heads, n_keys, _ = values.shape
    generator = torch.Generator().manual_seed(seed)
    later = torch.ones(n_keys, n_keys, dtype=torch.bool).triu(1)
    scores = torch.randn(batch, heads, n_keys, n_keys, generator=generator, dtype=torch.float64)
    pattern = scores.masked_fill(later, float("-inf")).softmax(-1).to(values.dtype)
    return pattern, torch.ones(batch, n_keys, dtype=torch.bool)


def test_exact_copies_of_values_are_averaged_without_the_exact_rule(monkeypatch):
    """Rows whose values are exact copies of a few independent ones (a RoPE decoder's first layer:
    one value per distinct token, SmolLM2's 5,769 of 9,216 rows on 8 texts of 128 tokens) are
    each weight averaged over the copies of its value, the projection onto V_≤q's column space,
    even when they read more than d_head keys: none takes the exact rule (each used to: about
    half of SmolLM2's causal route's time). Near copies (one float32 step apart: rank-deficient
    within the tolerance, but not equal) still take it. Both within ATOL of the per-row loop."""
    from attnlens.engine import effective_causal

    generator = torch.Generator().manual_seed(3)
    d_head, n_distinct = 8, 5
    n_keys = 3 * d_head + 5
    pool = torch.randn(2, 3, n_distinct, d_head, generator=generator)
    which = torch.randint(0, n_distinct, (n_keys,), generator=generator)
    which[:n_distinct] = torch.arange(n_distinct)
    v = pool[:, :, which].clone()  # [2, 3, key, d_head]: 5 distinct values, repeated
    near = v[1, :, n_distinct:]
    near[..., 0] = torch.nextafter(near[..., 0], torch.tensor(float("inf")))  # example 1: near copies
    pattern, valid = _causal_case(v)
    rows: list[int] = []
    exact_rule = effective_causal._causal_exact

    def counted(rows_given, *args):
        rows.append(rows_given.shape[:-1].numel())
        return exact_rule(rows_given, *args)

    monkeypatch.setattr(effective_causal, "_causal_exact", counted)
    got = effective_attention(pattern, v, key_mask=valid, causal=True)
    expected = torch.from_numpy(effective_attention_loop(pattern, v, valid, causal=True))
    assert (got.double() - expected).abs().max() <= ATOL
    alone = effective_attention(pattern[:1], v[:1], key_mask=valid[:1], causal=True)
    assert torch.equal(alone, got[:1])
    assert sum(rows) >= 3 * (n_keys - n_distinct)  # example 1's rows after its first near copy
    rows.clear()
    effective_attention(pattern[:1], v[:1], key_mask=valid[:1], causal=True)
    assert sum(rows) == 0  # example 0: every row averaged over its copies
    # its rows: each weight the mean over the copies of its value among the keys read
    first = got[0, 0].double()
    for q in (n_distinct, n_keys - 1):
        for k in range(q + 1):
            copies = [j for j in range(q + 1) if which[j] == which[k]]
            assert abs(first[q, k] - pattern[0, 0, q, copies].double().mean()) <= 1e-6


def test_values_of_equal_hash_that_are_not_copies_are_not_grouped():
    """Copies are found by an integer hash of their bits (sixteen at a time, times fixed weights
    w), then checked entry by entry: two different values of equal hash (the bits w[1, 0] at
    entry 0 and w[0, 0] at entry 1, in the low 32 bits: w₁w₀ = w₀w₁) are not grouped, and every row matches the
    per-row loop (float64 values)."""
    from attnlens.engine import effective_causal

    d_head, n_keys = 8, 12
    weights = effective_causal.hash_weights(d_head)
    v = torch.randn(1, 2, n_keys, d_head, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    bits = torch.zeros(2, d_head, dtype=torch.int64)
    bits[0, 0], bits[1, 1] = weights[1, 0], weights[0, 0]
    v[:, :, 3], v[:, :, 7] = bits[0].view(torch.float64), bits[1].view(torch.float64)
    assert not torch.equal(v[0, 0, 3], v[0, 0, 7])
    pattern, valid = _causal_case(v, seed=1)
    copy, exact = effective_causal._repeats(v, valid)
    assert copy[0, 0, 7] == 3 and not exact[0, 0, 7]  # the same hash, not a copy
    got = effective_attention(pattern, v, key_mask=valid, causal=True)
    expected = torch.from_numpy(effective_attention_loop(pattern, v, valid, causal=True,
                                                         eps=torch.finfo(torch.float64).eps))
    assert (got - expected).abs().max() <= 1e-9


def test_the_cpu_s_chunks_of_sequences_give_the_same_numbers(decoder, monkeypatch):
    """On the CPU a decoder's effective attention takes CAUSAL_CPU_BYTES of rows at a time
    (``effective.run`` stacks every layer along the batch axis): one sequence at a time and all
    at once give the same maps, bit for bit (each sequence's arithmetic is its own)."""
    from attnlens.engine import bases

    batch = attnlens.tokenize(decoder, TEXTS, max_len=64, layout="padded")
    monkeypatch.setattr(bases, "CAUSAL_CPU_BYTES", 2**40)
    whole = effective.run(decoder, batch).effective
    monkeypatch.setattr(bases, "CAUSAL_CPU_BYTES", 1)
    assert torch.equal(effective.run(decoder, batch).effective, whole)


@pytest.mark.parametrize("no_read_width", [0, 64])
def test_the_device_routes_average_copies_as_the_cpu_does(monkeypatch, no_read_width):
    """Off the CPU (``reads_are_free`` patched False) copies are found and averaged with no read,
    and the exact rule is taken after the one read a call (``NO_READ_WIDTH`` 0) or for every row
    by ``torch.where`` (64): both give the CPU route's maps bit for bit, on values with exact copies,
    near copies and right padding."""
    from attnlens.core import devices
    from attnlens.engine import effective as engine

    generator = torch.Generator().manual_seed(7)
    d_head, n_keys = 8, 3 * 8 + 5
    pool = torch.randn(3, 2, 5, d_head, generator=generator)
    v = pool[:, :, torch.randint(0, 5, (n_keys,), generator=generator)].clone()
    v[1, :, 10:, 0] = torch.nextafter(v[1, :, 10:, 0], torch.tensor(float("inf")))  # near copies
    v[2] = torch.randn(2, n_keys, d_head, generator=generator)  # no copies
    pattern, valid = _causal_case(v, seed=2)
    valid[0, -6:] = False
    pattern = (pattern * valid[:, None, None, :]).contiguous()
    cpu = effective_attention(pattern, v, key_mask=valid, causal=True)
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    monkeypatch.setattr(engine, "NO_READ_WIDTH", no_read_width)
    assert torch.equal(effective_attention(pattern, v, key_mask=valid, causal=True, check=False), cpu)


def test_grouped_key_value_heads_are_taken_as_they_are():
    """A grouped-query model's values are handed per key-value head (``LayerPatterns.values``,
    ``[batch, kv_head, key, d_head]``: tiny Llama's 6 query heads read 2), and
    ``effective_attention`` takes them so: the same maps as the values repeated for each query
    head (``repeat_interleave``, Hugging Face's ``repeat_kv``), within float32 rounding for the
    causal rule (its certificates made once per key-value head, its products batched otherwise:
    observed ~1e-9) and bit for bit for the encoder's rule (which repeats them itself); 4 query
    heads cannot share 3 value heads, and are refused."""
    model = tiny.llama_bridge()
    batch = attnlens.tokenize(model, TEXTS, max_len=64, layout="padded")
    valid = batch.attention_mask.bool()
    seen = {}

    class Keep(Accumulator):
        name = "keep"
        needs_values = True

        def update(self, layer) -> None:
            seen[layer.layer] = (layer.pattern.clone(), layer.values.clone(), layer.effective.clone())

        def state_dict(self) -> dict:
            return {}

    passes.run(model, TEXTS, [Keep()], max_len=64, batch_size=len(TEXTS), progress=False, by_length=False)
    run = effective.run(model, batch)
    for layer, v in enumerate(values_of(model, batch)):
        pattern, kv, shared = seen[layer]
        assert kv.shape[1] == 2 and pattern.shape[1] == 6
        repeated = kv.repeat_interleave(3, dim=1)
        for causal in (True, False):
            grouped = effective_attention(pattern, kv, key_mask=valid, causal=causal)
            each = effective_attention(pattern, repeated, key_mask=valid, causal=causal)
            if causal:
                torch.testing.assert_close(grouped, each, atol=1e-6, rtol=0)
                torch.testing.assert_close(shared, each, atol=1e-6, rtol=0)
            else:
                assert torch.equal(grouped, each)
        torch.testing.assert_close(run.effective[layer], effective_attention(run.standard[layer], v, key_mask=valid,
                                                                             causal=True), atol=1e-6, rtol=0)
        loop = effective_attention_loop(pattern, kv, valid, causal=True)  # the reference takes them too
        assert (shared.double() - torch.from_numpy(loop)).abs()[valid_block(valid).expand_as(shared)].max() <= ATOL
    with pytest.raises(ValueError, match="sharing kv_head key-value heads evenly"):
        effective_attention(pattern[:, :4], kv.repeat_interleave(3, dim=1)[:, :3], key_mask=valid, causal=True)
