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
import glob
import hashlib
import json
import os
import re
import stat
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlens.errors import AttnlensWarning, DamagedFileError, FileFormatError, MissingFileError

#: prefix and suffix of temporary files (``.<name>.<random>.tmp`` beside the target)
TEMPORARY_SUFFIX = ".tmp"


def text_lines(text: str) -> list[str]:
    """``text``'s lines, broken at ``\\n``, ``\\r\\n`` and ``\\r`` only: the other breaks that
    :meth:`str.splitlines` knows (form feed, ``\\x85``, ``\\u2028``, ...) may sit inside a text
    or a word of a data file, and are not line ends there. A final line break leaves an empty
    last line."""
    return re.split(r"\r\n|\r|\n", text)


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
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*{TEMPORARY_SUFFIX}"):
        with contextlib.suppress(OSError):
            if stat.S_ISREG(leftover.lstat().st_mode):
                leftover.unlink()
                removed += 1
    return removed


def safetensors_bytes(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file's bytes with a reproducible header: equal tensors and metadata give
    equal bytes (``safetensors.torch.save`` writes its metadata in a varying order).

    With ``metadata``, its ``"checksum"`` is (re)computed by :func:`file_checksum` over the
    tensors *and* every other metadata key, so no value of the file can be edited unnoticed."""
    from safetensors.torch import save

    if metadata is not None:
        metadata = {key: value for key, value in metadata.items() if key != CHECKSUM_KEY}
        metadata[CHECKSUM_KEY] = file_checksum(tensors, metadata)
    raw = save(dict(tensors), metadata=dict(metadata) if metadata is not None else None)
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to a multiple of 8 bytes
    # one copy of the tensors' bytes (a slice of raw and a sum of bytes would make two)
    return b"".join((len(text).to_bytes(8, "little"), text, memoryview(raw)[8 + size :]))


#: the metadata key holding a file's checksum
CHECKSUM_KEY = "checksum"
#: first characters of a checksum that covers the metadata too (version 2); a checksum of
#: the tensors only (``"sha256:<hex>"``) was written by attnlens before metadata was covered
CHECKSUM_PREFIX = "attnlens-sha256-v2 "


def _sha256(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def tensor_checksum(tensors: Mapping[str, Any]) -> str:
    """``"sha256:<hex>"`` of tensors' names, dtypes, shapes and bytes (in name order): a
    fingerprint of tensors (cache keys use it; files store :func:`file_checksum`)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        if tensor.numel():  # the bytes in place (a buffer), not a copy: the same digest
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return f"sha256:{digest.hexdigest()}"


def _key_digests(metadata: Mapping[str, str]) -> dict[str, str]:
    """One short SHA-256 per metadata key (of the key and its value), the checksum excluded."""
    return {
        key: _sha256(json.dumps([key, value]).encode())[:16]
        for key, value in metadata.items() if key != CHECKSUM_KEY
    }


def file_checksum(tensors: Mapping[str, Any], metadata: Mapping[str, str]) -> str:
    """The checksum stored in a file's metadata: :data:`CHECKSUM_PREFIX` and a canonical JSON
    object of ``tensors`` (:func:`tensor_checksum`), ``keys`` (a digest of each metadata key
    and its value, every key but the checksum itself) and ``all`` (SHA-256 of the tensors'
    checksum and the canonical JSON of all those keys). Any edit of a tensor, a metadata value,
    or a key added or removed, changes it; the per-key digests let :func:`verify_checksum` name
    the key."""
    return _file_checksum(tensor_checksum(tensors), metadata)


def _file_checksum(tensor_sum: str, metadata: Mapping[str, str]) -> str:
    """:func:`file_checksum` given its tensors' :func:`tensor_checksum` (computed once)."""
    keys = {key: value for key, value in metadata.items() if key != CHECKSUM_KEY}
    canonical = json.dumps(keys, sort_keys=True, separators=(",", ":"))
    whole = _sha256(f"{tensor_sum}|{canonical}".encode())
    record = {"all": whole, "keys": _key_digests(keys), "tensors": tensor_sum}
    return CHECKSUM_PREFIX + json.dumps(record, sort_keys=True, separators=(",", ":"))


def verify_checksum(path: str | os.PathLike, metadata: Mapping[str, str], tensors: Mapping[str, Any]) -> bool:
    """``True`` when ``metadata["checksum"]`` matches ``tensors`` and every other metadata key;
    :class:`~attnlens.errors.DamagedFileError` naming the file and the keys (or ``tensors``)
    that changed, else.

    Files written by an older attnlens load with an :class:`~attnlens.errors.AttnlensWarning`
    (and ``False``): with no checksum at all, or a checksum of the tensors only (``"sha256:"``,
    the tensors are still verified) whose metadata cannot be verified. Saving such a file again
    (load it, then ``save``; or rerun the command that wrote it) adds the full checksum.
    """
    recorded = metadata.get(CHECKSUM_KEY)
    if recorded is None:
        warnings.warn(
            f"{path} has no checksum (written by an older attnlens): its integrity cannot be "
            "verified; save it again to add one.",
            AttnlensWarning,
            stacklevel=3,
        )
        return False
    fix = "restore it, or re-create it with the command that wrote it (an edited file is never used)"
    if recorded.startswith("sha256:"):  # attnlens before 0.2: the tensors only
        found = tensor_checksum(tensors)
        if found != recorded:
            raise DamagedFileError(
                f"{path} is damaged: its tensors do not match the checksum recorded when it was "
                f"written ({recorded[:19]}..., now {found[:19]}...); {fix}.",
                path=path, keys=("tensors",),
            )
        warnings.warn(
            f"{path} was written by an older attnlens whose checksum covers its tensors but not "
            "its metadata (examples, layout, model, ...); save it again to cover them.",
            AttnlensWarning,
            stacklevel=3,
        )
        return False
    try:
        if not recorded.startswith(CHECKSUM_PREFIX):
            raise ValueError
        record = json.loads(recorded[len(CHECKSUM_PREFIX):])
        keys, tensor_sum = dict(record["keys"]), str(record["tensors"])
        str(record["all"])  # present (compared below through file_checksum)
    except (ValueError, TypeError, KeyError):
        raise DamagedFileError(
            f"{path} is damaged: its metadata key 'checksum' is not a checksum attnlens wrote; {fix}.",
            path=path, keys=(CHECKSUM_KEY,),
        ) from None
    found_keys = _key_digests(metadata)
    changed = sorted(key for key in {*keys, *found_keys} if keys.get(key) != found_keys.get(key))
    found_sum = tensor_checksum(tensors)
    if found_sum != tensor_sum:
        changed.append("tensors")
    if not changed and _file_checksum(found_sum, metadata) != recorded:
        changed = [CHECKSUM_KEY]
    if changed:
        keys_changed = [key for key in changed if key != "tensors"]
        named = ", ".join(
            f"{key!r} (added)" if key not in keys and key != CHECKSUM_KEY
            else f"{key!r} (removed)" if key not in found_keys and key != CHECKSUM_KEY
            else repr(key) for key in keys_changed
        )
        plural = "s" if len(keys_changed) > 1 else ""
        if "tensors" in changed:
            what = "its tensors do not match the checksum recorded when it was written" + (
                f", nor do its metadata key{plural} {named}" if keys_changed else "")
        else:
            what = (f"its metadata key{plural} {named} no longer match{'' if plural else 'es'} the checksum "
                    "recorded when it was written (edited after attnlens wrote it)")
        raise DamagedFileError(f"{path} is damaged: {what}; {fix}.", path=path, keys=tuple(changed))
    return True


def read_checked(path: str | os.PathLike, *, what: str, format: str) -> tuple[dict[str, str], dict[str, Any]]:
    """``(metadata, tensors)`` of an attnlens safetensors file of ``format`` (its metadata's
    ``"format"``), its checksum verified (:func:`verify_checksum`). One error naming the file and
    ``what`` it should be: :class:`~attnlens.errors.MissingFileError` when there is no such file,
    :class:`~attnlens.errors.FileFormatError` when it is a folder, cannot be read or is another
    kind of file, :class:`~attnlens.errors.DamagedFileError` when it was changed."""
    from safetensors import SafetensorError, safe_open

    check_readable(path, what)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError) as error:
        raise FileFormatError(f"{what} file {path} cannot be read ({error}); delete it or write it again.") from None
    if metadata.get("format") != format:
        check_sealed(path, metadata, tensors)  # an edited "format" is named as an edit
        raise FileFormatError(f"{path} is not an attnlens {what} file ({format}).")
    verify_checksum(path, metadata, tensors)
    return metadata, tensors


def check_sealed(
    path: str | os.PathLike, metadata: Mapping[str, str] | None = None, tensors: Mapping[str, Any] | None = None
) -> None:
    """:func:`verify_checksum` for a file whose checksum covers its metadata (others pass
    silently): called before refusing a file for its ``format``, so that an edited ``format``
    is reported as an edit (:class:`~attnlens.errors.DamagedFileError`), not as another kind
    of file. Reads ``path`` when ``metadata`` and ``tensors`` are not given; a file that cannot
    be read passes (the caller refuses it)."""
    if metadata is None or tensors is None:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = dict(handle.metadata() or {})
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        except (SafetensorError, OSError):
            return
    if str(metadata.get(CHECKSUM_KEY, "")).startswith(CHECKSUM_PREFIX):
        verify_checksum(path, metadata, tensors)


def check_readable(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a ``Path`` if it is a file; :class:`~attnlens.errors.MissingFileError` if
    nothing is there, :class:`~attnlens.errors.FileFormatError` for a folder (both naming
    ``what`` the file should be)."""
    path = Path(path)
    if path.is_dir():
        raise FileFormatError(f"{what} file {path} is a folder; give the path of the file itself.")
    if not path.exists():
        raise MissingFileError(f"{what} file {path} does not exist; check the path.")
    return path
