"""attnlens.core.modes.eval_mode: eval mode inside the block, each module's own mode after."""

from __future__ import annotations

import pytest

from attnlens.core.modes import eval_mode
from tests import tiny


def _modes(bridge) -> list[bool]:
    return [module.training for module in bridge.modules()] + [
        module.training for module in bridge.original_model.modules()
    ]


def test_a_mixture_of_modes_is_eval_inside_and_comes_back_exactly():
    bridge = tiny.bert_bridge()
    bridge.eval()
    bridge.original_model.bert.encoder.layer[1].train()  # one layer of the wrapped model trains
    before = _modes(bridge)
    assert any(before) and not all(before)
    with eval_mode(bridge) as model:
        assert model is bridge and not any(_modes(bridge))
    assert _modes(bridge) == before


def test_the_mode_comes_back_when_the_block_fails():
    bridge = tiny.bert_bridge()
    bridge.train()
    with pytest.raises(RuntimeError, match="half-way"), eval_mode(bridge):
        assert not any(_modes(bridge))
        raise RuntimeError("half-way")
    assert all(_modes(bridge))


def test_a_model_already_in_eval_mode_is_not_walked_again(monkeypatch):
    """The usual case (attnlens.load returns an eval model): no eval() call, no train() after."""
    bridge = tiny.bert_bridge()
    bridge.eval()
    calls = []
    monkeypatch.setattr(type(bridge), "train", lambda self, mode=True: calls.append(mode))
    with eval_mode(bridge):
        pass
    assert calls == []
