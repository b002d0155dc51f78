"""Head ablation effects (probe.effects): the ablation against weight surgery and explicit means,
the random baseline's selection, the intervals against independent computations, the induction
claim's loss, and ``probe effects`` end to end."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch
from click.testing import CliRunner

from conftest import save_tiny, tiny_model
from probe.architectures import site_outputs
from probe.capture.maps import encode, forward
from probe.cli import main
from probe.effects import ablating, head_effects, head_means, label_groups, paired_bootstrap, random_sets, t_interval
from probe.effects.ablation import repeat_batch
from probe.effects.groups import head_groups
from probe.effects.icl import icl_claim, windows
from probe.effects.induction import PositionLoss, induction_claim
from probe.effects.measure import EFFECT_COLUMNS, LABEL_COLUMNS
from probe.effects.report import section
from probe.errors import InputError
from probe.patterns.circuits import adds_bos, repeated_random_tokens

TEXTS = ["The cat sat on the mat.", "A dog barked at the mailman twice.", "Rain fell all night long.",
         "She read the letter and smiled.", "They built a small house by the river.", "Birds sing at dawn."]


def _out(lm, batch) -> torch.Tensor:
    out = forward(lm, batch)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _o(lm, layer: int):
    return [o for site, o in site_outputs(lm.model, lm.spec) if site.layer == layer][0]


def _surgery(lm, layer: int, head: int):
    """A copy of ``lm`` whose output projection in ``layer`` ignores ``head`` (its input columns zeroed)."""
    twin = copy.copy(lm)
    twin.model = copy.deepcopy(lm.model)
    o, dh = _o(twin, layer), lm.geometry.d_head
    with torch.no_grad():
        if type(o).__name__ == "Conv1D":  # GPT-2: weight [in, out]
            o.weight[head * dh:(head + 1) * dh, :] = 0
        else:
            o.weight[:, head * dh:(head + 1) * dh] = 0
    return twin


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_zero_ablation_equals_weight_surgery(kind):
    lm = tiny_model(kind)
    batch = encode(lm, TEXTS[:3])
    heads = [(0, 1), (1, 3), (1, 0)]  # one copy of the batch per head, in one pass
    sets = torch.zeros(len(heads), lm.geometry.n_layers, lm.geometry.n_heads, dtype=torch.bool)
    for c, (layer, h) in enumerate(heads):
        sets[c, layer, h] = True
    rep = repeat_batch(batch, len(heads))
    with torch.no_grad(), ablating(lm, "zero") as state:
        state.arm(lm, sets, rep)
        ablated = _out(lm, rep)
        state.disarm()
        clean = _out(lm, batch)
    real = batch.real
    B = len(batch)
    for c, (layer, h) in enumerate(heads):
        with torch.no_grad():
            expected = _out(_surgery(lm, layer, h), batch)
        got = ablated[c * B:(c + 1) * B]
        assert (got[real] - expected[real]).abs().max() <= 1e-6
        assert (got[real] - clean[real]).abs().max() > 1e-4  # the head mattered: the test can fail


def _explicit_means(lm, batches, layer: int) -> torch.Tensor:
    """[P, heads, d_head] the output projection's input of ``layer``, averaged by a plain hook."""
    got = []
    handle = _o(lm, layer).register_forward_pre_hook(lambda m, a: got.append(a[0].detach().double()))
    with torch.no_grad():
        for b in batches:
            forward(lm, b)
    handle.remove()
    H, dh = lm.geometry.n_heads, lm.geometry.d_head
    xs = [x.reshape(*x.shape[:2], H, dh) for x in got]
    reals = [b.real for b in batches]
    if lm.kind == "decoder":
        first = torch.cat([x[:, 0][r[:, 0]] for x, r in zip(xs, reals)]).mean(0)
        rest = torch.cat([x[:, 1:][r[:, 1:]] for x, r in zip(xs, reals)]).mean(0)
        return torch.stack([first, rest]).float()
    return torch.cat([x[r] for x, r in zip(xs, reals)]).mean(0)[None].float()


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_mean_ablation_equals_explicit_replacement(kind):
    lm = tiny_model(kind)
    ref = [encode(lm, TEXTS[:3]), encode(lm, TEXTS[3:])]
    means = head_means(lm, ref)
    for layer in range(lm.geometry.n_layers):
        assert torch.allclose(means[layer], _explicit_means(lm, ref, layer), atol=1e-6)
    layer, h, dh = 1, 2, lm.geometry.d_head
    batch = encode(lm, TEXTS[:2])
    sets = torch.zeros(1, lm.geometry.n_layers, lm.geometry.n_heads, dtype=torch.bool)
    sets[0, layer, h] = True
    with torch.no_grad(), ablating(lm, "mean", means) as state:
        state.arm(lm, sets, batch)
        got = _out(lm, batch)

    def replace(module, args):  # independent: overwrite the head's slice position by position
        x = args[0].clone()
        mu = means[layer, :, h]  # [P, d_head]
        x[:, :, h * dh:(h + 1) * dh] = mu[-1]
        x[:, 0, h * dh:(h + 1) * dh] = mu[0]
        return (x,)

    handle = _o(lm, layer).register_forward_pre_hook(replace)
    with torch.no_grad():
        expected = _out(lm, batch)
    handle.remove()
    assert (got[batch.real] - expected[batch.real]).abs().max() <= 1e-6


def test_random_sets_exclude_the_group():
    group = [(0, 1), (1, 2), (1, 3)]
    sets = random_sets(group, 2, 4, seeds=10)
    assert len(sets) == 10 and all(len(s) == 3 for s in sets)
    assert all(not set(s) & set(group) for s in sets)
    assert len({tuple(s) for s in sets}) > 1  # seeds differ
    assert sets == random_sets(group, 2, 4, seeds=10)  # and are fixed
    big = [(0, h) for h in range(4)] + [(1, 0)]  # 5 of 8 heads: only 3 outside, so all heads are the pool
    assert any(set(s) & set(big) for s in random_sets(big, 2, 4, seeds=10))
    with pytest.raises(InputError, match="at least 5"):
        random_sets(group, 2, 4, seeds=4)


def test_t_interval_against_scipy():
    v = np.array([0.3, 0.1, 0.45, 0.2, 0.27, 0.05, 0.33])
    mean, std, low, high = t_interval(v)
    lo, hi = scipy.stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=scipy.stats.sem(v))
    assert mean == pytest.approx(v.mean()) and std == pytest.approx(v.std(ddof=1))
    assert (low, high) == pytest.approx((lo, hi), rel=1e-10)


def test_paired_bootstrap_against_a_loop():
    rng = np.random.default_rng(3)
    units = rng.integers(1, 9, size=12).astype(float)
    delta = rng.normal(size=(2, 12)) * units
    effect, low, high = paired_bootstrap(delta, units)
    draws = np.random.default_rng(0)
    for s in range(2):
        stats = []
        for _ in range(1000):
            i = draws.integers(0, 12, 12)
            stats.append(delta[s, i].sum() / units[i].sum())
        draws = np.random.default_rng(0)  # every set sees the same resamples
        assert effect[s] == pytest.approx(delta[s].sum() / units.sum())
        assert (low[s], high[s]) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])), rel=1e-12)


def _heads(lm, labels: dict) -> pd.DataFrame:
    g = lm.geometry
    rows = [{"layer": a, "head": b, "labels": labels.get((a, b), "")} for a in range(g.n_layers)
            for b in range(g.n_heads)]
    return pd.DataFrame(rows)


def test_head_effects_tables():
    lm = tiny_model("llama")
    heads = _heads(lm, {(0, 1): "x;y", (1, 2): "y"})
    r = head_effects(lm, TEXTS * 2, heads=heads, kinds=("zero", "mean", "resample"), seeds=5, copies=3)
    assert head_effects(lm, TEXTS, heads=False, seeds=5).labels.empty
    g = lm.geometry
    assert list(r.heads.columns) == ["stack", "kind", "layer", "head", *EFFECT_COLUMNS]
    assert len(r.heads) == g.n_layers * g.n_heads
    assert (r.heads["effect_zero_low"] <= r.heads["effect_zero"]).all()
    assert list(r.labels.columns) == list(LABEL_COLUMNS)
    assert label_groups(heads) == {"x": [(0, 1)], "y": [(0, 1), (1, 2)]}
    one = r.labels[(r.labels["label"] == "x")].set_index("ablation")
    row = r.heads[(r.heads["layer"] == 0) & (r.heads["head"] == 1)].iloc[0]
    for kind in ("zero", "mean", "resample"):  # a one-head group is that head's own ablation
        assert one.loc[kind, "effect"] == pytest.approx(row[f"effect_{kind}"], abs=1e-12)
        assert one.loc[kind, "effect_low"] == pytest.approx(row[f"effect_{kind}_low"], abs=1e-12)
    again = head_effects(lm, TEXTS * 2, heads=heads, kinds=("resample", "mean", "zero"), seeds=5,
                         copies=1)  # copies (and the order of the kinds) change nothing but speed
    assert np.allclose(again.heads[list(EFFECT_COLUMNS)], r.heads[list(EFFECT_COLUMNS)], atol=1e-5)


def test_the_ablation_passes_time_is_said_once_after_the_second_where_it_is_long(monkeypatch, tmp_path):
    """``probe effects`` on the README's corpus printed its start line, then nothing for 44 s: once its second
    ablation pass has run, the passes left at that pass's pace are said in one line where they reach 10 s
    (probe.runs.pace.LONG_S), once; the first pass (one-off costs) is not the measure; the effects are the
    same with or without the line."""
    import time

    from probe.runs import pace

    lm = tiny_model("llama")
    heads = _heads(lm, {(0, 1): "x;y", (1, 2): "y"})
    ticks = iter(range(0, 10_000, 3))  # each reading of the clock 3 s after the last
    monkeypatch.setattr(pace, "clock", lambda: float(next(ticks)))
    lines: list[str] = []
    said = head_effects(lm, TEXTS * 2, heads=heads, seeds=5, copies=3, estimate=lines.append)
    passes = said.settings["passes"]
    assert passes >= 6
    assert lines == [f"ablation passes: 2 of {passes} run, 3.00 s each after the first; about "
                     f"{pace.duration(3.0 * (passes - 2))} left on this machine as loaded now"]
    quiet: list[str] = []
    monkeypatch.setattr(pace, "LONG_S", 3.0 * passes)  # more than the passes left would take: nothing said
    silent = head_effects(lm, TEXTS * 2, heads=heads, seeds=5, copies=3, estimate=quiet.append)
    assert quiet == []
    pd.testing.assert_frame_equal(said.heads, silent.heads)
    pd.testing.assert_frame_equal(said.labels, silent.labels)
    # the counter updates the bar it is given once per pass, as the bar was before
    counted = SimpleNamespace(n=0)
    counter = pace.Passes(4, "passes", None, SimpleNamespace(update=lambda n: setattr(counted, "n", counted.n + n)))
    for _ in range(4):
        counter.update(1)
    assert counted.n == 4 and counter.said == []
    # the command prints it on stderr (the threshold lowered: a tiny model's passes take milliseconds)
    monkeypatch.setattr(pace, "clock", time.perf_counter)
    monkeypatch.setattr(pace, "LONG_S", 0.0)
    model = save_tiny("llama", tmp_path / "model")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS * 2), encoding="utf-8")
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--corpus", str(corpus), "--seeds", "5",
                                    "--out", str(tmp_path / "run"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert len([ln for ln in res.stderr.splitlines() if ln.startswith("ablation passes: 2 of ")]) == 1, res.stderr


def test_head_groups_from_the_cluster_column():
    lm = tiny_model("bert")
    heads = _heads(lm, {(0, 0): "x"})
    heads["cluster"] = [0, 1, 0, -1, 2, 2, 1, 0]
    assert head_groups(heads) == {"cluster 0": [(0, 0), (0, 2), (1, 3)], "cluster 1": [(0, 1), (1, 2)],
                                  "cluster 2": [(1, 0), (1, 1)]}
    heads["group"] = [3] * 8  # the Jensen-Shannon grouping wins where the table has one
    assert head_groups(heads) == {"group 3": [(a, b) for a in range(2) for b in range(4)]}
    r = head_effects(lm, TEXTS, heads=heads.drop(columns=["group"]), seeds=5, clusters=True)
    assert sorted(set(r.labels["label"])) == ["cluster 0", "cluster 1", "cluster 2", "x"]


def test_induction_loss_is_the_mean_over_the_copyable_half():
    lm = tiny_model("llama")
    heads = _heads(lm, {})
    heads["induction"] = np.arange(len(heads), dtype=float)
    means = head_means(lm, [encode(lm, TEXTS)])
    claim = induction_claim(lm, heads, means, seeds=5)
    assert claim["group"] == ["L1H3", "L1H2", "L1H1", "L1H0", "L0H3"]
    ids, offset = repeated_random_tokens(lm.tokenizer)
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(input_ids=ids).logits.float(), -1)
    n = 25
    t = torch.arange(n + 1, 2 * n) + offset
    expected = -logp[:, t - 1].gather(-1, ids[:, t][..., None]).mean()
    assert claim["clean"]["induction_loss"] == pytest.approx(float(expected), abs=1e-5)
    for kind in ("zero", "mean"):
        k = claim[kind]
        assert k["delta"] == pytest.approx(k["ablated"] - claim["clean"]["induction_loss"])
        assert k["supported"] == (k["delta"] > max(2 * k["random_mean"], k["random_high"]))
    assert PositionLoss(2, 3).unit == "nats/token"


def test_cli_end_to_end(tmp_path):
    model = save_tiny("llama", tmp_path / "model")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS * 2), encoding="utf-8")
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--corpus", str(corpus), "--seeds", "5",
                                    "--ablation", "resample,zero,mean", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    effects = pd.read_csv(out / "effects.csv")
    assert len(effects) == 8 and set(EFFECT_COLUMNS) <= set(effects.columns)
    heads = pd.read_csv(out / "heads.csv")
    assert np.allclose(heads["effect_mean"], effects["effect_mean"], atol=1e-5)
    labels = pd.read_csv(out / "label_effects.csv")
    assert list(labels.columns) == list(LABEL_COLUMNS) and len(labels) > 0
    record = json.loads((out / "run.json").read_text())["effects"]
    assert record["objective"] == "clm" and record["induction"]["seeds"] == 5
    page = (out / "index.html").read_text()
    assert "Head ablation effects" in page and "effects-mean" in page and "Induction claim" in page
    assert "note: icl_score not measured: icl_score needs windows of 512 tokens" in res.output


@pytest.mark.parametrize("args, code, message", [
    (["--seeds", "3"], 2, "--seeds"),
    (["--ablation", "zero,shuffle"], 2, "unknown ablation 'shuffle'"),
    (["--limit", "2"], 1, "too small"),
])
def test_cli_bad_input_is_one_error_line(tmp_path, args, code, message):
    model = save_tiny("bert", tmp_path / "model")
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--out", str(tmp_path / "run"), *args])
    assert res.exit_code == code
    errors = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert len(errors) == 1 and message in errors[0], res.output
    assert "Traceback" not in res.output


def test_cli_refuses_encoder_decoder(tmp_path):
    model = save_tiny("bart", tmp_path / "model")
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--out", str(tmp_path / "run")])
    assert res.exit_code == 1 and res.output.count("Error:") == 1 and "encoder-decoder" in res.output


def test_icl_score_windows_and_clean_value():
    lm = tiny_model("llama")  # 64 positions: the value is checked on short windows, the 512-token windows' layout apart
    words = "the cat sat on a mat while dogs ran past the old barn and rain fell".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, 40)) for _ in range(700)]
    rows = windows(lm.tokenizer, texts)
    assert len(rows) >= 50 and all(500 <= len(r) <= 512 for r in rows)
    eos = lm.tokenizer.eos_token_id
    stream = []
    for t in texts:
        stream += lm.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]
    lead = 1 if adds_bos(lm.tokenizer) else 0
    assert rows[1][lead:] == stream[512 - lead:2 * (512 - lead)]  # consecutive, joined by EOS
    means = head_means(lm, [encode(lm, TEXTS)])
    short = texts[:90]
    claim = icl_claim(lm, short, [(0, 1), (1, 2)], means, seeds=5, copies=7, batch_size=32, length=64, late=60,
                      early=10)
    rows = windows(lm.tokenizer, short, 64, 60)
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(input_ids=torch.tensor(rows)).logits.float(), -1)
    nll = -logp.gather(-1, torch.tensor(rows)[:, 1:, None])[..., 0]  # [windows, 63]: nll[:, k - 2] = l_k
    expected = (nll[:, 58] - nll[:, 8]).double()
    assert claim["windows"] == len(rows) >= 50
    assert claim["clean"]["icl_score"] == pytest.approx(float(expected.mean()), abs=1e-4)
    assert claim["clean"]["low"] <= claim["clean"]["icl_score"] <= claim["clean"]["high"]
    for kind in ("zero", "mean"):
        k = claim[kind]
        assert k["lost"] == (k["delta"] > max(2 * k["random_mean"], k["random_high"]))
    with pytest.raises(InputError, match="at least 50 windows"):
        icl_claim(lm, texts[:40], [(0, 1)], means, length=64, late=60, early=10)
    with pytest.raises(InputError, match="windows of 512 tokens"):
        icl_claim(lm, texts, [(0, 1)], means)


def test_cli_keeps_a_folder_it_did_not_write(tmp_path):
    model = save_tiny("bert", tmp_path / "model")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--out", str(out), "--force"])
    assert res.exit_code == 1 and res.output.count("Error:") == 1
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine" and sorted(p.name for p in out.iterdir()) == [
        "notes.txt"]


def test_compare_shows_effect_differences_between_two_runs(tmp_path):
    """probe compare of two effects runs: every head's effect difference B - A, as the runs' own
    effects.csv give it (the effects columns travel in heads.csv like any statistic)."""
    model = save_tiny("llama", tmp_path / "model")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS * 2), encoding="utf-8")
    runs = []
    for name, objective in (("a", "clm"), ("b", "fidelity")):  # two objectives: different effects per head
        out = tmp_path / name
        res = CliRunner().invoke(main, ["effects", "--model", str(model), "--corpus", str(corpus), "--seeds", "5",
                                        "--objective", objective, "--out", str(out), "--no-progress"])
        assert res.exit_code == 0, res.output
        runs.append(pd.read_csv(out / "effects.csv").set_index(["layer", "head"]))
    res = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(tmp_path / "b"),
                                    "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    cmp = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index(["layer", "head"])
    for column in ("effect_zero", "effect_mean"):
        want = (runs[1][column] - runs[0][column]).reindex(cmp.index)
        assert np.allclose(cmp[f"delta_{column}"], want, atol=1e-5)
        assert not np.allclose(want, 0)
    assert "effect_zero" in (tmp_path / "cmp" / "index.html").read_text(encoding="utf-8")


def test_label_table_says_what_the_random_baseline_is_drawn_from():
    lm = tiny_model("llama")  # 8 heads: a 'prev' group of 2; of the 6 outside, 5 are primarily 'mixed'
    heads = _heads(lm, {(0, 1): "prev", (1, 2): "prev"})
    heads["label"] = ["mixed", "prev", "mixed", "mixed", "broad", "mixed", "prev", "mixed"]
    r = head_effects(lm, TEXTS, heads=heads, kinds=("zero",), seeds=5)
    row = r.labels.iloc[0]
    assert (row["label"], row["pool_heads"], row["pool_top"]) == ("prev", 6, "mixed")
    assert row["pool_top_share"] == pytest.approx(5 / 6) and row["heads"] == "L0H1 L1H2"
    assert any(n.startswith("prev: its random baseline is drawn from the 6 heads outside the group, 83% of them "
                            "primarily 'mixed'") for n in r.notes)
    page = section(SimpleNamespace(results={"effects": r}, heads=heads), None).html
    assert "6 heads, 83% mixed" in page and "L0H1 L1H2" in page and "Note: prev: its random baseline" in page
    low, high = row["effect_low"], row["effect_high"]
    assert f"{row['effect']:.4g} [{low:.4g}, {high:.4g}]" in page
