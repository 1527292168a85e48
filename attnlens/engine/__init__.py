"""Layer 2, ``engine``: the one loop over a corpus.

- :mod:`attnlens.engine.passes`: :func:`~attnlens.engine.passes.run`, the pass itself;
- :mod:`attnlens.engine.accumulator`: the accumulator protocol (``Accumulator``, ``PassBatch``,
  ``LayerPatterns``, ``PassSummary``);
- :mod:`attnlens.engine.batches`: the corpus read lazily in batches, in the pass's order, tokenized
  on the host; the progress bar;
- :mod:`attnlens.engine.forward`: a batch's forward with hooks, and the hooks that hand each
  layer's attention to the accumulators;
- :mod:`attnlens.engine.checkpoints`: checkpoints, resume, and the signals that write one;
- :mod:`attnlens.engine.distributed`: ``torch.distributed`` (shards, collectives);
- :mod:`attnlens.engine.split`: a batch that runs out of device memory, split in halves;
- :mod:`attnlens.engine.recording`: a pass's patterns kept for a later pass over the same batches,
  which replays them instead of running the forward;
- :mod:`attnlens.engine.hooks`: the one hook-list type of interventions;
- :mod:`attnlens.engine.effective`: effective attention of a pattern and its values, which the
  engine gives every accumulator that reads ``LayerPatterns.effective``.

Imports ``core`` only (see :mod:`attnlens.core` for the layers).
"""
