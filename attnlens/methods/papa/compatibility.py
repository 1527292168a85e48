"""Whether PAPA constants fit a model or a batch: :func:`check_model` (the model's id, layers,
heads, decoder or encoder and weights) and :func:`check_batch` (the layout, ``max_len`` and kind
of inputs), and what constants record of a model (:func:`model_info`; whether it is a decoder and
its weights' fingerprint: :func:`attnlens.core.loading.is_causal` and
:func:`~attnlens.core.fingerprints.weights_fingerprint`). :meth:`attnlens.methods.papa.PapaConstants.check_compatible` and
the data-free constants call them; they read a constants object's attributes only."""

from __future__ import annotations

from typing import Any

from jaxtyping import Bool
from torch import Tensor

from attnlens.core.fingerprints import weights_fingerprint
from attnlens.core.loading import is_causal, model_id
from attnlens.errors import InputError

__all__ = ["check_batch", "check_model", "check_padding", "model_info"]


def model_info(model: Any) -> tuple[str, int, int]:
    """``(model id, n_layers, n_heads)`` of a bridge, as recorded in constants."""
    return model_id(model), int(model.cfg.n_layers), int(model.cfg.n_heads)


def check_model(constants: Any, model: Any, *, weights: bool = True) -> None:
    """Raise unless ``model`` is the model ``constants`` were made for: its layers, heads and, when
    ``constants.fingerprint`` is set, weights. The model's id must match too, unless the weights
    fingerprint does (the same model loaded from another folder, or by name and by path).
    ``weights=False``: whether it is a decoder and its layers and heads only, which read nothing
    of the device (what the hooks check at every call: :func:`attnlens.engine.forward.check_hooks_model`)."""
    if model is None:
        return
    recorded = getattr(constants, "causal", None)
    if recorded is not None and bool(recorded) != is_causal(model):
        fitted, given = ("a decoder (causal)", "an encoder") if recorded else ("an encoder", "a decoder (causal)")
        raise InputError(
            f"these constants were fitted on {fitted}, and this model is {given}: a decoder's "
            "constants are lower-triangular and an encoder's are not. Fit constants on this model "
            "with papa.fit(model, corpus)."
        )
    name, n_layers, n_heads = model_info(model)
    expected = getattr(constants, "fingerprint", None) if weights else None
    found = weights_fingerprint(model) if expected is not None else None
    if weights and name != constants.model_id and (expected is None or found != expected):
        raise InputError(
            f"constants were fitted on {constants.model_id!r}, model is {name!r}"
            + (" (and its weights differ)." if expected is not None else ".")
            + " Fit constants on this model with papa.fit (attnlens fit-papa --model ...)."
        )
    if (n_layers, n_heads) != (constants.n_layers, constants.n_heads):
        raise InputError(
            f"constants have {constants.n_layers} layers x {constants.n_heads} heads, "
            f"model {name!r} has {n_layers} x {n_heads}."
        )
    if expected is not None and found != expected:
        raise InputError(
            f"constants were fitted on a {name!r} with other weights than this model's "
            f"(weights fingerprint {expected} when fitted, {found} for this model: e.g. another "
            "initialisation, a fine-tuned copy, or bfloat16 weights). Fit constants on this model "
            "with papa.fit(model, corpus); to use these on it anyway, set "
            "constants.fingerprint = None."
        )


def check_batch(constants: Any, batch: Any) -> None:
    """Raise unless ``batch`` was tokenized with the layout and ``max_len`` of ``constants``."""
    length = batch.input_ids.shape[-1]
    fitted = f"constants were fitted with layout={constants.layout!r}, max_len={constants.max_len}"
    if batch.layout != constants.layout or batch.max_len != constants.max_len:
        raise InputError(
            f"{fitted}; the batch has layout={batch.layout!r}, max_len={batch.max_len}. "
            f"Tokenize with attnlens.tokenize(model, texts, max_len={constants.max_len}, "
            f"layout={constants.layout!r})."
        )
    padded_papa = constants.layout == "papa" and not getattr(batch, "compact", False)
    if length > constants.max_len or (padded_papa and length != constants.max_len):
        raise InputError(f"{fitted}; the batch has {length} positions.")
    if not (constants.layout == "papa" and getattr(batch, "compact", False)):  # a compact batch's
        check_padding(constants, batch.attention_mask.bool().cpu())  # positions: the hooks check them
    pairs = getattr(constants, "pairs", None)
    if pairs is not None and bool(batch.is_pair) != pairs:
        fitted_on = "sentence pairs" if pairs else "single sentences"
        given = "sentence pairs" if batch.is_pair else "single sentences"
        raise InputError(f"constants were fitted on {fitted_on}; the batch holds {given}.")


def check_padding(constants: Any, key_mask: Bool[Tensor, "batch key"]) -> None:
    """Raise unless the real tokens of ``key_mask`` (read: give the host's copy) sit where the
    constants' layout puts them, since a constant is looked up by position: in the ``"papa"``
    layout the first and last positions are real tokens (the final separator at ``max_len - 1``);
    in the ``"padded"`` layout no real token follows padding (a left-padded row's tokens would
    read the constants of other positions)."""
    fitted = f"constants were fitted with layout={constants.layout!r}, max_len={constants.max_len}"
    if constants.layout == "papa":
        if not bool(key_mask[:, 0].all() and key_mask[:, -1].all()):
            raise InputError(
                f"{fitted}; the inputs are not in the 'papa' layout (they look like layout='padded': "
                "the last position is padding). Tokenize with layout='papa'."
            )
    elif bool((key_mask[:, 1:] & ~key_mask[:, :-1]).any()):
        raise InputError(
            f"{fitted}; the inputs are not right-padded (a real token follows padding: left padding, "
            "or the 'papa' layout). Tokenize with attnlens.tokenize(model, texts, layout='padded'), "
            "which pads on the right (model.generate of several prompts pads them on the left: "
            "generate one prompt at a time)."
        )
