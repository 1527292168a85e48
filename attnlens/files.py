"""One writer for every file attnlens writes: atomic, durable, never through a symlink.

:func:`write_atomic` writes bytes to a temporary file in the target's folder (named
``.<name>.<random>.tmp``, so it can never be taken for a result), fsyncs it, moves it over the
target with ``os.replace`` and fsyncs the folder: a reader sees the old file or the new one, never
half of one, and a crash of the machine loses neither. The target is never followed if it is a
symbolic link (the link itself is replaced), and a read-only target is refused unless
``overwrite_read_only=True``. :func:`clean_temporaries` removes the temporary files a killed
writer left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlens.errors import InputError

#: prefix and suffix of temporary files (``.<name>.<random>.tmp`` beside the target)
TEMPORARY_SUFFIX = ".tmp"


def _umask() -> int:
    """The process's file-creation mask (read by setting it, then put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(path: str | os.PathLike, *, overwrite_read_only: bool = False) -> Path:
    """``path`` as a ``Path`` if a file can be written there; else a ``PermissionError`` /
    ``IsADirectoryError`` naming it. Call it before long work, so the work is not lost."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(f"{path} is a folder; give a file name to write to.")
    folder = path.parent if str(path.parent) else Path(".")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {path}: the folder {existing} is not writable.")
    if path.exists() and not path.is_symlink() and not overwrite_read_only:
        if not path.stat().st_mode & 0o222:  # no write bit (os.access says yes to root)
            raise PermissionError(
                f"{path} is read-only; remove it or make it writable (chmod u+w) to replace it."
            )
    return path


def write_atomic(
    path: str | os.PathLike, data: bytes, *, overwrite_read_only: bool = False
) -> Path:
    """Write ``data`` to ``path`` atomically and durably (see the module docstring); returns
    the path. Missing folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_writable(path, overwrite_read_only=overwrite_read_only)
    handle, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it 0600; a file saved as usual
        os.replace(temporary, path)  # replaces a symlink itself, never the file it points to
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def clean_temporaries(path: str | os.PathLike) -> int:
    """Remove temporary files a killed :func:`write_atomic` left beside ``path``; returns how
    many were removed."""
    path = Path(path)
    removed = 0
    if not path.parent.is_dir():
        return 0
    for leftover in path.parent.glob(f".{path.name}.*{TEMPORARY_SUFFIX}"):
        with contextlib.suppress(OSError):
            if stat.S_ISREG(leftover.lstat().st_mode):
                leftover.unlink()
                removed += 1
    return removed


def safetensors_bytes(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file's bytes with a reproducible header: equal tensors and metadata give
    equal bytes (``safetensors.torch.save`` writes its metadata in a varying order)."""
    from safetensors.torch import save

    raw = save(dict(tensors), metadata=dict(metadata) if metadata is not None else None)
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to a multiple of 8 bytes
    return len(text).to_bytes(8, "little") + text + raw[8 + size :]


def tensor_checksum(tensors: Mapping[str, Any]) -> str:
    """``"sha256:<hex>"`` of tensors' names, dtypes, shapes and bytes (in name order): stored in
    a file's metadata and verified on load, so that a flipped bit is caught."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return f"sha256:{digest.hexdigest()}"


def verify_checksum(path: str | os.PathLike, metadata: Mapping[str, str], tensors: Mapping[str, Any]) -> bool:
    """``ValueError`` if ``metadata["checksum"]`` does not match ``tensors``; ``False`` (and a
    warning) for a file written before checksums were recorded, ``True`` when it matches."""
    import warnings

    recorded = metadata.get("checksum")
    if recorded is None:
        warnings.warn(
            f"{path} has no checksum (written by an older attnlens): its integrity cannot be "
            "verified; save it again to add one.",
            UserWarning,
            stacklevel=3,
        )
        return False
    found = tensor_checksum(tensors)
    if found != recorded:
        raise InputError(
            f"{path} is damaged: its tensors do not match the checksum recorded when it was "
            f"written ({recorded[:19]}..., now {found[:19]}...); restore or rebuild the file."
        )
    return True


def read_checked(path: str | os.PathLike, *, what: str, format: str) -> tuple[dict[str, str], dict[str, Any]]:
    """``(metadata, tensors)`` of an attnlens safetensors file of ``format`` (its metadata's
    ``"format"``), its checksum verified (:func:`verify_checksum`). One ``ValueError`` naming the
    file and ``what`` it should be when it cannot be read, is another kind of file, or is damaged."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError) as error:
        raise InputError(f"{what} file {path} cannot be read ({error}); delete it or write it again.") from None
    if metadata.get("format") != format:
        raise InputError(f"{path} is not an attnlens {what} file ({format}).")
    verify_checksum(path, metadata, tensors)
    return metadata, tensors
