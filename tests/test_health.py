"""Attention health checks (docs/statistics.md): each check fires on a tiny model broken the way the check
points at, flags exactly the broken heads, and stays quiet on the unbroken model."""

from __future__ import annotations

import pytest
import torch

from conftest import DECODERS, SEQ2SEQ, tiny_model
from probe.analysis import analyze
from probe.patterns import HealthProbe, health_checks, health_of, health_thresholds, pattern_accumulators
from probe.reference import swap_attention

TEXTS = ["The cat sat on the mat, and then it slept.", "Short one.",
         "Birds sing in the morning and fly away over the hills.", "Why?"]
D = 16  # d_head of the tiny models (64 wide, 4 heads)


def checks(lm, texts=TEXTS, batch_size=4, **kw) -> dict:
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
    assert heads_of(found["saturated"]) == {(0, 0)}  # a head that copies itself is one-hot too


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


@pytest.mark.parametrize("kind", ("bert", "distilbert", *[k for k in DECODERS if k not in SEQ2SEQ], "qwen2-window"))
def test_padding_attended_is_exactly_zero_on_every_family(kind):
    """Hugging Face's eager attention of every supported family, sliding windows included (the
    longest text is longer than the windows, so some padding rows see padding only and are left out)."""
    lm = tiny_model(kind)
    found, _ = checks(lm, distance=False, types=False)
    assert found["padding"].measured and found["padding"].value == 0.0


def test_not_measured_without_padding_or_distances(bert):
    found, _ = checks(bert, texts=TEXTS[:2], batch_size=1, distance=False)
    assert not found["padding"].measured and "no padded batch" in found["padding"].note
    assert not found["duplicates"].measured and "--no-distance" in found["duplicates"].note


def test_thresholds_are_configurable_and_checked(bert):
    found, _ = checks(bert, thresholds={"saturated": 0.5})
    assert len(found["saturated"].flagged) == 8 and found["saturated"].threshold == 0.5  # every max_weight > 0.6
    assert found["saturated"].rule == "max_weight >= 0.5"
    for bad in ({"padding": 0.1}, {"saturation": 0.5}, {"uniform": 0}, {"uniform": 1.5}, {"collapsed": True}):
        with pytest.raises(ValueError):
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
