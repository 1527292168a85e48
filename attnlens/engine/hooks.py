"""The one hook-list type: :class:`Hooks`, a list of TransformerLens ``(hook_name, hook_fn)`` pairs.

Every intervention of attnlens (:func:`attnlens.papa.hooks`, :func:`attnlens.methods.effective.hooks`,
:func:`attnlens.ablation.hooks`) returns a subclass of :class:`Hooks`, and everything that takes
``hooks=`` (:func:`attnlens.engine.forward.run_with_hooks`, :func:`attnlens.engine.passes.run`,
:func:`attnlens.evaluation.probing.run`, ``lm.*``, ``ablation.*``, :func:`attnlens.compare`) accepts one, as
it accepts any plain list of pairs: a :class:`Hooks` *is* a list, so
``model.run_with_hooks(tokens, fwd_hooks=hooks)`` works as it always did.

What a :class:`Hooks` adds to the list:

- :meth:`Hooks.key`: a stable string naming what the hooks do (equal keys, equal interventions),
  or ``None`` when they cannot be told apart from others (not cacheable). Caches of what a model
  computes under hooks (probe features) are keyed by it;
- ``a + b``: the hooks of ``a`` then those of ``b``, still a :class:`Hooks`, whose key joins
  both keys (``None`` if either has none);
- :meth:`Hooks.apply`: a context manager that installs the hooks on a model and removes them on
  exit, like TransformerLens's ``HookedRootModule.hooks()``;
- :meth:`Hooks.patched`: the part of the intervention that patches the model itself rather than
  running as a hook (none for plain hooks; a :class:`attnlens.papa.PapaHooks` made with
  ``fast=True`` skips the replaced heads' work, :func:`attnlens.core.fast_heads.constant_heads`), yielding
  the pairs still to pass as ``fwd_hooks``. The pass engine (:func:`attnlens.engine.passes.run`) and
  :func:`attnlens.engine.forward.run_with_hooks` run inside it; a caller who hands the list straight to
  ``run_with_hooks`` gets the hook path, the same intervention, at its usual cost.

A model may also carry hooks of its own when attnlens is called: ``model.add_hook(...)``, the
block of TransformerLens's ``model.hooks(...)``, :meth:`Hooks.apply`, ``papa.intervention(...)``,
``effective.hooked(...)``, a user's plain PyTorch hook on a module or a forward replaced (:func:`pytorch_edits`).
Every forward runs them, so what attnlens computes is the hooked model's; but no key names them. :func:`on_model` lists them, for what keys results by their
interventions (the features cache, checkpoints, curve points).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn
from torch.nn.modules import module as torch_module

from attnlens.core import fast_heads, seam

#: how TransformerLens's own permanent hooks show in ``list_hooks()``: a bridge wires each
#: placeholder's ``hook_in``/``hook_out`` (BERT's ``blocks.{i}.hook_mlp_in``) to the hook points
#: of its ``in``/``out`` parts (``_wire_symbolic_hooks`` in TransformerLens 4.3's
#: ``model_bridge/component_setup.py``); they pass activations through unchanged
TRANSFORMERLENS_WIRING = "_wire_symbolic_hooks."

#: the packages whose own PyTorch module hooks a model carries for itself (transformers'
#: ``output_capturing_hook`` behind ``output_attentions``, TransformerLens's hook points and its
#: blocks' capture of the normalized inputs, torch's weight norm): they record or belong to the
#: model's definition; a hook from anywhere else (a notebook, a script) is the user's
HOOKING_LIBRARIES = ("torch", "transformers", "transformer_lens", "accelerate", "attnlens")

#: the modules of those packages whose hooks edit a model as a user's do: torch's pruning
#: (``torch.nn.utils.prune``: a pre-hook multiplies a weight by a mask, a buffer that the
#: weights' fingerprint does not read)
EDITING_TOOLS = ("torch.nn.utils.prune",)



class Hooks(list):
    """``(hook_name, hook_fn)`` pairs for ``run_with_hooks``, with a :meth:`key` and :meth:`apply`.

    ``key``: the key of a plain :class:`Hooks` (None: not cacheable, unless it is empty, which is
    ``"none"``, the model itself). Subclasses override :meth:`key` with what they are made of.
    """

    def __init__(self, items: Iterable[tuple[Any, Callable]] = (), *, key: str | None = None) -> None:
        super().__init__(items)
        self._key = key

    def key(self) -> str | None:
        """A stable string for what these hooks do, or None when unknown (not cacheable)."""
        if self._key is not None:
            return self._key
        return "none" if len(self) == 0 else None

    @property
    def hook_names(self) -> list[str]:
        """The hook point of each pair, in order (a callable name filter shows as its repr)."""
        return [name if isinstance(name, str) else repr(name) for name, _ in self]

    def __add__(self, other: Iterable[tuple[Any, Callable]]) -> Hooks:  # type: ignore[override]
        other_list = list(other)
        mine, theirs = self.key(), _key_of(other)
        if len(other_list) == 0:
            key = mine
        elif len(self) == 0:
            key = theirs
        else:
            key = None if mine is None or theirs is None else f"{mine}+{theirs}"
        return Hooks([*self, *other_list], key=key)

    def __radd__(self, other: Iterable[tuple[Any, Callable]]) -> Hooks:
        return Hooks(other) + self

    def __iadd__(self, other: Iterable[tuple[Any, Callable]]) -> Hooks:  # type: ignore[override]
        # in place would keep a subclass whose key no longer says what it holds
        return self + other

    @contextlib.contextmanager
    def patched(self, model: Any) -> Iterator[list[tuple[Any, Callable]]]:
        """For the ``with`` block, ``model`` carries what these hooks do by patching it rather than
        as hooks; yields the ``(hook_name, hook_fn)`` pairs still to pass as ``fwd_hooks``. A plain
        :class:`Hooks` patches nothing and yields all its pairs; subclasses may patch (e.g.
        :class:`attnlens.papa.PapaHooks` with ``fast=True``) and yield fewer. A sum ``a + b``
        is a plain :class:`Hooks`: its pairs run as hooks (the same intervention)."""
        yield list(self)

    @contextlib.contextmanager
    def apply(self, model: Any) -> Iterator[Any]:
        """Install the hooks on ``model`` (a TransformerLens ``HookedRootModule`` or bridge) for the
        ``with`` block and remove them on exit, even on an error: ``with hooks.apply(model): ...``.
        Hooks that were on the model before stay. Any patch (:meth:`patched`) holds as long."""
        with self.patched(model) as remaining, model.hooks(fwd_hooks=remaining):
            yield model

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} hooks, key={self.key()!r})"


def as_hooks(hooks: Any) -> Hooks:
    """``hooks`` as a :class:`Hooks` (unchanged when it is one; None or ``()``: no hooks)."""
    if isinstance(hooks, Hooks):
        return hooks
    return Hooks(() if hooks is None else hooks)


def _key_of(hooks: Any) -> str | None:
    if len(list(hooks)) == 0:
        return "none"
    key = getattr(hooks, "key", None)
    return key() if callable(key) else None


def on_model(model: Any) -> list[str]:
    """What ``model`` carries now that changes or reads its forward, besides the hooks a call is
    given: the hook points with TransformerLens hooks on them (``add_hook``, permanent or not, and
    those of an open ``model.hooks(...)`` block; its own wiring, :data:`TRANSFORMERLENS_WIRING`,
    left out), each by its shortest alias; the layers whose attention constant heads patch
    (:func:`attnlens.core.fast_heads.patched_layers`); and the modules with a user's plain PyTorch
    hook or replaced forward (:func:`pytorch_edits`). Empty for a model as loaded. Host attributes only, once a call."""
    names: dict[int, str] = {}  # one name per hook, the shortest of its hook point's aliases
    list_hooks = getattr(model, "list_hooks", None)
    for name, handles in (list_hooks() if callable(list_hooks) else {}).items():
        for handle in handles:
            wiring = getattr(getattr(handle, "user_hook", None), "__qualname__", "").startswith(TRANSFORMERLENS_WIRING)
            if not (handle.is_permanent and wiring):
                known = names.get(id(handle))
                names[id(handle)] = name if known is None or len(name) < len(known) else known
    found = sorted(set(names.values()))
    patched = [f"blocks.{layer}.attn (constant heads patched in)" for layer in fast_heads.patched_layers(model)]
    return found + patched + pytorch_edits(model)


def pytorch_edits(model: Any) -> list[str]:
    """The plain PyTorch edits of a user's that ``model`` (an ``nn.Module``) runs: forward and
    backward hooks and pre-hooks registered on one of its modules (``register_forward_hook``, ...;
    named by the module's shortest path, e.g. ``"blocks.0.mlp (a PyTorch forward hook)"``) or on
    every module (``register_module_forward_hook``, ...: ``"every module (a PyTorch global forward
    hook)"``); a module's ``forward`` replaced by assignment (``module.forward = f``:
    ``"blocks.0.mlp (its forward replaced)"``); the ``forward`` of one of the libraries' classes
    replaced (``BertSelfOutput.forward = f``: ``"every BertSelfOutput (its class's forward
    replaced, ...)"``). The hooks and forwards of :data:`HOOKING_LIBRARIES` (by the module whose
    code defines the function) are the model's own and left out, TransformerLens's hook points
    among them (their hooks are :func:`on_model`'s hook points) and attnlens's constant heads
    (:func:`attnlens.core.fast_heads.patched_layers`), but for those of :data:`EDITING_TOOLS`.
    A class of the user's own inside the model is its definition, not an edit. Host attributes
    only."""
    if not isinstance(model, nn.Module):
        return []
    edited: dict[int, str] = {}  # the module's id: what of the user's it holds
    modules = list(model.modules())
    for module in modules:
        kinds = [_kind(table) for table in seam.MODULE_HOOKS if any(map(_users, getattr(module, table, {}).values()))]
        replaced = "forward" in vars(module) and _users(vars(module)["forward"])
        if kinds or replaced:
            edited[id(module)] = ", ".join([f"a PyTorch {' and '.join(kinds)}"] * bool(kinds) + ["its forward replaced"] * replaced)
    # the libraries' classes whose forward a user replaced, each class looked at once (MiniLM's
    # bridge: 421 modules of 23 classes)
    classes = {cls for cls in set(map(type, modules)) if _library(_defined_in(cls)) and _users(cls.forward)}
    found: dict[int, str] = {}
    if edited:  # a module's shortest path among its aliases (a bridge holds each Hugging Face module twice)
        for path, module in model.named_modules(remove_duplicate=False):
            known = found.get(id(module))
            if id(module) in edited and (known is None or (len(path), path) < (len(known), known)):
                found[id(module)] = path
    listed = [f"{found[key] or 'the model'} ({what})" for key, what in edited.items()]
    listed += [f"every {cls.__name__} (its class's forward replaced, {cls.__module__}.{cls.__qualname__}.forward)"
               for cls in classes]
    every = [_kind(table) for table in seam.GLOBAL_HOOKS if any(map(_users, getattr(torch_module, table).values()))]
    return sorted(listed) + ([f"every module (a PyTorch global {' and '.join(every)})"] if every else [])


def _kind(table: str) -> str:
    """The words for the hooks of a PyTorch hook table: ``"_forward_pre_hooks"``, ``"forward
    pre-hook"``."""
    direction, *pre = table.removeprefix("_global").strip("_").removesuffix("_hooks").split("_")
    return f"{direction} {'pre-hook' if pre else 'hook'}"


def _users(hook: Any) -> bool:
    """Whether a PyTorch hook's function (or a ``forward``) comes from outside
    :data:`HOOKING_LIBRARIES` or from :data:`EDITING_TOOLS` (through ``functools.partial``, bound
    methods and callable objects to the code that runs; a wrapper by the module that defines it,
    not the ``__module__`` that ``functools.wraps`` copies from what it wraps)."""
    function = hook
    while isinstance(function, functools.partial):
        function = function.func
    function = getattr(function, "__func__", function)  # a bound method
    package = _defined_in(function)
    return not _library(package) or package.startswith(EDITING_TOOLS)


def _defined_in(thing: Any) -> str:
    """The module whose code defines a function (its globals' ``__name__``), a class or a callable
    object (its class's ``__module__``)."""
    defined = getattr(thing, "__globals__", {}).get("__name__") or getattr(thing, "__module__", None)
    return str(defined or type(thing).__module__)


def _library(module: str) -> bool:
    """Whether a module belongs to one of :data:`HOOKING_LIBRARIES`."""
    return module.split(".")[0] in HOOKING_LIBRARIES
