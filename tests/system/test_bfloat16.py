"""A model loaded with ``attnlens.load(dtype=torch.bfloat16)`` runs its forward in bf16, and every
statistic of its patterns is summed in float32 (one batch) and float64 (the running totals): the
PAPA constants (:class:`attnlens.methods.papa.fitting.PatternSums`) and the head statistics
(:class:`attnlens.methods.stats.Statistics`, the accumulator of ``attnlens.compare``) of the
standard and effective views. MiniLM, 32 texts of the embedded corpus, one batch padded to 64.

The tolerances are derived here, not tuned. Notation: ``u₃₂ = 2⁻²⁴`` and ``u₁₆ = 2⁻⁸`` are the
unit roundoffs of float32 and bfloat16 (bf16 keeps 8 significant bits), ``γ_n = n·u₃₂/(1 − n·u₃₂)``
(:func:`tests.precision.gamma`: ``n`` float32 roundings compounded, Higham ch. 3); ``B = 32``
examples, ``K = Q = 64`` keys and queries per row and per example; ``a_r`` a map's row
(standard: a softmax row; effective: a signed row ``A⊥``), restricted to the valid keys.

1. **Accumulation** (:func:`test_bf16_maps_are_summed_in_float32`). A bf16 entry is an exact
   float32 number, so the only error between attnlens's result ``S`` and the exact (float64) mean
   ``R`` of the very maps the bf16 forward produced is float32 summation:

   - a PAPA constant is a float32 sum over the ``B`` examples of non-negative terms, added into
     float64: ``|S − R| ≤ γ_{B+1}·R`` (about ``2·10⁻⁶`` relative);
   - a linear statistic (``to_cls``, ``to_sep``, ``to_punct``: a sum over at most ``K`` keys;
     ``to_self``, ``to_prev``, ``to_next``: one entry) of row ``r`` errs by at most
     ``γ_K·‖a_r‖₁``, and the batch's sum over its ``B·Q`` rows adds ``γ_{BQ}·Σ_r |s_r|``, so
     ``|S − R| ≤ γ_{K+BQ}·mean_r ‖a_r‖₁`` (about ``1.3·10⁻⁴`` for a softmax row, ``‖a_r‖₁ = 1``);
   - the entropy ``H = log S_r − (Σ w log w)/S_r`` of ``w = |a_r|``: each ``w log w`` within 3
     roundings (a 1-ulp ``log`` and a product), their sum ``γ_{K−1}``, ``S_r`` within
     ``γ_{K−1}``, so ``|ΔH_r| ≤ γ_{K+2}·(2Λ_r/S_r + 1 + |log S_r| + H_r)`` with
     ``Λ_r = Σ w|log w|``; summed over the rows, ``γ_{K+BQ+2}`` times the mean of that bracket;
   - ``sink`` (is ``to_first`` above 0.3) is a count, exact in float32 below 2²⁴; only rows whose
     ``to_first`` lies within ``γ_K·‖a_r‖₁`` of 0.3 may flip: their share bounds ``|S − R|``.

   These bounds are 30 times below what bf16 storage of the same sums would cost (one rounding
   of each total: up to ``u₁₆ = 3.9·10⁻³`` relative), so the test fails if a sum is kept in the
   pattern's dtype. A bf16 *running* sum is far worse: once the total of ``N`` probabilities
   passes 2⁸ the spacing of bf16 numbers exceeds 1 and additions of probabilities stall, an error
   growing like ``N·u₁₆``; the test shows it on the same values (a running bf16 sum over the
   examples for the constants, over the rows for ``to_cls``) and checks that it breaks the bound.

2. **Against float32** (:func:`test_bf16_statistics_against_float32`). The float32 model's
   results ``S₃₂`` differ from the bf16 model's ``S₁₆`` by the accumulation bounds of both (1.)
   plus the difference of the exact means, ``|R₁₆ − R₃₂| ≤ mean_r |s₁₆,r − s₃₂,r|`` (a mean of
   differences is at most the mean of their sizes: it does not grow with the number of rows
   averaged). That difference is what the bf16 forward changes in each map, ``Δa_r``:

   - a constant: ``mean_r |Δp_r(q, k)|`` over the examples with ``(q, k)`` valid;
   - a linear statistic weighs the keys with 0 or 1: ``|Δs_r| ≤ ‖Δa_r‖₁``;
   - the entropy of the rows normalised ``w/S``, ``P`` and ``P'`` at total-variation distance
     ``T_r = ½‖P − P'‖₁`` over ``K_r`` valid keys: ``|ΔH_r| ≤ T_r·log(K_r − 1) + h(T_r)``, ``h``
     the binary entropy (Fannes–Audenaert);
   - ``sink``: the share of rows where either model's ``to_first`` is above 0.3 and the other's
     not (counted exactly), plus the accumulation bounds.

   The per-entry change ``Δa_r`` is the bf16 forward's own error: it comes from every bf16
   product and residual addition of the layers below (on MiniLM up to 0.03 on an entry, 1.7·10⁻⁴
   on average), so it is measured on the same maps, and the test asserts the derived bound built
   from it. Both test functions print the bounds and the errors measured.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import attnlens
from attnlens.core.corpus import default_corpus
from attnlens.core.inputs import tokenize
from attnlens.engine import passes
from attnlens.engine.effective import effective_attention
from attnlens.engine.forward import pattern_hooks, run_patterns
from attnlens.methods.papa.constants import PapaConstants
from attnlens.methods.papa.fitting import PatternSums
from attnlens.methods.stats import SINK_THRESHOLD, STATISTICS, Statistics, token_classes
from tests.precision import U32, gamma

#: two MiniLM loads and four passes: about 15 s on 2 cores
pytestmark = pytest.mark.slow

N_TEXTS, MAX_LEN = 32, 64
VIEWS = ("standard", "effective")
LINEAR = ("to_cls", "to_sep", "to_punct", "to_self", "to_prev", "to_next")
#: float32 roundings of one row statistic (K keys) and of the batch's sum of its rows (B·Q)
ROW, ROWS = MAX_LEN, N_TEXTS * MAX_LEN


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return default_corpus(N_TEXTS)


@pytest.fixture(scope="module")
def runs(minilm, texts) -> dict[torch.dtype, dict]:
    """For the float32 and the bf16 MiniLM: what attnlens computes over ``texts`` in one batch
    (``"constants"``, ``"statistics"`` per view) and, from the same forward on the same batch,
    every row's exact statistics (:func:`_reference`)."""
    bf16 = attnlens.load(device="cpu", dtype=torch.bfloat16)
    return {torch.float32: _run(minilm, texts), torch.bfloat16: _run(bf16, texts)}


def _run(model, texts: list[str]) -> dict:
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    sums = PatternSums(PapaConstants.empty(model, max_len=MAX_LEN, layout="papa"))
    statistics = {view: Statistics(n_layers, n_heads, view) for view in VIEWS}
    # one batch, padded, in corpus order: the forward below is the same computation
    passes.run(model, texts, [sums, *statistics.values()], max_len=MAX_LEN, layout="papa",
               batch_size=N_TEXTS, progress=False, compact=False, by_length=False)
    batch = tokenize(model, texts, max_len=MAX_LEN, layout="papa")
    maps: dict[str, list[Tensor]] = {view: [] for view in VIEWS}
    dtypes = set()

    def keep(layer: int, pattern: Tensor, v: Tensor, valid: Tensor) -> None:
        dtypes.add(pattern.dtype)
        maps["standard"].append(pattern.float())
        maps["effective"].append(effective_attention(pattern, v, key_mask=valid, check=False).float())

    run_patterns(model, batch, pattern_hooks(model, keep))
    valid = batch.attention_mask.bool()
    classes = token_classes(model.tokenizer, batch.input_ids, valid)
    return {
        "dtypes": dtypes,
        "constants": sums.result().mean,
        "statistics": {view: accumulator.result() for view, accumulator in statistics.items()},
        "maps": {view: torch.stack(layers) for view, layers in maps.items()},  # [layer, batch, head, q, k]
        "valid": valid,
        "classes": classes,
    }


def _rows(maps: Tensor, valid: Tensor, classes: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every row's statistics in float64, ``[layer, batch, head, query]``, from the maps alone:
    the reference. Also ``l1`` (``‖a_r‖₁``), ``lambda`` (``Σ w|log w|``), ``total`` (``S_r``) and
    ``normalised`` rows (``|a_r| / S_r``, the entropy's distribution)."""
    keys = valid[None, :, None, None, :].double()
    a = maps.double() * keys
    out = {f"to_{name}": (a * mask[None, :, None, None, :].double()).sum(-1) for name, mask in classes.items()}
    diagonal = a.diagonal(dim1=-2, dim2=-1)
    out["to_self"] = diagonal
    out["to_prev"] = torch.cat([torch.zeros_like(diagonal[..., :1]), a.diagonal(-1, dim1=-2, dim2=-1)], -1)
    out["to_next"] = torch.cat([a.diagonal(1, dim1=-2, dim2=-1), torch.zeros_like(diagonal[..., :1])], -1)
    w = a.abs()
    total = w.sum(-1)
    w_log_w = torch.where(w > 0, w * w.clamp_min(1e-300).log(), 0.0)
    safe = total.clamp_min(1e-300)
    out["entropy"] = torch.where(total > 0, safe.log() - w_log_w.sum(-1) / safe, 0.0)
    first = valid & (valid.long().cumsum(-1) == 1)
    out["to_first"] = (a * first[None, :, None, None, :].double()).sum(-1)
    out["sink"] = (out["to_first"] > SINK_THRESHOLD).double()
    out["l1"] = out["total"] = total
    out["lambda"] = (w * w.clamp_min(1e-300).log().abs()).sum(-1)
    out["normalised"] = w / safe[..., None]
    return out


def _mean(rows: Tensor, valid: Tensor) -> Tensor:
    """Mean over the valid query rows, ``[layer, head]``."""
    weights = valid[None, :, None, :].double()
    return (rows * weights).sum(dim=(1, 3)) / weights.sum(dim=(1, 3))


def _accumulation_bounds(rows: dict[str, Tensor], valid: Tensor) -> dict[str, Tensor]:
    """Part 1 of the module docstring: how far attnlens's float32/float64 sums may be from the
    exact mean of the same maps, per statistic, ``[layer, head]``; each with one more rounding,
    ``u₃₂·|mean|``, for the means being returned in float32."""
    mean_l1 = _mean(rows["l1"], valid)
    bounds = {name: gamma(ROW + ROWS) * mean_l1 for name in LINEAR}
    total = rows["total"].clamp_min(1e-300)
    bracket = 2 * rows["lambda"] / total + 1 + total.log().abs() + rows["entropy"]
    bounds["entropy"] = gamma(ROW + ROWS + 2) * _mean(bracket, valid)
    near = (rows["to_first"] - SINK_THRESHOLD).abs() <= gamma(ROW) * rows["l1"]
    bounds["sink"] = _mean(near.double(), valid)
    return {name: bound + U32 * _mean(rows[name], valid).abs() for name, bound in bounds.items()}


def _measured(got: dict[str, Tensor], reference: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: (got[name].double() - reference[name]).abs() for name in STATISTICS}


def test_bf16_maps_are_summed_in_float32(runs):
    """Part 1: the bf16 model's constants and statistics are the exact means of its bf16 maps up
    to float32 summation, 30 times below one bf16 rounding; a bf16 running sum breaks the bound."""
    run = runs[torch.bfloat16]
    assert run["dtypes"] == {torch.bfloat16}  # the forward ran in bf16
    standard = run["maps"]["standard"].double()
    valid = run["valid"]
    pairs = (valid[:, :, None] & valid[:, None, :])[None, :, None].double()  # [1, batch, 1, q, k]
    exact = (standard * pairs).sum(1) / pairs.sum(1).clamp_min(1)  # [layer, head, q, k]
    bound = gamma(N_TEXTS + 1) * exact
    error = (run["constants"] - exact).abs()
    print(f"constants: max error {error.max():.2e}, max bound {bound.max():.2e}")
    assert (error <= bound).all()
    # a bf16 running sum over the examples of the same (bf16) values breaks it
    running = torch.zeros(exact.shape, dtype=torch.bfloat16)
    for example in range(N_TEXTS):
        running += (standard[:, example] * pairs[:, example]).to(torch.bfloat16)
    running_error = (running.double() / pairs.sum(1).clamp_min(1) - exact).abs()
    print(f"constants, bf16 running sum: max error {running_error.max():.2e}")
    assert (running_error > bound).any()

    for view in VIEWS:
        rows = _rows(run["maps"][view], valid, run["classes"])
        reference = {name: _mean(rows[name], valid) for name in STATISTICS}
        bounds = _accumulation_bounds(rows, valid)
        errors = _measured(run["statistics"][view], reference)
        for name in STATISTICS:
            print(f"{view} {name}: max error {errors[name].max():.2e}, bound {bounds[name].max():.2e}")
            assert (errors[name] <= bounds[name]).all(), (view, name)
        # a bf16 total of the same rows (one rounding) would break the bound somewhere ...
        stored = (reference["to_cls"].to(torch.bfloat16).double() - reference["to_cls"]).abs()
        assert (stored > bounds["to_cls"]).any()
        # ... and a bf16 running sum over the rows stalls: an error growing with the rows
        flat = (rows["to_cls"] * valid[None, :, None, :]).permute(1, 3, 0, 2).reshape(-1, *rows["to_cls"].shape[::2])
        running = torch.zeros(flat.shape[1:], dtype=torch.bfloat16)
        for row in flat.to(torch.bfloat16):
            running += row
        counts = valid.sum().double()
        running_error = (running.double() / counts - reference["to_cls"]).abs()
        print(f"{view} to_cls, bf16 running sum over {int(counts)} rows: max error {running_error.max():.2e}")
        assert (running_error > bounds["to_cls"]).any()


def _binary_entropy(t: Tensor) -> Tensor:
    t = t.clamp(0, 1)
    inside = (t > 0) & (t < 1)
    safe = t.clamp(1e-300, 1 - 1e-16)
    return torch.where(inside, -safe * safe.log() - (1 - safe) * (1 - safe).log(), 0.0)


def test_bf16_statistics_against_float32(runs):
    """Part 2: the bf16 model's constants and statistics are within the derived bound of the
    float32 model's: what bf16 changes in each map (the forward's own per-entry error, averaged
    over the rows, not summed) plus both models' float32 accumulation bounds."""
    one, other = runs[torch.float32], runs[torch.bfloat16]
    valid = one["valid"]
    assert torch.equal(valid, other["valid"])
    pairs = (valid[:, :, None] & valid[:, None, :])[None, :, None].double()
    p32, p16 = one["maps"]["standard"].double(), other["maps"]["standard"].double()
    forward = ((p16 - p32).abs() * pairs).sum(1) / pairs.sum(1).clamp_min(1)  # mean_r |Δp_r(q, k)|
    exact32 = (p32 * pairs).sum(1) / pairs.sum(1).clamp_min(1)
    exact16 = (p16 * pairs).sum(1) / pairs.sum(1).clamp_min(1)
    bound = forward + gamma(N_TEXTS + 1) * (exact32 + exact16)
    error = (one["constants"] - other["constants"]).abs()
    entries = (p16 - p32).abs() * pairs
    print(f"forward: max |Δp| {entries.max():.2e}, mean {entries.sum() / pairs.expand_as(entries).sum():.2e}")
    print(f"constants: max |bf16 - float32| {error.max():.2e}, max bound {bound.max():.2e}")
    assert (error <= bound).all()

    keys = valid.sum(-1)[None, :, None, None].double()  # K_r: the row's valid keys
    for view in VIEWS:
        rows32 = _rows(one["maps"][view], valid, one["classes"])
        rows16 = _rows(other["maps"][view], valid, other["classes"])
        accumulation32 = _accumulation_bounds(rows32, valid)
        accumulation16 = _accumulation_bounds(rows16, valid)
        difference = (other["maps"][view].double() - one["maps"][view].double()) * valid[None, :, None, None, :]
        l1 = _mean(difference.abs().sum(-1), valid)
        distance = 0.5 * (rows16["normalised"] - rows32["normalised"]).abs().sum(-1)
        fannes = distance * (keys - 1).clamp_min(1).log() + _binary_entropy(distance)
        flips = _mean((rows16["sink"] != rows32["sink"]).double(), valid)
        forward = {**{name: l1 for name in LINEAR}, "entropy": _mean(fannes, valid), "sink": flips}
        for name in STATISTICS:
            bound = forward[name] + accumulation32[name] + accumulation16[name]
            error = (one["statistics"][view][name].double() - other["statistics"][view][name].double()).abs()
            print(f"{view} {name}: max |bf16 - float32| {error.max():.2e}, bound {bound.max():.2e} "
                  f"(forward {forward[name].max():.2e})")
            assert (error <= bound).all(), (view, name)
        # the same tolerance is broken by a bf16 running sum of the bf16 model's rows (it stalls)
        rows = (rows16["to_cls"] * valid[None, :, None, :]).permute(1, 3, 0, 2).reshape(-1, *rows16["to_cls"].shape[::2])
        running = torch.zeros(rows.shape[1:], dtype=torch.bfloat16)
        for row in rows.to(torch.bfloat16):
            running += row
        stalled = (running.double() / valid.sum().double() - one["statistics"][view]["to_cls"].double()).abs()
        tolerance = l1 + accumulation32["to_cls"] + accumulation16["to_cls"]
        print(f"{view} to_cls, bf16 running sum: max |bf16 - float32| {stalled.max():.2e}")
        assert (stalled > tolerance).any()
