"""probe.pruning.experiment, curves and objectives: the held-out rule (no curve value from scoring
text), curve values against an independent evaluation, random mean and spread, the JSON shape,
schedules, the objectives (clm, mlm, fidelity, classification) and the input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config, tiny_model
from probe.capture.maps import encode, forward
from probe.causal.gates import gated, ones
from probe.causal.objectives import CausalLM, MaskedLM, default_objective, make_objective
from probe.errors import InputError
from probe.loading.models import from_pretrained_objects
from probe.pruning.curves import schedule
from probe.pruning.experiment import prune, split_corpus
from probe.pruning.removal import remove_heads
from probe.text.corpus import sample_texts

TEXTS = sample_texts()[:12]


def test_split_is_disjoint_deterministic_and_covers_the_corpus():
    score, held = split_corpus(20, 0.5, seed=0)
    assert len(score) == len(held) == 10
    assert not set(score) & set(held) and sorted(score + held) == list(range(20))
    assert split_corpus(20, 0.5, seed=0) == (score, held)
    assert split_corpus(20, 0.5, seed=1) != (score, held)
    assert split_corpus(5, 0.4) == tuple(map(sorted, split_corpus(5, 0.4)))
    with pytest.raises(InputError, match="corpus too small to split: 3 sequence"):
        split_corpus(3)


def test_schedule_hand_computed():
    assert schedule(8, 0, 0.5, 4) == [1, 2, 3, 4]
    assert schedule(72, 0, 0.5, 10) == [4, 7, 11, 14, 18, 22, 25, 29, 32, 36]
    assert schedule(8, 2, 0.5, 2) == [3, 4]  # two heads already removed count as pruned
    with pytest.raises(InputError, match="already removed"):
        schedule(8, 4, 0.5, 2)
    with pytest.raises(InputError, match="--steps 4 or fewer"):
        schedule(8, 0, 0.5, 5)


class Spy:
    """Wraps an objective and records which texts each call saw, with or without gradients."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.unit, self.at_optimum = inner.name, inner.unit, inner.at_optimum

    def setup(self, lm, batches):
        self.inner.setup(lm, batches)

    def losses(self, lm, batch):
        self.calls.append((torch.is_grad_enabled(), [t.text for t in batch.texts]))
        return self.inner.losses(lm, batch)


@pytest.fixture(scope="module")
def gpt2_run():
    lm = tiny_model("gpt2")
    spy = Spy(CausalLM())
    import probe.pruning.experiment as ex

    original = ex.make_objective
    ex.make_objective = lambda name, seed=0: spy
    try:
        result = prune(lm, TEXTS, steps=4, fraction=0.5, seeds=3)
    finally:
        ex.make_objective = original
    return lm, result, spy


def test_curve_values_come_from_held_out_text_only(gpt2_run):
    lm, result, spy = gpt2_run
    held = {TEXTS[i] for i in result.split["held_out_index"]}
    score = {TEXTS[i] for i in result.split["scoring_index"]}
    assert held and score and not held & score
    scored = {t for grad, texts in spy.calls if grad for t in texts}
    measured = {t for grad, texts in spy.calls if not grad for t in texts}
    assert scored == score  # importance saw exactly the scoring part
    assert measured == held  # every curve value (and the comparison passes) saw the held-out part


def _held_out_loss(lm, texts, mask):
    """Next-token loss (nats per predicted token) of the gated model, computed here from scratch."""
    total, count = 0.0, 0
    with torch.no_grad(), gated(lm, mask):
        for t in texts:
            batch = encode(lm, [t])
            logits = forward(lm, batch).logits[0]
            ids = batch.input_ids[0]
            total += float(F.cross_entropy(logits[:-1], ids[1:], reduction="sum"))
            count += len(ids) - 1
    return total / count


def test_curve_values_equal_an_independent_evaluation(gpt2_run):
    lm, result, _ = gpt2_run
    held = [TEXTS[i] for i in result.split["held_out_index"]]
    for order in ("importance", "redundancy"):
        rows = result.curves[result.curves["order"] == order]
        mask = ones(lm)
        for row in rows.itertuples():
            for layer, h in row.heads:
                mask[layer, h] = 0.0
            assert int((mask == 0).sum()) == row.n_pruned
            assert row.value == pytest.approx(_held_out_loss(lm, held, mask), rel=1e-5)


def test_random_curve_is_mean_and_sample_std_over_seeds(gpt2_run):
    _, result, _ = gpt2_run
    rnd = result.curves[result.curves["order"] == "random"]
    vals = result.random_values
    assert vals.shape == (3, 5)
    np.testing.assert_allclose(rnd["value"], vals.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rnd["std"], vals.std(0, ddof=1), rtol=1e-12, atol=1e-15)
    assert (vals[:, 0] == vals[0, 0]).all()  # step 0: the model as it is
    assert len({tuple(v) for v in vals[:, 1:]}) == 3  # different seeds, different orders


def test_json_has_exactly_the_documented_shape(gpt2_run):
    lm, result, _ = gpt2_run
    out = result.to_json()
    assert list(out) == ["model", "objective", "curves", "pruned_params", "params_before", "speedup"]
    assert out["objective"] == "clm" and out["model"] == lm.name
    assert list(out["curves"]) == ["importance", "redundancy", "random"]
    assert [p[0] for p in out["curves"]["importance"]] == [0.0, 0.125, 0.25, 0.375, 0.5]
    assert all(len(p) == 2 for p in out["curves"]["redundancy"])
    assert all(len(p) == 3 for p in out["curves"]["random"])
    assert out["params_before"] > out["pruned_params"] > 0 and out["speedup"] > 0
    assert result.max_abs_diff < 1e-4


def test_heads_pruned_by_the_first_order_are_removed_from_the_copy(gpt2_run):
    lm, result, _ = gpt2_run
    first = result.curves[result.curves["order"] == "importance"]
    named = [pair for heads in first["heads"] for pair in heads]
    assert sorted(named) == sorted(result.removed) and len(named) == 4
    assert result.pruned_lm.pruned.mask().sum() == 4
    frame = result.heads_frame()
    assert frame["pruned_step"].notna().sum() == 4
    assert np.isfinite(frame["importance"]).all() and np.isfinite(frame["nearest_js"]).all()
    assert lm.pruned is None  # the model given stays whole


def test_pruning_a_pruned_model_counts_removed_heads_as_pruned():
    lm = tiny_model("gpt2")
    remove_heads(lm, {0: [1]})
    res = prune(lm, TEXTS, steps=2, fraction=0.5, orders=["importance", "random"], physical=False)
    assert res.n_start == 1
    assert res.curves["n_pruned"].tolist() == [1, 3, 4, 1, 3, 4]
    assert (0, 1) not in res.removed and np.isnan(res.importance[0, 1])


def test_mlm_masks_are_fixed_and_cover_15_percent_of_real_tokens():
    import transformers as tr

    from conftest import bert_tokenizer

    tok = bert_tokenizer()
    torch.manual_seed(0)
    lm = from_pretrained_objects(tr.BertForMaskedLM(tiny_config("bert", len(tok))), tok, name="tiny-mlm")
    assert default_objective(lm)[0] == "mlm"
    from probe.text.inputs import Text, iter_batches

    texts = [Text(t, meta={"index": i}) for i, t in enumerate(TEXTS[:4])]
    batches = list(iter_batches(lm, texts, batch_size=4))
    obj = MaskedLM(seed=0)
    obj.setup(lm, batches)
    ids, chosen = batches[0]._cache["probe.mlm"]
    b = batches[0]
    for row in range(len(b)):
        candidates = int((b.real[row] & ~b.special[row]).sum())
        assert int(chosen[row].sum()) == max(1, round(0.15 * candidates))
        assert not (chosen[row] & (b.special[row] | ~b.real[row])).any()
    assert (ids[chosen] == lm.tokenizer.mask_token_id).all() and (ids[~chosen] == b.input_ids[~chosen]).all()
    again = list(iter_batches(lm, texts, batch_size=4))
    obj.setup(lm, again)
    assert torch.equal(again[0]._cache["probe.mlm"][1], chosen)
    logits = forward(lm, b, input_ids=ids).logits
    want = F.cross_entropy(logits[chosen], b.input_ids[chosen], reduction="none")
    torch.testing.assert_close(obj.losses(lm, b), want)


def test_classification_objective_and_labels():
    import transformers as tr

    from conftest import bert_tokenizer

    tok = bert_tokenizer()
    cfg = tiny_config("bert", len(tok))
    cfg.num_labels, cfg.id2label, cfg.label2id = 2, {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    torch.manual_seed(0)
    lm = from_pretrained_objects(tr.BertForSequenceClassification(cfg), tok, name="tiny-cls")
    labels = ["pos", "neg", "1", "0"] * 3
    res = prune(lm, TEXTS, labels=labels, steps=2, fraction=0.5, orders=["importance", "random"], physical=False)
    assert res.objective == "classification"
    held = res.split["held_out_index"]
    ids = [1, 0, 1, 0] * 3
    with torch.no_grad():
        batch = encode(lm, [TEXTS[i] for i in held])
        logits = forward(lm, batch).logits
    want = float(F.cross_entropy(logits, torch.tensor([ids[i] for i in held])))
    assert res.curves["value"].iloc[0] == pytest.approx(want, rel=1e-5)
    with pytest.raises(InputError, match="label 1 .*'maybe'"):
        prune(lm, TEXTS, labels=["maybe"] * 12, steps=2)
    with pytest.raises(InputError, match="11 labels for 12 sequences"):
        prune(lm, TEXTS, labels=labels[:11], steps=2)


def test_default_objectives_and_wrong_objectives():
    bert, gpt2 = tiny_model("bert"), tiny_model("gpt2")
    assert default_objective(bert)[0] == "fidelity" and default_objective(gpt2)[0] == "clm"
    with pytest.raises(InputError, match="needs an encoder loaded with its masked-LM head"):
        prune(bert, TEXTS, objective="mlm", steps=2)
    with pytest.raises(InputError, match="needs a decoder with a language-model head"):
        prune(bert, TEXTS, objective="clm", steps=2)
    res = prune(gpt2, TEXTS, objective="fidelity", steps=2, orders=["importance", "random"], physical=False)
    assert res.curves["value"].iloc[0] == pytest.approx(0.0, abs=1e-6)  # the unpruned model is its reference
    with pytest.raises(InputError, match="unknown objective"):
        make_objective("bleu")


@pytest.mark.parametrize("kwargs,match", [
    ({"fraction": 1.0}, r"fraction must be in \(0, 1\)"), ({"fraction": 0}, r"fraction must be in \(0, 1\)"),
    ({"seeds": 2}, "seeds must be at least 3"), ({"orders": ["importance", "worst"]}, "orders must be"),
    ({"steps": 0}, "steps must be at least 1"),
])
def test_bad_settings_are_input_errors(kwargs, match):
    lm = tiny_model("bert")
    with pytest.raises(InputError, match=match):
        prune(lm, TEXTS, **kwargs)
    with pytest.raises(InputError, match="corpus too small to split"):
        prune(lm, TEXTS[:3])


@pytest.mark.parametrize("orders, seeds", [(("importance", "redundancy", "random"), 3), (("random",), 4),
                                           (("redundancy",), 3), (("importance", "random"), 3)])
def test_the_estimate_counts_every_scoring_pass_and_evaluation_the_curves_make(orders, seeds, monkeypatch):
    """planned_calls equals the calls the run makes (the Tally's counts at the end), and the one line says the
    calls left once every kind still to come has a pace, each at its latest call's time, the run's first call
    (the scoring of the model as given) not counted as a pace (a scripted clock: every call takes one tick)."""
    from probe.pruning import curves
    from probe.runs import pace

    ticks = iter(range(10_000))
    monkeypatch.setattr(pace, "clock", lambda: float(next(ticks)))
    monkeypatch.setattr(pace, "LONG_S", 0.0)
    made = []
    real = pace.Tally

    def tally(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr("probe.pruning.experiment.Tally", tally)
    lines = []
    lm = tiny_model("gpt2")
    prune(lm, TEXTS, orders=orders, steps=3, fraction=0.5, seeds=seeds, batch_size=4, physical=False,
          estimate=lines.append)
    (t,) = made
    assert t.done == t.totals == curves.planned_calls(orders, 3, seeds)
    greedy = sum(o != "random" for o in orders)
    assert t.totals == {"scoring passes": greedy * 3 - (greedy - 1) if greedy else 1,
                        "evaluations": 1 + 3 * (greedy + (seeds if "random" in orders else 0))}
    assert len(lines) == 1, lines
    # calls: scoring of the model as given (the run's first: no pace), evaluation of step 0; random only: then
    # every kind left has a pace; greedy: evaluation after step 1, then the next step's scoring
    left = ({"scoring passes": t.totals["scoring passes"] - 2, "evaluations": t.totals["evaluations"] - 2} if greedy
            else {"scoring passes": 0, "evaluations": t.totals["evaluations"] - 1})
    parts = " and ".join(f"{n:,} {k} (1.00 s each)" for k, n in left.items() if n)
    assert lines[0] == (f"pruning curves: {parts} left, about {pace.duration(sum(left.values()))} on this machine "
                        "as loaded now")
