"""Layer 2, ``engine``: the one loop over a corpus.

:mod:`attnlens.engine.passes`: the accumulator protocol, :func:`~attnlens.engine.passes.run`,
checkpoints, ``torch.distributed`` and the hooks that hand each layer's attention to the
accumulators; :mod:`attnlens.engine.effective`: effective attention of a pattern and its values,
which the engine gives every accumulator that reads ``LayerPatterns.effective``.

Imports ``core`` only (see :mod:`attnlens.core` for the layers).
"""
