"""Head labels (docs/statistics.md, "Labels") on hand-built statistics."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from probe.measures.classify import LABEL_RULES, MIXED, cluster_heads, default_thresholds, label_heads
from probe.measures.stats import STATISTICS

#: The labels' definition (docs/statistics.md), written out again here (not read from probe).
DEFINED_RULES = {
    "previous-token": ("prev", 0.5),
    "next-token": ("next", 0.5),
    "self": ("self", 0.5),
    "first-token": ("first", 0.5),
    "sep": ("sep", 0.5),
    "punctuation": ("punct", 0.5),
    "broad": ("norm_entropy", 0.8),
    "long-range": ("long", 0.5),
    "induction": ("induction", 0.4),  # "Decoder circuits" (repeated random tokens)
    "duplicate-token": ("duplicate", 0.4),
}


def frame(*rows: dict) -> pd.DataFrame:
    """One head per row; statistics not given are small (no label), distance/entropy neutral."""
    base = {name: 0.1 for name in STATISTICS}
    base.update(entropy=1.0, norm_entropy=0.3, distance=2.0, max_weight=0.4)
    out = []
    for i, row in enumerate(rows):
        r = {"layer": i // 4, "head": i % 4, **base}
        r.update(row)
        out.append(r)
    return pd.DataFrame(out)


def test_rules_match_metrics():
    assert {label: rule for label, rule in LABEL_RULES.items()} == DEFINED_RULES
    assert default_thresholds() == {label: thr for label, (_, thr) in DEFINED_RULES.items()}


@pytest.mark.parametrize("label", list(DEFINED_RULES))
def test_each_rule_at_and_below_threshold(label):
    stat, thr = DEFINED_RULES[label]
    heads = frame({stat: thr}, {stat: thr - 1e-4}, {stat: 1.0})
    out = label_heads(heads)
    assert out["label"].tolist() == [label, MIXED, label]
    assert out["labels"].tolist() == [label, MIXED, label]


def test_primary_is_highest_ratio_to_threshold():
    # prev 0.6 / 0.5 = 1.2 beats norm_entropy 0.9 / 0.8 = 1.125, although 0.9 > 0.6
    heads = frame(
        {"prev": 0.6, "norm_entropy": 0.9},
        {"prev": 0.52, "norm_entropy": 0.85},  # 1.04 < 1.0625: broad wins
        {"first": 0.7, "sep": 0.55, "self": 0.51},  # 1.4 > 1.1 > 1.02
        {"punct": 0.5},
    )
    out = label_heads(heads)
    assert out["label"].tolist() == ["previous-token", "broad", "first-token", "punctuation"]
    assert out["labels"].tolist() == [
        "previous-token;broad", "broad;previous-token", "first-token;sep;self", "punctuation"]


def test_mixed_when_no_rule_holds():
    out = label_heads(frame({}, {"prev": 0.49, "norm_entropy": 0.79, "long": 0.4999}))
    assert out["label"].tolist() == [MIXED, MIXED]
    assert out["labels"].tolist() == [MIXED, MIXED]


def test_nan_never_labels():
    nan = float("nan")
    heads = frame(
        {"next": nan, "sep": nan},
        {"next": nan, "prev": 0.9},
        {name: nan for name in STATISTICS},
    )
    heads["next"] = heads["next"].astype("float32")  # a float32 NaN is still NaN
    out = label_heads(heads)
    assert out["label"].tolist() == [MIXED, "previous-token", MIXED]
    assert out["labels"].tolist() == [MIXED, "previous-token", MIXED]


def test_custom_thresholds():
    heads = frame({"prev": 0.4}, {"norm_entropy": 0.75}, {"first": 0.55})
    assert label_heads(heads)["label"].tolist() == [MIXED, MIXED, "first-token"]
    out = label_heads(heads, {"previous-token": 0.3, "broad": 0.7, "first-token": 0.6})
    assert out["label"].tolist() == ["previous-token", "broad", MIXED]
    # a partial override keeps the other defaults
    out = label_heads(heads, {"previous-token": 0.4})
    assert out["label"].tolist() == ["previous-token", MIXED, "first-token"]
    # the ratio uses the custom threshold: prev 0.4 / 0.2 = 2 beats first 0.55 / 0.5 = 1.1
    out = label_heads(frame({"prev": 0.4, "first": 0.55}), {"previous-token": 0.2})
    assert out["label"].tolist() == ["previous-token"]
    assert out["labels"].tolist() == ["previous-token;first-token"]


@pytest.mark.parametrize("thresholds", [{"induction-head": 0.5}, {"prev": 0.5}, {"Previous-Token": 0.5}])
def test_unknown_label_raises(thresholds):
    with pytest.raises(ValueError, match="unknown label"):
        label_heads(frame({}), thresholds)


@pytest.mark.parametrize("value", [0, -0.5, "0.5", None, float("nan"), 1.5])
def test_bad_threshold_value_raises(value):
    with pytest.raises(ValueError):
        label_heads(frame({}), {"self": value})


def test_output_columns_and_input_untouched():
    heads = frame({"self": 0.9})
    before = heads.copy()
    out = label_heads(heads)
    pd.testing.assert_frame_equal(heads, before)
    assert list(out.columns[:4]) == ["layer", "head", "label", "labels"]
    assert list(out.columns[4:]) == list(STATISTICS)
    assert len(out) == len(heads)


def test_every_label_of_a_head_is_listed_by_ratio():
    row = {stat: min(1.0, thr * (1.1 + 0.05 * k)) for k, (stat, thr) in enumerate(DEFINED_RULES.values())}
    out = label_heads(frame(row))
    ratios = sorted(((row[stat] / thr, label) for label, (stat, thr) in DEFINED_RULES.items()), reverse=True)
    assert out["labels"][0].split(";") == [label for _, label in ratios]
    assert out["label"][0] == ratios[0][1]
    assert math.isclose(ratios[0][0], 1.1 + 0.05 * (len(DEFINED_RULES) - 1))


def test_cluster_heads_groups_similar_profiles():
    heads = frame(*([{"prev": 0.9}] * 4 + [{"first": 0.9}] * 4 + [{"norm_entropy": 0.95}] * 4))
    heads["next"] = np.nan  # a column that is NaN everywhere is ignored
    ids = cluster_heads(heads, list(STATISTICS), n_clusters=3)
    assert len(ids) == 12
    groups = [set(ids[i:i + 4]) for i in (0, 4, 8)]
    assert all(len(g) == 1 for g in groups)
    assert len(set.union(*groups)) == 3


def test_one_cluster_is_every_head_as_k_means_gives_it():
    """k = 1 (asked for, or one distinct profile) skips k-means' restarts and gives what k-means gives."""
    from sklearn.cluster import KMeans
    from sklearn.preprocessing import StandardScaler

    heads = frame(*([{"prev": 0.9}] * 4 + [{"first": 0.9}] * 4))
    ids = cluster_heads(heads, list(STATISTICS), n_clusters=1)
    x = heads[[c for c in STATISTICS if heads[c].notna().any()]].fillna(0).to_numpy(dtype=float)
    want = KMeans(n_clusters=1, n_init=10, random_state=0).fit_predict(StandardScaler().fit_transform(x))
    assert ids.tolist() == want.tolist() == [0] * 8 and ids.dtype == want.dtype
    same = cluster_heads(frame(*([{"prev": 0.9}] * 5)), list(STATISTICS), n_clusters=6)
    assert same.tolist() == [0] * 5
