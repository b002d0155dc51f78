"""Every number of ``probe effects`` and ``probe patch`` stays what it was: effects.csv, label_effects.csv,
patch.csv, composition.csv and heads.csv on tiny GPT-2 and LLaMA model folders equal, to the CSVs' six
significant digits, the files stored under ``tests/data/baseline/`` (made by ``tests/data/make_baseline.py``
at commit a93c0aa, before the weight convention and the causal methods were restructured); and (slow tier)
heads.csv of ``probe analyze`` on the embedded minilm and smollm2."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from conftest import DATA

_spec = importlib.util.spec_from_file_location("make_baseline", DATA / "make_baseline.py")
make_baseline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_baseline)
BASELINE = DATA / "baseline"
CASES = sorted(p.name for p in BASELINE.iterdir() if p.is_dir() and not p.name.endswith("-analyze"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return make_baseline.run_all(tmp_path_factory.mktemp("baseline"))


def assert_frames_equal_to_six_digits(now: pd.DataFrame, then: pd.DataFrame, where: str) -> None:
    """Same columns and rows; numeric cells within one unit of the sixth significant digit or 5e-6
    (float32 rounding of the O(1) logits an effect is a difference of: two CPUs' matrix kernels add in
    different orders, and an effect of 0.01 then moves in its sixth digit), text equal; group numbers
    (``cluster``) the same partition of the heads under some renaming (k-means numbers its groups in
    the order it finds them). A heads table's ``dtype`` column came later (the model's dtype beside its
    numbers): it must say float32, the dtype the stored values were measured in."""
    if "dtype" in now.columns and "dtype" not in then.columns:
        assert set(now["dtype"]) == {"float32"}, where
        now = now.drop(columns="dtype")
    assert list(now.columns) == list(then.columns), where
    assert len(now) == len(then), where
    for col in then.columns:
        a, b = now[col], then[col]
        if col == "cluster":
            pairs = set(zip(a.tolist(), b.tolist()))
            assert len(pairs) == len(set(a)) == len(set(b)), f"{where} {col}: another partition of the heads"
        elif pd.api.types.is_numeric_dtype(b) and pd.api.types.is_numeric_dtype(a):
            x, y = a.to_numpy(float), b.to_numpy(float)
            assert np.array_equal(np.isnan(x), np.isnan(y)), f"{where} {col}: missing values moved"
            ok = np.isclose(x, y, rtol=1e-5, atol=5e-6) | np.isnan(y)
            assert ok.all(), f"{where} {col}: {x[~ok]} != {y[~ok]}"
        else:
            assert a.astype(str).tolist() == b.astype(str).tolist(), f"{where} {col}"


def test_the_stored_cases_cover_both_commands_on_both_kinds():
    assert CASES == [f"{k}-{c}" for k in make_baseline.KINDS for c in ("effects", "patch")]


@pytest.mark.parametrize("case", CASES)
def test_effects_and_patch_csvs_equal_the_stored_values(runs, case):
    stored = sorted((BASELINE / case).glob("*.csv"))
    assert stored, case
    for path in stored:
        now = pd.read_csv(runs[case] / path.name)
        assert_frames_equal_to_six_digits(now, pd.read_csv(path), f"{case}/{path.name}")


@pytest.mark.slow
@pytest.mark.parametrize("alias", make_baseline.REALS)
def test_heads_csv_of_the_embedded_models_equals_the_stored_values(alias, tmp_path):
    path = make_baseline.run_real(alias, tmp_path / alias) / "heads.csv"
    assert_frames_equal_to_six_digits(pd.read_csv(path), pd.read_csv(BASELINE / f"{alias}-analyze" / "heads.csv"),
                                      f"{alias}-analyze/heads.csv")
