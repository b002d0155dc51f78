"""Attention health checks (docs/statistics.md): each check fires on a tiny model broken the way the check
points at, flags exactly the broken heads, and stays quiet on the unbroken model."""

from __future__ import annotations

import pytest
import torch

from conftest import DECODERS, SEQ2SEQ, tiny_model
from probe.capture.maps import encode, forward
from probe.capture.reference.swap import swap_attention
from probe.errors import InputError
from probe.patterns import HealthProbe, health_checks, health_of, health_thresholds, pattern_accumulators
from probe.runs.analysis import analyze

TEXTS = ["The cat sat on the mat, and then it slept.", "Short one.",
         "Birds sing in the morning and fly away over the hills.", "Why?"]
#: Enough text for the checks that need MIN_ROWS query rows (36 tokens a copy with the WordPiece tokenizer).
CORPUS = TEXTS * 7
D = 16  # d_head of the tiny models (64 wide, 4 heads)


def checks(lm, texts=CORPUS, batch_size=4, **kw) -> dict:
    res = analyze(lm, texts, batch_size=batch_size, n_examples=0, accumulators=pattern_accumulators(lm, **kw))
    return {c.name: c for c in health_of(res)}, res


def attention(lm, layer: int):
    return lm.model.encoder.layer[layer].attention.self  # tiny BERT: query, key, value Linears


def heads_of(check) -> set:
    return {(f["layer"], f["head"]) for f in check.flagged}


@pytest.fixture
def bert():
    return tiny_model("bert")


def test_unbroken_model_flags_nothing(bert):
    found, _ = checks(bert)
    assert all(c.measured and not c.flagged and not c.layers for c in found.values())
    assert found["padding"].value == 0.0


@torch.no_grad()
def test_saturated_fires_on_scaled_up_queries(bert):
    q = attention(bert, 0).query
    q.weight[D:2 * D] *= 30
    q.bias[D:2 * D] *= 30
    found, res = checks(bert)
    assert heads_of(found["saturated"]) == {(0, 1)}
    value = found["saturated"].flagged[0]["value"]
    assert value >= 0.95 and value == float(res.heads.set_index(["layer", "head"]).loc[(0, 1), "max_weight"])
    assert not found["uniform"].flagged and not found["collapsed"].flagged


@torch.no_grad()
def test_uniform_fires_on_zeroed_queries(bert):
    q = attention(bert, 1).query
    q.weight[2 * D:3 * D] = 0
    q.bias[2 * D:3 * D] = 0
    found, _ = checks(bert)
    assert heads_of(found["uniform"]) == {(1, 2)}
    assert found["uniform"].flagged[0]["value"] == pytest.approx(1.0, abs=1e-6)  # every row uniform
    assert not found["saturated"].flagged


@torch.no_grad()
def test_collapsed_fires_on_a_head_that_matches_itself(bert):
    att = attention(bert, 0)
    att.key.weight[:D] = att.query.weight[:D]
    att.key.bias[:D] = att.query.bias[:D]
    att.query.weight[:D] *= 20  # score(i, j) = 20 q_i . q_j / 4: largest at j = i (token + position differ)
    att.query.bias[:D] *= 20
    found, _ = checks(bert)
    assert heads_of(found["collapsed"]) == {(0, 0)}
    assert found["collapsed"].flagged[0]["value"] >= 0.8
    # a head that copies itself is one-hot too: its saturation is explained by its label "self" (the
    # collapsed check, whose statistic that label shares, is the one that flags it)
    assert not heads_of(found["saturated"])
    assert [(f["layer"], f["head"], f["label"]) for f in found["saturated"].explained] == [(0, 0, "self")]


@torch.no_grad()
def test_duplicates_fire_on_identical_heads_and_whole_layers(bert):
    for layer, copies in ((0, [3]), (1, [1, 2, 3])):
        att = attention(bert, layer)
        for h in copies:
            for lin in (att.query, att.key):
                lin.weight[h * D:(h + 1) * D] = lin.weight[:D]
                lin.bias[h * D:(h + 1) * D] = lin.bias[:D]
    found, res = checks(bert)
    pairs = {(f["layer"], tuple(f["heads"])) for f in found["duplicates"].flagged}
    assert pairs == {(0, (0, 3))} | {(1, (h, g)) for h in range(4) for g in range(h + 1, 4)}
    assert all(f["value"] < 1e-5 for f in found["duplicates"].flagged)
    assert found["duplicates"].layers == [1]
    # the same heads share a group (the map's distance is 0 between them)
    g = res.heads.set_index(["layer", "head"])["group"]
    assert g[(0, 0)] == g[(0, 3)] and len({g[(1, h)] for h in range(4)}) == 1


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_padding_attended_fires_on_a_broken_mask_and_is_zero_otherwise(kind):
    lm = tiny_model(kind)
    probe = HealthProbe(lm.sites)
    with swap_attention(lm, "no-padding-mask"):
        analyze(lm, TEXTS, batch_size=4, n_examples=0, accumulators=[probe])
    broken = probe.result()
    assert broken["padded_batches"] == 1 and broken["padding_max"] > 0.01
    check = health_checks(analyze(lm, TEXTS[:1], n_examples=0).heads, None, broken)[-1]
    assert check.name == "padding" and check.value == broken["padding_max"]
    assert {f["layer"] for f in check.flagged} == {0, 1}
    with swap_attention(lm):  # the correct from-scratch attention: exactly 0 again
        found, _ = checks(lm)
    assert found["padding"].value == 0.0 and not found["padding"].flagged


@pytest.mark.parametrize("kind", ("bert", "distilbert", "deberta-v2", *[k for k in DECODERS if k not in SEQ2SEQ],
                                  "qwen2-window"))
def test_padding_attended_is_exactly_zero_on_every_family(kind):
    """Hugging Face's eager attention of every supported family, sliding windows included (the
    longest text is longer than the windows, so some padding rows see padding only and are left out)."""
    lm = tiny_model(kind)
    found, _ = checks(lm, distance=False, types=False)
    assert found["padding"].measured and found["padding"].value == 0.0


def test_deberta_padding_queries_spread_evenly_and_the_check_reads_real_rows():
    """DeBERTa masks whole padding query rows (its mask is m_i m_j): their weights are 1 / T on
    every key, padding keys included, by design; the check reads its real query rows only (the
    other families' padding rows stay in)."""
    lm = tiny_model("deberta-v2")
    batch = encode(lm, TEXTS[:2])
    with torch.no_grad():  # the model's own maps (capture reads probe's reference module, equal on real rows)
        probs = forward(lm, batch, output_attentions=True).attentions[0]  # (B, heads, T, T)
    short = int(batch.real.sum(1).argmin())
    pad_rows = probs[short, :, ~batch.real[short]]  # (heads, padding queries, T)
    assert pad_rows.numel() and torch.allclose(pad_rows, torch.full_like(pad_rows, 1 / probs.shape[-1]))
    real = probs[short][:, batch.real[short]][..., ~batch.real[short]]  # real queries, padding keys
    assert real.numel() and float(real.max()) == 0.0
    probe = HealthProbe(lm.sites, real_rows_only=True)
    assert probe._cells(batch, lm.sites[0], probs.shape[-1])[short][~batch.real[short]].sum() == 0
    assert HealthProbe(lm.sites)._cells(batch, lm.sites[0], probs.shape[-1])[short][~batch.real[short]].any()


def test_not_measured_without_padding_or_distances(bert):
    found, _ = checks(bert, texts=TEXTS[:2], batch_size=1, distance=False)
    assert not found["padding"].measured and "no padded batch" in found["padding"].note
    assert not found["duplicates"].measured and "--no-distance" in found["duplicates"].note


def test_thresholds_are_configurable_and_checked(bert):
    found, _ = checks(bert, thresholds={"saturated": 0.5})
    assert len(found["saturated"].flagged) == 8 and found["saturated"].threshold == 0.5  # every max_weight > 0.6
    assert found["saturated"].rule == "max_weight >= 0.5"
    for bad in ({"padding": 0.1}, {"saturation": 0.5}, {"uniform": 0}, {"uniform": 1.5}, {"collapsed": True}):
        with pytest.raises(InputError):  # a bad option: the user's to fix
            health_thresholds(bad)


def test_health_of_a_run_without_the_health_probe_says_how_to_get_one():
    """health_of on an analysis run without the pattern accumulators: a ValueError naming the fix
    (it returned None without saying why), and the report shows no health section."""
    from probe.patterns.report import health_section

    lm = tiny_model("bert")
    res = analyze(lm, TEXTS, batch_size=4, n_examples=0)
    with pytest.raises(ValueError, match=r"no health checks: run it with analyze\(lm, texts, accumulators="):
        health_of(res)
    assert health_section(res, lm.tokenizer) is None
    assert {c.name for c in health_of(checks(lm)[1])} == {"saturated", "uniform", "collapsed", "duplicates", "padding"}


# --------------------------------------------------------------------------- item 5: no crying wolf

def exact_patterns(lm):
    """A forward hook making layer 0's captured probabilities exact healthy patterns: head 0 a clean
    previous-token head (row i on key i - 1, row 0 on itself), heads 2 and 3 attention sinks (every
    row on key 0). Registered before analyze's capture hooks, so these are the maps it measures."""
    def hook(module, args, output):
        probs = output[1].clone()
        T = probs.shape[-1]
        prev = torch.zeros(T, T)
        prev[torch.arange(T), (torch.arange(T) - 1).clamp(min=0)] = 1
        sink = torch.zeros(T, T)
        sink[:, 0] = 1
        probs[:, 0], probs[:, 2], probs[:, 3] = prev, sink, sink
        return (output[0], probs, *output[2:])
    return attention(lm, 0).register_forward_hook(hook)


def test_healthy_labelled_heads_are_explained_not_flagged(bert):
    """Issue trigger: a clean previous-token head (prev 1.00) and sink heads were FLAGGED saturated
    and as duplicates. Batch size 1: no padding, so rows are whole sequences."""
    handle = exact_patterns(bert)
    try:
        found, res = checks(bert, batch_size=1)
    finally:
        handle.remove()
    h = res.heads.set_index(["layer", "head"])
    assert h.loc[(0, 0), "max_weight"] == pytest.approx(1.0) and h.loc[(0, 0), "prev"] == pytest.approx(1.0)
    assert h.loc[(0, 0), "label"] == "previous-token" and h.loc[(0, 2), "label"] == "first-token"
    sat = found["saturated"]
    assert sat.status == "ok" and not sat.flagged
    assert {(f["layer"], f["head"]): f["label"] for f in sat.explained} == {
        (0, 0): "previous-token", (0, 2): "first-token", (0, 3): "first-token"}
    by_head = {(f["layer"], f["head"]): f for f in sat.explained}
    assert by_head[(0, 0)]["label_value"] == pytest.approx(1.0) and by_head[(0, 2)]["value"] == pytest.approx(1.0)
    dup = found["duplicates"]
    assert [(f["layer"], f["heads"], f["label"]) for f in dup.explained] == [(0, [2, 3], "first-token")]
    assert dup.explained[0]["value"] == pytest.approx(0.0, abs=1e-9)
    assert (0, (2, 3)) not in {(f["layer"], tuple(f["heads"])) for f in dup.flagged}


def test_too_little_text_says_so_instead_of_flagging(bert):
    """Issue trigger: 11 tokens flagged 38 saturated heads and 380 duplicate pairs on SmolLM2. Below
    MIN_ROWS query rows the per-head checks and duplicates need more text; padding still runs."""
    from probe.patterns.health import MIN_ROWS, NEED_ROWS

    with torch.no_grad():  # a head the saturated rule would catch on any amount of text
        attention(bert, 0).query.weight[D:2 * D] *= 30
        attention(bert, 0).query.bias[D:2 * D] *= 30
    found, res = checks(bert, texts=TEXTS)
    rows = res.counts["tokens"]
    assert rows == sum(len(bert.tokenizer(t)["input_ids"]) for t in TEXTS) and rows < MIN_ROWS == 200
    for name in NEED_ROWS:
        c = found[name]
        assert c.status == "needs more text" and c.needs_text and not c.flagged and not c.layers
        assert c.rows == rows and f"{rows} query rows measured, the check needs at least 200" in c.note
    assert "1 would have been caught" in found["saturated"].note
    assert found["padding"].status == "ok" and found["padding"].value == 0.0
    enough, _ = checks(bert)  # the same head on CORPUS (7 copies): flagged
    assert heads_of(enough["saturated"]) == {(0, 1)} and enough["saturated"].rows == 7 * rows


def test_report_run_json_and_cli_say_the_same(tmp_path):
    import json

    from click.testing import CliRunner

    from conftest import save_tiny
    from probe.cli import main

    folder = save_tiny("bert", tmp_path / "m")
    res = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--out", str(tmp_path / "run"),
                                    "--no-progress", *sum((["--text", t] for t in TEXTS), [])])
    assert res.exit_code == 0, res.output
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    rows = record["counts"]["tokens"]
    by_check = {c["check"]: c for c in record["health"]["checks"]}
    assert [by_check[k]["status"] for k in ("saturated", "uniform", "collapsed", "duplicates", "padding")] == \
        ["needs more text"] * 4 + ["ok"]
    assert by_check["saturated"]["rows"] == rows and by_check["saturated"]["min_rows"] == 200
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("health: "))
    assert line == (f"health: saturated needs more text ({rows} of 200 query rows); uniform needs more text ({rows} "
                    f"of 200 query rows); collapsed to self needs more text ({rows} of 200 query rows); duplicate "
                    f"heads needs more text ({rows} of 200 query rows); padding attended ok")
    html = (tmp_path / "run" / "index.html").read_text()
    assert html.count(f"needs more text: {rows} query rows measured, the check needs at least 200") == 4


@pytest.mark.slow
def test_smollm2_sinks_are_explained_and_a_short_text_needs_more(smollm2):
    """The field run: 11 words of text on SmolLM2 (10 tokens) flagged 38 saturated heads and 380
    duplicate pairs. Now: needs more text. On the built-in sample (371 tokens) its saturated heads
    and most near-identical pairs are attention sinks: explained by first-token, not flagged."""
    from probe.text.corpus import sample_texts

    found, res = checks(smollm2, texts=["The quick brown fox jumps over the lazy dog."])
    assert res.counts["tokens"] == 10
    assert all(found[n].status == "needs more text" and not found[n].flagged for n in
               ("saturated", "uniform", "collapsed", "duplicates"))
    found, res = checks(smollm2, texts=sample_texts())
    assert res.counts["tokens"] >= 200
    h = res.heads.set_index(["layer", "head"])
    sat = found["saturated"]
    assert sat.explained and not sat.flagged
    for f in sat.explained:
        first = h.loc[(f["layer"], f["head"]), "first"]
        assert f["label"] == "first-token" and f["label_value"] == pytest.approx(first)
    dup = found["duplicates"]
    assert len(dup.explained) > 10 * len(dup.flagged)
    for f in dup.explained:  # both heads of an explained pair hold its label
        assert all(f["label"] in h.loc[(f["layer"], g), "labels"].split(";") for g in f["heads"])
    assert {f["label"] for f in dup.explained} == {"first-token"}
