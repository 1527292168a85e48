"""Multi-process runs of the pass engine: torchrun, shards, merges, and the errors they can meet.

The torchrun test runs two real processes with the gloo backend on localhost; the others spawn
processes with ``torch.multiprocessing`` to reach the cases torchrun cannot (ranks given different
corpora, a rank that dies).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlens import papa, passes
from attnlens.errors import InputError
from tests import tiny
from tests.conftest import DATA

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bert")
    tiny.tiny_bert().save_pretrained(folder)
    tiny.bert_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "texts.txt"
    texts = [f"{text} ({index})" for index, text in enumerate(tiny.CORPUS + tiny.CORPUS[:5])]
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
    )
    return env


def test_shards_are_contiguous_batch_aligned_and_cover_the_corpus():
    for n, batch_size, size in [(21, 2, 2), (21, 4, 3), (5, 8, 2), (64, 8, 4), (1, 1, 3)]:
        shards = [passes.shard(n, batch_size, rank, size) for rank in range(size)]
        assert shards[0][0] == 0 and shards[-1][1] == n
        for (_, stop), (start, _) in zip(shards, shards[1:], strict=False):
            assert stop == start  # contiguous
        for start, stop in shards:
            assert start % batch_size == 0  # every batch is one a single process would run
            assert stop == n or stop % batch_size == 0


def test_a_pass_by_length_interleaves_the_batches_of_the_ranks():
    """Batches sorted by length, shared contiguously, would give the last rank the longest: by
    length, rank r runs batches r, r + size, ...; together every batch once."""
    for n, batch_size, size in [(21, 2, 2), (21, 4, 3), (5, 8, 2), (64, 8, 4), (1, 1, 3)]:
        shares = [passes.interleaved(n, batch_size, rank, size) for rank in range(size)]
        assert sorted(b for share in shares for b in share) == list(range(-(-n // batch_size)))
        for rank, share in enumerate(shares):
            assert all(b % size == rank for b in share)
    assert passes.interleaved(21, 2, 0, 2) == [0, 2, 4, 6, 8, 10]  # 11 batches: rank 0 gets 6


@pytest.mark.slow
def test_torchrun_fit_equals_the_single_process_fit(tmp_path, bert_folder, corpus_file):
    """Two gloo ranks on localhost, 21 texts in 11 batches of 2 (by length): rank 0 runs batches
    0, 2, …, 10 (11 texts), rank 1 batches 1, 3, …, 9 (10 texts); the all-reduced sums equal the single-process sums up to float64 rounding of the
    order of additions (2 · 21 · 2**-52 · max|sum| < 1e-12), and the counts exactly."""
    from attnlens.cli import main

    common = ["fit-papa", "--model", str(bert_folder), "--corpus", str(corpus_file),
              "--max-len", "16", "--batch-size", "2", "--quiet"]
    single = tmp_path / "single.safetensors"
    assert main([*common, "--out", str(single)]) == 0

    merged, checkpoint = tmp_path / "two.safetensors", tmp_path / "ck" / "fit.safetensors"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--standalone",
        "-m", "attnlens", *common, "--out", str(merged), "--checkpoint", str(checkpoint),
    ]
    done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = papa.load(single), papa.load(merged)
    assert torch.equal(one.pair_counts, two.pair_counts)
    assert (one.n_examples, one.n_tokens, one.n_truncated, one.pairs) == (
        two.n_examples, two.n_tokens, two.n_truncated, two.pairs,
    )
    torch.testing.assert_close(two.sums, one.sums, rtol=0, atol=1e-12)
    torch.testing.assert_close(two.squares, one.squares, rtol=0, atol=1e-12)
    ranks = sorted(path.name for path in checkpoint.parent.iterdir())
    assert ranks == ["fit.rank0-of-2.safetensors", "fit.rank1-of-2.safetensors"]
    assert [papa.load(checkpoint.parent / name).n_examples for name in ranks] == [11, 10]

    # a checkpoint of two processes cannot be resumed by one
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--out", str(tmp_path / "again.safetensors"), "--checkpoint", str(checkpoint)])
    assert exit_info.value.code == 2


FEATURES_SCRIPT = """
import sys
import torch.distributed as dist
import attnlens
from attnlens import probing
from attnlens.inputs import Words
dist.init_process_group("gloo")
model = attnlens.load(sys.argv[1])
texts = open(sys.argv[2], encoding="utf-8").read().splitlines()
for kind in ("texts", "words"):
    examples = texts if kind == "texts" else [Words(tuple(text.split())) for text in texts]
    features = probing.extract(model, examples, max_len=16, batch_size=2, progress=False)
    features.save(sys.argv[3] + f"-{kind}.rank{dist.get_rank()}.safetensors")
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def torchrun_features(tmp_path_factory, bert_folder, corpus_file) -> tuple[Path, Path]:
    """One torchrun of two gloo ranks extracting both kinds of features, texts then words
    (one launch: each rank's start, about 5 s of imports, is paid once): the prefix of the
    ranks' saved features, and the cache folder they shared."""
    folder = tmp_path_factory.mktemp("torchrun-features")
    cache, script, out = folder / "cache", folder / "features.py", folder / "two"
    script.write_text(FEATURES_SCRIPT, encoding="utf-8")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--standalone",
        str(script), str(bert_folder), str(corpus_file), str(out),
    ]
    done = subprocess.run(command, env=dict(_environment(), ATTNLENS_CACHE=str(cache)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, cache


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["texts", "words"])
def test_torchrun_features_equal_the_single_process_ones(tmp_path, bert_folder, corpus_file, kind,
                                                        torchrun_features, monkeypatch):
    """Two gloo ranks each extract their shard and exchange it through files of the cache folder
    (no collective carries a tensor); every rank ends with the single-process features, bit for
    bit, and the shard files are gone."""
    import attnlens
    from attnlens import probing
    from attnlens.inputs import Words

    out, cache = torchrun_features
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "single"))
    texts = corpus_file.read_text(encoding="utf-8").splitlines()
    examples = texts if kind == "texts" else [Words(tuple(text.split())) for text in texts]
    single = probing.extract(attnlens.load(bert_folder), examples, max_len=16, batch_size=2, progress=False)
    for rank in (0, 1):
        two = probing.Features.load(f"{out}-{kind}.rank{rank}.safetensors")
        for name in ("vectors", "lengths", "positions", "n_words"):
            assert torch.equal(getattr(two, name), getattr(single, name)), (rank, name)
    files = sorted(path.name for path in (cache / "features").iterdir())
    # the whole file of each kind (texts and words), no shard left
    assert f"{single.key}.safetensors" in files and len(files) == 2, files
    assert not any(".rank" in name for name in files), files


def test_merge_adds_up_constants_fitted_apart(tmp_path, bert_folder, corpus_file, capsys):
    """``attnlens merge`` of two halves fitted separately equals the fit of the whole corpus."""
    from attnlens.cli import main

    texts = corpus_file.read_text(encoding="utf-8").splitlines()
    halves = []
    for index, part in enumerate((texts[:10], texts[10:])):
        path = tmp_path / f"part{index}.txt"
        path.write_text("\n".join(part) + "\n", encoding="utf-8")
        halves.append(path)
    common = ["--model", str(bert_folder), "--max-len", "16", "--batch-size", "2", "--quiet"]
    outs = []
    for index, corpus in enumerate([corpus_file, *halves]):
        outs.append(tmp_path / f"fit{index}.safetensors")
        assert main(["fit-papa", *common, "--corpus", str(corpus), "--out", str(outs[-1])]) == 0
    merged = tmp_path / "merged.safetensors"
    assert main(["merge", str(outs[1]), str(outs[2]), "--out", str(merged)]) == 0
    whole, got = papa.load(outs[0]), papa.load(merged)
    assert torch.equal(whole.pair_counts, got.pair_counts) and whole.n_examples == got.n_examples
    # each fit runs its texts by length, so the halves' batches are not the whole's: the same
    # float64 sums of float32 patterns computed at other batch widths (a few units of float32
    # rounding, u = 6e-8, per value; 20 texts a sum: within 1e-5 relative, 1e-6 absolute)
    torch.testing.assert_close(got.sums, whole.sums, rtol=1e-5, atol=1e-6)

    other = tmp_path / "other.safetensors"
    assert main(["fit-papa", *common, "--corpus", str(halves[0]), "--max-len", "12",
                 "--out", str(other)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["merge", str(outs[1]), str(other), "--out", str(tmp_path / "bad.safetensors")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_len 16 vs 12" in err


def test_a_checkpoint_of_another_world_size_is_named(tmp_path):
    checkpoint = tmp_path / "fit.safetensors"
    (tmp_path / "fit.rank0-of-4.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"fit\.rank0-of-4\.safetensors was written by a run of another number"):
        passes.check_world_size(checkpoint, passes.World(rank=0, size=2))
    with pytest.raises(ValueError, match="another number of processes than this one \\(1\\)"):
        passes.check_world_size(checkpoint, passes.World())
    passes.check_world_size(checkpoint, passes.World(rank=1, size=4))  # its own world: fine


def _rank_main(rank: int, folder: str, init: str, outcome: str, case: str) -> None:
    """One spawned rank: join a 2-rank gloo world and fit; write what happened to a file."""
    import torch.distributed as dist

    import attnlens

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    model = attnlens.load(folder)
    corpus = list(tiny.CORPUS)
    if case == "other-corpus" and rank == 1:
        corpus[3] = "a different text on rank one"
    if case == "dead-rank" and rank == 1:
        os._exit(0)  # dies before the pass: rank 0's first collective finds no partner
    try:
        papa.fit(model, corpus, max_len=16, batch_size=2, progress=False)
        result = "ok"
    except Exception as error:  # noqa: BLE001 - the message is what the test checks
        result = f"{type(error).__name__}: {error}"
    Path(outcome).with_suffix(f".{rank}").write_text(result, encoding="utf-8")
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, expected",
    [
        ("other-corpus", "InputError: the ranks of this torchrun were given different corpora or settings"),
        ("dead-rank", "UnavailableError: rank 0 of 2: comparing settings failed"),
    ],
)
def test_distributed_failures_are_one_clear_error(tmp_path, bert_folder, case, expected):
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'rendezvous'}"
    outcome = tmp_path / "outcome"
    mp.start_processes(
        _rank_main, args=(str(bert_folder), init, str(outcome), case), nprocs=2,
        start_method="spawn", join=True,
    ) if case != "dead-rank" else _spawn_tolerating_exit(init, outcome, bert_folder, case)
    message = outcome.with_suffix(".0").read_text(encoding="utf-8")
    assert message.startswith(expected), message
    assert "\n" not in message


def _spawn_tolerating_exit(init: str, outcome: Path, folder: Path, case: str) -> None:
    import torch.multiprocessing as mp

    context = mp.start_processes(
        _rank_main, args=(str(folder), init, str(outcome), case), nprocs=2,
        start_method="spawn", join=False,
    )
    for process in context.processes:
        process.join(timeout=240)
    assert not any(process.is_alive() for process in context.processes)


#: A small curve of two tasks on the tiny BERT (real SST-2 and CoLA sentences, few of them).
CURVE = dict(tasks=["cola", "sst2"], fractions=(0.0, 1.0), baselines=("zeros",), train_limit=48,
             eval_limit=24, seeds=1, progress=False, data_dir=DATA)


def _sharing_main(rank: int, init: str, folder: str, constants: str, out: str) -> None:
    """One spawned rank of two: share six items with passes.distribute, twice (the second time
    one item raises), then a curve; write what each returned."""
    import json
    import time

    import torch.distributed as dist

    import attnlens

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    results = {}
    for case in ("ok", "fail"):

        def work(item: str, case: str = case) -> list:
            if case == "fail" and item == "c":
                raise ValueError("no labels for c")
            time.sleep(0.3)  # long enough that both ranks claim items
            return [item, rank, passes.world().size]

        try:
            results[case] = {"ok": passes.distribute(list("abcdef"), work, what="task")}
        except Exception as error:  # noqa: BLE001 - the message is what the test checks
            results[case] = {"error": f"{type(error).__name__}: {error}"}
    for case in ("after", "after-fail"):
        # b to e need a's result; f needs nothing, so the rank that did not claim a takes f,
        # then waits for a's result, and then both ranks share b to e

        def needing(item: str, needed: Any, case: str = case) -> list:
            started = time.time()
            if item == "a" and case == "after-fail":
                raise ValueError("no labels for a")
            time.sleep(1.5 if item == "a" else 0.3)
            value = f"{item} from rank {rank}"
            return [item, rank, passes.world().size, needed[0] if needed else None, started, time.time(), value]

        try:
            results[case] = {"ok": passes.distribute(list("abcdef"), needing, what="point",
                                                     after=[None, 0, 0, 0, 0, None])}
        except Exception as error:  # noqa: BLE001 - the message is what the test checks
            results[case] = {"error": f"{type(error).__name__}: {error}"}
    points = Path(out).parent / "points"  # the curve's checkpoint, one folder for both ranks
    curve = papa.curve(attnlens.load(folder), papa.load(constants), checkpoint=points, **CURVE)
    curve.to_csv(Path(out).with_suffix(f".{rank}.csv"))
    again = papa.curve(attnlens.load(folder), papa.load(constants), checkpoint=points, **CURVE)
    again.to_csv(Path(out).with_suffix(f".{rank}.again.csv"))
    results["curve"] = {"processes": curve.processes, "timings": sorted(t["task"] for t in curve.timings),
                        "resumed": [t["resumed"] for t in again.timings]}
    Path(out).with_suffix(f".{rank}.json").write_text(json.dumps(results), encoding="utf-8")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def shared(tmp_path_factory, bert_folder) -> tuple[Path, Path]:
    """One spawn of two gloo ranks running _sharing_main: the prefix of their outputs, and the
    constants file their curve used."""
    import torch.multiprocessing as mp

    import attnlens

    folder = tmp_path_factory.mktemp("sharing")
    constants = folder / "constants.safetensors"
    papa.fit(attnlens.load(bert_folder), tiny.CORPUS, max_len=16, batch_size=4, progress=False).save(constants)
    out = folder / "two"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLENS_CACHE", str(folder / "cache-two"))  # inherited by the ranks
        mp.start_processes(_sharing_main, args=(f"file://{folder / 'rendezvous'}", str(bert_folder),
                                                str(constants), str(out)), nprocs=2, start_method="spawn", join=True)
    return out, constants


@pytest.mark.slow
def test_distribute_shares_items_among_ranks_and_gives_every_rank_all_results(shared):
    """Two gloo ranks claim items in the store: every item runs once, on one rank, alone
    (world size 1 inside), and both ranks return all results in the items' order. An item that
    raises re-raises on its rank and is named on the other, so neither waits forever."""
    import json

    out, _ = shared
    results = [json.loads(out.with_suffix(f".{rank}.json").read_text(encoding="utf-8")) for rank in (0, 1)]
    assert results[0]["ok"] == results[1]["ok"]
    done = results[0]["ok"]["ok"]
    assert [item for item, _, _ in done] == list("abcdef")
    assert {rank for _, rank, _ in done} == {0, 1}  # both ranks worked
    assert all(size == 1 for _, _, size in done)  # each item run alone
    errors = sorted(result["fail"]["error"] for result in results)
    assert errors == ["UnavailableError: another rank failed: task 'c': ValueError: no labels for c",
                      "ValueError: no labels for c"], errors
    assert passes.distribute([1, 2], lambda item: item * 10) == [10, 20]  # one process: a loop


@pytest.mark.slow
def test_distribute_runs_an_item_after_the_one_it_needs_on_any_rank(shared):
    """With ``after``, an item waits for the result it needs (passed through the store to the
    other rank), a rank with nothing it may run yet takes an item that needs nothing, and the
    waiting items spread over both ranks. When the needed item fails, the rank waiting for it
    stops and names it, rather than waiting forever."""
    import json

    out, _ = shared
    results = [json.loads(out.with_suffix(f".{rank}.json").read_text(encoding="utf-8")) for rank in (0, 1)]
    assert results[0]["after"] == results[1]["after"]
    done = results[0]["after"]["ok"]
    assert [row[0] for row in done] == list("abcdef")
    first = done[0]
    assert all(row[3] == first[0] for row in done[1:5]) and done[5][3] is None  # the result each needed
    assert all(row[4] >= first[5] for row in done[1:5])  # started after a had finished
    assert all(row[2] == 1 for row in done)  # each run alone
    assert {row[1] for row in done[1:5]} == {0, 1}  # a's dependants ran on both ranks
    assert done[5][1] != first[1] and done[5][5] <= first[5]  # f: by the other rank, while a ran
    errors = sorted(result["after-fail"]["error"] for result in results)
    assert errors == ["UnavailableError: another rank failed: point 'a': ValueError: no labels for a",
                      "ValueError: no labels for a"], errors


def test_distribute_runs_an_item_after_the_one_it_needs_in_one_process():
    """One process: a loop, each item given the result of the earlier one it needs; ``after``
    must name an earlier item, one per item."""
    chained = passes.distribute([1, 2, 3], lambda item, needed: item + (needed or 0) * 10, after=[None, 0, 1])
    assert chained == [1, 12, 123]
    with pytest.raises(InputError, match=r"after\[1\] = 1: an item can only need an earlier one"):
        passes.distribute([1, 2], lambda item, needed: item, after=[None, 1])
    with pytest.raises(InputError, match="after has 1 entries for 2 items"):
        passes.distribute([1, 2], lambda item, needed: item, after=[None])


@pytest.mark.slow
def test_a_curve_shared_by_two_ranks_equals_the_one_process_curve(shared, bert_folder, tmp_path, monkeypatch):
    """Under torch.distributed the ranks share papa.curve's points, each task's later points
    after its first; both ranks return the table one process makes, value for value (each
    point is the same computation, on one thread, wherever it runs: its first point's result
    reaches it through the store, pickled). With a checkpoint folder shared by the ranks, each
    point is written once, and the same curve again reads every point back, to the same table."""
    import json

    import pandas as pd

    import attnlens

    out, constants = shared
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache-one"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = papa.curve(attnlens.load(bert_folder), papa.load(constants), **CURVE)
    finally:
        torch.set_num_threads(threads)
    for rank in (0, 1):
        for run in ("", ".again"):
            table = pd.read_csv(out.with_suffix(f".{rank}{run}.csv"))
            pd.testing.assert_frame_equal(table, single.table.reset_index(drop=True), check_dtype=False)
        seen = json.loads(out.with_suffix(f".{rank}.json").read_text(encoding="utf-8"))["curve"]
        assert seen == {"processes": 2, "timings": ["cola"] * 3 + ["sst2"] * 3, "resumed": [True] * 6}
    assert len(list((out.parent / "points").glob("point-*.safetensors"))) == 6
    assert single.processes == 1
