"""Supported architectures, one module each (see :class:`attnlens.core.models.Architecture`).

:func:`of` answers "what are this model's facts?" for a bridge, a Hugging Face model or a config;
an unsupported one raises :class:`UnsupportedArchitecture` naming the adapters there are.
"""

from __future__ import annotations

from typing import Any

from attnlens.core.models import bert, gpt2, llama, roberta
from attnlens.core.models.base import Architecture, Seam
from attnlens.errors import InputError

#: every adapter, in the order they are listed to users
ARCHITECTURES: tuple[Architecture, ...] = (
    bert.ARCHITECTURE,
    roberta.ARCHITECTURE,
    gpt2.ARCHITECTURE,
    llama.ARCHITECTURE,
)

__all__ = ["ARCHITECTURES", "Architecture", "Seam", "UnsupportedArchitecture", "of", "resolve_alias"]


class UnsupportedArchitecture(InputError):
    """A model whose architecture has no adapter in :mod:`attnlens.core.models`."""


def _config(model: Any) -> Any:
    """The Hugging Face config of a bridge, a Hugging Face model, or a config itself."""
    hf_model = getattr(model, "original_model", model)
    return getattr(hf_model, "config", hf_model)


def supported() -> str:
    """The adapters there are, for messages: ``bert (BertForMaskedLM), ...``."""
    return ", ".join(f"{a.name} ({', '.join(a.hf_classes)})" for a in ARCHITECTURES)


def of(model: Any) -> Architecture:
    """The :class:`Architecture` of a bridge, a Hugging Face model or config;
    :class:`UnsupportedArchitecture` (a ``ValueError``) names the adapters there are."""
    model_type = getattr(_config(model), "model_type", None)
    for architecture in ARCHITECTURES:
        if model_type in architecture.model_types:
            return architecture
    raise UnsupportedArchitecture(
        f"attnlens has no adapter for model_type {model_type!r}; adapters: {supported()}. "
        "A new architecture is one file in attnlens/core/models/."
    )


def find(model: Any) -> Architecture | None:
    """:func:`of`, or ``None`` for a model attnlens does not support (or a bare tokenizer)."""
    try:
        return of(model)
    except UnsupportedArchitecture:
        return None


def resolve_alias(name: str) -> str | None:
    """A local folder for a name an adapter knows (``"smollm2-135m"``), else ``None``."""
    for architecture in ARCHITECTURES:
        folder = architecture.resolve(name)
        if folder is not None:
            return folder
    return None
