"""Demo: compare standard, PAPA and effective attention on the default model and corpus.

Run with `make demo` (offline). It

1. loads the embedded all-MiniLM-L6-v2 and the first texts of the embedded default corpus
   (sentences written for attnlens, then prose from the Python documentation that ships with
   Python itself: ``pydoc_data.topics``);
2. runs ``attnlens.compare(model, "papa", "effective")``: PAPA constants are fitted on the corpus,
   then one pass measures, head by head, what each view attends to and how far it is from the
   model's own attention;
3. writes the self-contained HTML report (plotly.js embedded, works offline) and prints where;
4. as before, replaces every head's attention by uniform attention with a ``hook_pattern`` hook
   and prints how much the output moves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import attnlens
from attnlens.cli import summary
from attnlens.corpus import default_corpus
from attnlens.seam import key_mask

N_TEXTS = 96
MAX_LEN = 64
REPORT = Path("report.html")

SENTENCES = [
    "The film is a charming, funny and moving portrait of a family.",
    "It rained all day, so the match was postponed until Sunday.",
    "Researchers measured how much each attention head depends on its input.",
    "Short one.",
]


def uniform_attention(pattern, hook):
    valid = key_mask(pattern)[:, None, None, :].to(pattern.dtype)
    return (valid / valid.sum(-1, keepdim=True)).expand_as(pattern)


def intervention(model) -> None:
    """Before/after: every head's attention replaced by uniform attention over valid tokens."""
    batch = attnlens.tokenize(model, SENTENCES, max_len=32, layout="padded")
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
        edited = model.run_with_hooks(
            batch.input_ids,
            **batch.model_kwargs(),
            fwd_hooks=[(lambda name: name.endswith("hook_pattern"), uniform_attention)],
        )
    valid = batch.attention_mask.bool()
    change = (edited - logits).abs().amax(-1)[valid]
    pattern = cache["blocks.0.attn.hook_pattern"]
    print(f"batch: {len(batch)} sentences, {int(valid.sum())} tokens, pattern {tuple(pattern.shape)}")
    print(f"logit change with uniform attention in every head: max {change.max():.3f}, mean {change.mean():.3f}")
    top_before = logits.argmax(-1)[valid]
    top_after = edited.argmax(-1)[valid]
    print(f"tokens whose top prediction changed: {int((top_before != top_after).sum())} of {int(valid.sum())}")


def main() -> None:
    model = attnlens.load()
    cfg = model.cfg
    print(f"model: {cfg.model_name} ({cfg.n_layers} layers x {cfg.n_heads} heads, d_head {cfg.d_head})")

    texts = default_corpus(N_TEXTS)
    print(f"corpus: the first {len(texts)} texts of the embedded default corpus, max_len {MAX_LEN}")
    comparison = attnlens.compare(model, "papa", "effective", corpus=texts, max_len=MAX_LEN)
    print(summary(comparison))
    path = comparison.save_html(REPORT)
    print(f"report: {path.resolve()}")

    print()
    print("hook_pattern intervention (uniform attention in every head):")
    intervention(model)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
