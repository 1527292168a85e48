"""``attnlens fit-papa``: fit PAPA constant attention matrices; write a safetensors file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens import cli


def add(commands: Any) -> None:
    """The ``fit-papa`` command and its options."""
    parser = commands.add_parser(
        "fit-papa", help="fit PAPA constant attention matrices; write a safetensors file",
        description="Average every head's attention over a corpus (PAPA, Hassid et al. 2022) "
        "and save the constants.",
    )
    cli._common(parser, out_help="safetensors file to write", out_default=None)
    parser.add_argument(
        "--layout", choices=("papa", "padded"), default=None,
        help="tokenization layout (default by model: papa, fixed [CLS]/[SEP] positions, for "
        "encoders; padded for decoders such as GPT-2)",
    )
    parser.add_argument(
        "--checkpoint", default=None,
        help="save the fit's progress here; the same command run again resumes an interrupted fit",
    )
    parser.add_argument(
        "--checkpoint-every", type=cli._positive, default=None,
        help="batches between two saves of --checkpoint (default 20)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens fit-papa`` with the parsed ``args``; returns the exit status."""
    corpus = cli._corpus_file(args)
    out = cli._out(args.out, "--out", (".safetensors",), [corpus], force=args.force)
    checkpoint = None
    if args.checkpoint is not None:
        checkpoint = cli._out(args.checkpoint, "--checkpoint", keep=[corpus, ("--out", out)])
    elif args.checkpoint_every is not None:
        raise cli.UsageError(
            f"--checkpoint-every {args.checkpoint_every} would be unused without --checkpoint; "
            "add --checkpoint FILE or drop --checkpoint-every"
        )
    texts = cli._texts(args)
    model = cli._load(args.model, quiet=args.quiet, device=cli._resolve_device(args.device))
    max_len = args.max_len or 128
    layout = args.layout or cli._fit_layout(model)
    cli._check_max_len(model, texts, max_len, layout)
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
        from attnlens.engine.checkpoints import checkpoint_path
        from attnlens.engine.distributed import world

        if not checkpoint_path(checkpoint, world()).is_file():
            raise KeyboardInterrupt(
                f"before the first batch was done, so --checkpoint {checkpoint} was not written; "
                "run the same command again to start over"
            ) from None
        raise KeyboardInterrupt(
            f"run the same command again to resume from --checkpoint {checkpoint}"
        ) from None
    if cli._rank() != 0:  # under torchrun every rank holds the reduced constants; rank 0 writes
        return 0
    path = constants.save(out, overwrite_read_only=args.force)
    print(repr(constants))
    print(f"wrote constants: {Path(path).resolve()}")
    return 0
