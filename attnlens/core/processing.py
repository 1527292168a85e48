"""TransformerLens's weight processing, and what of the model it changes for attnlens.

``model.enable_compatibility_mode()`` (what TransformerLens 4 names the way to HookedTransformer's
numerics) and ``model.process_weights()`` rewrite a bridge's weights in place, keeping its output:
by default they fold each layer's value bias ``b_V`` into the output bias (``b_O + Σ_h b_V,h
W_O,h``; exact only because every attention row sums to 1), centre the weights that write to the
residual stream on LayerNorm models (``W_E``, ``W_pos``, ``W_O``, ``W_out``: the next LayerNorm
removes the mean again) and fold LayerNorm weights into the layers after them. The output is the
same; three things attnlens reads are not:

- ``"values"``: ``hook_v`` holds ``x W_V`` without ``b_V``, so effective attention (the left null
  space of ``V``), the norm-based view (``‖(x W_V + b_V) W_O‖``, Kobayashi et al. 2020) and each
  head's output ``z = A V`` (the zero ablation and head importance of Michel et al. 2019 gate it)
  are computed on other vectors than the model's (when the bridge has value biases);
- ``"output_weights"``: ``W_O`` is centred over ``d_model``, which changes the norm-based view;
- ``"residual"``: the residual stream of a pre-norm LayerNorm model (GPT-2) loses its mean over
  ``d_model``, which changes probe features. A post-norm model (BERT, RoBERTa,
  :attr:`attnlens.core.models.Architecture.post_norm`) hands each block's output on normalized,
  as before.

Attention patterns, PAPA's constants, pattern types, syntactic heads, the mean ablation and
LM scores are the same either way. :func:`check` refuses the rest by name; :func:`changed` tells
what was changed, from the bridge's attributes alone (no tensor is read), taking
TransformerLens's default options (a bridge processed with some of them off is refused as if
they were on: ``no_processing=True`` is the way to keep the weights).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnlens.core import models
from attnlens.errors import InputError

#: what a processed bridge may have changed (:func:`changed`), with the words for messages
CHANGES: dict[str, str] = {
    "values": "its value vectors (the value biases are folded into the output bias)",
    "output_weights": "its output weights W_O (centred over d_model)",
    "residual": "its residual stream (the writing weights centred over d_model)",
}


class ProcessedWeights(InputError):
    """A bridge whose weights TransformerLens processed, for an analysis that reads what the
    processing changed (:func:`check`)."""


def is_processed(model: Any) -> bool:
    """Whether TransformerLens processed ``model``'s weights (``enable_compatibility_mode()`` or
    ``process_weights()``; TransformerLens records it in the bridge's ``_weights_processed``)."""
    return bool(getattr(model, "_weights_processed", False))


def changed(model: Any) -> frozenset[str]:
    """Which of :data:`CHANGES` TransformerLens's weight processing (with its default options)
    changed in ``model``: empty for a bridge whose weights are its own. Host attributes only."""
    if not is_processed(model):
        return frozenset()
    found = set()
    blocks = getattr(model, "blocks", ())
    if any(getattr(block.attn, "b_V", None) is not None for block in blocks):
        found.add("values")  # folded into b_O (Llama has no value bias: nothing to fold)
    layer_norm = getattr(model.cfg, "normalization_type", None) in ("LN", "LNPre")
    if layer_norm and getattr(getattr(model, "adapter", None), "supports_center_writing_weights", True):
        found.add("output_weights")  # RMSNorm keeps the mean: TransformerLens centres only under LN
        architecture = models.find(model)
        if architecture is None or not architecture.post_norm:
            found.add("residual")
    return frozenset(found)


def check(model: Any, reads: Iterable[str], what: str) -> None:
    """Refuse ``what`` (e.g. ``"effective attention"``), which reads ``reads`` (of
    :data:`CHANGES`), on a bridge whose weight processing changed one of them
    (:class:`ProcessedWeights`, naming what changed and the fix). Host attributes only: once a
    call or a pass."""
    found = changed(model).intersection(reads)
    hit = [name for name in CHANGES if name in found]  # in CHANGES' order
    if hit:
        raise ProcessedWeights(
            f"{what} needs the model's weights as they are, but TransformerLens has processed this "
            "bridge's weights (enable_compatibility_mode() or process_weights()): that keeps the output "
            f"and changed {' and '.join(CHANGES[name] for name in hit)}, so these numbers would not be "
            "the model's. Use a bridge whose weights are its own: attnlens.load(...) again, or "
            "enable_compatibility_mode(no_processing=True) for TransformerLens's hook names alone."
        )
