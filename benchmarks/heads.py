"""Benchmark: what the "what heads do" analyses cost beside the forward they need (issue 14).

Three measurements on MiniLM, each against the plain forward that does the same model work:

- ``patterns.types`` (Kovaleva's types of every (example, layer, head) map, standard view) ÷ a
  plain forward of the same batches (by length and compact, as the pass runs them:
  :func:`common.pass_order`) stopped at the same point (after the last layer's
  ``hook_pattern``: :func:`attnlens.engine.forward.run_patterns` with ``until``); WikiText-2 paragraphs;
- ``syntax.dependency_heads`` (word attention, every head's prediction for every arc) ÷ the plain
  forward of the same sentences (as :class:`attnlens.Words`, same layout and ``max_len``), same
  stop; UD English EWT dev;
- ``ablation.importance`` (gates on every head's ``hook_z``, the gradient of a loss with respect
  to them) ÷ one forward + backward of the same batches and loss, the gradient taken with
  respect to the first block's input (so it flows through every layer, as the gates' does).

The limit of each ratio is 1.00x (the analysis does the forward's work plus its own); the target
of the first two is <= 1.20x. Whole passes are timed alternately after a warm-up; the median of
the back-to-back pairs is the headline. Wall-clock on a possibly shared CPU.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/heads.py [--texts 256] [--sentences 512] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from common import add_arguments, pass_order, setup
from realdata import DATA, wikitext_paragraphs

import attnlens
from attnlens import ablation
from attnlens.core.inputs import default_layout
from attnlens.engine.accumulator import PassBatch
from attnlens.engine.forward import run_patterns
from attnlens.methods import conllu, patterns, syntax

TARGET = 1.20


def pairs(first: Callable[[], None], second: Callable[[], None], repeats: int) -> tuple[list[float], list[float]]:
    """Alternate the two, ``repeats`` times each (first-second, then second-first, ...)."""
    times: tuple[list[float], list[float]] = ([], [])
    order = ((first, times[0]), (second, times[1]))
    for repeat in range(repeats):
        for function, bucket in order[:: 1 if repeat % 2 == 0 else -1]:
            start = time.perf_counter()
            function()
            bucket.append(time.perf_counter() - start)
    return times


def report(name: str, analysis: list[float], plain: list[float], plain_name: str, n: int, unit: str,
           target: float | None) -> None:
    ratios = sorted(a / p for a, p in zip(analysis, plain, strict=True))
    ratio = statistics.median(ratios)
    t_a, t_p = statistics.median(analysis), statistics.median(plain)
    verdict = "" if target is None else f"; target <= {target:.2f}x: {'met' if ratio <= target else 'missed'}"
    print(f"{name:<26} median {t_a:7.2f} s  {n / t_a:7.1f} {unit}/s")
    print(f"{plain_name:<26} median {t_p:7.2f} s  {n / t_p:7.1f} {unit}/s")
    print(f"RATIO {name} / {plain_name}: {ratio:.3f}x (pairs {ratios[0]:.3f}-{ratios[-1]:.3f}x; "
          f"limit 1.00x{verdict})\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--importance", type=int, default=512, help="sequences for importance")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    model = attnlens.load(device=device)
    model.eval()
    layout = "padded"  # the analyses' default inputs (importance's: default_layout(model), below)
    n_layers = model.cfg.n_layers
    last_pattern = f"blocks.{n_layers - 1}.attn.hook_pattern"
    print(f"heads benchmark: {attnlens.core.loading.model_id(model)}, max_len {args.max_len}, "
          f"batch {args.batch_size}, layout {layout}, torch threads {torch.get_num_threads()}\n")

    def plain_forward(examples: list, layout: str = layout) -> None:
        for start in range(0, len(examples), args.batch_size):
            batch = attnlens.tokenize(model, examples[start : start + args.batch_size],
                                      max_len=args.max_len, layout=layout, compact=True)
            with torch.inference_mode():
                run_patterns(model, batch, [], until=last_pattern)

    # -- pattern types ------------------------------------------------------------------------
    texts = wikitext_paragraphs()[: args.texts]

    def types() -> None:
        patterns.types(model, texts, max_len=args.max_len, layout=layout, batch_size=args.batch_size,
                       progress=False)

    types()  # warm-up
    ordered = pass_order(model, texts, args.batch_size)  # the batches patterns.types runs: by length
    analysis, plain = pairs(types, lambda: plain_forward(ordered), args.repeats)
    report("patterns.types", analysis, plain, "plain forward", len(texts), "texts", TARGET)

    # -- syntactic heads -------------------------------------------------------------------------
    treebank = DATA / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
    sentences = conllu.read_conllu(treebank, limit=args.sentences)
    lengths = syntax.token_counts(model, sentences, layout)
    kept = [s for s, n in zip(sentences, lengths, strict=True) if n is not None and n <= args.max_len]
    words = pass_order(model, [attnlens.Words(s.words) for s in kept], args.batch_size)  # as the pass runs them

    def dependency() -> None:
        syntax.dependency_heads(model, treebank, limit=args.sentences, max_len=args.max_len,
                                layout=layout, batch_size=args.batch_size, progress=False)

    dependency()
    analysis, plain = pairs(dependency, lambda: plain_forward(words), args.repeats)
    report("dependency_heads", analysis, plain, "plain forward", len(kept), "sentences", TARGET)

    # -- importance ----------------------------------------------------------------------------
    sequences = wikitext_paragraphs()[args.texts : args.texts + args.importance]
    batch_size = 16

    def loss(output: torch.Tensor, batch: PassBatch) -> torch.Tensor:
        """A loss of every example: the mean log-sum-exp of its real tokens' logits."""
        mask = batch.key_mask.to(output.dtype)
        return (output.logsumexp(-1) * mask).sum(-1) / mask.sum(-1)

    layout = default_layout(model)  # importance's default inputs

    def gates() -> None:
        ablation.importance(model, sequences, loss=loss, max_len=args.max_len, layout=layout,
                            batch_size=batch_size, progress=False)

    def forward_backward() -> None:
        for start in range(0, len(sequences), batch_size):
            batch = attnlens.tokenize(model, sequences[start : start + batch_size], max_len=args.max_len,
                                      layout=layout)
            leaf: dict[str, torch.Tensor] = {}

            def grad_from(x: torch.Tensor, hook: object, leaf: dict = leaf) -> torch.Tensor:
                leaf["x"] = x.detach().requires_grad_(True)
                return leaf["x"]

            with torch.enable_grad():
                output = attnlens.run_with_hooks(model, batch, [("blocks.0.hook_in", grad_from)])
                fake = PassBatch(batch, 0, model)
                torch.autograd.grad(loss(output, fake).sum(), leaf["x"])

    params = [p.requires_grad_(False) for p in model.parameters()]
    gates()
    analysis, plain = pairs(gates, forward_backward, args.repeats)
    report("importance", analysis, plain, "forward+backward", len(sequences), "sequences", None)
    del params


if __name__ == "__main__":
    main()
