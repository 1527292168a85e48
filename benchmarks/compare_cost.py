"""Benchmark: what ``attnlens compare`` costs beside one full forward of its corpus (issue 25.3).

Three jobs on the same texts (the embedded corpus, or its first ``--n``), MiniLM, max_len 128,
batch 32, in the PAPA layout (the one compare uses with the ``papa`` view), timed alternately:

- *forward*: the cheapest full forward a user writes: the texts sorted by length, each batch
  padded to its longest text, ``model(input_ids, ...)`` of every batch, tokenization included,
  under ``torch.inference_mode``: the embeddings, every layer and the MLM head (the bridge's
  unembed). The ratios are over it;
- *padded forward*: the same with every text padded to ``max_len`` in the PAPA layout, in corpus
  order (the reference of the tables before 2026-11-28), printed beside;
- *compare*: ``attnlens.compare(model, "papa", "effective")`` (fit the constants: one pass,
  whose patterns and values are kept; the comparison: a second pass replaying them, with no
  forward; the report's kept examples, 8-bit and deflated);
- off the CPU, *compare* again with every head's float64 exact basis computed instead of one
  read a batch of whether any head needs it (:data:`attnlens.engine.effective.NO_READ_WIDTH`),
  for a GPU to choose between the two;
- *CLI job*: ``attnlens compare --quiet --out report.html --json comparison.json`` on a corpus
  file of the same texts (loading the model, compare, the HTML report and the JSON written);
- the CLI job's *fixed costs*, timed apart: loading the model, and the figures, HTML and JSON of
  a comparison of one batch with the job's views, costs a faster device does not shorten (they
  bound the job's ratio on a GPU, whose forward of this corpus takes a fraction of a second).

Limit: compare runs one forward (the fit's: the comparison replays it,
:mod:`attnlens.engine.recording`), stopped after the last layer's pattern (no last MLP, no
unembed), the texts by length, each batch as wide as its longest text (:func:`attnlens.engine.passes.run`),
so in flops it is ``5 layers + the last layer's Q/K/QKᵀ`` over those batches, over the
forward's; the statistics, effective attention and the
report's encoding are extra work the limit leaves out.
The deflate share is the time spent in ``kept.deflate`` (the kept examples' codes, ISA-L's zlib format) over compare's time.
Target: the CLI job <= 1.4x the full forward (2.02x before issue 25).

Run: ``HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/compare_cost.py [--quick] [--n N] [--batch B]``
(on a GPU, ``--device cuda --batch 128``: batches that fill it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import (
    RANDOM_MODELS,
    add_arguments,
    alternate,
    encoder_flops,
    load_model,
    median_ratio,
    pattern_pass_flops,
    record,
    setup,
)

import attnlens
from attnlens import cli
from attnlens.core.corpus import default_corpus
from attnlens.core.inputs import by_length
from attnlens.engine import effective as engine_effective
from attnlens.methods import views
from attnlens.present import kept

TARGET = 1.4
MAX_LEN, BATCH = 128, 32
#: the kept examples' deflate, timed by the benchmark in its place
DEFLATE = kept.deflate


class _TimedDeflate:
    """:func:`attnlens.present.kept.deflate`, adding up its seconds."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, data: bytes) -> bytes:
        start = time.perf_counter()
        try:
            return DEFLATE(data)
        finally:
            self.seconds += time.perf_counter() - start


def fixed_costs(folder_of_model: str | None, device: str, texts: list[str], batch_size: int, folder: Path,
                repeats: int) -> dict[str, float]:
    """Seconds (medians of ``repeats``) of what the CLI job does besides the comparison, whatever
    the corpus: loading the model, and the report's figures, HTML and JSON of a comparison with
    the job's views (every registered one)."""
    model = attnlens.load(folder_of_model, device=device) if folder_of_model else attnlens.load(device=device)
    result = attnlens.compare(model, *views.names(), corpus=texts[:batch_size], batch_size=batch_size,
                              progress=False)

    def figures() -> int:
        result.__dict__.pop("figures", None)  # a cached property: made again
        return len(result.figures)

    steps = {
        "load": lambda: attnlens.load(folder_of_model, device=device) if folder_of_model else attnlens.load(device=device),
        "figures": figures,
        "HTML": lambda: result.save_html(folder / "fixed.html", overwrite_read_only=True),
        "JSON": lambda: result.to_json(folder / "fixed.json", overwrite_read_only=True),
    }
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main() -> None:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--n", type=int, default=None, help="first N texts of the embedded corpus (default all)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of the three jobs (default 3: one round moved the job by 0.3x between runs)")
    parser.add_argument("--quick", action="store_true", help="64 texts, 3 rounds")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"texts per batch (default {BATCH})")
    parser.add_argument("--model", default="minilm", choices=("minilm", *RANDOM_MODELS),
                        help="minilm (default) or a random-weight model of a user's size")
    args = parser.parse_args()
    batch_size = args.batch
    device = setup(args)
    n = args.n or (64 if args.quick else None)
    repeats = args.repeats or 3
    texts = default_corpus(n)
    model, folder_of_model = load_model(args.model, device)
    folder = Path(tempfile.mkdtemp(prefix="attnlens-bench-"))
    corpus_file = folder / "corpus.txt"
    corpus_file.write_text("\n".join(texts) + "\n", encoding="utf-8")
    print(f"compare cost: {args.model}, {len(texts)} texts, max_len {MAX_LEN}, batch {batch_size}, device {device}, "
          f"torch threads {torch.get_num_threads()}, {repeats} round(s)")
    ordered = [texts[index] for index in by_length(model.tokenizer, texts)]

    def forward() -> None:  # the cheapest full forward: by length, each batch padded to its longest
        for start in range(0, len(ordered), batch_size):
            batch = attnlens.tokenize(model, ordered[start : start + batch_size], max_len=MAX_LEN, layout="padded")
            batch = batch.to(device)
            with torch.inference_mode():
                model(batch.input_ids, **batch.model_kwargs())

    def padded_forward() -> None:
        for start in range(0, len(texts), batch_size):
            batch = attnlens.tokenize(model, texts[start : start + batch_size], max_len=MAX_LEN, layout="papa")
            batch = batch.to(device)
            with torch.inference_mode():
                model(batch.input_ids, **batch.model_kwargs())

    timed = _TimedDeflate()
    deflate_seconds: list[float] = []

    def compare() -> None:
        timed.seconds = 0.0
        kept.deflate = timed
        try:
            attnlens.compare(model, "papa", "effective", corpus=texts, batch_size=batch_size, progress=False)
        finally:
            kept.deflate = DEFLATE
        deflate_seconds.append(timed.seconds)

    def job() -> None:
        cli.main(["compare", "--quiet", "--force", "--device", device, "--batch-size", str(batch_size),
                  *(["--model", folder_of_model] if folder_of_model else []), "--corpus", str(corpus_file),
                  "--out", str(folder / "report.html"), "--json", str(folder / "comparison.json")])

    def compare_no_read() -> None:  # off the CPU: every head's exact basis, no read (effective.NO_READ_WIDTH)
        width = engine_effective.NO_READ_WIDTH
        engine_effective.NO_READ_WIDTH = int(model.cfg.d_head)
        try:
            attnlens.compare(model, "papa", "effective", corpus=texts, batch_size=batch_size, progress=False)
        finally:
            engine_effective.NO_READ_WIDTH = width

    forward()  # warm-up
    padded_forward()
    attnlens.compare(model, "papa", "effective", corpus=texts[:batch_size], batch_size=batch_size, progress=False)
    off_the_cpu = torch.device(device).type != "cpu"
    jobs = [forward, padded_forward, compare, job, *([compare_no_read] if off_the_cpu else [])]
    t_forward, t_padded, t_compare, t_job, *t_no_read = alternate(jobs, repeats, device)
    report_mb = (folder / "report.html").stat().st_size / 1e6
    fixed = fixed_costs(folder_of_model, device, texts, batch_size, folder, repeats)
    shutil.rmtree(folder, ignore_errors=True)  # the corpus, the report and its JSON

    full = 0.0  # the forward computes every position of each batch, padded to its longest text
    for start in range(0, len(ordered), batch_size):
        width = attnlens.tokenize(model, ordered[start : start + batch_size], max_len=MAX_LEN,
                                  layout="padded").input_ids.shape
        full += encoder_flops(model.cfg, width[0] * width[1], width[1])
    # compare's one forward (the fit's, replayed by the comparison) runs by length, each batch as wide as its
    # longest text
    one_pass = pattern_pass_flops(model, texts, max_len=MAX_LEN, layout="papa", batch_size=batch_size)
    limit = one_pass / full
    r_compare, r_job = median_ratio(t_compare, t_forward), median_ratio(t_job, t_forward)
    share = statistics.median(z / c for z, c in zip(deflate_seconds, t_compare, strict=True))
    med = statistics.median
    print(f"forward       median {med(t_forward):7.2f} s  (runs {', '.join(f'{t:.2f}' for t in t_forward)}; "
          f"by length, padded to each batch's longest)")
    print(f"padded fwd    median {med(t_padded):7.2f} s  (every text padded to {MAX_LEN}: "
          f"{median_ratio(t_padded, t_forward):.2f}x the forward)")
    print(f"compare       median {med(t_compare):7.2f} s  ratio {r_compare:.2f}x  (limit {limit:.2f}x in flops)")
    print(f"CLI job       median {med(t_job):7.2f} s  ratio {r_job:.2f}x  (target <= {TARGET:.1f}x: "
          f"{'met' if r_job <= TARGET else 'missed'}; report {report_mb:.2f} MB)")
    if t_no_read:
        print(f"compare, every head's exact basis computed (no read a batch; effective.NO_READ_WIDTH "
              f"{int(model.cfg.d_head)}) median {med(t_no_read[0]):7.2f} s  ratio "
              f"{median_ratio(t_no_read[0], t_forward):.2f}x  (the default reads once a batch)")
    print(f"deflate share of compare: {100 * share:.1f}% (ISA-L level {kept.COMPRESSION_LEVEL}; target <= 3%)")
    print("CLI job's fixed costs (medians; what a faster device does not shorten): "
          + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in fixed.items())
          + f" = {sum(fixed.values()):.2f} s, {sum(fixed.values()) / med(t_forward):.2f}x the forward")
    suffix = ("" if args.model == "minilm" else f", {args.model}") + ("" if batch_size == BATCH else f", batch {batch_size}")
    name = "compare_cost" + ("" if args.model == "minilm" else f"_{args.model}") + ("" if batch_size == BATCH else f"_b{batch_size}")
    record(name, [
        {"job": f"attnlens.compare(papa, effective){suffix}", "seconds": med(t_compare), "forward_ratio": r_compare,
         "limit_ratio": limit, "note": f"deflate {100 * share:.1f}%; batch {batch_size}"},
        {"job": f"attnlens compare (CLI job){suffix}", "seconds": med(t_job), "forward_ratio": r_job,
         "limit_ratio": limit, "note": f"target <= {TARGET}x; report {report_mb:.1f} MB"},
        *([{"job": f"attnlens.compare(papa, effective){suffix}, every head's exact basis (no read)",
            "seconds": med(t_no_read[0]), "forward_ratio": median_ratio(t_no_read[0], t_forward),
            "limit_ratio": limit, "note": f"effective.NO_READ_WIDTH {int(model.cfg.d_head)}"}] if t_no_read else []),
    ], texts=len(texts), max_len=MAX_LEN, device=device, threads=torch.get_num_threads(),
        forward_seconds=med(t_forward), padded_forward_seconds=med(t_padded), batch=batch_size,
        fixed_seconds=fixed)


if __name__ == "__main__":
    main()
