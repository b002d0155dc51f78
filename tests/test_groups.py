"""Head groups (clustering on the divergence, k by silhouette) and the 2-D map (MDS)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import silhouette_score

from probe.patterns.groups import cluster_by_distance, head_groups, head_map


def planted(sizes=(4, 3, 5), inside=0.02, between=0.6, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """A divergence matrix with planted groups (small inside, large between, a little noise)."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    perm = rng.permutation(len(truth))  # shuffled, so the renumbering is tested
    truth = truth[perm]
    d = np.where(truth[:, None] == truth[None, :], inside, between) + rng.uniform(0, 0.01, (len(truth),) * 2)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0)
    return d, truth


def test_planted_groups_are_found_and_numbered_by_first_head():
    d, truth = planted()
    groups = head_groups(d)
    assert groups.k == 3
    # same partition as planted: the pair relation "same group" is identical
    assert np.array_equal(groups.group[:, None] == groups.group[None, :], truth[:, None] == truth[None, :])
    # ids in order of first appearance: head 0 is in group 0, the first head outside it starts group 1 ...
    firsts = [int(np.flatnonzero(groups.group == g)[0]) for g in range(groups.k)]
    assert firsts == sorted(firsts) and firsts[0] == 0
    # the criterion: k is where the silhouette (recomputed here with scikit-learn) is largest
    assert max(groups.silhouette, key=groups.silhouette.get) == 3
    assert groups.silhouette[3] == pytest.approx(silhouette_score(d, groups.group, metric="precomputed"))
    assert {2, 3, 4} <= set(groups.silhouette) <= set(range(2, 12))


def test_a_far_outlier_does_not_make_two_groups():
    """Weak structure (groups 0.05 inside, 0.1 apart) plus one head 0.9 from everything: the plain
    mean silhouette peaks at k = 2 (the outlier against the rest); the criterion, over heads that
    share their group, finds the planted groups with the outlier alone."""
    d, truth = planted((4, 3, 5), inside=0.05, between=0.1)
    n = len(d)
    d = np.pad(d, ((0, 1), (0, 1)), constant_values=0.9)
    d[n, n] = 0
    truth = np.append(truth, 3)
    plain = {k: silhouette_score(d, cluster_k(d, k), metric="precomputed") for k in range(2, 8)}
    assert max(plain, key=plain.get) == 2
    groups = head_groups(d)
    assert groups.k == 4
    assert np.array_equal(groups.group[:, None] == groups.group[None, :], truth[:, None] == truth[None, :])
    assert 2 not in groups.silhouette  # one group of two or more heads: no structure to score


def cluster_k(d, k):
    from sklearn.cluster import AgglomerativeClustering

    return AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage="average").fit_predict(d)


def test_mds_map_reproduces_euclidean_distances():
    rng = np.random.default_rng(1)
    pts = rng.normal(size=(10, 2))
    d = np.linalg.norm(pts[:, None] - pts[None, :], axis=-1)
    xy, stress = head_map(d)
    got = np.linalg.norm(xy[:, None] - xy[None, :], axis=-1)
    np.testing.assert_allclose(got, d, atol=1e-3)  # a 2-D configuration exists, so MDS finds it
    assert stress < 1e-3


def test_degenerate_inputs_give_one_group():
    zero = np.zeros((5, 5))
    assert head_groups(zero).k == 1 and head_groups(zero).group.tolist() == [0] * 5
    two = np.array([[0, 0.3], [0.3, 0]])
    g = head_groups(two)
    assert g.k == 1 and abs(g.xy[1, 0] - g.xy[0, 0]) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        head_map(np.full((3, 3), np.nan))
    d, truth = planted((2, 2))
    labels, scores = cluster_by_distance(d)  # 4 heads: k = 2 or 3; k = 3 leaves one group of two
    assert sorted(scores) == [2]
    assert scores[2] == pytest.approx(silhouette_score(d, labels, metric="precomputed"))
