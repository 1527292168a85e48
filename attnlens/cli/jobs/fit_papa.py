"""The job of ``attnlens fit-papa``: fit PAPA constant attention matrices; write a safetensors file."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlens.cli.jobs import common
from attnlens.engine.checkpoints import checkpoint_path
from attnlens.engine.distributed import world
from attnlens.methods.papa import fitting


def run(args: argparse.Namespace) -> int:
    """``attnlens fit-papa`` with the parsed ``args``; returns the exit status."""
    corpus = common.corpus_file(args)
    out = common.output(args.out, "--out", (".safetensors",), [corpus], force=args.force)
    checkpoint = None
    if args.checkpoint is not None:
        checkpoint = common.output(args.checkpoint, "--checkpoint", keep=[corpus, ("--out", out)])
    elif args.checkpoint_every is not None:
        raise common.UsageError(
            f"--checkpoint-every {args.checkpoint_every} would be unused without --checkpoint; "
            "add --checkpoint FILE or drop --checkpoint-every"
        )
    texts = common.corpus_texts(args)
    model = common.load(args.model, quiet=args.quiet, device=common.resolve_device(args.device))
    max_len = args.max_len or 128
    layout = args.layout or fitting.default_layout(model)
    common.check_max_len(model, texts, max_len, layout)
    try:
        constants = fitting.fit(
            model, texts, max_len=max_len, layout=layout, batch_size=args.batch_size,
            progress=not args.quiet, checkpoint=checkpoint,
            checkpoint_every=args.checkpoint_every or fitting.CHECKPOINT_EVERY,
        )
    except KeyboardInterrupt:
        if checkpoint is None:
            raise
        if not checkpoint_path(checkpoint, world()).is_file():
            raise KeyboardInterrupt(
                f"before the first batch was done, so --checkpoint {checkpoint} was not written; "
                "run the same command again to start over"
            ) from None
        raise KeyboardInterrupt(
            f"run the same command again to resume from --checkpoint {checkpoint}"
        ) from None
    if world().rank != 0:  # under torchrun every rank holds the reduced constants; rank 0 writes
        return 0
    path = constants.save(out, overwrite_read_only=args.force)
    print(repr(constants))
    print(f"wrote constants: {Path(path).resolve()}")
    return 0
