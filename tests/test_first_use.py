"""The first use of a GGUF model announces an estimate and every step with its time (nothing
silent), builds the model from the config it read (the header is not read a third time), and
leaves a complete float32 cache folder.

The trigger: the first use of smollm2 was announced as about 30 s; 69 s were measured, 65 s of it
without a word. Here the steps are faked (no real GGUF file) so the test is fast; the slow test in
test_models.py loads the real smollm2 into a fresh cache.
"""

from __future__ import annotations

import re

import probe.loading.checkpoints as loading
from conftest import notes, tiny_model


def test_first_use_logs_an_estimate_and_every_step(tmp_path, monkeypatch, caplog):
    model, tok = tiny_model("llama", wrap=False)
    calls = []

    class FakeClass:
        @staticmethod
        def from_pretrained(folder, **kw):
            calls.append(("model", kw))
            return model

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained",
                        lambda *a, **kw: calls.append(("config", kw)) or model.config)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained",
                        lambda *a, **kw: calls.append(("tokenizer", kw)) or tok)
    monkeypatch.setattr(loading, "model_class", lambda config, head=None: FakeClass)
    gguf = tmp_path / "m.gguf"
    with open(gguf, "wb") as fh:  # 100 MB, sparse
        fh.truncate(100 * 2**20)
    cached = tmp_path / "cache" / "m-dequantized-float32"
    with notes(caplog, "probe.loading.models"):
        # the loader itself, past the test tiers' guard (this stand-in file is not a real model)
        got, _ = loading.load_gguf.__wrapped__(tmp_path, "m.gguf", cached, None)
    assert got is model
    assert [c[0] for c in calls] == ["config", "tokenizer", "model"]
    assert calls[2][1]["config"] is model.config
    lines = list(dict.fromkeys(r.getMessage() for r in caplog.records))  # a record may reach caplog twice
    assert "(100 MB)" in lines[0] and "about 15 s on 2 CPU cores" in lines[0]
    assert "depends on the CPU and the disk" in lines[0]
    assert str(cached) in lines[0] and "one-time step" in lines[0]
    mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    steps = ["reading the GGUF header (config and tokenizer vocabulary)", "building the tokenizer",
             "de-quantizing the tensors", f"saving the float32 copy ({mb:.0f} MB)"]
    for i, what in enumerate(steps, 1):
        assert lines[2 * i - 1] == f"  {i}/4 {what} ..."
        assert re.fullmatch(rf"  {i}/4 {re.escape(what)}: done in \d+\.\d s", lines[2 * i])
    assert (cached / "config.json").exists() and not list(cached.parent.glob(cached.name + ".*"))
    # a .gguf file given by its path (no cache folder): the same steps, numbered the same, step 4 skipped
    caplog.clear()
    with notes(caplog, "probe.loading.models"):
        loading.load_gguf.__wrapped__(tmp_path, "m.gguf", None, None)
    uncached = list(dict.fromkeys(r.getMessage() for r in caplog.records))
    assert uncached[0:6:2] == [f"  {i}/4 {what} ..." for i, what in enumerate(steps[:3], 1)]
    assert uncached[-1].startswith("  4/4 saving the float32 copy: skipped") and len(uncached) == 7


def test_estimate_scales_with_the_file():
    """0.15 s per MB (11.5 s measured for SmolLM2's 94 MB file on 2 busy cores), to 5 s, at least 5."""
    assert [loading.first_use_estimate(mb) for mb in (94, 100, 10, 400)] == [15, 15, 5, 60]


def test_the_header_is_parsed_once(monkeypatch):
    """Config and tokenizer loaders each call transformers' header reader; inside, it parses once."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    parsed = []

    def reader(path, return_tensors=False, **kw):
        parsed.append((path, return_tensors))
        return {"config": {"model_type": "llama"}, "tokenizer": {"tokens": ["a", "b"]}}

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", reader)
    with loading._parse_once():
        first = gguf_utils.load_gguf_checkpoint("f.gguf")
        first["config"].pop("model_type")  # a caller changing its copy changes no other caller's
        second = gguf_utils.load_gguf_checkpoint("f.gguf", return_tensors=False)
        gguf_utils.load_gguf_checkpoint("f.gguf", return_tensors=True)
    assert second == {"config": {"model_type": "llama"}, "tokenizer": {"tokens": ["a", "b"]}}
    assert parsed == [("f.gguf", False), ("f.gguf", True)]
    assert gguf_utils.load_gguf_checkpoint is reader


def test_the_tensor_name_map_is_built_once_per_arguments():
    import gguf

    original = gguf.get_tensor_name_map
    with loading._parse_once():
        a = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is a
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is not a
        assert a.get_name("model.layers.3.self_attn.q_proj") == original(gguf.MODEL_ARCH.LLAMA, 30).get_name(
            "model.layers.3.self_attn.q_proj") == "blk.3.attn_q"
    assert gguf.get_tensor_name_map is original


def test_a_gguf_file_is_opened_once(tmp_path, monkeypatch):
    import gguf

    opened = []

    class Reader:
        def __init__(self, path, mode="r"):
            opened.append(str(path))

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    with loading._parse_once():
        first = gguf.GGUFReader(tmp_path / "a.gguf")
        assert gguf.GGUFReader(tmp_path / "a.gguf") is first
        gguf.GGUFReader(tmp_path / "b.gguf")
    assert opened == [str(tmp_path / "a.gguf"), str(tmp_path / "b.gguf")] and gguf.GGUFReader is Reader


def test_a_busy_machine_gets_a_longer_estimate():
    """Issue 27 item 12: 'about 15 s' took 62 s at load 11 on 2 cores."""
    assert loading.busy_estimate(15, load=0.3, cores=2) == ""
    assert loading.busy_estimate(15, load=11.0, cores=2) == (
        "; this machine is busy (load 11.0 on 2 cores): expect about 90 s")
    assert loading.busy_estimate(15, load=3.0, cores=16) == ""


def test_the_dequantizing_bar_shows_only_on_a_terminal(monkeypatch):
    """Its tqdm bar wrote ~70 updates into a redirected log, while probe's own bars follow --progress."""
    import io

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    with loading._parse_once():
        log = io.StringIO()  # not a terminal
        for _ in gguf_utils.tqdm(range(70), desc="Converting and de-quantizing GGUF tensors...", file=log):
            pass
        assert log.getvalue() == ""
    assert gguf_utils.tqdm is original
