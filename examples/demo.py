"""Demo: the embedded default model, with and without a hook_pattern intervention.

Run with `make demo`. Loads all-MiniLM-L6-v2 offline, runs a batch of real sentences,
then runs it again with every head's attention replaced by uniform attention over the
valid tokens, and prints how much the output moved.
"""

import torch

import attnlens
from attnlens.seam import key_mask

SENTENCES = [
    "The film is a charming, funny and moving portrait of a family.",
    "It rained all day, so the match was postponed until Sunday.",
    "Researchers measured how much each attention head depends on its input.",
    "Short one.",
]


def uniform_attention(pattern, hook):
    valid = key_mask(pattern)[:, None, None, :].to(pattern.dtype)
    return (valid / valid.sum(-1, keepdim=True)).expand_as(pattern)


def main() -> None:
    model = attnlens.load()
    batch = attnlens.tokenize(model, SENTENCES, max_len=32, layout="padded")
    cfg = model.cfg
    print(f"model: {cfg.model_name} ({cfg.n_layers} layers x {cfg.n_heads} heads, d_head {cfg.d_head})")
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
        edited = model.run_with_hooks(
            batch.input_ids,
            **batch.model_kwargs(),
            fwd_hooks=[(lambda name: name.endswith("hook_pattern"), uniform_attention)],
        )
    valid = batch.attention_mask.bool()
    change = (edited - logits).abs().amax(-1)[valid]
    pattern = cache["blocks.0.attn.hook_pattern"]
    print(f"batch: {len(batch)} sentences, {int(valid.sum())} tokens, pattern {tuple(pattern.shape)}")
    print(f"logit change with uniform attention in every head: max {change.max():.3f}, mean {change.mean():.3f}")
    top_before = logits.argmax(-1)[valid]
    top_after = edited.argmax(-1)[valid]
    print(f"tokens whose top prediction changed: {int((top_before != top_after).sum())} of {int(valid.sum())}")


if __name__ == "__main__":
    main()
