"""The ``attnlens`` command line.

::

    attnlens compare [--model M] [--device D] [--corpus FILE|default]
                     [--views standard,papa,effective] [--max-len N] [--n-examples N]
                     [--batch-size N] [--constants FILE] [--example N] [--focus L,H]
                     [--json FILE] [--task T ...] [--data-dir DIR] [--lm-texts FILE]
                     [--quiet] --out report.html
    attnlens fit-papa [--model M] [--device D] [--corpus FILE|default] [--max-len N]
                      [--layout papa|padded]
                      [--n-examples N] [--batch-size N] [--checkpoint FILE [--checkpoint-every N]]
                      [--quiet] --out constants.safetensors
    attnlens merge a.safetensors b.safetensors ... --out all.safetensors
    attnlens curve --constants constants.safetensors --task sst2 [--task ner ...] [--device D] \
        [--data-dir DIR] [--lm-texts FILE] [--fractions 0,0.5,0.875,0.9375,1] --out curve.html
    attnlens table --constants constants.safetensors --task sst2 [--task cola ...] [--seeds 3] \
        [--data-dir DIR] [--lm-texts FILE] --out table.html
    attnlens --version

Every command also takes ``--force`` (replace read-only outputs) and ``--debug`` (tracebacks).

    torchrun --nproc_per_node N -m attnlens fit-papa ...        # N processes, one result
    torchrun --nnodes M --nproc_per_node N --rdzv_backend c10d --rdzv_endpoint HOST:PORT \
        -m attnlens fit-papa ...                                # M machines

Under ``torchrun`` (``WORLD_SIZE`` > 1) each rank fits its contiguous, batch-aligned shard of
the corpus (gloo on CPU, NCCL on GPU), the sums are all-reduced, and rank 0 writes ``--out``
(equal to a single-process fit); ``--checkpoint`` is then one file per rank
(``<name>.rank<r>-of-<n>.safetensors``). ``merge`` adds up constants fitted anywhere on parts of
a corpus (a Slurm array, Ray, Kubernetes, another day).

``--model`` is anything :func:`attnlens.load` accepts (a hub name or a local folder; default: the
embedded all-MiniLM-L6-v2); ``--device`` is where it runs: ``cpu`` (the default), ``cuda``
(``cuda:N``), ``mps`` or ``auto`` (a CUDA GPU, else Apple's MPS, else the CPU); a device this
machine lacks is refused before the model is loaded. ``--corpus`` is a file (one text per line, or a TSV/CSV with a
header; see :func:`attnlens.corpus.read_corpus`) or ``default``, the embedded corpus. Passes over
the corpus (and the loading of the model's weights) show progress bars on stderr unless
``--quiet``. ``--constants`` needs the ``papa`` view in ``--views``; ``--example N`` is the
corpus text the report's maps show (an index from 0, after ``--n-examples``) and ``--focus L,H``
the head shown side by side (layer and head from 0); out of range, either is refused with the
valid range before the pass over the corpus; ``--max-len`` must fit the
model's position embeddings. ``--layout`` defaults to the model's: ``padded`` for a decoder
(GPT-2), ``papa`` otherwise, as ``compare`` fits them. ``--checkpoint`` saves a fit's progress
(every ``--checkpoint-every`` batches and when interrupted): the same command run again resumes
it. ``--out``, ``--json`` and ``--checkpoint`` may name folders that do not exist yet (they are
created). Bad input exits with status 2 and a one-line reason on stderr (``attnlens: error:
...``), before the model is loaded when possible, and before any pass over the corpus otherwise;
bad output paths (a folder, a file where a folder should be, a folder that cannot be written, a
read-only file without ``--force``, the file of an input (``--corpus``, ``--constants``,
``--lm-texts``) or of another output) are refused before the model is loaded. An unexpected error is one line too (exit status 1); ``--debug`` shows
tracebacks.

This module imports only the standard library: torch, transformers, TransformerLens, plotly and
pandas are imported by the command's handler, so ``attnlens --help`` and ``--version`` answer at
once (``benchmarks/cli_help.py`` measures it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from attnlens.errors import AttnlensError

PROG = "attnlens"
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


class UsageError(AttnlensError):
    """Bad input on the command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        _fail(f"{message} (see '{self.prog} --help')")


def _fail(message: str, status: int = EXIT_USAGE) -> NoReturn:
    line = " ".join(str(message).split()) or "failed"
    print(f"{PROG}: error: {line}", file=sys.stderr)
    raise SystemExit(status)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


#: values of ``--device`` (``cuda:N`` too)
DEVICES = ("cpu", "cuda", "mps", "auto")


def _device_name(text: str) -> str:
    """``--device``: one of :data:`DEVICES` or ``cuda:N`` (checked against the machine later, in
    :func:`_resolve_device`, which imports torch)."""
    name = text.strip().lower()
    kind, _, index = name.partition(":")
    if name in DEVICES or (kind == "cuda" and index.isdigit()):
        return name
    raise argparse.ArgumentTypeError(
        f"unknown device {text!r}; use one of {', '.join(DEVICES)} (or cuda:N)"
    )


def _model_option(parser: argparse.ArgumentParser) -> None:
    """``--model`` (as for compare) and ``--device``."""
    parser.add_argument("--model", default=None, help="as for compare (default: embedded MiniLM)")
    _add_device(parser)


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", type=_device_name, default=None, metavar="{cpu,cuda,mps,auto}",
        help="where the model runs: cpu (default), cuda or cuda:N, mps, or auto (a CUDA GPU, "
        "else MPS, else the CPU)",
    )


def _example_index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected the index of a corpus text (0, 1, ...), got {text!r}"
        ) from None
    return value


def _head(text: str) -> tuple[int, int]:
    """``--focus L,H``: a (layer, head) pair of integers."""
    parts = text.replace(" ", "").split(",")
    try:
        layer, head = (int(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LAYER,HEAD such as 3,7 (both from 0), got {text!r}"
        ) from None
    return layer, head


def _common(parser: argparse.ArgumentParser, *, out_help: str, out_default: str | None) -> None:
    parser.add_argument(
        "--model", default=None,
        help="hub name, local folder or .gguf of a BERT/RoBERTa/GPT-2/Llama model, or smollm2-135m (default: embedded MiniLM)",
    )
    _add_device(parser)
    parser.add_argument(
        "--corpus", default="default",
        help="text file (one text per line; .tsv/.csv: a text column) or 'default' (embedded corpus)",
    )
    parser.add_argument(
        "--max-len", type=_positive, default=None,
        help="tokens per text (default 128; compare with --constants: the constants' max_len)",
    )
    parser.add_argument("--n-examples", type=_positive, default=None, help="use the first N texts")
    parser.add_argument("--batch-size", type=_positive, default=32, help="texts per forward pass")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bars (nor the model's weight loading)"
    )
    parser.add_argument(
        "--out", required=out_default is None, default=out_default, help=out_help,
    )
    _force(parser)


def _force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true",
        help="replace output files that are read-only (refused otherwise, before any work)",
    )
    _debug(parser, default=argparse.SUPPRESS)


def _debug(parser: argparse.ArgumentParser, *, default: Any = False) -> None:
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help="show the full traceback of any error instead of one line",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnlens")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without install
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attnlens`` command."""
    parser = _Parser(
        prog=PROG,
        description="How much does a transformer use its input-dependent attention?",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _debug(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    compare = commands.add_parser(
        "compare", help="compare views of attention head by head; write an HTML report",
        description="Compare standard, PAPA and effective attention head by head over a corpus "
        "and write a self-contained HTML report.",
    )
    _common(compare, out_help="HTML report to write (default report.html)", out_default="report.html")
    compare.add_argument(
        "--views", default="standard,papa,effective",
        help="comma-separated views among standard, papa, effective (default: all)",
    )
    compare.add_argument(
        "--constants", default=None, help="PAPA constants from 'attnlens fit-papa' (else fitted)",
    )
    compare.add_argument(
        "--example", type=_example_index, default=None, metavar="N",
        help="corpus text whose maps the report shows, from 0 (default: the first, or with the "
        "effective view the first longer than the head dimension)",
    )
    compare.add_argument(
        "--focus", type=_head, default=None, metavar="L,H",
        help="head shown side by side, as layer,head from 0 (default: the one farthest from "
        "standard attention)",
    )
    compare.add_argument(
        "--json", default=None, help="also write the comparison as JSON to this .json file"
    )
    _measure(compare)
    compare.set_defaults(handler=_compare)

    fit = commands.add_parser(
        "fit-papa", help="fit PAPA constant attention matrices; write a safetensors file",
        description="Average every head's attention over a corpus (PAPA, Hassid et al. 2022) "
        "and save the constants.",
    )
    _common(fit, out_help="safetensors file to write", out_default=None)
    fit.add_argument(
        "--layout", choices=("papa", "padded"), default=None,
        help="tokenization layout (default by model: papa, fixed [CLS]/[SEP] positions, for "
        "encoders; padded for decoders such as GPT-2)",
    )
    fit.add_argument(
        "--checkpoint", default=None,
        help="save the fit's progress here; the same command run again resumes an interrupted fit",
    )
    fit.add_argument(
        "--checkpoint-every", type=_positive, default=None,
        help="batches between two saves of --checkpoint (default 20)",
    )
    fit.set_defaults(handler=_fit_papa)

    merge = commands.add_parser(
        "merge", help="merge PAPA constants fitted on parts of a corpus into one file",
        description="Add up constants (or fit checkpoints) fitted on shards of a corpus anywhere "
        "(a Slurm array, other machines, another day) into the constants of the whole corpus.",
    )
    merge.add_argument("inputs", nargs="+", help="constants files (.safetensors) to merge")
    merge.add_argument("--out", required=True, help="safetensors file to write")
    _force(merge)
    merge.set_defaults(handler=_merge)

    curve = commands.add_parser(
        "curve", help="the PAPA curve: task scores as heads are replaced; write CSV and HTML",
        description="Probe tasks with a growing share of heads replaced by PAPA constants "
        "(Hassid et al. 2022) and write the table (CSV) and its figure (HTML).",
    )
    _model_option(curve)
    curve.add_argument("--constants", required=True, help="PAPA constants from 'attnlens fit-papa'")
    curve.add_argument(
        "--fractions", default="0,0.5,0.875,0.9375,1",
        help="replaced shares of heads, comma-separated (default: the paper's 0,0.5,0.875,0.9375,1)",
    )
    curve.add_argument(
        "--strategy", default="input_dependence",
        help="order in which heads are replaced (a papa.select_heads strategy; default input_dependence)",
    )
    curve.add_argument("--out", default="curve.html", help="HTML figure to write (the CSV goes beside it)")
    _probe_options(curve)
    curve.set_defaults(handler=_curve)

    papa_table = commands.add_parser(
        "table", help="PAPA's Table 1: original, average constants and data-free matrices per task",
        description="Probe tasks with the original attention, PAPA's average constants in every "
        "head and the data-free identity, Toeplitz, zeros and uniform matrices in every head "
        "(Hassid et al. 2022, Table 1); write the table (CSV, Markdown) and its figure (HTML).",
    )
    _model_option(papa_table)
    papa_table.add_argument("--constants", required=True, help="PAPA constants from 'attnlens fit-papa'")
    papa_table.add_argument("--out", default="table.html", help="HTML figure to write (CSV and .md beside it)")
    _probe_options(papa_table)
    papa_table.set_defaults(handler=_table)

    types = commands.add_parser(
        "types", help="Kovaleva pattern types per head and view; write CSV and HTML",
        description="Classify every head's map on every text into Kovaleva et al.'s five types "
        "(vertical, diagonal, vertical+diagonal, block, heterogeneous) and write the shares per "
        "head (CSV) and per layer (HTML figure, a panel per view).",
    )
    _common(types, out_help="HTML figure to write (the CSV goes beside it; default types.html)",
            out_default="types.html")
    types.add_argument(
        "--views", default="standard,effective",
        help="comma-separated views among standard, effective, papa (papa needs --constants)",
    )
    types.add_argument("--constants", default=None, help="PAPA constants for the papa view")
    types.set_defaults(handler=_types)

    syntax = commands.add_parser(
        "syntax", help="syntactic heads on a CoNLL-U treebank; write CSV and HTML",
        description="For every dependency relation, the single head that best finds it against "
        "the best fixed-offset baseline (Clark et al. 2019, §4); write the table (CSV) and a "
        "figure (HTML).",
    )
    syntax.add_argument("--conllu", required=True, help="a CoNLL-U treebank (e.g. UD English EWT dev)")
    _model_option(syntax)
    syntax.add_argument("--view", choices=("standard", "effective", "papa"), default="standard",
                        help="which attention (papa needs --constants; default standard)")
    syntax.add_argument("--constants", default=None, help="PAPA constants for --view papa")
    syntax.add_argument("--limit", type=_positive, default=None, help="read the first N sentences")
    syntax.add_argument("--max-len", type=_positive, default=None,
                        help="skip sentences longer than this many tokens (default 128)")
    syntax.add_argument("--batch-size", type=_positive, default=32, help="sentences per forward pass")
    syntax.add_argument("--quiet", action="store_true", help="no progress bars")
    syntax.add_argument("--out", default="syntax.html", help="HTML figure to write (the CSV goes beside it)")
    _force(syntax)
    syntax.set_defaults(handler=_syntax)

    importance = commands.add_parser(
        "importance", help="head importance (Michel et al. 2019); write CSV and HTML",
        description="Michel et al.'s head importance E|dL/dxi_h| from a gate on every head: with "
        "--task, the loss of a PAPA probe trained on that task; else the model's own LM loss on "
        "--corpus (refused for a model whose LM head is untrained). Writes the importance per head "
        "(CSV) and its head grid (HTML).",
    )
    _common(importance, out_help="HTML figure to write (the CSV goes beside it; default importance.html)",
            out_default="importance.html")
    importance.add_argument(
        "--task", default=None, choices=("sst2", "cola", "mrpc", "mnli", "ner", "pos"),
        help="the task whose probe's loss is differentiated (default: the model's LM loss on --corpus)",
    )
    importance.add_argument("--data-dir", default=None, help="folder of the task files (default: the hub)")
    importance.add_argument("--train-limit", type=_positive, default=4000,
                            help="training examples of the probe (default 4000)")
    importance.add_argument("--limit", type=_positive, default=512,
                            help="dev examples the importance is averaged over (default 512)")
    importance.set_defaults(handler=_importance)
    return parser


def _probe_options(parser: argparse.ArgumentParser) -> None:
    """The options of the commands that probe tasks under PAPA constants (curve, table)."""
    parser.add_argument("--seeds", type=_positive, default=3, help="probe seeds per point (default 3)")
    parser.add_argument("--batch-size", type=_positive, default=32, help="texts per forward pass")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    _measure(parser, required=True)
    _force(parser)


def _measure(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """Options that measure what an intervention costs: task probes and LM scores."""
    parser.add_argument(
        "--task", action="append", default=[], choices=("sst2", "cola", "mrpc", "mnli", "ner", "pos"),
        required=required, help="probe this task per view (repeat for several)",
    )
    parser.add_argument(
        "--data-dir", default=None,
        help="folder of the GLUE / CoNLL-2003 files (sst2/dev.tsv, conll2003/valid.txt, ...); default: the hub",
    )
    parser.add_argument(
        "--train-limit", type=_positive, default=4000, help="training examples per probe (default 4000)",
    )
    parser.add_argument(
        "--eval-limit", type=_positive, default=None, help="evaluation examples (default: the whole dev split)",
    )
    parser.add_argument(
        "--lm-texts", default=None,
        help="a text file: also score the language model on it (own trained head, else the MLM probe)",
    )


def _texts(args: argparse.Namespace) -> list[str]:
    """The corpus's texts (the first ``--n-examples``); blank lines of a file are skipped and
    their number said on stderr, as the API refuses blank texts in a list."""
    from attnlens.core.corpus import read_corpus_counted, resolve_corpus

    if args.corpus == "default":
        texts = resolve_corpus(None)
    else:
        texts, blank = read_corpus_counted(args.corpus)
        if blank and not args.quiet:
            print(f"{PROG}: corpus {args.corpus}: {len(texts)} texts read, {blank} blank "
                  f"line{'s' if blank != 1 else ''} skipped", file=sys.stderr)
    return texts[: args.n_examples] if args.n_examples else texts


def _views(text: str) -> list[str]:
    from attnlens.compare import validate_views

    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UsageError("--views is empty; choose from standard, papa, effective")
    validate_views(names)
    return names


def _corpus_file(args: argparse.Namespace) -> tuple[str, str | None]:
    """``("--corpus", path)`` for :func:`_out`'s ``keep``; no path for the embedded corpus."""
    return "--corpus", None if args.corpus == "default" else args.corpus


def _same_file(path: Path, other: str | Path) -> bool:
    """Whether ``path`` and ``other`` name one file (through links, ``..`` or another spelling)."""
    try:
        return os.path.samefile(path, other)
    except OSError:  # one of them does not exist (yet)
        return path.resolve() == Path(other).resolve()


def _out(
    path: str,
    option: str,
    suffixes: tuple[str, ...] = (),
    keep: Sequence[tuple[str, str | Path | None]] = (),
    *,
    force: bool = False,
) -> Path:
    """An output path checked before any work: not a folder, no file where its folders go
    (missing folders are created when it is written), a file can be created in its nearest
    existing folder, ending in one of ``suffixes`` if given, and not the file of any
    ``(option, path)`` in ``keep`` (the inputs and other outputs; ``None`` paths are skipped)."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{option} {out} is a folder; give a file name")
    folder = next(parent for parent in out.parents if parent.exists())
    if not folder.is_dir():
        raise UsageError(
            f"{option} {out} cannot be written: {folder} is a file, not a folder; "
            "choose another path"
        )
    if suffixes and out.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {out} should end in {' or '.join(suffixes)}")
    for other, kept in keep:
        if kept is not None and _same_file(out, kept):
            raise UsageError(
                f"{option} {out} is the same file as {other} {kept} and would overwrite it; "
                f"give {option} another path"
            )
    try:  # os.access says yes to root even where nothing can be created (/proc, read-only mounts)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnlens-", suffix=".tmp"):
            pass
    except OSError as error:
        raise UsageError(
            f"{option} {out} cannot be written: creating a file in {folder} failed "
            f"({error.strerror or error}); choose another path"
        ) from None
    if not force and out.is_file() and not out.is_symlink() and not out.stat().st_mode & 0o222:
        raise UsageError(
            f"{option} {out} is read-only; choose another path or make it writable (chmod u+w)"
            + ("" if option == "--checkpoint" else ", or add --force to replace it")
        )
    return out


def _resolve_device(name: str | None) -> str | None:
    """The torch device of ``--device`` (``None``: :func:`attnlens.load`'s default, the CPU);
    ``auto`` is a CUDA GPU, else MPS, else the CPU. A device this machine lacks is a
    :class:`UsageError` naming the devices it has."""
    if name is None or name == "cpu":
        return name
    import torch

    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if name == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    have = ", ".join(["cpu", *(["cuda"] if cuda else []), *(["mps"] if mps else [])])
    if name == "mps" and not mps:
        raise UsageError(f"--device mps: Apple's MPS is not available here (devices: {have}); "
                         "use --device cpu or --device auto")
    if name.startswith("cuda"):
        if not cuda:
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
            raise UsageError(
                f"--device {name}: no CUDA GPU is available here (torch {torch.__version__} is "
                f"built {build}; devices: {have}); use --device cpu or --device auto"
            )
        index = int(name.partition(":")[2] or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise UsageError(
                f"--device {name}: this machine has {count} CUDA GPU{'s' if count != 1 else ''} "
                f"(cuda:0 to cuda:{count - 1}); choose one of them"
            )
        if name == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"  # torchrun: a GPU per rank
    return name


def _load(model: str | None, *, quiet: bool = False, device: str | None = None) -> Any:
    """:func:`attnlens.load` on ``device`` (a :func:`_resolve_device` result); ``quiet`` also
    hides transformers' weight-loading bar."""
    from transformers.utils import logging as hf_logging

    from attnlens.core.loading import load

    shown = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        return load(model, device=device)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _fit_layout(model: Any) -> str:
    from attnlens.methods.papa.fitting import default_layout

    return default_layout(model)


def _check_max_len(model: Any, texts: list, max_len: int, layout: str) -> None:
    """Refuse a ``--max-len`` the model cannot take before any pass over the corpus starts."""
    from attnlens.core.inputs import check_max_len

    check_max_len(model, max_len, layout=layout, is_pair=isinstance(texts[0], tuple))


def _check_example(example: int, n_texts: int) -> None:
    """Refuse ``--example`` outside the corpus (:func:`attnlens.compare._check_example`'s test)
    in one line naming the valid range."""
    from attnlens.compare import _check_example

    try:
        _check_example(example, n_texts)
    except ValueError:
        raise UsageError(
            f"--example {example} is outside the corpus of {n_texts} text"
            f"{'s' if n_texts != 1 else ''}; use 0 to {n_texts - 1}"
        ) from None


def _check_focus(focus: tuple[int, int], model: Any) -> None:
    """Refuse ``--focus`` outside the model's heads (:func:`attnlens.compare._check_focus`'s
    test) in one line naming the valid range, before any pass over the corpus."""
    from attnlens.compare import _check_focus

    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    try:
        _check_focus(focus, n_layers, n_heads)
    except ValueError:
        raise UsageError(
            f"--focus {focus[0]},{focus[1]} is outside the model's {n_layers} layers x {n_heads} "
            f"heads; use a layer from 0 to {n_layers - 1} and a head from 0 to {n_heads - 1}"
        ) from None


def _compare(args: argparse.Namespace) -> int:
    views = _views(args.views)
    inputs = [_corpus_file(args), ("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out = _out(args.out, "--out", (".html", ".htm"), inputs, force=args.force)
    json_out = None
    if args.json is not None:
        json_out = _out(args.json, "--json", (".json",), [*inputs, ("--out", out)], force=args.force)
    if args.constants is not None and "papa" not in views:
        raise UsageError(
            f"--constants {args.constants} would be unused: --views {args.views} has no papa "
            "view; add papa to --views (e.g. --views standard,papa) or drop --constants"
        )
    texts = _texts(args)
    if args.example is not None:
        _check_example(args.example, len(texts))
    if args.constants is not None and not Path(args.constants).is_file():
        raise UsageError(f"constants file not found: {args.constants}")
    device = _resolve_device(args.device)
    model = _load(args.model, quiet=args.quiet, device=device)
    if args.focus is not None:
        _check_focus(args.focus, model)
    constants = None
    if args.constants is not None:
        from attnlens.methods.papa import PapaConstants

        constants = PapaConstants.load(args.constants, model)
    if args.max_len is not None:
        if constants is not None:
            layout = constants.layout
        else:
            layout = _fit_layout(model) if "papa" in views else "padded"
        _check_max_len(model, texts, args.max_len, layout)
    from attnlens.compare import compare

    comparison = compare(
        model, *views, corpus=texts, max_len=args.max_len,
        batch_size=args.batch_size, constants=constants, progress=not args.quiet,
        example=args.example, focus=args.focus, **_measures(args),
    )
    path = comparison.save_html(out, overwrite_read_only=args.force)
    print(summary(comparison))
    if json_out is not None:
        comparison.to_json(json_out, overwrite_read_only=args.force)
        print(f"wrote {args.json}")
    print(f"wrote report: {path.resolve()}")
    return 0


def summary(comparison: Any) -> str:
    """A few lines for the terminal: per view, the mean distance and the farthest heads."""
    lines = [repr(comparison)]
    table = comparison.table
    for view in comparison.views:
        if view == "standard":
            continue
        rows = table[table["view"] == view].nlargest(3, "distance_from_standard")
        top = ", ".join(
            f"L{r.layer}H{r.head} {r.distance_from_standard:.3f}" for r in rows.itertuples()
        )
        mean = table.loc[table["view"] == view, "distance_from_standard"].mean()
        lines.append(f"  {view}: mean distance from standard {mean:.3f}; farthest heads {top}")
    if comparison.scores is not None:
        for row in comparison.scores.itertuples():
            lines.append(f"  {row.task} ({row.metric}) under {row.view}: {row.score:.4f}")
    return "\n".join(lines)


def _fit_papa(args: argparse.Namespace) -> int:
    corpus = _corpus_file(args)
    out = _out(args.out, "--out", (".safetensors",), [corpus], force=args.force)
    checkpoint = None
    if args.checkpoint is not None:
        checkpoint = _out(args.checkpoint, "--checkpoint", keep=[corpus, ("--out", out)])
    elif args.checkpoint_every is not None:
        raise UsageError(
            f"--checkpoint-every {args.checkpoint_every} would be unused without --checkpoint; "
            "add --checkpoint FILE or drop --checkpoint-every"
        )
    texts = _texts(args)
    model = _load(args.model, quiet=args.quiet, device=_resolve_device(args.device))
    max_len = args.max_len or 128
    layout = args.layout or _fit_layout(model)
    _check_max_len(model, texts, max_len, layout)
    from attnlens.methods.papa import fitting

    try:
        constants = fitting.fit(
            model, texts, max_len=max_len, layout=layout, batch_size=args.batch_size,
            progress=not args.quiet, checkpoint=checkpoint,
            checkpoint_every=args.checkpoint_every or fitting.CHECKPOINT_EVERY,
        )
    except KeyboardInterrupt:
        if checkpoint is None:
            raise
        from attnlens.engine import passes

        if not passes.checkpoint_path(checkpoint, passes.world()).is_file():
            raise KeyboardInterrupt(
                f"before the first batch was done, so --checkpoint {checkpoint} was not written; "
                "run the same command again to start over"
            ) from None
        raise KeyboardInterrupt(
            f"run the same command again to resume from --checkpoint {checkpoint}"
        ) from None
    if _rank() != 0:  # under torchrun every rank holds the reduced constants; rank 0 writes
        return 0
    path = constants.save(out, overwrite_read_only=args.force)
    print(repr(constants))
    print(f"wrote constants: {Path(path).resolve()}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    inputs = [("input", path) for path in args.inputs]
    out = _out(args.out, "--out", (".safetensors",), inputs, force=args.force)
    for _, path in inputs:
        if not Path(path).is_file():
            raise UsageError(f"constants file not found: {path}")
    from attnlens.methods.papa import PapaConstants

    parts = [PapaConstants.load(path) for path in args.inputs]
    merged = parts[0]
    for path, part in zip(args.inputs[1:], parts[1:], strict=True):
        try:
            merged = merged + part
        except ValueError as error:
            raise UsageError(f"cannot merge {path}: {error}") from None
    path = merged.save(out, overwrite_read_only=args.force)
    print(repr(merged))
    print(f"wrote constants: {Path(path).resolve()}")
    return 0


def _measures(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`_measure`'s options (task probes, LM texts)."""
    lm_texts = None
    if args.lm_texts is not None:
        from attnlens.core.corpus import read_corpus

        lm_texts = read_corpus(args.lm_texts)
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UsageError(f"--data-dir {args.data_dir} is not a folder")
    return dict(tasks=list(args.task), lm_texts=lm_texts, data_dir=args.data_dir,
                train_limit=args.train_limit, eval_limit=args.eval_limit)


def _curve(args: argparse.Namespace) -> int:
    inputs = [("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out = _out(args.out, "--out", (".html", ".htm"), inputs, force=args.force)
    table = _out(str(out.with_suffix(".csv")), "--out (its CSV)", (".csv",), inputs, force=args.force)
    try:
        fractions = [float(part) for part in args.fractions.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--fractions {args.fractions} should be numbers separated by commas") from None
    if not fractions:
        raise UsageError(f"--fractions {args.fractions!r} holds no fraction; give numbers separated by commas (e.g. 0,0.5,1)")
    from attnlens.methods.papa import STRATEGIES

    if args.strategy not in STRATEGIES:
        raise UsageError(f"--strategy {args.strategy} is unknown; use one of {', '.join(STRATEGIES)}")
    if not Path(args.constants).is_file():
        raise UsageError(f"constants file not found: {args.constants}")
    measures = _measures(args)
    model = _load(args.model, quiet=args.quiet, device=_resolve_device(args.device))
    from attnlens.evaluation.curve import curve
    from attnlens.methods.papa import PapaConstants

    constants = PapaConstants.load(args.constants, model)
    result = curve(
        model, constants, measures["tasks"], fractions=fractions, strategy=args.strategy,
        lm_texts=measures["lm_texts"], data_dir=measures["data_dir"],
        train_limit=measures["train_limit"], eval_limit=measures["eval_limit"],
        batch_size=args.batch_size, seeds=args.seeds, progress=not args.quiet,
    )
    result.to_csv(table, overwrite_read_only=args.force)
    from attnlens.core.files import write_atomic

    html = result.figure().to_html(include_plotlyjs=True, full_html=True)
    write_atomic(out, html.encode("utf-8"), overwrite_read_only=args.force)
    print(result.table.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    print(f"wrote {table} and {out} ({result.seconds:.0f} s, {result.forward_seconds:.0f} s in probes)")
    return 0


def _table(args: argparse.Namespace) -> int:
    inputs = [("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out, csv = _outputs(args, inputs)
    markdown = _out(str(out.with_suffix(".md")), "--out (its Markdown)", (".md",), inputs, force=args.force)
    if not Path(args.constants).is_file():
        raise UsageError(f"constants file not found: {args.constants}")
    measures = _measures(args)
    model = _load(args.model, quiet=args.quiet, device=_resolve_device(args.device))
    from attnlens.core.files import write_atomic
    from attnlens.evaluation.table import table
    from attnlens.methods.papa import PapaConstants

    constants = PapaConstants.load(args.constants, model)
    result = table(model, constants, measures.pop("tasks"), batch_size=args.batch_size, seeds=args.seeds,
                   progress=not args.quiet, **measures)
    _write_table_and_figure(result.long, result.figure(), csv, out, args.force)
    write_atomic(markdown, (result.to_markdown() + "\n").encode("utf-8"), overwrite_read_only=args.force)
    print(result.frame().to_string())
    print(f"wrote {csv}, {markdown} and {out} ({result.seconds:.0f} s)")
    return 0


def _write_table_and_figure(table: Any, figure: Any, csv: Path, out: Path, force: bool) -> None:
    """The CSV and the self-contained HTML figure of a subcommand, each written atomically."""
    from attnlens.core.files import write_atomic

    write_atomic(csv, table.to_csv(index=False).encode("utf-8"), overwrite_read_only=force)
    html = figure.to_html(include_plotlyjs=True, full_html=True)
    write_atomic(out, html.encode("utf-8"), overwrite_read_only=force)


def _outputs(args: argparse.Namespace, inputs: list) -> tuple[Path, Path]:
    """``--out`` (HTML) and the CSV beside it, both checked before any work."""
    out = _out(args.out, "--out", (".html", ".htm"), inputs, force=args.force)
    csv = _out(str(out.with_suffix(".csv")), "--out (its CSV)", (".csv",), inputs, force=args.force)
    return out, csv


def _constants_for(args: argparse.Namespace, wanted: bool) -> None:
    if wanted and args.constants is None:
        raise UsageError("the papa view needs --constants (a file from 'attnlens fit-papa')")
    if not wanted and args.constants is not None:
        raise UsageError(f"--constants {args.constants} would be unused: no papa view was asked for")
    if args.constants is not None and not Path(args.constants).is_file():
        raise UsageError(f"constants file not found: {args.constants}")


def _types(args: argparse.Namespace) -> int:
    names = [name.strip() for name in args.views.split(",") if name.strip()]
    unknown = [name for name in names if name not in ("standard", "effective", "papa")]
    if not names or unknown:
        raise UsageError(f"--views {args.views}: choose among standard, effective, papa")
    _constants_for(args, "papa" in names)
    out, csv = _outputs(args, [_corpus_file(args), ("--constants", args.constants)])
    texts = _texts(args)
    model = _load(args.model, quiet=args.quiet, device=_resolve_device(args.device))
    import pandas as pd

    from attnlens.methods import patterns

    options = dict(batch_size=args.batch_size, progress=not args.quiet)
    tables = []
    named = [name for name in names if name != "papa"]
    if named:  # standard and effective: one pass, the maximum length asked for
        tables.append(patterns.types(model, texts, view=named, max_len=args.max_len, **options))
    if "papa" in names:  # the constants' own pass, their own max_len and layout
        from attnlens.methods.papa import PapaConstants

        constants = PapaConstants.load(args.constants, model)
        tables.append(patterns.types(model, texts, view=constants, **options))
    table = pd.concat(tables, ignore_index=True)
    _write_table_and_figure(table, patterns.figure(table), csv, out, args.force)
    print("share of maps per type, mean over heads")
    means = table.groupby("view", sort=False)[list(patterns.TYPES)].mean()
    print(means.to_string(float_format=lambda value: f"{value:.3f}"))
    print(f"wrote {csv} and {out}")
    return 0


def _syntax(args: argparse.Namespace) -> int:
    _constants_for(args, args.view == "papa")
    if not Path(args.conllu).is_file():
        raise UsageError(f"--conllu {args.conllu}: file not found")
    out, csv = _outputs(args, [("--conllu", args.conllu), ("--constants", args.constants)])
    model = _load(args.model, quiet=args.quiet, device=_resolve_device(args.device))
    from attnlens.methods import syntax

    view: Any = args.view
    if args.view == "papa":
        from attnlens.methods.papa import PapaConstants

        view = PapaConstants.load(args.constants, model)
    table = syntax.dependency_heads(
        model, args.conllu, view=view, max_len=args.max_len, batch_size=args.batch_size,
        limit=args.limit, progress=not args.quiet,
    )
    _write_table_and_figure(table, syntax.figure(table), csv, out, args.force)
    print(table.head(12).to_string(index=False, float_format=lambda value: f"{value:.3f}"))
    print(f"{table.attrs['sentences']} sentences ({table.attrs['skipped']} skipped as longer than "
          f"max_len); wrote {csv} and {out}")
    return 0


def _importance(args: argparse.Namespace) -> int:
    if args.task is None and args.data_dir is not None:
        raise UsageError("--data-dir is for --task; without --task the corpus is --corpus")
    inputs = [_corpus_file(args)]
    out, csv = _outputs(args, inputs)
    corpus: Any = args.task if args.task is not None else _texts(args)
    model = _load(args.model, quiet=args.quiet, device=_resolve_device(args.device))
    import pandas as pd

    from attnlens.core import plots
    from attnlens.evaluation.importance import importance

    result = importance(
        model, corpus, max_len=args.max_len or 128, batch_size=args.batch_size,
        progress=not args.quiet, data_dir=args.data_dir, train_limit=args.train_limit, limit=args.limit,
    )
    n_layers, n_heads = result.shape
    table = pd.DataFrame({
        "layer": [layer for layer in range(n_layers) for _ in range(n_heads)],
        "head": [head for _ in range(n_layers) for head in range(n_heads)],
        "importance": result.scores.reshape(-1).tolist(),
        "raw": result.raw.reshape(-1).tolist(),
    })
    what = f"the {args.task} probe's loss" if args.task else "the LM loss"
    figure = plots.head_grid(result.scores.numpy(), name="importance",
                             title=f"Head importance (Michel et al. 2019), {what}, normalised per layer")
    _write_table_and_figure(table, figure, csv, out, args.force)
    ranked = ", ".join(f"L{layer}H{head}" for layer, head in result.heads_ranked("descending")[:8])
    print(f"{result!r}\nmost important: {ranked}\nwrote {csv} and {out}")
    return 0


def _rank() -> int:
    from attnlens.engine.passes import world

    return world().rank


def _start_distributed(device: str | None = None) -> bool:
    """Join the ``torch.distributed`` world ``torchrun`` describes (``WORLD_SIZE`` > 1): gloo on
    CPU (also with ``--device cpu`` on a GPU machine), NCCL on GPU. Returns whether this process
    started it (and so must end it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import datetime

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() and device != "cpu" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Errors in the input (unknown view, missing or empty corpus, bad model name, damaged
    weights or constants, ...) print one line ``attnlens: error: <reason>`` on stderr and exit
    with status 2; an unexpected error (a bug) prints one line too and exits with status 1.
    ``--debug`` shows the full traceback of any error instead.
    """
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _show_warning
        return _run(args, debug)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr (``attnlens: warning: ...``), without the source line."""
    print(f"{PROG}: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def _run(args: argparse.Namespace, debug: bool) -> int:
    started = False
    try:
        started = _start_distributed(getattr(args, "device", None))
        return int(args.handler(args) or 0)
    except KeyboardInterrupt as interrupt:
        if debug:
            raise
        _fail(f"interrupted; {interrupt}" if str(interrupt) else "interrupted", EXIT_INTERRUPTED)
    except (AttnlensError, ValueError, TypeError, OSError, KeyError) as error:
        if debug:
            raise
        _fail(_reason(error))
    except Exception as error:  # a bug: one line, the traceback under --debug
        if debug:
            raise
        _fail(
            f"unexpected {type(error).__name__}: {_reason(error)[:300]} (run the same command "
            "with --debug for the traceback, and please report it)", EXIT_FAILURE,
        )
    finally:
        if started:
            import torch.distributed as dist

            dist.destroy_process_group()


def _reason(error: BaseException) -> str:
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    text = str(error).strip()
    return text or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
