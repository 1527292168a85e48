"""What a PAPA curve runs on: the constants of each task, WikiText-2's paragraphs, the λ order
of ``strategy="lambda"`` and the constants trained with labels (Table 1's labelled rows).

The curve of ``docs/papa_curve.csv`` (and PAPA's Table 1, ``docs/papa_table.csv``) is
:func:`attnlens.evaluation.curve.curve` on :data:`TASKS` with constants fitted on
:func:`wikitext` (its validation paragraphs, ``max_len`` 128), given to each task by
:func:`constants_by_task` (MRPC, a sentence-pair task, gets constants fitted on its own training
pairs), every data-free baseline, the labelled rows (:func:`labelled_constants`), and PAPA's
MLM probe on the first :data:`LM_PARAGRAPHS` WikiText-2 test paragraphs of more than :data:`LM_MIN_WORDS` words. ``attnlens curve`` runs it
(``docs/probing.md`` gives the command).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlens.core.checks import optional_count
from attnlens.core.files import text_lines
from attnlens.core.inputs import tokenize
from attnlens.errors import InputError, InputTypeError, MismatchError
from attnlens.evaluation import probing
from attnlens.evaluation import tasks as task_module
from attnlens.evaluation.probing.recipes import TABLE3
from attnlens.methods import interventions
from attnlens.methods.papa.baselines import TrainableConstants, toeplitz
from attnlens.methods.papa.fitting import fit
from attnlens.methods.papa.selection import learn_lambda
from attnlens.methods.papa.training import train_constants

#: The tasks of the documented curve (``docs/papa_curve.csv``), in its table's order.
TASKS: tuple[str, ...] = ("sst2", "cola", "mrpc", "ner", "pos")
#: The documented curve's MLM probe: the first 400 WikiText-2 test paragraphs of more than 20 words.
LM_PARAGRAPHS, LM_MIN_WORDS = 400, 20


#: why a task of Table 1 has no row here: its dev data cannot be read
UNAVAILABLE = "not available: dev data not in this environment"


def wikitext(data_dir: str | os.PathLike, splits: Sequence[str] = ("valid",), *, min_words: int = 0,
             limit: int | None = None) -> list[str]:
    """WikiText-2's paragraphs: the lines of ``data_dir/wikitext2/<split>.txt``, split after
    split, stripped, without blank lines and headings (`` = Title = ``), those of more than
    ``min_words`` words, the first ``limit`` (``None``: all). The documented curve fits its
    constants on ``wikitext(data_dir)``, the validation paragraphs, and scores the MLM probe on
    ``wikitext(data_dir, ["test"], min_words=LM_MIN_WORDS, limit=LM_PARAGRAPHS)``: no scored
    paragraph is among those the constants were fitted on (``tests/system/test_curve_cli.py``)."""
    if isinstance(splits, str):
        raise InputTypeError(f"splits is a list of names, e.g. [{splits!r}], not one string.")
    limit = optional_count(limit, "limit", " of paragraphs (or None for all)")
    paragraphs: list[str] = []
    for split in splits:
        path = Path(data_dir) / "wikitext2" / f"{split}.txt"
        if not path.is_file():
            raise InputError(f"WikiText-2 file not found: {path} (the data folder holds wikitext2/valid.txt "
                             "and wikitext2/test.txt).")
        lines = (line.strip() for line in text_lines(path.read_text(encoding="utf-8-sig")))
        paragraphs += [line for line in lines if line and not line.startswith("=") and len(line.split()) > min_words]
    return paragraphs if limit is None else paragraphs[:limit]


def constant_texts(data_dir: str | os.PathLike) -> list[str]:
    """The paragraphs the documented curve fits its constants on: WikiText-2's validation split
    (:func:`wikitext`), disjoint from :func:`lm_texts`."""
    return wikitext(data_dir, ["valid"])


def lm_texts(data_dir: str | os.PathLike, limit: int = LM_PARAGRAPHS) -> list[str]:
    """The paragraphs the documented curve scores the LM on: the first ``limit`` WikiText-2 test
    paragraphs of more than :data:`LM_MIN_WORDS` words (:func:`wikitext`), none of which the
    constants of :func:`constant_texts` saw."""
    return wikitext(data_dir, ["test"], min_words=LM_MIN_WORDS, limit=limit)


def missing_tasks(measured: Any, data_dir: str | os.PathLike | None) -> dict[str, str]:
    """The tasks of PAPA's Table 1 (:data:`attnlens.evaluation.tasks.NAMES`) that the curve
    ``measured`` lacks, each with why, for :meth:`attnlens.evaluation.table.PapaTable.from_curve`:
    ``"not available: dev data not in this environment"`` when ``data_dir`` has no dev split of
    it (MNLI here), ``"not run"`` otherwise (or without ``data_dir``). A task is never silently
    absent from Table 1."""
    run = set(measured.table["task"])
    missing = {}
    for name in task_module.NAMES:
        if name in run:
            continue
        missing[name] = "not run"
        if data_dir is not None:
            try:
                task_module.load(name, "dev", data_dir=data_dir, limit=1)
            except task_module.TaskError:
                missing[name] = UNAVAILABLE
    return missing


def constants_by_task(model: Any, constants: Any, tasks: Sequence[Any], *, data_dir: Any = None,
                      train_limit: int | None = 4000, seed: int = 0, batch_size: int = 32,
                      progress: bool = True) -> dict[str, Any]:
    """``{task name: PapaConstants}``, and ``"lm"``, for :func:`attnlens.evaluation.curve.curve`:
    ``constants`` for the LM and for every task whose inputs are of the kind they were fitted
    on (single sentences or sentence pairs), and, for a task of the other kind, constants
    fitted on its own training inputs (``train_limit`` of them, drawn with ``seed``, as its
    probes train on; ``data_dir`` as for :func:`attnlens.evaluation.tasks.load`) at
    ``constants``' ``max_len`` and layout, as PAPA §4 fits each task's. Constants are
    positional: a sentence pair's middle [SEP] sits at ``max_len // 2``, where constants fitted
    on single sentences never saw one. ``tasks``: names, or training splits
    (:class:`attnlens.evaluation.tasks.Task`)."""
    if isinstance(tasks, str):
        tasks = [tasks]
    pairs = getattr(constants, "pairs", None)
    if not hasattr(constants, "check_compatible"):
        raise InputTypeError(f"constants must be PapaConstants (papa.fit(model, texts)), not {type(constants).__name__}.")
    by_task = {"lm": constants}
    for task in tasks:
        name = _name(task)
        if pairs is None or (_kind(task) == "pair") == bool(pairs):  # data-free, or of the task's kind
            by_task[name] = constants
            continue
        train = task_module.load(task, "train", data_dir=data_dir, limit=train_limit, seed=seed) if isinstance(
            task, str) else task
        by_task[name] = fit(model, train.inputs(), max_len=constants.max_len, layout=constants.layout,
                            batch_size=batch_size, progress=progress)
    return by_task


def _name(task: Any) -> str:
    return task if isinstance(task, str) else str(getattr(task, "name", task))


def _kind(task: Any) -> str | None:
    """A task's kind ("sentence", "pair" or "token"), ``None`` when unknown."""
    if isinstance(task, str):
        spec = task_module.SPECS.get(task)
        return None if spec is None else spec.kind
    return getattr(task, "kind", None)


def checked_constants(model: Any, constants: Any, tasks: Sequence[Any], lm_texts: Any) -> dict[str, Any]:
    """``{task name (and "lm"): constants}`` from one :class:`PapaConstants` or a mapping, each
    checked against the model and against its task's inputs before any work: constants are
    positional, and a sentence pair's layout puts its middle [SEP] at ``max_len // 2``, which
    constants fitted on single sentences never saw (and the reverse): :func:`constants_by_task`
    gives such a task constants of its own."""
    names = [_name(task) for task in tasks] + (["lm"] if lm_texts is not None else [])
    if isinstance(constants, Mapping):
        missing = [name for name in names if name not in constants]
        if missing:
            raise InputError(f"constants has no entry for {missing[0]!r}; give one PapaConstants per "
                             f"task (keys {', '.join(map(repr, names))}; 'lm' for lm_texts).")
        by_task = {name: constants[name] for name in names}
    else:
        by_task = dict.fromkeys(names, constants)
    for name, fitted in by_task.items():
        check = getattr(fitted, "check_compatible", None)
        if check is None:
            raise InputTypeError(f"constants for {name!r} must be PapaConstants (papa.fit(model, texts)), "
                                 f"not {type(fitted).__name__}.")
        check(model)
        pairs = getattr(fitted, "pairs", None)
        if name == "lm" or pairs is None:
            continue
        is_pair = _kind(next(task for task in tasks if _name(task) == name)) == "pair"
        if bool(pairs) != is_pair:
            fitted_on = "sentence pairs" if pairs else "single sentences"
            given = "sentence pairs" if is_pair else "single sentences"
            raise MismatchError(
                f"the constants for {name!r} were fitted on {fitted_on}, and {name!r} has {given}. "
                f"Give constants as a mapping with constants fitted on {given} for it, e.g. "
                f"constants={{..., {name!r}: papa.fit(model, <its training inputs>)}}."
            )
    return by_task


#: The documented cheaper recipe of ``strategy="lambda"``: steps and training examples.
LAMBDA_STEPS, LAMBDA_EXAMPLES, LAMBDA_BATCH = 100, 512, 16
#: The labelled rows of Table 1 (:func:`labelled_constants`): each a start for trainable constants.
LABELLED: tuple[str, ...] = ("toeplitz_init", "average_init")
#: Their recipe, fixed before any result was read: Adam steps of LAMBDA_BATCH training examples
#: (250 steps: one pass over a 4,000-example training subset) and the logits' learning rate.
LABELLED_STEPS, LABELLED_LR = 250, 1e-2


def lambda_order(
    model: Any, constants: Any, task: Any, *, data_dir: Any = None, train_limit: Any = 4000,
    seed: int = 0, max_len: int = 128, layout: str | None = None, batch_size: int = 32,
    probe: dict | None = None, progress: bool = True, steps: int = LAMBDA_STEPS,
    examples: int = LAMBDA_EXAMPLES, **_: Any,
) -> Any:
    """λ per head, for ``strategy="lambda"`` (Hassid et al. 2022, §3.2): every head blended,
    ``B = λ·A + (1 − λ)·C``, and λ learned with the task probe's loss, jointly with the probe.

    That needs a forward and a backward pass through the model per step, which the feature
    cache cannot serve. attnlens's recipe, cheaper than the paper's full training: the probe is
    first fitted on the unmodified model's cached features (``train_limit`` examples), then λ and
    the probe are trained together (:func:`attnlens.papa.learn_lambda` with ``jointly=``) for
    ``steps`` steps of ``LAMBDA_BATCH`` examples drawn from the first ``examples`` training
    examples. Returns λ ``[layer, head]`` (its cost is the curve's ``settings["lambda_seconds"]``).
    """
    train = _train(task, data_dir, train_limit, seed)
    network, fwd_hooks, loss_fn, batches = _probe_objective(
        model, train, (), max_len=max_len, layout=layout, batch_size=batch_size,
        probe={"seed": seed, **(probe or {})}, examples=examples, progress=progress)
    network.train()
    try:
        with model.hooks(fwd_hooks=fwd_hooks):
            lam = learn_lambda(model, constants, loss_fn=loss_fn, batches=batches, steps=steps,
                               progress=progress, jointly=list(network.parameters()))
    finally:
        network.eval()
    return lam


def labelled_constants(
    model: Any, constants: Any, task: Any, init: str, *, data_dir: Any = None, train_limit: Any = 4000,
    seed: int = 0, batch_size: int = 32, probe: dict | None = None, progress: bool = True,
    steps: int = LABELLED_STEPS, lr: float = LABELLED_LR, **_: Any,
) -> Any:
    """Constants trained with ``task``'s labels, for the labelled rows of PAPA's Table 1
    (Hassid et al. 2022, §5.2): ``init`` ``"toeplitz_init"`` starts from the Toeplitz matrix,
    ``"average_init"`` from ``constants`` (PAPA's average), every head replaced, and the matrices
    are "updated during the training procedure of the probing classifier".

    attnlens's recipe (the paper gives none): the probe (Table 3's recipe for the task) is first
    fitted on the training features under the starting matrices (the feature cache's entries of
    the Toeplitz and average rows), then the matrices' logits (Adam, ``lr``) and the probe (Adam,
    its Table 3 learning rate) are trained together (:func:`attnlens.papa.train_constants`) for
    ``steps`` steps of ``LAMBDA_BATCH`` training examples, in order, cycling (the default: one
    pass over 4,000). The model's weights stay frozen. Returns the trained matrices as
    :class:`PapaConstants` (``kind="trained"``), which the curve then probes as any other row: a
    fresh probe per seed on the frozen model under them, so that the row differs from the others
    in its matrices only."""
    if init not in LABELLED:
        raise InputError(f"Unknown labelled start {init!r}; use one of {', '.join(LABELLED)}.")
    train = _train(task, data_dir, train_limit, seed)
    if init == "toeplitz_init":
        start, trainable = toeplitz(constants), TrainableConstants.from_toeplitz(constants)
    else:
        start, trainable = constants, TrainableConstants.from_average(constants)
    row = TABLE3.get(train.name, TABLE3["sst2"])
    settings = {**row.probe_settings(), "seed": seed, **(probe or {})}
    hooks = interventions.build("papa", model, "all", constants=start)
    network, fwd_hooks, loss_fn, batches = _probe_objective(
        model, train, hooks, max_len=constants.max_len, layout=constants.layout, batch_size=batch_size,
        probe=settings, examples=len(train), progress=progress)
    torch.manual_seed(seed)  # the probe's dropout while the matrices train
    network.train()
    try:
        with model.hooks(fwd_hooks=fwd_hooks):
            return train_constants(model, trainable, loss_fn=loss_fn, batches=batches, steps=steps, lr=lr,
                                   jointly=list(network.parameters()), jointly_lr=settings["lr"],
                                   progress=progress)
    finally:
        network.eval()


def _train(task: Any, data_dir: Any, train_limit: Any, seed: int) -> Any:
    """The training split of ``task`` (a name, loaded as the curve's probes train on, or a Task)."""
    return task if not isinstance(task, str) else task_module.load(
        task, "train", data_dir=data_dir, limit=train_limit, seed=seed)


def _probe_objective(model: Any, train: Any, hooks: Any, *, max_len: int, layout: str | None, batch_size: int,
                     probe: dict, examples: int, progress: bool) -> tuple[Any, list, Any, list]:
    """What trains something inside the model with a task probe's loss: the probe's network
    (a :class:`attnlens.evaluation.probing.PapaProbe` fitted with ``probe`` on the cached features
    of ``train`` under ``hooks``), the forward hooks that capture every layer's residual stream,
    the loss of a batch (the probe's cross-entropy on what those hooks captured: the pooled
    tokens of a sentence, each word's first sub-token of a token task) and the compact batches
    of ``LAMBDA_BATCH`` of the first ``examples`` training examples, their labels attached."""
    features = probing.extract(model, train.inputs(), hooks=hooks, max_len=max_len, layout=layout,
                               batch_size=batch_size, progress=progress)
    fitted = probing.PapaProbe(**probe).fit(features, train.labels())
    inputs, labels = train.inputs()[:examples], train.labels()[:examples]
    batches = []
    for start in range(0, len(inputs), LAMBDA_BATCH):
        batch = tokenize(model, inputs[start : start + LAMBDA_BATCH], max_len=max_len, layout=layout,
                         compact=True)
        batch.extra["labels"] = labels[start : start + LAMBDA_BATCH]
        batches.append(batch)
    n_layers = int(model.cfg.n_layers)
    names = ["blocks.0.hook_in"] + [f"blocks.{layer}.hook_out" for layer in range(n_layers)]
    captured: dict[int, Any] = {}

    def keep(index: int):
        def hook(residual: Any, hook: Any) -> None:
            captured[index] = residual

        return hook

    network = fitted.network
    loss_of = torch.nn.CrossEntropyLoss(ignore_index=-1)

    def loss_fn(logits: Any, batch: Any) -> Any:
        stacked = torch.stack([captured[index] for index in range(n_layers + 1)], dim=2)
        words = batch.extra.get("word_index")
        if words is None:
            keep_mask = batch.attention_mask.bool()
            positions = batch.positions[keep_mask]
            targets = torch.as_tensor(batch.extra["labels"], dtype=torch.long)
        else:
            keep_mask = words >= 0
            positions = words[keep_mask]
            rows = keep_mask.nonzero()[:, 0]
            targets = torch.as_tensor([batch.extra["labels"][row][word] for row, word in
                                       zip(rows.tolist(), positions.tolist(), strict=True)], dtype=torch.long)
        example = keep_mask.nonzero()[:, 0]
        output = network(stacked[keep_mask], positions, example, keep_mask.shape[0])
        return loss_of(output, targets)

    return network, [(name, keep(index)) for index, name in enumerate(names)], loss_fn, batches
