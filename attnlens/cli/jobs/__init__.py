"""What each command does once its options are parsed: one module per command, each with its
``run(args)``, and :mod:`~attnlens.cli.jobs.common`, what they share (checks of paths and
devices, the corpus, loading the model).

These modules import torch, transformers, TransformerLens, plotly and pandas (through attnlens)
at their top: a command module of :mod:`attnlens.cli` imports its job only when the command runs,
so that the parser (``attnlens --help``) never imports them.
"""
