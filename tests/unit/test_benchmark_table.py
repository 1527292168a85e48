"""``benchmarks/table.py``, the one table of every benchmark's results: each result names the
machine it was measured on (``benchmarks/common.py``'s ``record``), and a table whose rows come
from several machines says so, row by row, instead of setting their seconds side by side."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture()
def common(monkeypatch, tmp_path):
    """benchmarks/common.py (a script's module, not a package's), writing into ``tmp_path``."""
    spec = importlib.util.spec_from_file_location("bench_common", BENCHMARKS / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "BENCH_DIR", tmp_path)
    return module


def job(seconds: float) -> dict:
    return {"job": "papa.fit (x)", "seconds": seconds, "forward_ratio": 0.4, "limit_ratio": 0.3}


def table(folder: Path, *flags: str) -> list[str]:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "table.py"), "--dir", str(folder), *flags],
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": ""})
    return done.stdout.splitlines()


def test_a_result_names_the_processor_its_vector_instructions_and_cpus(common, tmp_path):
    path = common.record("papa_fit", [job(1.0)], device="cpu", threads=1)
    settings = json.loads(path.read_text())["settings"]
    capability = torch.backends.cpu.get_cpu_capability()
    assert settings["machine"].endswith(f" ({capability}, {os.cpu_count()} CPUs)")
    assert settings["machine"] == common.machine("cpu")
    # a machine the caller names is kept
    path = common.record("papa_fit", [job(1.0)], device="cpu", threads=1, machine="the lab's box")
    assert json.loads(path.read_text())["settings"]["machine"] == "the lab's box"


def test_one_machine_is_one_line_above_the_table(common, tmp_path):
    common.record("papa_fit", [job(1.0)], device="cpu", threads=1, machine="box A")
    common.record("compare_cost", [job(2.0)], device="cpu", threads=1, machine="box A")
    lines = table(tmp_path)
    assert lines[0] == "measured on box A"
    rows = [line for line in lines if line.startswith(("papa_fit", "compare_cost"))]
    assert len(rows) == 2 and not any("box A" in row for row in rows)


def test_rows_from_several_machines_name_their_own(common, tmp_path):
    common.record("papa_fit", [job(1.0)], device="cpu", threads=1, machine="box A")
    common.record("curve", [job(2000.0)], device="default", threads=1, machine="box B")
    # a result written before benchmarks recorded their machine
    (tmp_path / "old.json").write_text(json.dumps({"benchmark": "old", "settings": {}, "jobs": [job(3.0)]}) + "\n")
    lines = table(tmp_path, "--markdown")
    assert lines[0].startswith("measured on 3 machines (each row names its own): their seconds do not compare")
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| ") and "---" not in line}
    assert "cpu, 1 thr, box A" in rows["papa_fit"]
    assert "default, 1 thr, box B" in rows["curve"]
    assert "?, ? thr, an unrecorded machine" in rows["old"]
