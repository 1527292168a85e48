"""attnlens: how much does a pretrained transformer use its input-dependent attention?

Methods are hooks on TransformerLens hook points of an unmodified model:

- :mod:`attnlens.papa`: constant attention (Hassid et al. 2022);
- :mod:`attnlens.effective`: effective attention (Brunner et al. 2020; Sun & Marasović 2021);
- :mod:`attnlens.stats`: what heads look at (Clark et al. 2019);
- :mod:`attnlens.compare` and :mod:`attnlens.plots`: head-grid views and reports.

``attnlens.load()`` returns a ``TransformerBridge`` on which ``blocks.{l}.attn.hook_pattern``
is a real intervention point (see :mod:`attnlens.seam`).
"""

from attnlens.inputs import Batch, tokenize
from attnlens.loading import load

__all__ = ["Batch", "load", "tokenize"]
__version__ = "0.1.0"
