"""Holm's (1979) step-down adjustment by its definition, a plain loop: the reference the tables'
``p_adjusted`` columns are tested against."""

from __future__ import annotations


def holm_loop(p: list[float]) -> list[float]:
    """The ``i``-th smallest of ``m`` p-values becomes ``max_{j ≤ i} min(1, (m − j + 1) · p_(j))``."""
    order = sorted(range(len(p)), key=p.__getitem__)
    adjusted, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted
