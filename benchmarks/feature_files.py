"""Benchmark: writing and reading a features file of the cache, against safetensors alone.

Every point of a PAPA curve writes its features to the cache (:meth:`Features.save`), and since
2026-11-27 reads them back once (a job of its own extracts them while the task's first point
trains, :func:`attnlens.evaluation.probing.cache_features`); a resumed run and NER (which reads POS's
sentences) read them too. Features of MRPC's shape (4,000 pairs of 25 to 75 kept tokens, 7 layers
of MiniLM's 384 dimensions, float16: 1 GB; random values, the work does not depend on them).
Printed, medians of alternated runs:

- ``Features.load`` (read, checksum verified, checked finite) against ``safetensors.torch.load_file``
  of the same file and a copy of each tensor (the floor: every byte read once, nothing verified;
  ``load_file`` alone maps the file and reads nothing);
- ``Features.save`` (checksum, reproducible header, atomic and durable: ``fsync``) against
  ``safetensors.torch.save_file`` and one ``fsync`` (the floor);
- their two checks, each against what it replaced: ``all_finite`` (one ``aminmax``) against
  ``torch.isfinite(...).all()`` on float16, and SHA-256 of the bytes in place against SHA-256 of
  a copy (the same digest). Before, a load hashed the tensors twice and a save three times.

Run: ``python benchmarks/feature_files.py [--repeats 3] [--threads 1]`` (``make bench``).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
from pathlib import Path

import torch
from common import alternate, mrpc_benchmark
from safetensors.torch import load_file, save_file

from attnlens.core.checks import all_finite
from attnlens.core.files import tensor_checksum


def save_floor(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path))
    with open(path, "rb+") as stream:
        os.fsync(stream.fileno())


def load_floor(path: Path) -> None:
    for tensor in load_file(str(path)).values():
        tensor.clone()


def hash_copy(vectors: torch.Tensor) -> str:
    return hashlib.sha256(vectors.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def hash_in_place(vectors: torch.Tensor) -> str:
    return hashlib.sha256(vectors.reshape(-1).view(torch.uint8).numpy()).hexdigest()


def main() -> None:
    args, device, features = mrpc_benchmark(__doc__.splitlines()[0], repeats=3)
    vectors = features.vectors
    tensors = features._tensors()
    if hash_copy(vectors) != hash_in_place(vectors) or not all_finite(vectors):
        raise SystemExit("the in-place hash differs from the copy's, or the features are not finite")
    with tempfile.TemporaryDirectory() as folder:
        ours, floor = Path(folder) / "ours.safetensors", Path(folder) / "floor.safetensors"
        features.save(ours)
        save_floor(tensors, floor)
        print(f"features: {len(features)} examples, {vectors.shape[0]:,} vectors of {vectors.shape[1]} x "
              f"{vectors.shape[2]} (float16, {os.path.getsize(ours) / 1e9:.2f} GB file), "
              f"{torch.get_num_threads()} thread(s)")
        times = alternate([
            lambda: features.load(ours), lambda: load_floor(floor),
            lambda: features.save(ours), lambda: save_floor(tensors, floor),
            lambda: all_finite(vectors), lambda: bool(torch.isfinite(vectors).all()),
            lambda: hash_in_place(vectors), lambda: hash_copy(vectors),
        ], args.repeats, device)
        tensor_checksum(tensors)  # the function itself runs (its digest is checked in the tests)
    load, read, save, write, finite, isfinite, in_place, copy = (statistics.median(t) for t in times)
    print(f"LOAD {load:.2f} s = {load / read:.2f}x safetensors' load_file and a copy ({read:.2f} s, nothing verified)")
    print(f"SAVE {save:.2f} s = {save / write:.2f}x safetensors' save_file + fsync ({write:.2f} s)")
    print(f"CHECKS all_finite {finite:.3f} s against isfinite().all() {isfinite:.3f} s ({isfinite / finite:.0f}x); "
          f"SHA-256 in place {in_place:.3f} s against of a copy {copy:.3f} s ({copy / in_place:.1f}x)")


if __name__ == "__main__":
    main()
