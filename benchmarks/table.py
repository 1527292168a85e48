"""One table of every benchmark's results: the JSON lines ``build/bench/*.json`` that the
benchmarks write (:func:`common.record`), one row per job: its time, its ratio to a full forward
of the same inputs measured in the same run, the flop-limit ratio (what it cannot beat), and the
peer with the job's ratio to it where one exists. ``make bench`` runs it last.

Each file names the machine it was measured on (:func:`common.machine`). When every row comes
from one machine, the table says so in one line above it; when they come from several (for
example a ``curve.json`` kept from a run on another machine), each row's device names its
machine, and a line above the table says that their seconds do not compare, only their ratios.

Run: ``python benchmarks/table.py [--dir build/bench] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import BENCH_DIR

#: the machine of a result written before benchmarks recorded it
UNKNOWN = "an unrecorded machine"


def results(folder: Path) -> list[dict]:
    """Every benchmark's JSON line in ``folder``, by file name."""
    return [json.loads(path.read_text(encoding="utf-8").splitlines()[0]) for path in sorted(folder.glob("*.json"))]


def machines(found: list[dict]) -> list[str]:
    """The machines of ``found``, each once, in order."""
    return list(dict.fromkeys(data.get("settings", {}).get("machine", UNKNOWN) for data in found))


def rows(found: list[dict]) -> list[list[str]]:
    """One row per job of ``found`` (:func:`results`); the device names the machine when the
    results come from several."""
    several = len(machines(found)) > 1
    out = []
    for data in found:
        settings = data.get("settings", {})
        where = f"{settings.get('device', '?')}, {settings.get('threads', '?')} thr"
        if several:
            where += f", {settings.get('machine', UNKNOWN)}"
        for job in data["jobs"]:
            limit = job.get("limit_ratio")
            peer = job.get("peer")
            out.append([
                data["benchmark"], job["job"], f"{job['seconds']:.2f}", f"{job['forward_ratio']:.2f}x",
                "-" if limit is None else f"{limit:.2f}x",
                "-" if not peer else f"{job['peer_ratio']:.2f}x {peer}", where, job.get("note", ""),
            ])
    return out


HEADER = ["benchmark", "job", "s", "/ forward", "flop limit", "vs peer", "device", "note"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=BENCH_DIR)
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (docs/performance.md)")
    args = parser.parse_args()
    found = results(args.dir)
    table = rows(found)
    if not table:
        raise SystemExit(f"no benchmark results in {args.dir}; run the benchmarks first (make bench)")
    where = machines(found)
    if len(where) == 1:
        print(f"measured on {where[0]}")
    else:
        print(f"measured on {len(where)} machines (each row names its own): their seconds do not compare, "
              "their ratios to a forward measured in the same run do")
    if args.markdown:
        print()
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "|".join("---" for _ in HEADER) + "|")
        for row in table:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(row[i]) for row in [HEADER, *table]) for i in range(len(HEADER))]
    for row in [HEADER, ["-" * w for w in widths], *table]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
