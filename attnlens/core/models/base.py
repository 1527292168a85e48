"""What attnlens needs to know about an architecture, in one value: :class:`Architecture`.

Each supported architecture has one small module in :mod:`attnlens.core.models` (``bert.py``,
``roberta.py``, ``gpt2.py``, ``llama.py``) holding its :class:`Architecture`. Loading, the hook
seam, tokenizing, the pass engine and effective attention ask it, never ``isinstance`` checks or
lists of model types of their own. A new architecture is one new module and its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

#: how ``blocks.{l}.attn.hook_pattern`` edits reach the computation:
#: ``"attnlens"``: through attnlens's attention implementation (:mod:`attnlens.core.seam`);
#: ``"native"``: the TransformerLens bridge already runs attention itself and honours edits.
Seam = Literal["attnlens", "native"]


#: a refused setting (:attr:`Architecture.refused_settings`) of the encoders (BERT, RoBERTa): one
#: configured as a decoder runs causal self-attention, which attnlens would read as an encoder's
#: (PAPA constants, the uniform ablation and the PAPA layout all bidirectional)
ENCODER_AS_DECODER = (
    "is_decoder", True, "it then runs causal self-attention, but attnlens treats BERT and RoBERTa as "
    "encoders (its constant and uniform patterns would let a token see later ones)",
)


def _no_reserved_positions(config: Any) -> int:
    return 0


def _no_alias(name: str) -> str | None:
    return None


def _no_window(config: Any) -> int | None:
    return None


@dataclass(frozen=True)
class Architecture:
    """The facts of one architecture.

    - ``name``: the adapter's name (``"bert"``);
    - ``model_types``: the Hugging Face ``config.model_type`` values it covers;
    - ``hf_classes``: the model classes attnlens wraps (the LM-head class: names and folders are
      loaded as the first one);
    - ``causal``: a decoder (query ``q`` never sees a key ``k > q``);
    - ``seam``: see :data:`Seam`;
    - ``layout``: the default input layout of PAPA constants (``"papa"``: fixed [CLS]/[SEP]
      positions; ``"padded"``: left-aligned, right padding, no fixed separator);
    - ``positions_from_mask``: position ids come from the attention mask (decoders), so a
      left-padded text keeps the positions it has alone; else the model's own positions;
    - ``counts_positions``: the model numbers the real tokens itself, skipping padding (RoBERTa
      from its padding token, decoders from the mask), so a PAPA-layout text gets the same
      position ids with or without the padding before its final separator: a compact batch
      (:func:`attnlens.core.inputs.compact_batch`) runs without explicit ``position_ids``. False (BERT):
      the model numbers columns, and a compact batch passes the layout's positions;
    - ``reserved_positions(config)``: position embeddings never used (RoBERTa: ``padding_idx + 1``);
    - ``value_hook`` / ``output_hook``: hook names (``{layer}`` filled in) carrying V
      (``[batch, key, kv_head, d_head]``) and each head's output ``z`` (``[batch, query, head,
      d_head]``);
    - ``resolve(name)``: a local folder for a name this architecture knows (e.g. the SmolLM2 GGUF
      converted once into a cache), or ``None``;
    - ``lm_head_keys``: checkpoint key prefixes of the LM head's own parameters, never tied to
      the input embedding (BERT: ``cls.predictions.transform.``; RoBERTa: ``lm_head.dense.``,
      ``lm_head.layer_norm.``); a checkpoint without them (a bare encoder such as
      all-MiniLM-L6-v2) leaves the head to transformers' random initialisation;
    - ``output_embedding_keys``: checkpoint key prefixes of the output embedding (the unembedding
      matrix), needed in the checkpoint only when the config does not tie it to the input
      embedding (``tie_word_embeddings=False``; GPT-2 and Llama: ``lm_head.weight``).
      :meth:`lm_head_prefixes` combines the two for a config;
    - ``post_norm``: each block normalizes the residual stream it hands on (BERT, RoBERTa:
      LayerNorm after each sub-layer), so a block's output keeps no mean over ``d_model`` that
      centring the writing weights could remove (:mod:`attnlens.core.processing`); False: a
      pre-norm model (GPT-2, Llama), whose residual stream is the sum of what wrote to it;
    - ``refused_settings``: ``(config attribute, value, why)`` of configurations TransformerLens's
      bridge does not run as Hugging Face does, refused at load (:func:`attnlens.load`);
    - ``window(config)``: how many keys (its own included) a query may reach when some layer
      attends through a sliding window (Mistral; Qwen2 with ``use_sliding_window``), else
      ``None``. attnlens's own patterns (PAPA constants, the uniform ablation) know no window,
      so a text may hold at most that many tokens (:func:`attnlens.core.inputs.position_limit`):
      then no query has a key beyond it, and a replaced head reads only what the model could.
    """

    name: str
    model_types: tuple[str, ...]
    hf_classes: tuple[str, ...]
    causal: bool
    seam: Seam
    layout: str
    positions_from_mask: bool = False
    counts_positions: bool = False
    reserved_positions: Callable[[Any], int] = field(default=_no_reserved_positions)
    value_hook: str = "blocks.{layer}.attn.hook_v"
    output_hook: str = "blocks.{layer}.attn.hook_z"
    resolve: Callable[[str], str | None] = field(default=_no_alias)
    aliases: tuple[str, ...] = ()
    lm_head_keys: tuple[str, ...] = ()
    output_embedding_keys: tuple[str, ...] = ()
    refused_settings: tuple[tuple[str, Any, str], ...] = ()
    post_norm: bool = False
    window: Callable[[Any], int | None] = field(default=_no_window)

    def lm_head_prefixes(self, config: Any) -> tuple[str, ...]:
        """Checkpoint key prefixes the LM head of a model with ``config`` needs (each matched by
        at least one key, counted without the base model's prefix such as ``bert.``) for the
        head to be trained rather than initialised at load: :attr:`lm_head_keys`, plus
        :attr:`output_embedding_keys` when the output embedding is not tied to the input one.
        Empty: the head is the (tied) input embedding, trained with the model."""
        tied = bool(getattr(config, "tie_word_embeddings", True))
        return self.lm_head_keys + (() if tied else self.output_embedding_keys)

    def kv_heads(self, config: Any) -> int:
        """Key-value heads per layer: ``num_key_value_heads`` where the config has it (grouped
        queries, Ainslie et al. 2023), else one per query head."""
        heads = int(config.num_attention_heads if hasattr(config, "num_attention_heads") else config.n_head)
        return int(getattr(config, "num_key_value_heads", None) or heads)

    def kv_group(self, config: Any) -> int:
        """Query heads per key-value head: query head ``h`` reads key-value head
        ``h // kv_group`` (as Hugging Face's ``repeat_kv``)."""
        heads = int(config.num_attention_heads if hasattr(config, "num_attention_heads") else config.n_head)
        return heads // self.kv_heads(config)

    def __repr__(self) -> str:
        kind = "decoder" if self.causal else "encoder"
        return f"Architecture({self.name!r}, {kind}, seam={self.seam!r}, layout={self.layout!r})"
