"""Demo: compare standard, PAPA and effective attention on the default model and corpus.

Run with `make demo` (offline). It

1. loads the embedded all-MiniLM-L6-v2 and the first texts of the embedded default corpus
   (sentences written for attnlens, then prose from the Python documentation that ships with
   Python itself: ``pydoc_data.topics``);
2. runs ``attnlens.compare(model, "papa", "effective")``: PAPA constants are fitted on the corpus,
   then one pass measures, head by head, what each view attends to and how far it is from the
   model's own attention;
3. writes the self-contained HTML report (plotly.js embedded, works offline) and prints where;
4. measures what replacing attention by PAPA constants does to what MiniLM is for: sentence
   embeddings. MiniLM is a sentence-embedding model; its output is the last hidden state
   mean-pooled over the real tokens (as sentence-transformers computes it). For a few sentences
   the demo prints the cosine similarity between the model's own embedding and the embedding
   with the least input-dependent half of the heads, then all heads, replaced by their PAPA
   constants (``hook_pattern`` hooks).

The default checkpoint ships no masked-LM head: the bridge's MLM head is randomly initialised at
load, so its logits and top predictions mean nothing and the demo prints none of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import attnlens
from attnlens import papa
from attnlens.cli import summary
from attnlens.core.corpus import default_corpus

N_TEXTS = 96
MAX_LEN = 64
REPORT = Path("report.html")

SENTENCES = [
    "The film is a charming, funny and moving portrait of a family.",
    "It rained all day, so the match was postponed until Sunday.",
    "Researchers measured how much each attention head depends on its input.",
    "Short one.",
]


def sentence_embeddings(model, batch, fwd_hooks=()) -> torch.Tensor:
    """MiniLM's sentence embeddings ``[batch, d_model]``: the last block's output
    (``blocks.{n_layers - 1}.hook_out``, HF's ``last_hidden_state``) mean-pooled over the real
    tokens of each example. ``fwd_hooks`` run too (e.g. PAPA replacement)."""
    captured = {}

    def keep(hidden, hook):
        captured["hidden"] = hidden.detach()

    last = f"blocks.{model.cfg.n_layers - 1}.hook_out"
    with torch.no_grad():
        model.run_with_hooks(
            batch.input_ids, **batch.model_kwargs(), fwd_hooks=[*fwd_hooks, (last, keep)]
        )
    real = batch.attention_mask[..., None].to(captured["hidden"].dtype)
    return (captured["hidden"] * real).sum(1) / real.sum(1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


def embedding_similarity(model, constants) -> tuple[dict[str, torch.Tensor], float]:
    """Per sentence of SENTENCES, the cosine similarity between the model's own embedding
    (ordinary tokenization) and the embedding in the constants' layout: with no head replaced
    (the layout alone: it moves [SEP] to the last position), with the least input-dependent
    half of the heads replaced, and with all heads replaced. Also, for scale, the mean
    similarity between the model's embeddings of two different sentences."""
    plain = attnlens.tokenize(model, SENTENCES, max_len=constants.max_len, layout="padded")
    reference = sentence_embeddings(model, plain)
    batch = attnlens.tokenize(model, SENTENCES, max_len=constants.max_len, layout=constants.layout)
    similarity = {}
    for label, heads in (("layout only", None), ("half replaced", 0.5), ("all replaced", "all")):
        hooks = [] if heads is None else list(papa.hooks(constants, heads=heads))
        similarity[label] = cosine(sentence_embeddings(model, batch, hooks), reference)
    pairs = torch.combinations(torch.arange(len(SENTENCES)))
    between = cosine(reference[pairs[:, 0]], reference[pairs[:, 1]]).mean().item()
    return similarity, between


def print_similarity(model, constants) -> None:
    similarity, between = embedding_similarity(model, constants)
    print(f"cosine similarity to the model's own sentence embedding ({constants.layout} layout):")
    print(f"  {'sentence':<48} " + " ".join(f"{label:>14}" for label in similarity))
    for index, sentence in enumerate(SENTENCES):
        text = sentence if len(sentence) <= 48 else sentence[:45] + "..."
        print(f"  {text:<48} " + " ".join(f"{values[index]:>14.3f}" for values in similarity.values()))
    print(f"  {'mean':<48} " + " ".join(f"{values.mean():>14.3f}" for values in similarity.values()))
    print(f"for scale, two different sentences above: mean cosine similarity {between:.3f}")


def main() -> None:
    model = attnlens.load()
    cfg = model.cfg
    print(f"model: {cfg.model_name} ({cfg.n_layers} layers x {cfg.n_heads} heads, d_head {cfg.d_head})")

    texts = default_corpus(N_TEXTS)
    print(f"corpus: the first {len(texts)} texts of the embedded default corpus, max_len {MAX_LEN}")
    constants = papa.fit(model, texts, max_len=MAX_LEN)  # the PAPA layout, as compare fits them
    comparison = attnlens.compare(model, "papa", "effective", corpus=texts, constants=constants)
    print(summary(comparison))
    path = comparison.save_html(REPORT)
    print(f"report: {path.resolve()}")

    print()
    print("PAPA constants in place of attention (hook_pattern hooks), sentence embeddings:")
    print_similarity(model, constants)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
