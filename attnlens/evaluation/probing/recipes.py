"""PAPA's probe recipe per task (Hassid et al. 2022, Appendix B, Table 3).

The paper trains its probe (§3.3) with these hyper-parameters: learning rate, batch size (in
examples), epochs and the maximal sequence length. attnlens uses them as the defaults of
:func:`attnlens.evaluation.probing.run` (the probe's ``lr``, ``batch_size``, ``epochs``; ``max_len`` when none
is given). The MLM row is the paper's MLM probe (:mod:`attnlens.evaluation.probing.mlm`); MNLI's is kept for users
who have its files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnlens.errors import InputError


@dataclass(frozen=True)
class Recipe:
    """One row of PAPA's Table 3: ``lr``, ``batch_size``, ``epochs``, ``max_len``."""

    lr: float
    batch_size: int
    epochs: int
    max_len: int

    def probe_settings(self) -> dict:
        """The keyword arguments of :class:`attnlens.evaluation.probing.PapaProbe` (without ``max_len``)."""
        settings = asdict(self)
        settings.pop("max_len")
        return settings


#: Hassid et al. 2022, Table 3 (learning rate / batch size / epochs / max sequence length).
TABLE3: dict[str, Recipe] = {
    "cola": Recipe(2e-5, 16, 15, 64),
    "sst2": Recipe(1e-4, 32, 4, 64),
    "mnli": Recipe(2e-4, 8, 4, 256),
    "mrpc": Recipe(2e-5, 16, 15, 128),
    "ner": Recipe(1e-4, 8, 4, 128),
    "pos": Recipe(5e-4, 8, 4, 128),
    "mlm": Recipe(5e-4, 8, 2, 128),
}


def recipe(task: str) -> Recipe:
    """Table 3's row for ``task`` (a name of :data:`attnlens.evaluation.tasks.NAMES`, or ``"mlm"``)."""
    if task not in TABLE3:
        raise InputError(f"PAPA's Table 3 has no recipe for {task!r}; it has {', '.join(TABLE3)}.")
    return TABLE3[task]
