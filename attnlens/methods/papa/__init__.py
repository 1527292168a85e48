"""PAPA's method layer (Hassid et al. 2022): constants, their hooks and which heads to replace.

The guide with an example is the public module's docstring, :mod:`attnlens.papa`, which gathers
these names with the evaluation layer's (the curve and Table 1: :mod:`attnlens.evaluation.curve`,
:mod:`attnlens.evaluation.table`).
"""

from attnlens.methods.papa.baselines import TrainableConstants, identity, toeplitz, uniform, zeros
from attnlens.methods.papa.constants import PapaConstants
from attnlens.methods.papa.fitting import fit
from attnlens.methods.papa.intervene import PapaHooks, check_inputs, hooks, intervention
from attnlens.methods.papa.replace import constant_pattern, softmax_pattern
from attnlens.methods.papa.selection import STRATEGIES, HeadSet, learn_lambda, select_heads
from attnlens.methods.papa.training import train_constants

load = PapaConstants.load

__all__ = [
    "HeadSet",
    "PapaConstants",
    "PapaHooks",
    "STRATEGIES",
    "TrainableConstants",
    "check_inputs",
    "constant_pattern",
    "fit",
    "hooks",
    "identity",
    "intervention",
    "learn_lambda",
    "load",
    "select_heads",
    "softmax_pattern",
    "toeplitz",
    "train_constants",
    "uniform",
    "zeros",
]
