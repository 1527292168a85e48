"""Benchmark: how long ``attnlens --help`` (and ``--version``) takes, against a 0.5 s target.

Prints the median wall time over ``--repeats`` runs (default 5, after one warm-up run that fills
the file cache) of

- ``python -m attnlens --help`` and ``python -m attnlens --version`` run from this checkout;
- the installed console script ``attnlens --help`` (beside the interpreter, else on ``PATH``),
  with this checkout first on ``PYTHONPATH`` so that it runs this code;
- ``python -c pass``: the interpreter's own start, the floor of every line above;
- ``python -c "import torch"``: what ``--help`` cost when ``import attnlens`` imported torch.

Each line shows its ratio to the 0.5 s target (below 1.00 meets it). The command line imports
only the standard library until a subcommand runs (``attnlens/__init__.py`` imports its names
lazily; the parser of :mod:`attnlens.cli` is built from modules that import no torch, and each
command imports its job, :mod:`attnlens.cli.jobs`, which imports torch, transformers, plotly and
pandas, only when it runs).

Usage: ``python benchmarks/cli_help.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.5


def wall_time(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def median_time(command: list[str], env: dict[str, str], repeats: int) -> float:
    wall_time(command, env)  # warm-up: the file cache
    return statistics.median(wall_time(command, env) for _ in range(repeats))


def console_script() -> str | None:
    beside = Path(sys.executable).with_name("attnlens")
    return str(beside) if beside.exists() else shutil.which("attnlens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    # accepted like every benchmark's; `attnlens --help` loads no model and runs no torch op
    parser.add_argument("--device", default="cpu", help="unused: the help loads no model")
    parser.add_argument("--threads", type=int, default=None, help="unused: the help runs no torch op")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    python = sys.executable
    commands = {
        "python -m attnlens --help": [python, "-m", "attnlens", "--help"],
        "python -m attnlens --version": [python, "-m", "attnlens", "--version"],
    }
    script = console_script()
    if script:
        commands["attnlens --help (console script)"] = [script, "--help"]
    commands["python -c pass (interpreter start)"] = [python, "-c", "pass"]
    commands["python -c 'import torch' (the old floor)"] = [python, "-c", "import torch"]
    print(f"median wall time of {args.repeats} runs (after one warm-up); target {TARGET_S} s")
    for name, command in commands.items():
        seconds = median_time(command, env, args.repeats)
        print(f"  {name:<42} {seconds:6.3f} s   {seconds / TARGET_S:5.2f} x target")
    if not script:
        print("  (no console script: pip install -e . installs 'attnlens')")


if __name__ == "__main__":
    main()
