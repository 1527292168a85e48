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

import pytest
import torch

from attnlens import papa
from attnlens.engine.checkpoints import check_world_size
from attnlens.engine.distributed import World, interleaved, shard
from tests import tiny

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
        shards = [shard(n, batch_size, rank, size) for rank in range(size)]
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
        shares = [interleaved(n, batch_size, rank, size) for rank in range(size)]
        assert sorted(b for share in shares for b in share) == list(range(-(-n // batch_size)))
        for rank, share in enumerate(shares):
            assert all(b % size == rank for b in share)
    assert interleaved(21, 2, 0, 2) == [0, 2, 4, 6, 8, 10]  # 11 batches: rank 0 gets 6


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
from attnlens.evaluation import probing
from attnlens.core.inputs import Words
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
    from attnlens.core.inputs import Words
    from attnlens.evaluation import probing

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
        check_world_size(checkpoint, World(rank=0, size=2))
    with pytest.raises(ValueError, match="another number of processes than this one \\(1\\)"):
        check_world_size(checkpoint, World())
    check_world_size(checkpoint, World(rank=1, size=4))  # its own world: fine


#: the failures one spawn of two ranks meets in turn: ``(case, what rank 0 must report)``
FAILURES = [
    ("other-corpus", "InputError: the ranks of this torchrun were given different corpora or settings"),
    ("dead-rank", "UnavailableError: rank 0 of 2: comparing settings failed"),
]


def _rank_main(rank: int, folder: str, init: str, outcome: str) -> None:
    """One spawned rank: join a 2-rank gloo world, then fit once per case of :data:`FAILURES`
    (one start and one model load for all of them); write what happened to a file per case.
    The group survives a refused fit (every rank refuses at the same collective), so the next
    case runs in it; the last one kills rank 1."""
    import torch.distributed as dist

    import attnlens

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    model = attnlens.load(folder)
    for case, _ in FAILURES:
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
        Path(f"{outcome}.{case}.{rank}").write_text(result, encoding="utf-8")
    dist.destroy_process_group()


@pytest.mark.slow
def test_distributed_failures_are_one_clear_error(tmp_path, bert_folder):
    """Ranks given different corpora, then a rank that dies: rank 0 reports each as one line
    naming it (the other rank of the first case too)."""
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'rendezvous'}"
    outcome = tmp_path / "outcome"
    context = mp.start_processes(_rank_main, args=(str(bert_folder), init, str(outcome)), nprocs=2,
                                 start_method="spawn", join=False)
    for process in context.processes:  # rank 1 exits on its own; rank 0 after its last report
        process.join(timeout=240)
    assert not any(process.is_alive() for process in context.processes)
    for case, expected in FAILURES:
        message = Path(f"{outcome}.{case}.0").read_text(encoding="utf-8")
        assert message.startswith(expected), (case, message)
        assert "\n" not in message
    assert Path(f"{outcome}.other-corpus.1").read_text(encoding="utf-8").startswith(FAILURES[0][1])