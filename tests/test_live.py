"""``probe live``: the model session's answers equal the library's, the server's API through Starlette's
TestClient (every route, every refusal, the token and Origin checks, a short load test), the command's
one-line errors and Ctrl-C, and the page in headless Chromium on a real uvicorn server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

import probe  # noqa: E402
from conftest import CHROMIUM_ARGS, ServedApp, invoke_cli, one_error, save_tiny, tiny_model  # noqa: E402
from probe.capture.maps import capture_attention, encode, forward  # noqa: E402
from probe.causal.gates import gated  # noqa: E402
from probe.causal.objectives import sentence_embedding  # noqa: E402
from probe.effects.ablation import ablating, head_means  # noqa: E402
from probe.effects.patching import patch_heads  # noqa: E402
from probe.live.api import answer  # noqa: E402
from probe.live.server import MAX_BODY, make_app  # noqa: E402
from probe.live.session import Latest, LiveSession, open_session, two_stack_refusal  # noqa: E402
from probe.measures.steps import head_steps  # noqa: E402
from probe.qk.labels import head_labels  # noqa: E402
from probe.qk.run import measure  # noqa: E402
from probe.settings import LiveSettings  # noqa: E402
from probe.text.corpus import sample_texts  # noqa: E402
from probe.text.pairfile import Pair  # noqa: E402
from probe.view.data import decoded_map  # noqa: E402
from probe.view.stepview import step_view_data  # noqa: E402

TEXT = "The cat sat on the mat and then it slept."
TOKEN = "t0k3n-for-tests"
HEADERS = {"X-Probe-Token": TOKEN}


@pytest.fixture(scope="module")
def enc():
    return LiveSession(tiny_model("bert"))


@pytest.fixture(scope="module")
def dec():
    return LiveSession(tiny_model("gpt2"))


@pytest.fixture(scope="module")
def client(dec):
    return TestClient(make_app(dec, TOKEN))


def post(client, route, body, headers=HEADERS, **kw):
    return client.post(f"/api/{route}", json=body, headers=headers, **kw)


# --------------------------------------------------------------------------- the session equals the library

@pytest.mark.parametrize("kind", ["enc", "dec"])
def test_edit_statistics_labels_and_maps_are_the_librarys(kind, request):
    """The grid is probe.analyze's heads table of the one text (every label, every statistic); the head view
    holds the layer's maps as capture_attention records them (to the view's 1/1000); the model view one
    thumbnail per head of every layer."""
    s = request.getfixturevalue(kind)
    r = json.loads(json.dumps(s.edit(TEXT, 1)))  # JSON-ready
    heads = probe.analyze(s.lm, [TEXT]).heads
    for row in heads.itertuples():
        assert r["grid"]["labels"][row.layer][row.head] == row.label
        for stat in ("prev", "first", "entropy", "max_weight"):
            assert r["grid"]["statistics"][stat][row.layer][row.head] == pytest.approx(getattr(row, stat), abs=1e-6)
    probs = capture_attention(s.lm, [TEXT])[1][0].numpy()   # [heads, n, n]
    hv = r["headView"]
    assert hv["layers"] == [1] and hv["tokens"] == r["tokens"] and len(r["tokens"]) == probs.shape[-1]
    for h in range(s.n_heads):
        np.testing.assert_allclose(decoded_map(hv, 0, h), probs[h], atol=5e-4 + 1e-6)
    mv = r["modelView"]
    assert len(mv["sites"]) == s.n_layers and all(len(site["heads"]) == s.n_heads for site in mv["sites"])


@pytest.mark.parametrize("kind", ["enc", "dec"])
def test_head_steps_and_why_are_the_librarys(kind, request):
    """The steps are step_view_data(head_steps(...)); why is probe.why's split at the query: every listed
    pair's contribution is C_ij[a, b], and the check's sums equal the model's scores within tolerance."""
    s = request.getfixturevalue(kind)
    r = json.loads(json.dumps(s.head(TEXT, 1, 2, 4)))
    assert r["stepsRefusal"] is None and r["whyRefusal"] is None
    assert r["steps"] == json.loads(json.dumps(step_view_data(head_steps(s.lm, TEXT, 1, 2), site_index=1, query=4)))
    w = probe.why(s.lm, TEXT, (1, 2), 4)
    assert r["why"]["query"] == 4 and r["why"]["holds"] is True
    for c in r["why"]["checks"]:
        assert c["score"] == pytest.approx(float(w.scores[c["key"]]), abs=1e-9)
        assert abs(c["sum"] - c["score"]) <= r["why"]["tolerance"]
    frame = measure(s.lm, TEXT, (1, 2), 4).frame
    assert [p["contribution"] for p in r["why"]["pairs"]] == pytest.approx(frame["contribution"].tolist(), abs=1e-12)
    first = r["why"]["pairs"][0]
    a, b = w.sources.index(first["query_source"]), w.sources.index(first["key_source"])
    assert first["contribution"] == pytest.approx(float(w.contributions[a, b, first["key"]]), abs=1e-12)
    # the labels probe why shows beside the head and its sources: the labelling analysis' (probe.qk.labels)
    labels = head_labels(s.lm)
    assert r["why"]["label"] == labels["L1H2"] and r["why"]["labelsRefusal"] is None and r["why"]["labelsNote"]
    heads_named = 0
    for p in r["why"]["pairs"]:
        for side in ("query", "key"):
            source = p[f"{side}_source"]
            assert p[f"{side}_label"] == ("" if source == "(other pairs)" else labels.get(source, ""))
            heads_named += source in labels
    assert heads_named > 0  # layer 1's sources include layer 0's heads, each with its label


def test_why_without_head_labels_says_why_and_still_answers(monkeypatch):
    """A model whose labelling analysis is refused: why answers, its labels empty and the refusal's line beside."""
    import probe.live.session as session_module
    from probe.errors import UnsupportedAnalysisError

    def refuse(lm, **kw):
        raise UnsupportedAnalysisError("the labelling analysis does not run on this model")

    monkeypatch.setattr(session_module, "head_labels", refuse)
    s = LiveSession(tiny_model("gpt2"))
    w = s.head(TEXT, 1, 2, 4)["why"]
    assert w["labelsRefusal"] == "no head labels: the labelling analysis does not run on this model"
    assert w["label"] == "" and w["labelsNote"] is None and all(p["query_label"] == "" for p in w["pairs"])


def test_zero_ablation_equals_the_gated_model(dec, enc):
    """Zero ablation of two heads: the decoder's next-token probabilities after equal those of the model with
    those heads' gates at 0 (probe.causal.gates), before those of the model as it is; the encoder's cosine is
    the cosine of the gated model's sentence embedding to the plain one; the maps below the first ablated
    layer are unchanged and those after it are the gated model's."""
    heads = [[0, 1], [0, 3]]
    gates = torch.ones(2, 4)
    gates[0, 1] = gates[0, 3] = 0
    r = dec.ablate(TEXT, heads, "zero", 1)
    batch = encode(dec.lm, [TEXT])
    with torch.no_grad():
        plain = torch.softmax(forward(dec.lm, batch).logits[0, -1].double(), -1)
        with gated(dec.lm, gates):
            off = torch.softmax(forward(dec.lm, batch).logits[0, -1].double(), -1)
    for row in r["output"]["tokens"]:
        assert row["before"] == pytest.approx(float(plain[row["id"]]), abs=1e-6)
        assert row["after"] == pytest.approx(float(off[row["id"]]), abs=1e-6)
    assert r["output"]["after"] == torch.topk(off, len(r["output"]["after"])).indices.tolist()
    with torch.no_grad(), gated(dec.lm, gates):
        downstream = capture_attention(dec.lm, [TEXT])[1][0].numpy()
    clean = capture_attention(dec.lm, [TEXT])[1][0].numpy()
    after = np.stack([decoded_map(r["headView"], 0, h) for h in range(4)])
    np.testing.assert_allclose(after, downstream, atol=5e-4 + 1e-6)
    assert np.abs(after - clean).max() > 0.01  # layer 1 reads the heads switched off in layer 0
    r0 = dec.ablate(TEXT, heads, "zero", 0)
    np.testing.assert_allclose(np.stack([decoded_map(r0["headView"], 0, h) for h in range(4)]),
                               capture_attention(dec.lm, [TEXT])[0][0].numpy(), atol=5e-4 + 1e-6)

    e = enc.ablate(TEXT, heads, "zero", 0)
    b = encode(enc.lm, [TEXT])
    with torch.no_grad():
        ref = sentence_embedding(enc.lm, b)[0].double()
        with gated(enc.lm, gates):
            got = sentence_embedding(enc.lm, b)[0].double()
    assert e["output"]["kind"] == "embedding"
    assert e["output"]["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(ref, got, 0)), abs=1e-7)
    assert e["output"]["cosine"] < 0.9999
    # no head switched off: the same embedding, a cosine of 1 (not 1 + 2e-16, the rounding of the dot product,
    # as torch gives for this vector and itself)
    assert enc.ablate(TEXT, [], "zero", 0)["output"]["cosine"] == 1.0
    same = torch.randn(2, 384, generator=torch.Generator().manual_seed(0), dtype=torch.float64)[1].repeat(2, 1)
    assert float(torch.nn.functional.cosine_similarity(same[0], same[1], 0)) > 1.0
    assert enc._compare("embedding", same, None)["cosine"] == 1.0


@pytest.mark.parametrize("kind", ["enc", "dec"])
def test_an_ablation_reuses_the_unablated_output_of_its_texts_edit(kind, request):
    """The output before an ablation is kept from the text's edit (the same pass of the same ids): the ablation
    then runs the ablated copy alone, and answers what a session that never saw the text answers (both copies
    in one pass) to float rounding; a second ablation of that fresh session reuses its first one's copy."""
    from probe.architectures.modules import base_model

    s = request.getfixturevalue(kind)
    text, heads = "A text no other test runs, for the ablation.", [[0, 1], [1, 3]]
    rows: list[int] = []
    handle = base_model(s.lm.model).register_forward_pre_hook(
        lambda m, args, kwargs: rows.append(len(kwargs.get("input_ids", args[0] if args else None))), with_kwargs=True)
    try:
        fresh_session = LiveSession(s.lm)
        fresh = fresh_session.ablate(text, heads, "zero", 1)
        again = fresh_session.ablate(text, heads[:1], "zero", 1)
        s.edit(text, 1)
        got = s.ablate(text, heads, "zero", 1)
    finally:
        handle.remove()
    assert rows == [2, 1, 1, 1]  # both copies; then the ablated copy alone; the edit's pass; the ablated copy alone
    assert got["output"].keys() == fresh["output"].keys()
    if kind == "enc":
        assert got["output"]["cosine"] == pytest.approx(fresh["output"]["cosine"], abs=1e-6)
    else:
        assert got["output"]["before"] == fresh["output"]["before"] == again["output"]["before"]
        for a, b in zip(got["output"]["tokens"], fresh["output"]["tokens"]):
            assert a["id"] == b["id"] and a["before"] == pytest.approx(b["before"], abs=1e-6)
            assert a["after"] == pytest.approx(b["after"], abs=1e-6)
    for h in range(s.n_heads):
        np.testing.assert_allclose(decoded_map(got["headView"], 0, h), decoded_map(fresh["headView"], 0, h),
                                   atol=1e-3 + 1e-6)


def test_mean_ablation_uses_the_sample_texts_means(dec):
    """Mean ablation: each head's output replaced by its mean over the built-in sample text (head_means), the
    probabilities after equal those of the library's ablation context run on the text alone."""
    r = dec.ablate(TEXT, [[1, 0]], "mean", 1)
    texts = [t for t in sample_texts() if dec.n_tokens(t) <= dec.max_tokens]
    means = head_means(dec.lm, [encode(dec.lm, texts, dec.max_tokens)])
    batch = encode(dec.lm, [TEXT])
    sets = torch.zeros(1, 2, 4, dtype=torch.bool)
    sets[0, 1, 0] = True
    with torch.no_grad(), ablating(dec.lm, "mean", means) as state:
        state.arm(dec.lm, sets, batch)
        p = torch.softmax(forward(dec.lm, batch).logits[0, -1].double(), -1)
        state.disarm()
    for row in r["output"]["tokens"]:
        assert row["after"] == pytest.approx(float(p[row["id"]]), abs=1e-6)


def test_patching_effects_are_probe_patchs(dec):
    """The per-head effects are patch_heads' on the one pair, with the answers the session chose (the two
    texts' most probable next tokens)."""
    clean, corrupted = "The cat sat on the mat", "The dog sat on the mat"
    r = dec.patch(clean, corrupted)
    frame = patch_heads(dec.lm, [Pair(clean, corrupted, r["answer"], r["wrong"])])
    np.testing.assert_allclose(np.array(r["effect"]).ravel(), frame["effect"].to_numpy(), atol=1e-12)
    np.testing.assert_allclose(np.array(r["effectLast"]).ravel(), frame["effect_last"].to_numpy(), atol=1e-12)
    assert r["ldClean"] == pytest.approx(frame.attrs["ld_clean"])
    batch = encode(dec.lm, [clean])
    with torch.no_grad():
        top = forward(dec.lm, batch).logits[0, -1].argmax()
    assert dec.lm.tokenizer(r["answer"], add_special_tokens=False)["input_ids"][0] in (int(top),) or r["answer"]


def test_masked_lm_encoder_predicts_at_its_mask():
    """An encoder with its masked-LM head: the output before and after is the prediction at the [MASK] typed,
    each probability the model's own (plain, and with the head's gate at 0); without a [MASK] the panel says
    how to get one; patching runs on it (the library's effects)."""
    import transformers as tr

    from conftest import make_tokenizer, tiny_config

    tok = make_tokenizer("wordpiece")
    torch.manual_seed(0)
    lm = probe.from_pretrained_objects(tr.BertForMaskedLM(tiny_config("bert", len(tok))).eval(), tok, name="mlm")
    s = LiveSession(lm)
    text = "The cat sat on the [MASK] and slept."
    r = s.ablate(text, [[1, 3]], "zero", 1)
    batch = encode(lm, [text], parse_special_tokens=True)  # the [MASK] typed is the mask, as probe patch reads it
    at = batch.input_ids[0].tolist().index(tok.mask_token_id)
    gates = torch.ones(2, 4)
    gates[1, 3] = 0
    with torch.no_grad():
        plain = torch.softmax(forward(lm, batch).logits[0, at].double(), -1)
        with gated(lm, gates):
            off = torch.softmax(forward(lm, batch).logits[0, at].double(), -1)
    assert r["output"]["kind"] == "masked-lm" and r["output"]["position"] == at
    for row in r["output"]["tokens"]:
        assert row["before"] == pytest.approx(float(plain[row["id"]]), abs=1e-6)
        assert row["after"] == pytest.approx(float(off[row["id"]]), abs=1e-6)
    assert s.ablate(TEXT, [[1, 3]])["output"]["position"] is None
    p = s.patch(text, "The dog sat on the [MASK] and slept.")
    frame = patch_heads(lm, [Pair(text, "The dog sat on the [MASK] and slept.", p["answer"], p["wrong"])])
    np.testing.assert_allclose(np.array(p["effect"]).ravel(), frame["effect"].to_numpy(), atol=1e-12)


def _mlm_session():
    import transformers as tr

    from conftest import make_tokenizer, tiny_config

    tok = make_tokenizer("wordpiece")
    torch.manual_seed(0)
    lm = probe.from_pretrained_objects(tr.BertForMaskedLM(tiny_config("bert", len(tok))).eval(), tok, name="mlm")
    return LiveSession(lm)


def test_a_masked_lm_reads_its_mask_at_one_position_in_every_panel():
    """An encoder with its masked-LM head, a text holding [MASK]: the head panel's default query is the mask's
    position, the position the output panel predicts at; the steps and why read the mask as one token there
    (their tokens are the model's tokens with the mask parsed), the steps' probabilities at that row are the
    model's own attention (capture_attention with the mask parsed), why's scores are probe.why's on the text read
    the same way; a query given is kept, and a text without a mask opens at the last token."""
    s = _mlm_session()
    lm, text = s.lm, "The cat sat on the [MASK] and slept."
    batch = encode(lm, [text], parse_special_tokens=True)
    ids = batch.input_ids[0].tolist()
    at = ids.index(lm.tokenizer.mask_token_id)
    assert at == 6 and len(ids) == 11  # [CLS] the cat sat on the [MASK] and slept . [SEP]
    out = s.ablate(text, [[0, 1]])["output"]
    r = json.loads(json.dumps(s.head(text, 1, 2)))
    assert r["query"] == out["position"] == at and r["queryFrom"] == "mask"
    assert r["steps"]["query"] == at and r["steps"]["nq"] == len(ids) and r["steps"]["qTokens"][at] == "[MASK]"
    assert r["why"]["query"] == at and r["why"]["query_token"] == "[MASK]" and len(r["why"]["tokens"]) == len(ids)
    probs = capture_attention(lm, [text], parse_special_tokens=True)[1][0, 2].numpy()  # [T, T]
    nk = r["steps"]["nk"]
    np.testing.assert_allclose(r["steps"]["probs"][at * nk:(at + 1) * nk], probs[at], atol=1e-6)
    w = probe.why(lm, probe.Text(text, parse_special_tokens=True), (1, 2), at)
    for c in r["why"]["checks"]:
        assert c["score"] == pytest.approx(float(w.scores[c["key"]]), abs=1e-9)
    assert s.head(text, 1, 2, 3)["query"] == 3 and s.head(text, 1, 2, 3)["queryFrom"] == "given"
    plain = s.head(TEXT, 1, 2)
    assert plain["queryFrom"] == "last" and plain["query"] == len(lm.tokenizer(TEXT)["input_ids"]) - 1
    # a decoder reads a typed special token as text (as probe.why does): its default row is the last
    d = LiveSession(tiny_model("gpt2"))
    assert d.mask_position(text) is None and d.head(TEXT, 0, 0)["queryFrom"] == "last"


def test_a_text_reads_its_typed_special_tokens_only_when_asked():
    """probe.Text(..., parse_special_tokens=True) reads a typed [MASK] as the mask token, as the call's
    parse_special_tokens=True does; plain text keeps it as characters; one call's texts agree."""
    lm = tiny_model("bert")
    text = "a [MASK] b"
    mask = lm.tokenizer.mask_token_id
    asked = encode(lm, [probe.Text(text, parse_special_tokens=True)]).input_ids[0].tolist()
    assert asked == encode(lm, [text], parse_special_tokens=True).input_ids[0].tolist() and mask in asked
    assert mask not in encode(lm, [text]).input_ids[0].tolist()
    with pytest.raises(probe.errors.InputError, match="either all read their typed special tokens"):
        encode(lm, [probe.Text(text, parse_special_tokens=True), text])


def test_the_step_view_record_holds_the_sink_and_its_share():
    """gpt-oss's sink logits: the head panel's step record holds the layer's sink logit of the head at every
    query row, and 1 - the keys' probabilities (the share the step view draws in its sink row) is the softmax
    share of the sink column computed from the scaled scores of the kept keys."""
    from generic_models import generic_lm

    s = LiveSession(generic_lm("gpt_oss"))
    st = s.head(TEXT, 0, 2, 4)["steps"]
    sink = float(s.lm.model.model.layers[0].self_attn.sinks[2].detach())
    assert st["sink"] == pytest.approx([sink] * st["nq"], rel=1e-6)
    nk = st["nk"]
    for i in range(st["nq"]):
        keep = np.array(st["keep"][i * nk:(i + 1) * nk], bool)
        scaled = np.array(st["scaled"][i * nk:(i + 1) * nk], np.float64)[keep]
        m = max(scaled.max(), sink)
        share = np.exp(sink - m) / (np.exp(scaled - m).sum() + np.exp(sink - m))
        assert 1 - sum(st["probs"][i * nk:(i + 1) * nk]) == pytest.approx(share, abs=2e-6)


def test_the_step_view_draws_the_sink_row_and_n_a_for_a_missing_value_norm(chromium, tmp_path):
    """The head panel's step view (the live page's and the reports' stepview.js) on gpt-oss: below the keys a
    sink row holds the sink logit and the sink column's softmax share (computed here from the scaled scores), the
    status line says it; where the record's valueNorm is null (no output projection found) the value-norm and
    contribution cells read n/a, not NaN, blank or 0."""
    from generic_models import generic_lm

    from conftest import watched_page
    from probe.view.stepview import render_step_view

    s = LiveSession(generic_lm("gpt_oss"))
    st = s.head(TEXT, 0, 2, 0)["steps"]  # query 0: one key, the sink's share is large
    nk = st["nk"]
    sink = st["sink"][0]
    scaled = st["scaled"][0]
    share = np.exp(sink) / (np.exp(sink) + np.exp(scaled))
    missing = {**st, "valueNorm": [None] * nk}
    page_file = tmp_path / "sv.html"
    page_file.write_text("<!doctype html><meta charset='utf-8'><body>" + render_step_view(st, "a") +
                         render_step_view(missing, "b") + "</body>", encoding="utf-8")
    with watched_page(chromium, page_file) as (page, messages, requests):
        page.wait_for_selector("#b[data-query]")
        sv = "document.getElementById('{}').probeStepView"
        header = page.evaluate(f"{sv.format('a')}.header()")
        col = {name: i for i, name in enumerate(header)}
        row = page.evaluate(f"{sv.format('a')}.sink()")
        assert row[0] == "sink" and float(row[col["scaled"]]) == pytest.approx(sink, abs=5e-5)
        assert float(row[col["probability"]]) == pytest.approx(share, abs=5e-5) and share > 0.01
        assert f"sink logit {sink:.4f}" in page.evaluate(f"{sv.format('a')}.status()")
        assert len(page.evaluate(f"{sv.format('a')}.rows()")) == nk
        keys = page.evaluate(f"{sv.format('a')}.rows()")
        assert float(keys[0][col["||f(x_j)||"]]) == pytest.approx(st["valueNorm"][0], abs=5e-4)
        for r in page.evaluate(f"{sv.format('b')}.rows()"):
            assert r[col["||f(x_j)||"]] == "n/a" and r[col["||\u03b1 f(x_j)||"]] == "n/a"
        assert "NaN" not in page.inner_text("#b")
    assert messages == [] and len(requests) == 1


def test_session_refusals_name_the_value(dec, enc):
    with pytest.raises(probe.errors.InputError, match="head L0H9 out of range: layers have heads 0-3"):
        dec.head(TEXT, 0, 9)
    with pytest.raises(probe.errors.InputError, match="query 99 out of range"):
        dec.head(TEXT, 0, 0, 99)
    with pytest.raises(probe.errors.InputError, match="layer 5 out of range: the model has layers 0-1 and heads 0-3"):
        dec.edit(TEXT, 5)
    with pytest.raises(probe.errors.InputError, match="at most 2,000"):
        dec.edit("x" * 2001)
    with pytest.raises(probe.errors.InputError, match="tokens; the live page takes at most"):
        dec.edit("cat " * 200)
    with pytest.raises(probe.errors.InputError, match="the live page ablates with one of zero, mean, got 'resample'"):
        dec.ablate(TEXT, [[0, 0]], "resample")
    with pytest.raises(probe.errors.UnsupportedAnalysisError, match="without a masked-LM head"):
        enc.patch(TEXT, TEXT)
    limit = dec.lm.max_length
    with pytest.raises(probe.errors.InputError, match=f"--max-tokens {limit + 1} tokens is above the model's limit "
                                                      f"of {limit} tokens"):
        LiveSession(dec.lm, max_tokens=limit + 1)


# --------------------------------------------------------------------------- the server's API

def test_routes_answer_the_sessions_values(client, dec):
    """Every route through HTTP answers what the session answers (JSON round trip)."""
    info = client.get("/api/info", headers=HEADERS)
    assert info.status_code == 200 and info.json()["layers"] == 2 and info.json()["output"] == "next-token"
    for route, body, method in (("edit", {"text": TEXT, "layer": 1}, "edit"),
                                ("head", {"text": TEXT, "layer": 0, "head": 1, "query": 3}, "head"),
                                ("ablate", {"text": TEXT, "heads": [[0, 0]], "ablation": "zero", "layer": 1},
                                 "ablate")):
        got = post(client, route, body)
        assert got.status_code == 200, got.text
        want = json.loads(json.dumps(getattr(dec, method)(**body)))
        if route == "head":  # why's wall time differs from run to run
            got_json = got.json()
            assert got_json["why"].pop("seconds") and want["why"].pop("seconds")
            assert got_json == want
            labels = head_labels(dec.lm)  # the head's and its sources' labels, as probe why shows them
            assert got_json["why"]["label"] == labels["L0H1"] and got_json["why"]["labelsNote"]
            assert all(p["query_label"] == labels.get(p["query_source"], "") for p in got_json["why"]["pairs"]
                       if p["query_source"] != "(other pairs)")
        else:
            assert got.json() == want
    page = client.get(f"/?token={TOKEN}")
    assert page.status_code == 200 and "probeViews.live" in page.text and "default-src 'none'" in \
        page.headers["content-security-policy"]
    assert "http" not in page.text.replace("probeViews.httpTransport", "").replace("http://www.w3.org", "").lower() \
        .split("<script>")[0]  # the page's markup names no outside resource


@pytest.mark.parametrize("case", ["json", "head", "query", "long", "binary", "type", "size", "field", "route", "array",
                                  "deep", "empty", "bool", "info"])
def test_bad_requests_get_a_4xx_line_and_the_next_is_answered(client, case):
    """Each bad request: a 4xx with one line saying what was wrong; the next good request is answered."""
    raw = {"headers": {**HEADERS, "Content-Type": "application/json"}}
    status, word, resp = {
        "json": (400, "malformed JSON", lambda: client.post("/api/edit", content=b'{"text": ', **raw)),
        "head": (400, "head L0H7 out of range", lambda: post(client, "head", {"text": TEXT, "layer": 0, "head": 7})),
        "query": (400, "out of range",
                  lambda: post(client, "head", {"text": TEXT, "layer": 0, "head": 0, "query": 50})),
        "long": (400, "at most 2,000", lambda: post(client, "edit", {"text": "a" * 3000})),
        "binary": (400, "binary", lambda: client.post("/api/edit", content=b"\xff\xfe\x00\x81", **raw)),
        "type": (415, "Content-Type", lambda: client.post("/api/edit", content=b"text=a", headers=HEADERS)),
        "size": (413, "at most", lambda: client.post("/api/edit", content=b" " * (MAX_BODY + 1), **raw)),
        "field": (400, "unknown edit setting 'txt'; settings: text, layer",
                  lambda: post(client, "edit", {"txt": TEXT})),
        "route": (404, "no route /api/nope", lambda: post(client, "nope", {})),
        "array": (400, "JSON object", lambda: post(client, "edit", [TEXT])),
        "deep": (400, "malformed JSON: nested too deeply",  # deeper than the JSON parser's stack
                 lambda: client.post("/api/edit", content=b"[" * 20000 + b"]" * 20000, **raw)),
        "empty": (400, "text is empty", lambda: post(client, "edit", {"text": ""})),
        "bool": (400, "layer must be an integer, got true",
                 lambda: post(client, "edit", {"text": TEXT, "layer": True})),
        "info": (405, "/api/info takes GET", lambda: post(client, "info", {})),
    }[case]
    r = resp()
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and word in r.json()["error"] and "\n" not in r.json()["error"]
    assert post(client, "edit", {"text": TEXT}).status_code == 200


def test_a_declared_oversized_body_is_refused_with_its_size(client):
    r = client.post("/api/edit", content=b" " * 10, headers={**HEADERS, "Content-Type": "application/json",
                                                              "Content-Length": str(MAX_BODY + 13)})
    assert r.status_code == 413
    assert r.json()["error"] == f"the request body is {MAX_BODY + 13:,} bytes; at most {MAX_BODY:,}"


def test_patching_a_model_without_logits_is_422_with_the_librarys_line(enc):
    r = post(TestClient(make_app(enc, TOKEN)), "patch", {"text": TEXT, "corrupted": TEXT})
    assert r.status_code == 422 and "without a masked-LM head" in r.json()["error"], r.text


def test_token_host_and_origin_are_checked(client):
    assert client.get("/api/info").status_code == 401
    assert client.get("/").status_code == 401
    assert client.get("/api/info", headers={"X-Probe-Token": "wrong"}).status_code == 403
    assert client.get("/api/info?token=wrong").status_code == 403
    assert client.get(f"/api/info?token={TOKEN}").status_code == 200
    foreign = post(client, "edit", {"text": TEXT}, headers={**HEADERS, "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and "another site" in foreign.json()["error"]
    assert post(client, "edit", {"text": TEXT}, headers={**HEADERS, "Origin": "http://127.0.0.1"}).status_code == 200
    rebound = client.get("/api/info", headers={**HEADERS, "Host": "evil.example:8765"})
    assert rebound.status_code == 403 and "host" in rebound.json()["error"]


def test_a_model_error_is_answered_and_the_server_goes_on(dec, monkeypatch):
    c = TestClient(make_app(dec, TOKEN))
    monkeypatch.setattr(dec, "edit", lambda text, layer=0: (_ for _ in ()).throw(RuntimeError("boom\nsecond line")))
    r = post(c, "edit", {"text": TEXT})
    assert r.status_code == 500 and r.json()["error"] == "the model failed on /api/edit: RuntimeError: boom"
    monkeypatch.undo()
    assert post(c, "edit", {"text": TEXT}).status_code == 200


def test_stale_requests_are_dropped(dec):
    latest = Latest()
    latest.note("p", "edit", 3)
    latest.note("p", "edit", 2)
    assert latest.stale("p", "edit", 2) and not latest.stale("p", "edit", 3) and not latest.stale("q", "edit", 1)
    status, _ = answer(dec, "edit", {"text": TEXT, "page": "pg", "seq": 5})
    assert status == 200
    status, out = answer(dec, "edit", {"text": TEXT, "page": "pg", "seq": 4})
    assert status == 409 and out["stale"] is True


def test_patching_reports_its_progress_and_equals_the_run_without_it(dec):
    """A patch request's progress: every patched pass says its runs done of 2 x layers x heads, increasing to
    all of them, as the request's own (``yours``) to its page and as another's to another page; the
    estimate line after the first passes; nothing running after; the effects those of the run without it."""
    clean, corrupted = "The cat sat on the mat", "The dog sat on the mat"
    seen, other = [], []

    def on_progress(snap):
        seen.append(snap)
        other.append(answer(dec, "progress", {"page": "someone-else"}))

    status, r = answer(dec, "patch", {"text": clean, "corrupted": corrupted, "page": "pg", "seq": 1}, on_progress)
    assert status == 200
    total = 2 * dec.n_layers * dec.n_heads
    assert [s["total"] for s in seen] == [total] * len(seen) and seen[-1]["done"] == total
    assert [s["done"] for s in seen] == sorted(s["done"] for s in seen) and seen[0]["done"] > 0
    assert all(s["busy"] and s["yours"] and s["route"] == "patch" and s["seconds"] >= 0 for s in seen)
    assert all(s["estimate"].startswith("estimate from the first passes") for s in seen)
    assert all(st == 200 and o["busy"] and not o["yours"] for st, o in other)
    assert answer(dec, "progress", {"page": "pg"}) == (200, {"busy": False})
    plain = dec.patch(clean, corrupted, r["answer"], r["wrong"])
    assert plain["effect"] == r["effect"] and plain["effectLast"] == r["effectLast"]


@pytest.mark.parametrize("newer", ["patch", "edit"])
def test_a_patch_request_stops_when_a_newer_patch_or_edit_of_its_page_arrives(dec, newer):
    """A newer request of the same page (another pair, or an edit of the clean text) stops the patch at its
    next patched pass: answered 409 stale, after one pass, and the next request is answered. Another page's
    requests do not stop it."""
    clean, corrupted = "The cat sat on the mat", "The dog sat on the mat"
    steps, page = [], f"stop-on-{newer}"

    def arrives(snap):
        steps.append(snap["done"])
        dec.latest.note("other-page", newer, 99)  # another page: no effect
        if len(steps) == 1:
            dec.latest.note(page, newer, 50)

    dec.latest.note(page, "edit", 7)  # an edit before the patch started does not stop it
    dec.latest.note(page, "patch", 9)
    status, out = answer(dec, "patch", {"text": clean, "corrupted": corrupted, "page": page, "seq": 10}, arrives)
    assert status == 409 and out["stale"] is True and len(steps) == 1
    assert steps == [dec.n_heads * 2]  # the first of the two layers' passes, then stopped
    assert answer(dec, "progress", {})[1] == {"busy": False}
    status, _ = answer(dec, "edit", {"text": TEXT, "page": page, "seq": 51})
    assert status == 200


def test_progress_is_answered_while_the_model_works(client, dec):
    """GET /api/progress answers without the session's lock: while a request holds it, the page's own
    request in progress (its runs done, the estimate line) or another's; POST is refused; nothing running:
    busy false."""
    assert client.get("/api/progress", headers=HEADERS).json() == {"busy": False}
    with dec.lock, dec.work.running("patch", "mine"):
        dec.work.step(36, 144)
        dec.work.estimate("estimate from the first passes: about 3 s")
        mine = client.get("/api/progress?page=mine", headers=HEADERS).json()
        theirs = client.get("/api/progress?page=other", headers=HEADERS).json()
    assert mine["busy"] and mine["yours"] and (mine["done"], mine["total"]) == (36, 144)
    assert mine["estimate"] == "estimate from the first passes: about 3 s" and mine["route"] == "patch"
    assert theirs["busy"] and not theirs["yours"]
    refused = post(client, "progress", {})
    assert refused.status_code == 405 and refused.json() == {"error": "/api/progress takes GET"}
    assert client.get("/api/progress").status_code == 401


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_load_many_clients_every_answer_right_none_lost(dec):
    """20 clients at once, each a few edits and an ablation: every answer equals the sequential run's, none
    is lost, and the resident memory after later rounds stays within 10% of the first round's."""
    c = TestClient(make_app(dec, TOKEN))
    texts = [f"The cat number {i} sat on the mat." for i in range(4)]
    expect = {t: json.loads(json.dumps(dec.edit(t, 1))) for t in texts}
    abl = {t: json.loads(json.dumps(dec.ablate(t, [[0, 1]], "zero", 1))) for t in texts}

    def client_run(i):
        out = []
        for k in range(3):
            t = texts[(i + k) % len(texts)]
            out.append(("edit", t, post(c, "edit", {"text": t, "layer": 1})))
        t = texts[i % len(texts)]
        out.append(("ablate", t, post(c, "ablate", {"text": t, "heads": [[0, 1]], "layer": 1})))
        return out

    rss = []
    for _ in range(3):
        with ThreadPoolExecutor(20) as pool:
            results = [r for rs in pool.map(client_run, range(20)) for r in rs]
        rss.append(_rss())
        assert len(results) == 80
        for route, t, r in results:
            assert r.status_code == 200, r.text
            assert r.json() == (expect[t] if route == "edit" else abl[t])
    assert max(rss[1:]) <= 1.10 * rss[0], rss


# --------------------------------------------------------------------------- the command

def test_port_in_use_and_a_model_that_fails_are_one_error_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        one_error(invoke_cli("live", "--port", port), 1, f"port {port} on 127.0.0.1 is in use")
    one_error(invoke_cli("live", "--model", "/nonexistent/folder", "--port", 0), 1, "/nonexistent/folder")
    one_error(invoke_cli("live", "--host", "999.1.1.1", "--port", 0), 1, "cannot listen on 999.1.1.1 port 0")


def test_an_encoder_decoder_is_refused_before_its_weights_load(tmp_path, monkeypatch):
    """The config decides it: refused by the line LiveSession gives, with no weights read."""
    import transformers

    import probe.loading.models as pm
    folder = tmp_path / "t5"
    transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2).save_pretrained(folder)

    def no_load(*a, **k):
        raise AssertionError("the weights were loaded")
    monkeypatch.setattr(pm, "load_model", no_load)
    one_error(invoke_cli("live", "--model", str(folder), "--port", 0), 1,
              f"{folder} is an encoder-decoder model; probe live draws encoders and decoders")
    with pytest.raises(probe.errors.InputError) as err:  # the library's door: the same line, no weights read
        open_session(str(folder))
    assert str(err.value) == two_stack_refusal(str(folder))


def test_open_session_loads_the_named_model_with_its_settings(tmp_path):
    """What probe live serves, as one library call: the model of the folder loaded, the session's caps the
    settings' (the command line loads nothing itself: tests/test_imports.py)."""
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    session = open_session(str(folder), LiveSettings(max_chars=50, max_tokens=20))
    assert isinstance(session, LiveSession) and session.lm.name == str(folder)
    assert (session.max_chars, session.max_tokens) == (50, 20)
    ids = session.token_ids("The cat sat on the mat.")
    assert session.n_layers == 2 and ids == session.lm.tokenizer("The cat sat on the mat.")["input_ids"]


def test_any_address_accepts_the_address_each_connection_reached():
    """--host 0.0.0.0 or ::: a Host that is the IP address (with the port) the connection reached is this server's,
    so other machines can open the page; a name, another address or another port is not (DNS rebinding)."""
    from starlette.requests import Request

    from probe.live.server import Guard, served_hosts

    def refused(guard, host, server=("192.0.2.7", 8000), origin=None):
        headers = [(b"host", host.encode()), (b"x-probe-token", TOKEN.encode())]
        headers += [(b"origin", origin.encode())] if origin else []
        scope = {"type": "http", "method": "GET", "path": "/", "query_string": b"", "headers": headers,
                 "server": server}
        refusal = guard.refusal(Request(scope))
        return None if refusal is None else refusal.status_code

    anywhere = Guard(None, TOKEN, served_hosts("0.0.0.0", 8000), any_address=True)
    assert refused(anywhere, "192.0.2.7:8000") is None
    assert refused(anywhere, "192.0.2.7:8000", origin="http://192.0.2.7:8000") is None
    assert refused(anywhere, "127.0.0.1:8000", server=("127.0.0.1", 8000)) is None
    assert refused(anywhere, "[fd00::2]:8000", server=("fd00::2", 8000)) is None
    assert refused(anywhere, "192.0.2.7:8000", server=("::ffff:192.0.2.7", 8000)) is None
    assert refused(anywhere, "192.0.2.8:8000") == 403
    assert refused(anywhere, "192.0.2.7:8001") == 403
    assert refused(anywhere, "evil.example:8000") == 403
    assert refused(anywhere, "192.0.2.7:8000", origin="http://evil.example") == 403
    both = Guard(None, TOKEN, served_hosts("::", 8000), any_address=True)
    assert refused(both, "127.0.0.1:8000", server=("::ffff:127.0.0.1", 8000)) is None
    assert refused(both, "[::1]:8000", server=("::1", 8000)) is None
    local = Guard(None, TOKEN, served_hosts("127.0.0.1", 8000))
    assert refused(local, "192.0.2.7:8000") == 403


def test_serves_until_ctrl_c_with_status_130(tmp_path):
    """A real server (a tiny model folder): the printed address answers with its token; another host prints a
    warning; Ctrl-C ends it with 'Interrupted.' and status 130."""
    folder = save_tiny("gpt2", tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "probe", "live", "--model", str(folder), "--port", "0", "--host",
                             "0.0.0.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        proc.stdout.readline()
        address = proc.stdout.readline().strip()
        assert address.startswith("http://127.0.0.1:") and "/?token=" in address
        import httpx

        base, token = address.split("/?token=")
        deadline = time.time() + 60
        while True:
            try:
                r = httpx.get(f"{base}/api/info", headers={"X-Probe-Token": token}, timeout=10)
                break
            except httpx.TransportError:
                assert time.time() < deadline
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["kind"] == "decoder"
        assert httpx.get(f"{base}/api/info", timeout=10).status_code == 401
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.count("warning: serving on 0.0.0.0") == 1 and err.strip().endswith("Interrupted.")
    assert "Traceback" not in err


# --------------------------------------------------------------------------- the page in a browser

def Served(session) -> ServedApp:
    """A real uvicorn server of a session on a free port, in a thread."""
    from probe.live.server import served_hosts

    return ServedApp(lambda port: make_app(session, TOKEN, served_hosts("127.0.0.1", port)))


@pytest.mark.parametrize("width", [1200, 390])
def test_page_types_inspects_and_switches_off_heads(chromium, dec, width):
    """Type a sentence: the grid redraws with the labels of the library; click a head: its steps and why; switch a
    head off: the output changes by the value the library computes; no console message, no request leaves the
    server, and at 390 px the page does not overflow."""
    sync_api, executable = chromium
    with Served(dec) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            messages, requests = [], []
            page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(f"{base}/?token={TOKEN}")
            page.wait_for_selector(".probe-live[data-edits='1']", timeout=60_000)
            page.fill("textarea.pl-text:not(.pl-corrupt)", TEXT)
            page.wait_for_selector(".probe-live[data-edits='2']", timeout=60_000)
            labels = page.evaluate("document.querySelector('.probe-live').probeLive.grid()")
            heads = probe.analyze(dec.lm, [TEXT]).heads
            label = {(int(r["layer"]), int(r["head"])): r["label"] for r in heads.to_dict("records")}
            assert labels == [[label[(l, h)] for h in range(4)] for l in range(2)]
            page.click("td.pl-cell[data-layer='1'][data-head='2']")
            page.wait_for_selector(".probe-live[data-heads='1'] .probe-sv table", timeout=60_000)
            assert "Why L1H2" in page.inner_text(".pl-why") and "check holds" in page.inner_text(".pl-check")
            # the labels probe why shows: the head's beside its name, each source head's beside the source
            corpus = head_labels(dec.lm)
            assert f"Why L1H2 ({corpus['L1H2']} over the sample texts) attends" in page.inner_text(".pl-why")
            # the head's title: its label on this text (the grid's), said to be this text's
            assert f"L1H2 \u00b7 {label[(1, 2)]} on this text: query " in page.inner_text(".pl-headpanel .pl-title")
            cells = page.eval_on_selector_all(".pl-why table.pl-table tr", "rs => rs.map(r => Array.from("
                                              "r.children, c => c.textContent))")
            assert cells[0][4:8] == ["query source", "its label", "key source", "its label"]
            assert len(cells) > 1 and all(row[5] == corpus.get(row[4], "") and row[7] == corpus.get(row[6], "")
                                          for row in cells[1:])
            assert any(row[5] for row in cells[1:])  # layer 0's heads among the query sources, labelled
            page.select_option("select >> nth=0", "off")
            page.click("td.pl-cell[data-layer='0'][data-head='1']")
            page.wait_for_selector(".probe-live[data-ablations='1'] table.pl-probs", timeout=60_000)
            rows = page.eval_on_selector_all("table.pl-probs tr[data-id]", "rs => rs.map(r => [Number(r.dataset.id), "
                                             "Number(r.children[2].textContent)])")
            gates = torch.ones(2, 4)
            gates[0, 1] = 0
            with torch.no_grad(), gated(dec.lm, gates):
                off = torch.softmax(forward(dec.lm, encode(dec.lm, [TEXT])).logits[0, -1].double(), -1)
            assert rows and all(abs(v - float(off[i])) <= 5e-5 for i, v in rows)
            assert page.evaluate("document.querySelector('.probe-live').probeLive.counts().errors") == 0
            clean_messages = list(messages)
            if width == 1200:  # a refused text: its line in the page; the next edit is answered and clears it
                page.fill("textarea.pl-text:not(.pl-corrupt)", "cat " * 200)
                page.wait_for_selector(".pl-error >> text=the live page takes at most", timeout=60_000)
                edits = page.evaluate("document.querySelector('.probe-live').probeLive.counts().edit")
                page.fill("textarea.pl-text:not(.pl-corrupt)", TEXT + " Then it woke.")
                page.wait_for_selector(f".probe-live[data-edits='{edits + 1}']", timeout=60_000)
                assert not page.is_visible(".pl-error"), page.inner_text(".pl-error")
            assert page.evaluate("document.documentElement.scrollWidth") == width
            assert page.evaluate("document.querySelector('.probe-live').probeLive.timings().lastEditMs") > 0
        finally:
            browser.close()
    assert clean_messages == []
    # the refused text's 400 is the browser's one line about a failed resource, nothing else
    assert all("status of 400" in m for m in messages[len(clean_messages):]), messages
    assert requests and all(u.startswith(base + "/") for u in requests), requests


def test_the_page_shows_a_patch_requests_progress_then_its_effects(chromium, dec, monkeypatch):
    """A patch request that takes seconds: the patch panel says its patched runs done of all, the seconds so
    far and the estimate line while it runs (GET /api/progress), then draws the effects and drops the line."""
    import probe.live.session as live_session

    def slow(lm, pairs, progress=None, estimate=None, **kw):  # each patched pass 0.7 s longer
        return patch_heads(lm, pairs, estimate=estimate, **kw,
                           progress=lambda done, total: (time.sleep(0.7), progress(done, total)))

    monkeypatch.setattr(live_session, "patch_heads", slow)
    sync_api, executable = chromium
    with Served(dec) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(f"{base}/?token={TOKEN}&text=" + "The cat sat on the mat")
            page.wait_for_selector(".probe-live[data-edits='1']", timeout=60_000)
            page.fill("textarea.pl-corrupt", "The dog sat on the mat")
            line = page.wait_for_selector(".pl-progress >> text=patched runs", timeout=60_000).inner_text()
            total = 2 * dec.n_layers * dec.n_heads
            assert f" of {total} patched runs, " in line and "s so far; estimate from the first passes" in line
            page.wait_for_selector(".probe-live[data-patches='1'] table.pl-effects", timeout=60_000)
            assert page.query_selector(".pl-progress") is None
        finally:
            browser.close()


def test_an_image_model_is_refused_in_one_line_by_the_session_and_the_command(tmp_path):
    """The live page reads typed text: an image model is refused when the session is made (the widget's and the
    server's door) and by `probe live` (exit 1, one line), not by every edit after it loads."""
    from vision_models import save_vision, tiny_vision

    from probe.live.session import media_refusal

    lm = tiny_vision("vit")
    with pytest.raises(probe.errors.InputError) as err:
        LiveSession(lm)
    assert str(err.value) == media_refusal("tiny vit") and "\n" not in str(err.value)
    folder = save_vision("vit", tmp_path / "vit")
    one_error(invoke_cli("live", "--model", str(folder), "--port", 0), 1,
              f"{folder} is an image or speech model; probe live reads typed text")


def test_the_architecture_page_says_which_call_serves_each_route():
    """docs/architecture.md's table of the live page's routes: every route of probe.live.api.ROUTES once, with its
    request settings class (probe.settings.REQUESTS) and the LiveSession method that answers it."""
    from probe.live.api import ROUTES
    from probe.settings import REQUESTS

    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {cells[0].strip("` ")[len("/api/"):]: [c.strip() for c in cells]
            for cells in (line.strip("|").split("|") for line in page.splitlines() if line.startswith("| `/api/"))}
    assert set(rows) == set(ROUTES)
    for route, (_, request, method, calls, _command) in rows.items():
        assert request.split()[0].strip("`") == (REQUESTS[route].__name__ if route in REQUESTS else "none"), route
        assert method == f"`{ROUTES[route]}`" and callable(getattr(LiveSession, ROUTES[route])), route
        assert calls, route
