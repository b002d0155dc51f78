"""Heads outside the model are refused by every entry point that takes heads (masks, gates, tables,
lists, layers of a view, sites of the steps), with the valid ranges; a head inside the model is
ablated exactly as weight surgery removes it. The tiny GPT-2 has 2 layers of 4 heads."""

from __future__ import annotations

import copy
import re

import pandas as pd
import pytest
import torch

from conftest import tiny_model
from probe import attention_steps, show
from probe.architectures import site_outputs
from probe.capture.maps import encode, forward
from probe.causal.gates import gated
from probe.causal.heads import normalize_heads, table_heads
from probe.effects import ablating, composition_scores, head_effects, patch_residual
from probe.effects.composition import top_partners
from probe.effects.dla import head_out_weights
from probe.effects.induction import induction_claim
from probe.effects.measure import _mask
from probe.errors import InputError
from probe.pruning.removal import remove_heads

OUTSIDE = [(2, 0), (0, 4), (-1, 0)]
TEXTS = ["The cat sat on the mat.", "A dog barked at the mailman twice.", "Rain fell all night long.",
         "She read the letter and smiled.", "They built a small house by the river.", "Birds sing at dawn."]
RANGES = "layers 0-1 and heads 0-3"


@pytest.fixture(scope="module")
def gpt2():
    return tiny_model("gpt2")


def _surgery(lm, layer: int, head: int) -> torch.Tensor:
    """Logits of ``TEXTS[:2]`` with ``head``'s input rows of layer ``layer``'s output projection zeroed."""
    twin = copy.copy(lm)
    twin.model = copy.deepcopy(lm.model)
    o = [o for site, o in site_outputs(twin.model, twin.spec) if site.layer == layer][0]
    dh = lm.geometry.d_head
    with torch.no_grad():
        o.weight[head * dh:(head + 1) * dh, :] = 0  # GPT-2's Conv1D: weight [in, out]
        return forward(twin, encode(twin, TEXTS[:2])).logits


def _mask_of(shape, pairs) -> torch.Tensor:
    m = torch.zeros(shape, dtype=torch.bool)
    for layer, head in pairs:
        m[layer, head] = True
    return m


def test_a_head_inside_the_model_is_ablated_as_surgery_removes_it(gpt2):
    batch = encode(gpt2, TEXTS[:2])
    with torch.no_grad(), ablating(gpt2, "zero") as state:
        clean = forward(gpt2, batch).logits
        state.arm(gpt2, _mask_of((2, 4), [(1, 3)])[None], batch)
        ablated = forward(gpt2, batch).logits
        state.disarm()
    real = batch.real
    assert (ablated[real] - clean[real]).abs().max() > 1e-4
    assert (ablated[real] - _surgery(gpt2, 1, 3)[real]).abs().max() <= 1e-6


@pytest.mark.parametrize("shape", [(1, 3, 4), (1, 2, 5), (1, 1, 4), (4,)])
def test_an_ablation_mask_of_another_size_is_refused(gpt2, shape):
    """(2, 0) needs a 3-layer mask, (0, 4) a 5-head one: both were a no-op or a broadcast error."""
    batch = encode(gpt2, TEXTS[:1])
    with ablating(gpt2, "zero") as state:
        with pytest.raises(InputError, match=re.escape(
                f"shape {list(shape)} does not fit the model: it has {RANGES}")):
            state.arm(gpt2, torch.ones(shape, dtype=torch.bool), batch)
        state.sets, state.batch = torch.ones(shape, dtype=torch.bool), batch  # set directly: refused where read
        with pytest.raises(InputError, match=RANGES), torch.no_grad():
            forward(gpt2, batch)


@pytest.mark.parametrize("shape", [(3, 4), (2, 5), (4,)])
def test_gates_of_another_size_are_refused(gpt2, shape):
    message = re.escape(f"gates of shape {list(shape)} does not fit the model: it has {RANGES}")
    with pytest.raises(InputError, match=message):
        with gated(gpt2, torch.ones(shape)):
            pass
    with gated(gpt2) as state, torch.no_grad():
        state.values = torch.ones(shape)
        with pytest.raises(InputError, match=RANGES):
            forward(gpt2, encode(gpt2, TEXTS[:1]))


@pytest.mark.parametrize("pair, message", [((2, 0), f"layer 2 out of range: the model has {RANGES}"),
                                           ((0, 4), f"head L0H4 out of range: .*{RANGES}"),
                                           ((-1, 0), f"layer -1 out of range: the model has {RANGES}")])
def test_lists_and_tables_of_heads_outside_the_model_are_refused(gpt2, pair, message):
    table = pd.DataFrame({"layer": [pair[0]], "head": [pair[1]], "label": ["x"], "labels": ["x"],
                          "induction": [1.0]})
    calls = [lambda: normalize_heads([pair], 2, 4), lambda: table_heads(table, 2, 4),
             lambda: _mask(gpt2, [pair]), lambda: remove_heads(gpt2, [pair]),
             lambda: head_effects(gpt2, TEXTS, heads=table, seeds=5),
             lambda: induction_claim(gpt2, table, None)]
    for call in calls:
        with pytest.raises(InputError, match=message):
            call()


def test_a_heads_table_of_an_encoder_decoder_model_is_checked_per_stack():
    lm = tiny_model("t5")
    table = pd.DataFrame({"stack": ["decoder"], "kind": ["cross"], "layer": [5], "head": [0], "labels": ["x"]})
    n = sum(s.stack == "decoder" and s.kind == "cross" for s in lm.sites)
    with pytest.raises(InputError, match=f"decoder cross-attention: layer 5 out of range: the model has layers "
                                         f"0-{n - 1} and heads 0-3"):
        head_effects(lm, [], heads=table, seeds=5)


def test_layers_blocks_and_readers_outside_the_model_are_refused(gpt2):
    for layer in (2, -1):
        with pytest.raises(InputError, match=f"layer {layer} out of range: {gpt2.name} has layers 0-1"):
            head_out_weights(gpt2, layer)
        with pytest.raises(InputError, match=f"no block {layer}: {gpt2.name} has blocks 0-1"):
            patch_residual(gpt2, [], layer)
    frame = composition_scores(gpt2)
    for layer, head in OUTSIDE:
        with pytest.raises(InputError, match=RANGES):
            top_partners(frame, layer, head)
    assert len(top_partners(frame, 1, 3)) == 3  # a reader inside the model has its writers


def test_views_and_steps_name_the_valid_layers_and_heads(gpt2):
    text = "The cat sat on the mat."
    for layer in (2, 99, -1):
        with pytest.raises(InputError, match=f"no layer {layer}: {gpt2.name} has layers 0-1"):
            show(gpt2, text, layers=[layer])
        with pytest.raises(InputError, match=f"no site {layer!r}: {gpt2.name} has 2 sites, 0-1"):
            attention_steps(gpt2, text, site=layer)
    for head in (4, -1):
        with pytest.raises(InputError, match=f"no head {head}: layers have heads 0-3"):
            show(gpt2, text, heads=[head])
        with pytest.raises(InputError, match=f"no head {head}: L0 has heads 0-3"):
            attention_steps(gpt2, text, site=0, head=head)
        with pytest.raises(InputError, match=f"no head {head}"):
            show(gpt2, text, steps=(0, head))


def test_an_encoder_decoder_site_form_on_a_one_stack_model_is_not_suggested_back():
    """Issue 27 item 4: 'enc L0' on an encoder-only model was refused with 'enc L0' as the suggestion."""
    lm = tiny_model("bert")
    with pytest.raises(InputError) as err:
        attention_steps(lm, "The cat sat.", site="enc L0")
    assert str(err.value) == (f"no site 'enc L0': {lm.name} has 2 sites, 0-1 (an index, a name such as "
                              "'encoder.0.self', or 'L0'); the 'enc', 'dec' and 'cross' forms name the sites of "
                              "encoder-decoder models")
    assert attention_steps(lm, "The cat sat.", site="L0").attrs["steps"].site == "encoder.0.self"


def test_why_and_path_name_the_valid_heads_for_a_head_outside_the_model(gpt2, tmp_path):
    """The entry points added since (probe.why and its corpus average, the checks before the weights load,
    probe path's senders and receivers, why's cross-attention heads) refuse (2, 0), (0, 4) and (-1, 0) with
    the valid ranges, never a run and never a wrapped index."""
    import probe
    from conftest import invoke_cli, save_tiny
    from probe.circuits.graph import Graph
    from probe.circuits.path_run import check_arguments, parse_receivers, parse_senders
    from probe.loading.models import peek_config
    from probe.qk import why_corpus
    from probe.qk.score import check_head_config

    messages = {(2, 0): f"layer 2 out of range: the model has {RANGES}",
                (0, 4): f"head L0H4 out of range: .*{RANGES}",
                (-1, 0): f"layer -1 out of range: the model has {RANGES}"}
    for pair, message in messages.items():
        with pytest.raises(InputError, match=message):
            probe.why(gpt2, TEXTS[0], pair)
        with pytest.raises(InputError, match=message):
            why_corpus(gpt2, TEXTS[:2], pair, "previous-token")
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    config, graph = peek_config(str(folder)), Graph(2, 4, 4)
    for name, message in (("L2H0", f"layer 2 out of range: the model has {RANGES}"),
                          ("L0H4", f"head L0H4 out of range: .*{RANGES}")):
        with pytest.raises(InputError, match=message):
            check_head_config(name, config, "gpt2")
        with pytest.raises(InputError, match=r"--senders: .* is not a head of this model \(L0H0 \.\. L1H3\)"):
            parse_senders(name, graph)
        with pytest.raises(InputError, match=r"--receivers: .*\(layers 0 \.\. 1, heads 0 \.\. 3"):
            parse_receivers(f"{name}.q", graph)
        with pytest.raises(InputError, match=r"is not a head of this model|is neither logits"):
            check_arguments(name if name == "L0H4" else "L0H0", "logits" if name == "L0H4" else f"{name}.q", config)
    # a negative index is not a name of the form at all: a usage error on the command line
    result = invoke_cli("why", "--model", folder, "--text", TEXTS[0], "--head", "L-1H0")
    assert result.exit_code == 2 and "not a head of the form L5H1" in result.stderr
    # cross-attention heads of an encoder-decoder model: layers and heads of its cross-attention
    bart = tiny_model("bart")
    n = sum(s.kind == "cross" for s in bart.sites)
    for head, message in ((f"cross L{n}H0", f"layer {n} out of range"), ("cross L0H4", "head L0H4 out of range")):
        with pytest.raises(InputError, match=message):
            probe.why(bart, TEXTS[0], head)

