"""Measurement: does a *trained* LM head lose when every head is replaced by PAPA constants?

MiniLM's MLM probe scores higher with constants than with its own attention (docs/probing.md,
the curve's ``lm`` rows). MiniLM's MLM head is untrained and the probe is a fresh head trained
on frozen states, so that rise may say more about the probe than about the model (issue 60).
This checks the direction on a model whose LM head is trained: SmolLM2-135M (a Llama decoder,
30 × 9 heads) and its own causal LM head.

- constants: :func:`attnlens.papa.fit` on the first ``--fit`` WikiText-2 *validation* paragraphs
  (:func:`attnlens.evaluation.curve_inputs.constant_texts`), max_len 128;
- score: minus the mean negative log-likelihood per predicted token of the first ``--texts``
  WikiText-2 *test* paragraphs of more than 20 words (:func:`curve_inputs.lm_texts`, disjoint
  from the constants' paragraphs), each text scored alone (:func:`attnlens.evaluation.lm.scorer.score`,
  kind ``"causal"``), with no hook and with every head replaced;
- the difference (replaced − original) with its paired 95% bootstrap interval over the texts and
  its two-sided p-value (:func:`attnlens.evaluation.probing.intervals.paired_counts` on per-text
  ``[sum of log-likelihoods, tokens]``).

Writes ``docs/lm_check.csv`` and ``docs/lm_check.md``.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/lm_check.py [--fit 400] [--texts 100]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import add_arguments, setup
from realdata import DATA

import attnlens
from attnlens import papa
from attnlens.core.files import write_atomic
from attnlens.evaluation import curve_inputs
from attnlens.evaluation.lm import scorer
from attnlens.evaluation.probing.intervals import bootstrap_counts, paired_counts
from attnlens.methods.papa import HeadSet

OUT = Path(__file__).resolve().parents[1] / "docs" / "lm_check.csv"


def per_text(model, texts, hooks) -> np.ndarray:
    """``[text, 2]``: each text's summed log-likelihood of its predicted tokens, and how many."""
    rows = []
    for text in texts:
        score = scorer.score(model, [text], hooks=hooks, kind="causal", max_len=128, progress=False)
        rows.append([score.value * score.n_tokens, score.n_tokens])
    return np.asarray(rows, dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=int, default=400, help="validation paragraphs the constants are fitted on")
    parser.add_argument("--texts", type=int, default=100, help="test paragraphs scored")
    parser.add_argument("--out", default=str(OUT))
    add_arguments(parser)
    args = parser.parse_args()
    setup(args)
    started = time.perf_counter()
    model = attnlens.load("smollm2-135m", device=args.device)
    fitted_on = curve_inputs.constant_texts(DATA)[: args.fit]
    scored = curve_inputs.lm_texts(DATA, args.texts)
    assert not set(fitted_on) & set(scored)
    constants = papa.fit(model, fitted_on, max_len=128, progress=False)
    every = HeadSet.all(model.cfg.n_layers, model.cfg.n_heads)
    original = per_text(model, scored, ())
    replaced = per_text(model, scored, papa.hooks(constants, heads=every))
    rows = []
    for name, counts in (("original", original), ("every head replaced", replaced)):
        interval = bootstrap_counts(counts, "accuracy")  # a mean over tokens: [sum, count]
        rows.append(dict(model="SmolLM2-135M", head="its own causal LM head (trained)", attention=name,
                         score=interval.score, low=interval.low, high=interval.high))
    versus = paired_counts(original, replaced, "accuracy")
    rows[1].update(difference=versus.difference, difference_low=versus.low, difference_high=versus.high,
                   p_value=versus.p_value)
    table = pd.DataFrame(rows)
    out = Path(args.out)
    write_atomic(out, table.to_csv(index=False).encode("utf-8"))
    lines = ["| attention | score [95%] | difference [paired 95%] | p (two-sided) |", "|---|---|---|---|"]
    for row in table.itertuples():
        difference = ("–" if pd.isna(getattr(row, "difference", float("nan"))) else
                      f"{row.difference:+.3f} [{row.difference_low:+.3f}, {row.difference_high:+.3f}]")
        p = "–" if pd.isna(getattr(row, "p_value", float("nan"))) else f"{row.p_value:.4f}"
        lines.append(f"| {row.attention} | {row.score:.3f} [{row.low:.3f}, {row.high:.3f}] | {difference} | {p} |")
    write_atomic(out.with_suffix(".md"), ("\n".join(lines) + "\n").encode("utf-8"))
    print("\n".join(lines))
    print(f"SmolLM2-135M, constants on {len(fitted_on)} validation paragraphs, {len(scored)} test paragraphs "
          f"scored, {original[:, 1].sum():.0f} tokens; {time.perf_counter() - started:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
