"""The weights | rollout | flow view (probe.view.rollout): its data equal the API's results, the report
section and the CLI switch, and the values drawn in Chromium equal the data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import probe
import probe.loading.models as pm
from conftest import CHROMIUM_ARGS, tiny_model
from probe.cli import main
from probe.entries.notebook import rollout_view
from probe.errors import InputError
from probe.measures.rollout_examples import kept_layers, run_rollout
from probe.report.sections import BUILDERS
from probe.view.rollout import DIGITS, RolloutView, rollout_data, rollout_section

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A <b>cat</b> sat.", "Short one here."]


@pytest.fixture(scope="module")
def tiny():
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = tiny_model(kind)
        return cache[kind]
    return get


@pytest.mark.parametrize("kind", ["bert", "llama", "t5"])
def test_section_data_equal_attention_rollout_and_attention_flow(tiny, kind):
    lm = tiny(kind)
    texts = [probe.Text(t, target="Ein Satz.") for t in TEXTS] if kind == "t5" else TEXTS
    result = probe.analyze(lm, texts, n_examples=3)
    record = run_rollout(lm, result, max_examples=2)
    assert [e.index for e in record.examples] == [ex.index for ex in result.examples[:2]]
    assert "1 more example kept by the run not shown" in record.notes
    data = rollout_data(record)
    for e, d in zip(record.examples, data["examples"]):
        text = next(x.text for x in result.examples if x.index == e.index)
        api = probe.attention_rollout(lm, text)
        flow = probe.attention_flow(lm, text, rows="reported")
        np.testing.assert_allclose(e.rollout.matrix, api.matrix, atol=1e-12)
        np.testing.assert_allclose(e.flow.row, flow.row, atol=1e-12)
        assert d["tokens"] == api.tokens and d["row"] == api.row_index
        np.testing.assert_array_equal(np.array(d["rollout"]), np.round(api.matrix, DIGITS))
        np.testing.assert_array_equal(np.array(d["flow"]), np.round(flow.row, DIGITS))
        # the weights are the head means of the layers kept, from the model's own captured maps
        captured = probe.capture_attention(lm, [probe.Text(text, target="Ein.") if kind == "t5" else text])
        sites = [s for s in lm.sites if s.stack == api.stack and s.kind == "self"]
        n = len(api.tokens)
        for k, layer in enumerate(d["layers"]):
            mean = captured[sites[layer]][0, :, :n, :n].double().mean(0).numpy()
            np.testing.assert_allclose(np.array(d["weights"][k]), np.round(mean, DIGITS), atol=1.01 * 10 ** -DIGITS)
        assert any("encoder stack only" in note for note in d["notes"]) == (kind == "t5")
    section = rollout_section(type(result)(**{**result.__dict__, "results": {"rollout": record}}))
    assert section.id == "rollout" and section.record["examples"][0]["flow"] is True
    assert "<b>cat</b>" not in section.html  # tokens are data: escaped JSON, set as text by the script
    assert rollout_section in BUILDERS and rollout_section(result) is None  # not run: no section


def test_flow_above_the_limit_is_left_out_counted_and_said(tiny):
    lm = tiny("bert")
    result = probe.analyze(lm, TEXTS, n_examples=3)
    lengths = {ex.index: ex.n_tokens for ex in result.examples}
    limit = sorted(lengths.values())[1]
    record = run_rollout(lm, result, max_flow_tokens=limit)
    over = [e.index for e in record.examples if lengths[e.index] > limit]
    assert over and [e.index for e in record.examples if e.flow is None] == over
    assert any(note.startswith(f"flow not computed for {len(over)} example") for note in record.notes)
    assert all(np.isfinite(e.rollout.matrix).all() for e in record.examples)  # rollout for every example


def test_kept_layers_fit_the_budget_and_keep_the_last():
    assert kept_layers(6, 64) == [0, 1, 2, 3, 4, 5]
    layers = kept_layers(30, 64, budget=5 * 64 * 64)
    assert len(layers) == 5 and layers[-1] == 29 and layers[0] == 0
    assert kept_layers(30, 512, budget=100) == [29]


def test_rollout_view_of_a_text_and_its_page(tiny, tmp_path):
    lm = tiny("gpt2")
    view = rollout_view(lm, TEXTS[0], max_flow_tokens=4)
    assert isinstance(view, RolloutView) and view.record.examples[0].flow is None
    assert "flow not computed" in view.record.notes[0] and "max_flow_tokens" in view.record.notes[0]
    assert view._repr_html_().startswith('<div class="probe-rv"')
    page = view.save(tmp_path / "rv.html").read_text()
    assert "Content-Security-Policy" in page and "</script><script>" in page
    with pytest.raises(InputError):
        rollout_view(lm, "")


def test_cli_switch_and_the_summary_timing(tiny, tmp_path, monkeypatch):
    lm = tiny("bert")
    monkeypatch.setattr(pm, "load_model", lambda name, **kw: lm)
    for flag, shown in (("--rollout", True), ("--no-rollout", False)):
        out = tmp_path / flag
        res = CliRunner().invoke(main, ["analyze", "--text", TEXTS[0], "--text", TEXTS[1], "--out", str(out),
                                        "--no-progress", "--no-distance", flag])
        assert res.exit_code == 0, res.output + repr(res.exception)
        record = json.loads((out / "run.json").read_text())
        assert ("rollout_s" in record["timings_s"]) == shown
        assert ("rollout " in res.stdout.split(" in ")[-1]) == shown  # the summary line's parts
        assert ('id="probe-rv-report"' in (out / "index.html").read_text()) == shown


# --------------------------------------------------------------------------- in a real browser

CSP_WATCH = ("window.__csp = []; document.addEventListener('securitypolicyviolation', "
             "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")


@pytest.mark.browser
def test_drawn_bars_are_the_data_and_a_click_picks_the_row(chromium, tiny, tmp_path):
    sync_api, path = chromium
    lm = tiny("bert")
    view = rollout_view(lm, TEXTS[1])
    ex = view.data["examples"][0]
    url = view.save(tmp_path / "rv.html").as_uri()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        page = b.new_page(viewport={"width": 900, "height": 700})
        messages, requests = [], []
        page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
        page.on("request", lambda r: requests.append(r.url))
        page.add_init_script(CSP_WATCH)
        page.goto(url)
        page.wait_for_selector(".probe-rv[data-draws='1']")
        api = "document.querySelector('.probe-rv').probeRollout"
        drawn = page.evaluate(f"{api}.drawn()")
        i, last = ex["row"], len(ex["layers"]) - 1
        for kind, expected in (("w", ex["weights"][last][i]), ("r", ex["rollout"][i]), ("f", ex["flow"])):
            assert [d["v"] for d in drawn[kind]] == expected
            np.testing.assert_allclose([d["width"] for d in drawn[kind]], expected, atol=1e-9)
        page.screenshot(path=str(tmp_path / "rollout.png"), full_page=True)
        k = len(ex["tokens"]) - 2
        pt = page.evaluate(f"{api}.token({k})")
        page.mouse.click(pt["x"], pt["y"])
        assert page.evaluate(f"{api}.state()")["row"] == k
        drawn = page.evaluate(f"{api}.drawn()")
        assert [d["v"] for d in drawn["r"]] == ex["rollout"][k] and drawn["f"] == []
        assert "reported row only" in page.inner_text(".probe-rv")
        page.select_option(".probe-rv select.rv-layer", "0")
        assert [d["v"] for d in page.evaluate(f"{api}.drawn()")["w"]] == ex["weights"][0][k]
        texts = page.evaluate("[...document.querySelectorAll('.probe-rv text.rv-tok')].map(t => t.textContent)")
        assert texts == ex["tokens"] and any("<" in t for t in texts)
        assert messages == [] and requests == [url] and page.evaluate("window.__csp") == []
        b.close()


def test_an_example_whose_text_does_not_give_its_tokens_back_is_left_out_and_said(tiny):
    """A sentence pair's example is re-encoded with its second segment (issue 27 item 3: it was left
    out); an example whose text no longer gives its tokens is left out with a note instead of showing
    another sequence's rollout."""
    from dataclasses import replace

    lm = tiny("bert")
    result = probe.analyze(lm, [probe.Text("A cat sat.", pair="A dog ran."), probe.Text("Hi.", pair="Hello there.")],
                           n_examples=2)
    record = run_rollout(lm, result)
    assert [e.index for e in record.examples] == [0, 1] and record.notes == []
    ex = result.examples[0]
    assert list(record.examples[0].rollout.tokens).count("[SEP]") == 2 == ex.ids.count(lm.tokenizer.sep_token_id)
    changed = replace(result, examples=[replace(ex, pair=None)])
    record = run_rollout(lm, changed)
    assert record.examples == []
    assert record.notes == ["example 1 left out: the text's tokens differ from the analysed ones"]


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_show_with_rollout_holds_the_rollout_view_of_the_same_text(tiny, kind, tmp_path):
    """show(lm, text, rollout=True): the head view with the weights | rollout | flow view below it,
    whose data are rollout_view's for the same text (and equal attention_rollout / attention_flow)."""
    lm = tiny(kind)
    text = "The cat sat on the mat because it was warm."
    view = probe.show(lm, text, rollout=True)
    alone = probe.rollout_view(lm, text)
    assert view.rollout is not None and view.rollout.data == alone.data
    want = probe.attention_rollout(lm, text)
    assert np.allclose(view.rollout.record.examples[0].rollout.matrix, want.matrix, atol=1e-12)
    html = view.to_html()
    assert html.count('class="probe-rv-data"') == 1 and 'class="probe-hv' in html
    page = view.save(tmp_path / "v.html").read_text(encoding="utf-8")
    assert page.count('class="probe-rv-data"') == 1 and "Content-Security-Policy" in page
    assert probe.show(lm, text).rollout is None  # off by default
