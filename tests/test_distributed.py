"""Beyond one process: data parallelism on torch.distributed (gloo on CPU), models spread over
devices and offloaded, corpora streamed from disk."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import SHARED_DATA, assert_statistics_close, save_tiny, tiny_model
from probe.measures.stats import ALL_STATISTICS
from probe.runs.analysis import analyze
from probe.runs.distributed import World, detect, reducer, shard
from probe.text.corpus import iter_corpus
from probe.text.inputs import Text

TEXTS = [f"Sentence number {i}, with a comma; and {'more ' * (i % 5)}words." for i in range(23)]


def test_detect_reads_the_launcher_environment():
    assert detect({}) is None
    assert detect({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert detect({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0"}) == World(2, 4, 0)
    assert detect({"WORLD_SIZE": "2", "RANK": "1"}) == World(1, 2, 1)
    assert detect({"WORLD_SIZE": "x"}) is None


def test_shards_partition_the_corpus_and_keep_positions():
    shards = [list(shard(iter(TEXTS), World(r, 3))) for r in range(3)]
    indices = sorted(t.index for s in shards for t in s)
    assert indices == list(range(len(TEXTS)))
    for r, s in enumerate(shards):
        assert all(t.index % 3 == r and t.text == TEXTS[t.index] for t in s)
    assert [t.index for t in shard(TEXTS, None)] == list(range(len(TEXTS)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain_run(world: World) -> dict:
    """This rank's shard of TEXTS, reduced over the process group: what rank 0 saves."""
    res = analyze(tiny_model("bert"), shard(TEXTS, world), batch_size=4, n_examples=3, reduce=reducer(world))
    return {"means": res.stats.means(), "counts": res.stats.counts, "labels": list(res.heads["labels"]),
            "counts_run": res.counts, "examples": [(e.index, e.probs) for e in res.examples]}


def test_two_gloo_processes_equal_one(gloo_runs):
    """2 processes on CPU, each analysing every other text, reduced with gloo: the same counts,
    labels and example maps as one process, statistics within their tolerance."""
    got = gloo_runs["plain"]
    one = analyze(tiny_model("bert"), TEXTS, batch_size=4, n_examples=3)
    assert torch.equal(got["counts"], one.stats.counts)
    # per-head statistics (means over the corpus), each with its tolerance: the shards' batches are
    # composed differently, and float32 attention differs by ~1e-7 between batch compositions
    assert_statistics_close(got["means"], one.stats.means(), names=ALL_STATISTICS)
    assert got["labels"] == list(one.heads["labels"])
    assert {k: v for k, v in got["counts_run"].items() if k != "batches"} == \
        {k: v for k, v in one.counts.items() if k != "batches"}
    assert [i for i, _ in got["examples"]] == [0, 1, 2]  # the first texts of the corpus, whoever read them
    for (_, probs), ex in zip(got["examples"], one.examples):
        np.testing.assert_allclose(probs, ex.probs, atol=1e-6)


GAP_ROWS = [  # ID, Text, Pronoun, offset, A, offset, A-coref, B, offset, B-coref; row g4's "she" is not at 0
    ("g1", 'Anna Berg met "Clara," and she smiled.', "she", 27, "Anna Berg", 0, "TRUE", "Clara", 15, "FALSE"),
    ("g2", "Tom saw Eric. He waved.", "He", 14, "Tom", 0, "FALSE", "Eric", 8, "TRUE"),
    ("g3", "Mary called Jane because she was late.", "she", 25, "Mary", 0, "TRUE", "Jane", 12, "FALSE"),
    ("g4", "Bad offsets here, she said.", "she", 0, "Bad", 0, "TRUE", "here", 12, "FALSE"),
    ("g5", "Paul thanked Mark, and he left.", "he", 23, "Paul", 0, "FALSE", "Mark", 13, "TRUE"),
]
CONLLU = ("# sent_id = s1\n# text = I saw it.\n1\tI\tI\tPRON\t_\t_\t2\tnsubj\t_\t_\n"
          "2\tsaw\tsee\tVERB\t_\t_\t0\troot\t_\t_\n3\tit\tit\tPRON\t_\t_\t2\tobj\t_\tSpaceAfter=No\n"
          "4\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_\n\n"
          "# sent_id = s2\n# text = Hello world\n1\tHello\thello\tINTJ\t_\t_\t0\troot\t_\t_\n"
          "2\tthere\tthere\tADV\t_\t_\t1\tadvmod\t_\t_\n\n"
          "# sent_id = s3\n# text = Dogs bark loudly.\n1\tDogs\tdog\tNOUN\t_\t_\t2\tnsubj\t_\t_\n"
          "2\tbark\tbark\tVERB\t_\t_\t0\troot\t_\t_\n3\tloudly\tloudly\tADV\t_\t_\t2\tadvmod\t_\tSpaceAfter=No\n"
          "4\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_\n\n")


def _annotated_files(folder) -> tuple[str, str]:
    from probe.linguistic.gap import GAP_COLUMNS

    gap = folder / "gap.tsv"
    gap.write_text("\n".join(["\t".join(GAP_COLUMNS)] + ["\t".join(map(str, r)) for r in GAP_ROWS]) + "\n",
                   encoding="utf-8")
    conllu = folder / "trees.conllu"
    conllu.write_text(CONLLU, encoding="utf-8")
    return str(gap), str(conllu)


def _annotated_run(world: World | None, gap: str, conllu: str):
    from probe.linguistic import annotated_input

    annotated = annotated_input(gap, conllu)
    lm = tiny_model("bert")
    return analyze(lm, shard(annotated.texts, world), batch_size=2, n_examples=1,
                   accumulators=annotated.accumulators(lm, prior=world is None or world.main),
                   reduce=reducer(world))


def _worker(rank: int, world_size: int, port: int, gap: str, conllu: str, out: str) -> None:
    """One rank of both runs over gloo: the plain analysis of TEXTS, then ``probe analyze --coref GAP
    --syntax CONLLU``; rank 0 saves what it got. (One spawn for both: starting the two processes
    costs more than the runs.)"""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        world = World(rank, world_size)
        plain = _plain_run(world)
        res = _annotated_run(world, gap, conllu)
        if rank == 0:
            annotated = {name: (res.results[name].table, res.results[name].counts)
                         for name in ("coreference", "syntax")}
            torch.save({"plain": plain, "annotated": annotated}, out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    """What rank 0 of 2 gloo processes got, and the annotated files it read: ``{"plain", "annotated",
    "files"}``."""
    folder = tmp_path_factory.mktemp("gloo")
    gap, conllu = _annotated_files(folder)
    out = folder / "rank0.pt"
    torch.multiprocessing.spawn(_worker, args=(2, _free_port(), gap, conllu, str(out)), nprocs=2, join=True)
    return {**torch.load(out, weights_only=False), "files": (gap, conllu)}


def test_annotated_input_two_gloo_processes_equal_one(gloo_runs):
    """--coref/--syntax under 2 processes: the same coreference and syntax tables as one process,
    and the rows the readers left out (GAP offsets, a CoNLL-U text mismatch) counted once."""
    got = gloo_runs["annotated"]
    one = _annotated_run(None, *gloo_runs["files"])
    coref, syntax = one.results["coreference"], one.results["syntax"]
    assert coref.counts["examples"] == len(GAP_ROWS)
    assert coref.counts["unaligned"] == {"offsets do not match the names": 1}
    assert syntax.counts["sentences"] == 3 and syntax.counts["unaligned"] == {"text mismatch": 1}
    for name, res in (("coreference", coref), ("syntax", syntax)):
        table, counts = got[name]
        assert counts == res.counts
        assert table.drop(columns=["accuracy", "ci_low", "ci_high"]).equals(
            res.table.drop(columns=["accuracy", "ci_low", "ci_high"]))
        np.testing.assert_allclose(table[["accuracy", "ci_low", "ci_high"]].to_numpy(dtype=float),
                                   res.table[["accuracy", "ci_low", "ci_high"]].to_numpy(dtype=float), equal_nan=True)


def _launch(cmd: list[str], tmp_path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=os.getcwd(),
                          env={**os.environ, **(env or {})})


def _heads(path):
    import pandas as pd

    return pd.read_csv(path / "heads.csv")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_launchers_just_work(launcher, tmp_path):
    """`torchrun --nproc-per-node 2 -m probe analyze` and `accelerate launch ... -m probe analyze`
    (2 CPU processes): one report, equal to a single-process run."""
    model = save_tiny("gpt2", tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    args = ["-m", "probe", "analyze", "--model", str(model), "--corpus", str(corpus), "--batch-size", "4",
            "--no-progress"]
    single = _launch([sys.executable, *args, "--out", str(tmp_path / "one")], tmp_path)
    assert single.returncode == 0, single.stderr
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(_free_port())]
    else:
        if shutil.which("accelerate") is None:
            pytest.skip("the accelerate command is not installed")
        cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
               str(_free_port())]
    multi = _launch(cmd + args + ["--out", str(tmp_path / "two")], tmp_path)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert "process 0 of 2" in multi.stderr and "process 1 of 2" in multi.stderr
    assert multi.stdout.count("Report:") == 1  # rank 0 writes the one report
    a, b = _heads(tmp_path / "one"), _heads(tmp_path / "two")
    assert list(a["labels"]) == list(b["labels"])
    num = [c for c in a.columns if a[c].dtype.kind == "f"]
    # heads.csv holds 6 significant digits, so compare relatively as well (11.0586 vs 11.0585 is one digit)
    np.testing.assert_allclose(a[num].to_numpy(), b[num].to_numpy(), rtol=2e-5, atol=2e-5, equal_nan=True)
    ca = json.loads((tmp_path / "one" / "run.json").read_text())["counts"]
    cb = json.loads((tmp_path / "two" / "run.json").read_text())["counts"]
    assert ca["sequences"] == cb["sequences"] == len(TEXTS) and ca["tokens"] == cb["tokens"]


# --------------------------------------------------------------------------- models spread over devices

@pytest.mark.parametrize("how", ["cpu_offload", "disk_offload", "split"])
def test_offloaded_and_split_models_give_the_same_statistics(how, tmp_path):
    """accelerate's own utilities: weights kept on 'meta' and brought in per forward (CPU or disk
    offload), or layers dispatched over 'cpu' and 'disk': hooks, statistics, head distances and
    pattern types see the same maps."""
    from accelerate import cpu_offload, disk_offload, dispatch_model

    from probe.patterns import pattern_accumulators

    ref_lm = tiny_model("llama")
    reference = analyze(ref_lm, TEXTS[:6], n_examples=1, accumulators=pattern_accumulators(ref_lm))
    lm = tiny_model("llama")
    if how == "cpu_offload":
        cpu_offload(lm.model, execution_device=torch.device("cpu"))
    elif how == "disk_offload":
        disk_offload(lm.model, offload_dir=str(tmp_path / "off"), execution_device=torch.device("cpu"))
    else:
        device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                      "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
        dispatch_model(lm.model, device_map=device_map, offload_dir=str(tmp_path / "off"))
    assert any(p.device.type == "meta" for p in lm.model.parameters())  # really offloaded
    res = analyze(lm, TEXTS[:6], n_examples=1, accumulators=pattern_accumulators(lm))
    torch.testing.assert_close(res.stats.sums, reference.stats.sums, atol=1e-9, rtol=0)
    np.testing.assert_allclose(res.results["distances"].model, reference.results["distances"].model, atol=1e-9)
    np.testing.assert_allclose(res.results["distances"].layer, reference.results["distances"].layer, atol=1e-9)
    assert res.heads["pattern"].tolist() == reference.heads["pattern"].tolist()
    assert torch.equal(res.stats.counts, reference.stats.counts)
    np.testing.assert_array_equal(res.examples[0].probs, reference.examples[0].probs)


def test_device_options_are_checked(tmp_path):
    from probe.errors import ModelLoadError
    from probe.loading.models import load_model, resolve_device

    assert resolve_device("cpu") == "cpu" and resolve_device(None) is None
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelLoadError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            resolve_device("cuda")
    folder = save_tiny("bert", tmp_path / "m")
    lm = load_model(str(folder), device_map="auto")
    assert lm.notes and "device map auto" in lm.notes[-1]
    with pytest.raises(ModelLoadError, match="unknown device map"):
        load_model(str(folder), device_map="balanced")


# --------------------------------------------------------------------------- streamed corpora

def test_corpus_is_read_lazily(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("".join(f"Line {i}.\n" for i in range(10_000)), encoding="utf-8")
    it = iter_corpus(path)
    assert list(itertools.islice(it, 3)) == ["Line 0.", "Line 1.", "Line 2."]
    assert next(it) == "Line 3."  # a generator: nothing beyond what was asked was kept
    assert len(list(iter_corpus(path, limit=50))) == 50


def test_a_stream_gives_what_a_list_gives():
    lm = tiny_model("gpt2")
    from_list = analyze(lm, TEXTS, batch_size=4, n_examples=2)
    from_stream = analyze(lm, (t for t in TEXTS), batch_size=4, n_examples=2)
    assert torch.equal(from_list.stats.counts, from_stream.stats.counts)
    torch.testing.assert_close(from_list.stats.sums, from_stream.stats.sums, atol=1e-12, rtol=0)
    assert [e.index for e in from_stream.examples] == [0, 1]
    with pytest.raises(Exception, match="text 3 is empty"):
        analyze(lm, (t for t in ["fine", "also fine", "  "]))
    with pytest.raises(Exception, match="no text"):
        analyze(lm, iter([]))


def test_stream_chunks_are_sorted_within_chunks_only():
    """A stream is tokenized a chunk at a time: batches never mix texts of two chunks."""
    from probe.text.inputs import iter_batches

    lm = tiny_model("bert")
    texts = (Text(t, index=i) for i, t in enumerate(TEXTS))
    batches = list(iter_batches(lm, texts, batch_size=4, chunk=8))
    for b in batches:
        assert len({i // 8 for i in b.index}) == 1
    assert sorted(i for b in batches for i in b.index) == list(range(len(TEXTS)))


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu").exists(), reason="no UD EWT data")
def test_ud_dev_two_processes_equal_one_with_minilm(tmp_path):
    """The issue's acceptance run, small: UD dev (100 sentences), minilm, 2 gloo processes vs 1."""
    ud = SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"
    args = ["-m", "probe", "analyze", "--corpus", str(ud), "--limit", "100", "--no-progress"]
    one = _launch([sys.executable, *args, "--out", str(tmp_path / "one")], tmp_path)
    two = _launch([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                   str(_free_port()), *args, "--out", str(tmp_path / "two")], tmp_path)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    a, b = _heads(tmp_path / "one"), _heads(tmp_path / "two")
    assert list(a["labels"]) == list(b["labels"])
    num = [c for c in a.columns if a[c].dtype.kind == "f"]
    # heads.csv holds 6 significant digits, so compare relatively as well (11.0586 vs 11.0585 is one digit)
    np.testing.assert_allclose(a[num].to_numpy(), b[num].to_numpy(), rtol=2e-5, atol=2e-5, equal_nan=True)
