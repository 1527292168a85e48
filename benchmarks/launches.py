"""Benchmark: the kernels a pass launches per batch, against a plain forward's, counted on the CPU.

On a GPU a small batch's pass is bound by kernel launches, not arithmetic: the H200 profile of
``compare`` at batch 128 showed the GPU busy 169 ms of 1.35 s, with 35,819 launches
(``docs/performance.md``). Every ATen operator that computes (not a view: ``select``,
``reshape``, ``transpose``, ...) is one launch or more on a GPU, so counting them needs no GPU:
this runs each job on n and on 2n batches of 8 texts of the embedded corpus (MiniLM, max_len
32) under a ``TorchDispatchMode`` that counts them (but those of the host's tokenization, which
are CPU work on any device), with the device routes forced
(``attnlens.core.devices.reads_are_free`` false, as ``tests/system/test_host_reads.py`` does),
and prints the operators per extra batch, beside a plain TransformerLens forward's (the
cheapest a user writes: the texts by length, each batch padded to its longest), and the attnlens
functions that launch the most. The fast constant heads are counted on both routes of a layer
with both kinds of heads (:data:`attnlens.core.fast_heads.ASSEMBLED_OFF_THE_CPU`).

The limit is the forward's count (a pass cannot launch fewer than the forward it observes);
the ratio is what launch-bound GPU time scales with. A composite operator is counted as its
decomposition (a ``matmul`` of a transposed operand: its copy and a ``bmm``; an evaluation
``dropout``: nothing), whatever the grad mode the job runs in; a primitive is counted once even
where its own implementation launches several kernels.

Then the host's time per extra batch of 2 texts of at most 10 tokens, where the arithmetic is
small: the time the host takes to issue a batch's work, which a launch-bound GPU waits for
(Python, the dispatcher, hooks), over that of the encoder's forward through TransformerLens
(every layer: a full forward adds the MLM head's arithmetic, which a tiny batch does not make
small on a CPU). ``--rounds 0`` skips it.

Then (``--bytes``, off by default: minutes) the bytes each job's operators read and write per
extra batch at a size that fills a device more (``BYTES_SIZE``: 32 texts of up to 128 tokens),
the sum of every computing operator's tensor arguments and results, over the forward's: what a
memory-bound GPU's time scales with, where a launch-bound one's follows the operators. (A
product reads its operands once here, however it tiles them; the full forward's includes its
MLM head's vocabulary-sized logits, which a pass stopped after the last pattern never makes.)

Run: ``OMP_NUM_THREADS=1 python benchmarks/launches.py [--top 12] [--rounds 3] [--bytes]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnlens
from attnlens import papa
from attnlens.comparison.accumulator import ReportRows, row_tokens
from attnlens.core import devices, fast_heads
from attnlens.core.corpus import default_corpus
from attnlens.core.inputs import by_length, tokenize
from attnlens.engine.accumulator import on_host_copy
from attnlens.engine.batches import stage_batch
from attnlens.engine.forward import check_hooks, check_token_ids, run_patterns
from attnlens.evaluation import probing
from attnlens.methods import effective

#: operators that only make a view or change nothing (no kernel on a GPU) when their result
#: shares its input's storage; one that copies (``to`` another dtype, ``contiguous`` of a
#: strided tensor, ``reshape`` that cannot view) is counted (:func:`_copied`)
VIEWS = frozenset({
    "_reshape_alias", "_unsafe_view", "alias", "as_strided", "chunk", "contiguous", "detach", "diagonal",
    "expand", "expand_as", "flatten", "lift_fresh", "mT", "movedim", "narrow", "permute", "promote_types",
    "reshape", "select", "slice", "split", "split_with_sizes", "squeeze", "t", "to", "transpose", "unbind",
    "unflatten", "unsqueeze", "view", "view_as",
})
#: operators that allocate and compute nothing (the caching allocator: no kernel)
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
BATCH, MAX_LEN = 8, 32
#: the batch size and max_len of the host's timing (:func:`host_seconds`)
TINY = (2, 10)
#: the batch size and max_len of the bytes moved (``--bytes``)
BYTES_SIZE = (32, 128)


#: the host's work on a batch's tokens: its tokenization (a pass's, a plain forward's; run ahead
#: in a worker thread off the CPU), the checks of its tokens and of the hooks' layout before it
#: is copied, what accumulators compute of its tokens on the host copy (PassBatch.from_host;
#: on a GPU then moved in one copy a batch and key, not counted here), and compare's kept
#: rows' columns and tokens (found on the host copy, moved in one copy): CPU tensors on any
#: device, so none of their operators is a GPU launch
HOST = frozenset(inspect.unwrap(function).__code__ for function in (
    stage_batch, tokenize, check_hooks, check_token_ids, on_host_copy, row_tokens, ReportRows.of.__func__))


class Launches(TorchDispatchMode):
    """Counts the computing operators outside the host's tokenization (:data:`HOST`), by the
    attnlens function that called them."""

    def __init__(self) -> None:
        super().__init__()
        self.by_site: collections.Counter[str] = collections.Counter()
        #: bytes of each counted operator's tensor arguments and results, by the same sites
        self.bytes_by_site: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # a composite operator (``matmul``, ``linear``, ``dropout``, ``layer_norm``...) is run as
        # its decomposition, whose operators come back here: what its kernels are, whatever the
        # grad mode (under ``inference_mode`` the mode sees it whole; under ``no_grad``, already
        # decomposed: ``matmul`` of a transposed key is a copy and a ``bmm``, an evaluation
        # ``dropout`` nothing)
        with self:  # (as torch.utils.flop_counter.FlopCounterMode: the mode again for its parts)
            decomposed = func.decompose(*args, **(kwargs or {}))
        if decomposed is not NotImplemented:
            return decomposed
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ALLOCATIONS or (name in VIEWS and not _copied(args, out)):
            return out
        frame, site = sys._getframe(1), "transformers and TransformerLens"
        while frame is not None:
            if frame.f_code in HOST:
                return out
            file = frame.f_code.co_filename
            if site == "transformers and TransformerLens" and "/attnlens/" in file \
                    and not file.endswith("engine/forward.py"):
                site = f"{file.split('/attnlens/')[1]}:{frame.f_code.co_name}"
            frame = frame.f_back
        self.by_site[site] += 1
        self.bytes_by_site[site] += sum(value.numel() * value.element_size()
                                        for value in torch.utils._pytree.tree_leaves((args, kwargs, out))
                                        if isinstance(value, torch.Tensor))
        return out


def _copied(args: Any, out: Any) -> bool:
    """Whether a :data:`VIEWS` operator's result holds new memory (it copied) rather than a
    view of its first tensor argument."""
    source = next((arg for arg in args if isinstance(arg, torch.Tensor)), None)
    results = [value for value in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(value, torch.Tensor)]
    if source is None or not results:
        return False
    pointer = source.untyped_storage().data_ptr()
    return any(value.numel() and value.untyped_storage().data_ptr() != pointer for value in results)


def per_batch(job: Callable[[list[str]], Any], texts: list[str], n: int, batch: int = BATCH,
              bytes_moved: bool = False) -> collections.Counter[str]:
    """Operators per extra batch (``bytes_moved``: their bytes): the counts on 2n batches minus
    those on n, over n."""
    counts = []
    for size in (n, 2 * n):
        with Launches() as mode:
            job(texts[: size * batch])
        counts.append(mode.bytes_by_site if bytes_moved else mode.by_site)
    return collections.Counter({site: (counts[1][site] - counts[0][site]) / n for site in counts[1]
                                if counts[1][site] > counts[0][site]})


def host_seconds(job: Callable[[list[str]], Any], texts: list[str], n: int, batch: int, rounds: int) -> float:
    """Wall-clock seconds per extra batch (the time on 2n batches minus that on n, over n; the
    median of ``rounds``), at a size whose arithmetic is negligible: what the host spends to
    issue a batch's work, which a launch-bound GPU waits for."""
    job(texts[:batch])  # warm-up: caches, first-call costs
    measured = []
    for _ in range(rounds):
        times = []
        for size in (n, 2 * n):
            start = time.perf_counter()
            job(texts[: size * batch])
            times.append(time.perf_counter() - start)
        measured.append((times[1] - times[0]) / n)
    return statistics.median(measured)


def make_jobs(model: Any, constants: Any, batch: int, max_len: int) -> dict[str, Callable[[list[str]], Any]]:
    """The jobs compared, on batches of ``batch`` texts of at most ``max_len`` tokens."""

    def user_batches(batch_texts: list[str]) -> Iterator[Any]:
        """The cheapest batches a user writes: the texts by length, each batch padded to its longest."""
        ordered = [batch_texts[index] for index in by_length(model.tokenizer, batch_texts)]
        for start in range(0, len(ordered), batch):
            yield attnlens.tokenize(model, ordered[start : start + batch], max_len=max_len, layout="padded")

    def forward(batch_texts: list[str]) -> None:
        for inputs in user_batches(batch_texts):
            with torch.inference_mode():
                model(inputs.input_ids, **inputs.model_kwargs())

    options = dict(max_len=max_len, batch_size=batch, progress=False)
    return {
        "forward": forward,
        "papa.fit": lambda t: papa.fit(model, t, **options),
        "compare(papa, effective)": lambda t: attnlens.compare(model, "papa", "effective", corpus=t, max_len=max_len,
                                                               constants=constants, batch_size=batch, progress=False),
        # what a user runs: the constants fitted first (a pass whose recording the comparison replays)
        "compare(papa, effective), fitting the constants": lambda t: attnlens.compare(
            model, "papa", "effective", corpus=t, max_len=max_len, batch_size=batch, progress=False),
        "effective.statistics": lambda t: effective.statistics(model, t, **options),
        "probe features": lambda t: probing.extract(model, t, cache=False, **options),
        "probe features, half the heads constant (fast)": lambda t: probing.extract(
            model, t, hooks=papa.hooks(constants, heads=0.5, fast=True), cache=False, **options),
        "effective.run": lambda t: [effective.run(model, inputs) for inputs in user_batches(t)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8, help="n: the jobs run on n and 2n batches")
    parser.add_argument("--top", type=int, default=12, help="attnlens functions listed per job")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the host's time (0: not timed)")
    parser.add_argument("--bytes", action="store_true", help=f"the bytes moved per batch of {BYTES_SIZE[0]} x {BYTES_SIZE[1]}")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    model = attnlens.load(device="cpu")
    texts = default_corpus(2 * args.batches * BATCH)
    constants = papa.fit(model, texts, max_len=MAX_LEN, progress=False)
    devices.reads_are_free = lambda where: False  # the routes a GPU takes
    jobs = make_jobs(model, constants, BATCH, MAX_LEN)
    counted = {name: per_batch(job, texts, args.batches) for name, job in jobs.items()}
    # constant heads skipping their work (papa.intervention(fast=True)) against the plain encoder,
    # on one batch of the PAPA layout: a fast path must launch no more than the plain one
    batch = attnlens.tokenize(model, texts[:BATCH], max_len=MAX_LEN, layout="papa")
    encoder = model.original_model.bert
    kwargs = {"attention_mask": batch.attention_mask, "token_type_ids": batch.token_type_ids}

    def encoder_launches(fraction: float | None, assembled: bool = True) -> tuple[float, float]:
        """The launches and bytes of a forward after the first (inside the intervention, entered
        once, as a pass does: what it makes once, e.g. the constants' means, left out);
        ``assembled``: :data:`attnlens.core.fast_heads.ASSEMBLED_OFF_THE_CPU`."""
        with contextlib.ExitStack() as stack, torch.inference_mode():
            stack.callback(setattr, fast_heads, "ASSEMBLED_OFF_THE_CPU", fast_heads.ASSEMBLED_OFF_THE_CPU)
            fast_heads.ASSEMBLED_OFF_THE_CPU = assembled
            if fraction is not None:
                stack.enter_context(papa.intervention(model, constants, heads=fraction, fast=True))
            encoder(batch.input_ids, **kwargs)
            with Launches() as mode:
                encoder(batch.input_ids, **kwargs)
        return mode.by_site.total(), mode.bytes_by_site.total()

    plain, plain_bytes = encoder_launches(None)
    fast = {fraction: encoder_launches(fraction) for fraction in (0.25, 0.5, 0.75, 1.0)}
    by_group = {fraction: encoder_launches(fraction, assembled=False) for fraction in fast}
    floor = counted["forward"].total()
    print(f"MiniLM, batches of {BATCH} texts, max_len {MAX_LEN}, device routes (reads_are_free false); "
          "computing operators per extra batch (each one GPU launch or more)")
    for name, sites in counted.items():
        print(f"LAUNCHES {name}: {sites.total():,.0f} per batch = {sites.total() / floor:.2f}x the forward's "
              f"{floor:,.0f} (limit 1.00x)")
        if name != "forward":
            for site, count in sites.most_common(args.top):
                print(f"    {count:7.1f}  {site}")
    for name, counted_heads in (("assembled", fast), ("by group", by_group)):
        print(f"LAUNCHES constant heads (fast, {name}) ÷ the plain encoder's {plain:,.0f} operators and "
              f"{plain_bytes / 1e6:.1f} MB, one batch of {BATCH} x {MAX_LEN}: "
              + ", ".join(f"{fraction:.0%} replaced {count / plain:.2f}x / {moved / plain_bytes:.2f}x"
                          for fraction, (count, moved) in counted_heads.items())
              + " (limit: at most 1.00x, falling with the fraction)")
    if args.bytes:
        batch_size, width = BYTES_SIZE
        sized = make_jobs(model, papa.fit(model, texts, max_len=width, progress=False), batch_size, width)
        moved = {name: per_batch(job, default_corpus(4 * batch_size), 1, batch_size, bytes_moved=True)
                 for name, job in sized.items()}
        reference = moved["forward"].total()
        print(f"Bytes read and written per extra batch of {batch_size} texts, max_len {width}, device routes "
              f"(the full forward: {reference / 1e6:,.0f} MB)")
        for name, sites in moved.items():
            print(f"BYTES {name}: {sites.total() / 1e6:,.0f} MB = {sites.total() / reference:.2f}x the forward's")
            if name != "forward":
                for site, count in sites.most_common(min(args.top, 6)):
                    print(f"    {count / 1e6:9.1f} MB  {site}")
    if args.rounds:
        small, width = TINY
        last = f"blocks.{model.cfg.n_layers - 1}.hook_out"

        def encoder(batch_texts: list[str]) -> None:  # every layer, not the MLM head's arithmetic
            for start in range(0, len(batch_texts), small):
                run_patterns(model, attnlens.tokenize(model, batch_texts[start : start + small], max_len=width), [],
                             until=last)

        tiny = {"encoder": encoder, **make_jobs(model, papa.fit(model, texts, max_len=width, progress=False), *TINY)}
        seconds = {name: host_seconds(job, texts, 2 * args.batches, small, args.rounds) for name, job in tiny.items()}
        print(f"Host time per extra batch of {small} texts, max_len {width}, median of {args.rounds} rounds, device "
              "routes: the time to issue a batch's work (the arithmetic is small, but for the full forward's MLM "
              "head: the ratios are over the encoder's forward, every layer through TransformerLens)")
        for name, value in seconds.items():
            print(f"HOST {name}: {value * 1e3:.2f} ms per batch = {value / seconds['encoder']:.2f}x the encoder's")


if __name__ == "__main__":
    main()
