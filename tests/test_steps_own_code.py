"""Issue 47 item 4: the attention steps of capture-only types (attention computed in their own code, outside
transformers' AttentionInterface). probe reads q, k and v from the projections it finds by name
(probe.architectures.own_code) and the maps the model returns: the content score q . k is checked here against
the same product computed from the modules' weights, written out per layout; on plain types the softmax of the
scaled scores is the model's own output_attentions; on RoFormer (rotary positions inside its own code) and MPT
(ALiBi) the implied term is the term the model adds, computed here from its definition."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from probe.capture.maps import encode
from probe.errors import UnsupportedArchitectureError
from probe.measures.steps import attention_steps, head_steps, heads_steps
from probe.text.inputs import Text
from probe.view.stepview import step_view_data

TEXT = "the cat sat on the mat and then it ran away from the dog"
PAIR = Text("the cat sat on the mat today", target="a dog ran home")
ATOL = 1e-5


def tools_lm(model_type: str, **config):
    """A tiny random model of ``model_type`` as tools/tiny_models.py builds it (``config``: attributes set on its
    config before it is built again), wrapped."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import tiny_models

    from probe.loading.models import from_pretrained_objects

    kind = dict(tiny_models.text_types())[model_type]
    model, tok = tiny_models.build(model_type, kind)
    if config:
        for k, v in config.items():
            setattr(model.config, k, v)
        torch.manual_seed(0)
        model = type(model)(model.config).eval()
    return from_pretrained_objects(model, tok, name=f"tiny-{model_type}")


@pytest.fixture(scope="module")
def lms():
    made: dict = {}

    def get(model_type: str, **config):
        key = (model_type, repr(sorted(config.items())))
        if key not in made:
            made[key] = tools_lm(model_type, **config)
        return made[key]
    return get


#: Each type's projection modules (path of layer 0's, or of the decoder's cross-attention) and how q, k, v of
#: one head come out of their weights, written out: ``(path, layout)``.
PROJECTIONS = {
    "roformer": ("encoder.layer.0.attention.self", "separate:query,key,value"),
    "ibert": ("encoder.layer.0.attention.self", "separate:query,key,value"),  # maps from its IntSoftmax child
    "xglm": ("model.layers.0.self_attn", "separate:q_proj,k_proj,v_proj"),
    "fsmt": ("model.decoder.layers.0.encoder_attn", "separate:q_proj,k_proj,v_proj"),  # time first, cross
    "openai-gpt": ("transformer.h.0.attn", "conv1d:c_attn"),
    "mpt": ("transformer.blocks.0.attn", "stacked:Wqkv"),
    "deberta": ("encoder.layer.0.attention.self", "per_head:in_proj"),
}


def by_hand(module, layout: str, xq: torch.Tensor, xk: torch.Tensor, H: int, head: int):
    """q [Tq, dh], k, v [Tk, dh] of ``head`` from the projection weights (x [T, d_model])."""
    kind, names = layout.split(":")
    if kind == "separate":
        mods = [getattr(module, n) for n in names.split(",")]
        dh = mods[0].weight.shape[0] // H
        rows = slice(head * dh, (head + 1) * dh)
        return tuple(x @ m.weight[rows].T + m.bias[rows] for x, m in zip((xq, xk, xk), mods))
    m = getattr(module, names)
    if kind == "conv1d":  # GPT-2 Conv1D: y = x W + b, W [d_model, q | k | v]
        dh = m.weight.shape[1] // 3 // H
        cols = [slice(part * H * dh + head * dh, part * H * dh + (head + 1) * dh) for part in range(3)]
        return tuple(x @ m.weight[:, c] + m.bias[c] for x, c in zip((xq, xk, xk), cols))
    dh = m.weight.shape[0] // 3 // H
    if kind == "stacked":  # rows q | k | v
        rows = [slice(part * H * dh + head * dh, part * H * dh + (head + 1) * dh) for part in range(3)]
    else:  # per head: rows [heads, 3, dh]
        rows = [slice(head * 3 * dh + part * dh, head * 3 * dh + (part + 1) * dh) for part in range(3)]
    got = [x @ m.weight[r].T + (0 if m.bias is None else m.bias[r]) for x, r in zip((xq, xk, xk), rows)]
    for i, name in ((0, "q_bias"), (2, "v_bias")):  # DeBERTa v1 adds these after in_proj
        extra = getattr(module, name, None)
        if extra is not None:
            got[i] = got[i] + extra[head * dh:(head + 1) * dh]
    return tuple(got)


def own_pass(lm, text, module_path: str, layout: str, site_index: int):
    """The model's own output_attentions of ``text`` and the inputs its projections at ``module_path`` read
    (queries', keys'), from one pass with forward hooks (no probe code)."""
    module = lm.model.get_submodule(module_path)
    names = layout.split(":")[1].split(",")
    seen: list = []
    key_side: list = []
    hooks = [getattr(module, names[0]).register_forward_hook(lambda m, a, o: seen.append(a[0]))]
    if len(names) > 1:
        hooks.append(getattr(module, names[1]).register_forward_hook(lambda m, a, o: key_side.append(a[0])))
    batch = encode(lm, [text])
    inputs = dict(batch.model_inputs())
    if lm.kind != "encoder":
        inputs["use_cache"] = False
    try:
        with torch.no_grad():
            out = lm.model(**inputs, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    if lm.kind == "encoder-decoder":
        maps = [*out.encoder_attentions, *[a for pair in zip(out.decoder_attentions, out.cross_attentions)
                                            for a in pair]]
        order = [*[("encoder", n) for n in range(len(out.encoder_attentions))],
                 *[x for n in range(len(out.decoder_attentions)) for x in (("dec", n), ("cross", n))]]
        assert len(order) == len(maps)
    else:
        maps = list(out.attentions)
    xq = seen[0]
    xk = key_side[0] if key_side else xq
    if xq.shape[0] != 1:  # FSMT: time first
        xq, xk = xq.transpose(0, 1), xk.transpose(0, 1)
    return maps[site_index][0], xq[0], xk[0]


def site_of(lm, model_type: str) -> int:
    return next(i for i, s in enumerate(lm.sites) if s.kind == "cross") if model_type == "fsmt" else 0


@pytest.mark.parametrize("model_type", list(PROJECTIONS))
def test_the_content_score_is_q_k_from_the_weights_and_the_maps_are_the_models(lms, model_type):
    """Every head: probe's q, k, v and q . k equal the ones computed from the projection weights of the module (each
    layout written out); the model's probabilities are its own output_attentions; keys the model gives exactly 0 are
    masked, and only they; rows sum to 1; the output is the model's probabilities times v. Plain types: the softmax
    of the scaled scores is the model's output_attentions within 1e-5 and there is no implied term."""
    lm = lms(model_type)
    assert lm.spec.capture_only
    text = PAIR if lm.kind == "encoder-decoder" else TEXT
    site = site_of(lm, model_type)
    path, layout = PROJECTIONS[model_type]
    maps, xq, xk = own_pass(lm, text, path, layout, site)
    H = maps.shape[0]
    steps = heads_steps(lm, text, [(site, h) for h in range(H)])
    for head, st in enumerate(steps):
        with torch.no_grad():
            q, k, v = by_hand(lm.model.get_submodule(path), layout, xq, xk, H, head)
        np.testing.assert_allclose(st["q"], q.numpy(), atol=ATOL)
        np.testing.assert_allclose(st["k"], k.numpy(), atol=ATOL)
        np.testing.assert_allclose(st["score"], (q @ k.T).numpy(), rtol=1e-5, atol=ATOL)
        np.testing.assert_allclose(st["scaled"], st["score"] * st["scale"], rtol=1e-6)
        np.testing.assert_array_equal(st["model_probs"], maps[head].numpy())
        np.testing.assert_array_equal(st["keep"], maps[head].numpy() > 0)
        assert (st["probs"][~st["keep"]] == 0).all() and (st["model_probs"][~st["keep"]] == 0).all()
        np.testing.assert_allclose(st["probs"].sum(-1), 1, atol=1e-6)
        np.testing.assert_allclose(st["output"], maps[head].numpy() @ v.numpy(), atol=ATOL)
        if model_type not in ("roformer", "mpt"):
            assert st["implied"] is None, (model_type, st["implied_max"])
            soft = np.exp(np.where(st["keep"], st["scaled"], -np.inf) - st["scaled"].max(-1, keepdims=True))
            np.testing.assert_allclose(soft / soft.sum(-1, keepdims=True), maps[head].numpy(), atol=ATOL)
            np.testing.assert_allclose(st["probs"], st["model_probs"], atol=ATOL)
            assert "plain scaled dot-product attention" in st["note"]


def row_centred(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """x minus its mean over each row's kept keys (0 elsewhere)."""
    n = keep.sum(-1, keepdims=True)
    return np.where(keep, x - np.where(keep, x, 0).sum(-1, keepdims=True) / n, 0)


def test_roformers_implied_term_is_its_rotation_of_q_and_k(lms):
    """RoFormer rotates q and k inside its own code (sinusoidal pairs (2i, 2i + 1) at angle pos / 10000^(2i/d)):
    the implied term is nonzero, scaled score + implied term is log p up to a row constant, and the implied term is
    (rot(q) . rot(k) - q . k) * scale, centred, computed here from the rotation's definition."""
    lm = lms("roformer")
    st = head_steps(lm, TEXT, 1, 2)
    keep = st["keep"]
    assert keep.all() and st["implied"] is not None and np.abs(st["implied"]).max() > 1e-2
    assert "cannot see" in st["note"]
    logp = np.log(st["model_probs"].astype(np.float64))
    np.testing.assert_allclose(row_centred(st["scaled"] + st["implied"] - logp, keep), 0, atol=1e-5)
    q, k = torch.tensor(st["q"], dtype=torch.float64), torch.tensor(st["k"], dtype=torch.float64)
    d = q.shape[-1]
    pos = torch.arange(q.shape[0], dtype=torch.float64)[:, None]
    angle = pos / 10000 ** (torch.arange(d // 2, dtype=torch.float64) * 2 / d)  # [T, d/2]

    def rot(x):
        a, b = x[:, 0::2], x[:, 1::2]
        return torch.stack([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1).reshape(x.shape)
    term = ((rot(q) @ rot(k).T - q @ k.T) * st["scale"]).numpy()
    np.testing.assert_allclose(st["implied"], row_centred(term, keep), atol=1e-4)
    np.testing.assert_allclose(st["probs"], st["model_probs"], atol=ATOL)


def test_mpts_implied_term_is_its_alibi_slope_times_the_key_position(lms):
    """MPT adds ALiBi in its own code: the implied term of head h is slope_h * key position (centred over the
    causal keys), slope_h = 2^(-(h + 1) * alibi_bias_max / heads)."""
    lm = lms("mpt")
    H = lm.spec.dims[1]
    for head in range(H):
        st = head_steps(lm, TEXT, 0, head)
        keep = st["keep"]
        assert np.array_equal(keep, np.tril(np.ones_like(keep)))
        slope = 2.0 ** (-(head + 1) * lm.model.config.attn_config.alibi_bias_max / H)
        j = np.broadcast_to(np.arange(keep.shape[1], dtype=np.float64), keep.shape)
        np.testing.assert_allclose(st["implied"], row_centred(slope * j, keep), atol=1e-5)


def test_debertas_relative_terms_and_scale_are_its_own(lms):
    """DeBERTa v1 with its relative terms (c2p, p2c): q . k holds its q_bias, scaled by 1/sqrt(3 d_head); the
    relative terms show as the implied term; scaled + implied is log p up to a row constant."""
    lm = lms("deberta", relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=16)
    module = lm.model.encoder.layer[0].attention.self
    with torch.no_grad():
        module.q_bias.normal_(0, 0.5)
    maps, xq, _ = own_pass(lm, TEXT, "encoder.layer.0.attention.self", "per_head:in_proj", 0)
    st = head_steps(lm, TEXT, 0, 1)
    q, k, _ = by_hand(module, "per_head:in_proj", xq, xq, maps.shape[0], 1)
    np.testing.assert_allclose(st["score"], (q @ k.T).detach().numpy(), rtol=1e-5, atol=ATOL)
    assert st["scale"] == pytest.approx(1 / math.sqrt(3 * q.shape[-1]))
    assert st["implied"] is not None and np.abs(st["implied"]).max() > 1e-3
    logp = np.log(maps[1].numpy().astype(np.float64))
    np.testing.assert_allclose(row_centred(st["scaled"] + st["implied"] - logp, st["keep"]), 0, atol=1e-5)


def test_the_table_and_the_record_carry_the_implied_term_and_the_note(lms):
    """attention_steps on RoFormer has an implied_term column after scaled_score (0 where masked); a plain type has
    none; both carry the note; the step view's record holds implied (null on a plain type) and note; a type that is
    not capture-only keeps implied and note null."""
    lm = lms("roformer")
    df = attention_steps(lm, TEXT, site=0, head=1, query=3)
    cols = list(df.columns)
    assert cols[cols.index("scaled_score") + 1] == "implied_term"
    logp = np.log(df["model_probability"].to_numpy(np.float64))
    x = (df["scaled_score"] + df["implied_term"]).to_numpy() - logp
    np.testing.assert_allclose(x - x.mean(), 0, atol=1e-5)
    assert "cannot see" in df.attrs["steps"].note
    data = step_view_data(head_steps(lm, TEXT, 0, 1))
    assert len(data["implied"]) == data["nq"] * data["nk"] and "roformer" in data["note"]
    plain = lms("xglm")
    df = attention_steps(plain, TEXT, site=1, head=0, query=4)
    assert "implied_term" not in df.columns and df.attrs["steps"].max_diff <= ATOL
    assert df["masked"].tolist() == [j > 4 for j in range(len(df))]
    data = step_view_data(head_steps(plain, TEXT, 1, 0))
    assert data["implied"] is None and "plain scaled dot-product attention" in data["note"]
    from conftest import tiny_model

    data = step_view_data(head_steps(tiny_model("bert"), TEXT, 0, 0))
    assert data["implied"] is None and data["note"] is None


def test_what_probe_cannot_read_is_refused_in_one_specific_line():
    """Reformer's LSH layers project queries and keys with one shared module: one line naming it (its local layers
    run); the from-scratch route stays refused on a capture-only type; no head beyond the maps' heads."""
    from probe.errors import InputError

    lm = tools_lm("reformer")
    kinds = [type(lm.model.get_submodule(f"encoder.layers.{n}.attention.self_attention")).__name__
             for n in range(len(lm.sites))]
    lsh, local = kinds.index("LSHSelfAttention"), kinds.index("LocalSelfAttention")
    assert head_steps(lm, TEXT, local, 1)["implied"] is None
    with pytest.raises(UnsupportedArchitectureError) as err:
        head_steps(lm, TEXT, lsh, 0)
    line = str(err.value)
    assert "query_key" in line and "\n" not in line and "attention steps do not run on reformer" in line
    with pytest.raises(UnsupportedArchitectureError, match="from-scratch"):
        head_steps(lm, TEXT, local, 0, via="reference")
    with pytest.raises(InputError, match="no head 9"):
        head_steps(lm, TEXT, local, 9)


def test_the_live_head_panel_shows_the_steps_of_a_capture_only_type(lms):
    """probe live's head(): a capture-only type's head has a step record (no refusal), the implied term where the
    model has one, equal to the library's steps of the same head (the page draws what head_steps gives)."""
    from probe.live.session import LiveSession

    for model_type, implied in (("roformer", True), ("xglm", False)):
        s = LiveSession(lms(model_type))
        r = s.head(TEXT, 1, 2, 3)
        assert r["stepsRefusal"] is None and r["steps"] is not None
        st = r["steps"]
        assert (st["implied"] is not None) == implied and st["note"]
        want = step_view_data(head_steps(s.lm, TEXT, 1, 2), site_index=1, query=3)
        assert st == want


@pytest.mark.browser
def test_the_step_view_draws_the_implied_term_column_and_the_note(lms, chromium, tmp_path):
    """stepview.js (reports, probe.show, the live page) on RoFormer's record: an "implied term" column right after
    "scaled" holding the record's term, the probability the softmax of scaled + implied term, the note under the
    rule; on XGLM's (checked steps) no such column, its note; no request leaves the page."""
    from conftest import watched_page
    from probe.view.stepview import render_step_view

    rof = step_view_data(head_steps(lms("roformer"), TEXT, 0, 1), query=2)
    plain = step_view_data(head_steps(lms("xglm"), TEXT, 0, 1), query=2)
    page_file = tmp_path / "sv.html"
    page_file.write_text("<!doctype html><meta charset='utf-8'><body>" + render_step_view(rof, "a") +
                         render_step_view(plain, "b") + "</body>", encoding="utf-8")
    sv = "document.getElementById('{}').probeStepView"
    with watched_page(chromium, page_file) as (page, messages, requests):
        page.wait_for_selector("#b[data-query]")
        header = page.evaluate(f"{sv.format('a')}.header()")
        assert header[header.index("scaled") + 1] == "implied term"
        col = {name: i for i, name in enumerate(header)}
        nk = rof["nk"]
        scaled = np.array(rof["scaled"][2 * nk:3 * nk], np.float64)
        implied = np.array(rof["implied"][2 * nk:3 * nk], np.float64)
        soft = np.exp(scaled + implied - (scaled + implied).max())
        for j, r in enumerate(page.evaluate(f"{sv.format('a')}.rows()")):
            assert float(r[col["implied term"]]) == pytest.approx(implied[j], abs=5e-5)
            assert float(r[col["probability"]]) == pytest.approx(soft[j] / soft.sum(), abs=5e-5)
        assert "cannot see" in page.inner_text("#a .sv-note")
        assert "implied term" not in page.evaluate(f"{sv.format('b')}.header()")
        assert "plain scaled dot-product attention" in page.inner_text("#b .sv-note")
    assert messages == [] and len(requests) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_own_steps_tell_plain_attention_from_an_added_term(dtype):
    """own_steps on probabilities made here: softmax(q k^T * scale) with a causal mask (in the maps' dtype) has no
    implied term and its softmax is those probabilities; adding a term b to the logits gives implied = b centred over
    each row's kept keys (the causal keys: probability exactly 0 elsewhere)."""
    from probe.measures.steps import own_steps

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 8, generator=g) for _ in range(3))
    scale = 8 ** -0.5
    causal = torch.ones(6, 6).tril().bool()
    logits = (q @ k.T * scale).masked_fill(~causal, float("-inf"))
    st = own_steps(q, k, v, torch.softmax(logits, -1).to(dtype), scale)
    assert st["implied"] is None and torch.equal(st["keep"], causal)
    coarse = dtype != torch.float32
    np.testing.assert_allclose(st["probs"].numpy(), torch.softmax(logits, -1).numpy(), atol=4e-3 if coarse else 1e-6)
    b = torch.randn(6, 6, generator=g)
    st = own_steps(q, k, v, torch.softmax(logits + b, -1).to(dtype), scale)
    want = row_centred(b.double().numpy(), causal.numpy())
    np.testing.assert_allclose(st["implied"].numpy(), want, atol=3e-2 if coarse else 1e-5)
    assert (st["implied"][~causal] == 0).all() and (st["probs"][~causal] == 0).all()
    np.testing.assert_allclose(st["output"].numpy(), (st["model_probs"].float() @ v).numpy(), atol=1e-6)


@pytest.mark.parametrize("model_type", ["roformer", "mpt"])
def test_loading_a_capture_only_type_logs_no_transformers_warning(model_type):
    """Discovery asks every model to run probe's attention function; a type whose attention is its own code cannot,
    and transformers logged so ("does not support setting its attention implementation dynamically", and on MPT "We
    set the attention implementation for the sub-config") on every load, before probe's own note said the model is
    read capture-only. Loading it now logs no warning from transformers, and it is still read capture-only."""
    import logging

    from transformers.utils import logging as tlog

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import tiny_models

    from probe.loading.models import from_pretrained_objects

    model, tok = tiny_models.build(model_type, dict(tiny_models.text_types())[model_type])
    heard: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record):
            heard.append(record.getMessage())

    handler, root = Heard(level=logging.WARNING), tlog.get_logger("transformers")
    root.addHandler(handler)
    try:
        lm = from_pretrained_objects(model, tok, name=f"tiny-{model_type}")
    finally:
        root.removeHandler(handler)
    assert lm.spec.capture_only
    assert heard == []


@pytest.mark.parametrize("model_type", ["roformer", "gpt2"])
def test_the_reports_steps_section_says_where_a_capture_only_types_steps_come_from(lms, model_type):
    """The report's "Attention steps" section opens with where its numbers come from: on a capture-only type (RoFormer)
    q, k and v read from its projections and the probabilities it returns, not "the from-scratch attention ... (its
    probabilities equal the model's to 1e-5)", which its own rows contradict (its probabilities are not the softmax of
    its scaled scores); on a type probe runs from scratch (GPT-2), that sentence."""
    from probe import analyze
    from probe.entries.texts import report_steps
    from probe.view.section import steps_section

    if model_type == "gpt2":
        from conftest import tiny_model
        lm = tiny_model("gpt2")
    else:
        lm = lms(model_type)
    result = analyze(lm, [TEXT])
    steps = report_steps(lm, result)
    assert steps and all(bool(st.get("note")) == (model_type == "roformer") for st in steps)
    intro = str(steps_section(result, lm.tokenizer).html).split("</p>")[0]
    assert ("from-scratch" in intro) == (model_type == "gpt2")
    assert ("read from the model's own projections" in intro.replace("&#39;", "'")) == (model_type == "roformer")


def test_the_live_session_says_before_a_click_why_a_capture_only_type_cannot_switch_heads_off(lms):
    """LiveSession.info() carries ``ablation``: ablation's own refusal (check_model's line) on a capture-only type, the
    same line ablate() raises; None on a type whose heads can be switched off (its ablate() answers)."""
    from conftest import tiny_model
    from probe.effects.ablation import check_model
    from probe.errors import ProbeError
    from probe.live.session import LiveSession

    s = LiveSession(lms("roformer"))
    with pytest.raises(ProbeError) as err:
        check_model(s.lm)
    assert s.info()["ablation"] == str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ProbeError, match="ablation"):
        s.ablate(TEXT, [[0, 1]])
    plain = LiveSession(tiny_model("gpt2"))
    assert plain.info()["ablation"] is None
    assert plain.ablate(TEXT, [[0, 1]])["heads"] == [[0, 1]]


@pytest.mark.browser
def test_the_live_page_of_a_capture_only_type_greys_out_switching_heads_off(lms, chromium):
    """probe live on RoFormer: the page says under the text boxes why heads cannot be switched off (info's line) and
    its "switch it off" choice, the ablation kind and "all heads on" are disabled, so no click sends a request the
    server refuses; a head clicked shows its steps with the implied term, and why's refusal is the library's line
    once, capitalized (the page prefixed "Why: " to a line starting "why: ": "Why: why: ..."). No console message,
    no 4xx."""
    from conftest import ServedApp, watched_page
    from probe.live.server import make_app, served_hosts
    from probe.live.session import LiveSession

    s, token = LiveSession(lms("roformer")), "t0k3n"
    line, why_line = s.info()["ablation"], s.head(TEXT, 1, 2)["whyRefusal"]
    assert why_line.startswith("why ")
    served = ServedApp(lambda port: make_app(s, token, served_hosts("127.0.0.1", port)))
    with served as base, watched_page(chromium, f"{base}/?token={token}") as (page, messages, _):
        page.wait_for_selector(".probe-live[data-edits='1']", timeout=60_000)
        assert page.inner_text(".pl-noablation") == "Switching heads off: " + line + "."
        assert page.eval_on_selector("select >> nth=0", "s => [s.options[1].value, s.options[1].disabled]") == [
            "off", True]
        assert page.is_disabled("select >> nth=1") and page.is_disabled("button >> text=all heads on")
        page.click("td.pl-cell[data-layer='1'][data-head='2']")
        page.wait_for_selector(".probe-live[data-heads='1'] .probe-sv table", timeout=60_000)
        assert "implied term" in page.inner_text(".pl-steps")
        refusal = page.inner_text(".pl-why .pl-refusal")
        assert refusal == why_line[0].upper() + why_line[1:], refusal
        assert page.evaluate("document.querySelector('.probe-live').probeLive.counts().errors") == 0
    assert messages == []


def test_why_on_a_capture_only_type_is_refused_as_its_other_analyses_are(lms, tmp_path):
    """probe why on RoFormer: the capture-only refusal every other analysis of such a type gives (naming why, the type
    and what runs), before any forward pass; from the command, one Error: line and status 1. Before, it was "why:
    X's attention modules do not call probe's attention function (...), where the scores are read"."""
    from conftest import invoke_cli, one_error
    from probe.qk.run import measure

    lm = lms("roformer")
    with pytest.raises(UnsupportedArchitectureError) as err:
        measure(lm, TEXT, (1, 2), 3, 5)
    line = str(err.value)
    assert line.startswith("why (each score split by the sources of its query and key) does not run on roformer: its "
                           "attention is its own code") and "\n" not in line
    folder = tmp_path / "rof"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    result = invoke_cli("why", "--model", folder, "--text", TEXT, "--head", "L1H2", "--out", tmp_path / "out")
    assert one_error(result, 1) == "Error: " + line
    assert result.stderr.strip() == "Error: " + line
