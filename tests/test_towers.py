"""Dual encoders (CLIP, SigLIP) as the pair a user loads: the towers split out with the pair's own
weights, both analysed in one run with heads named by tower, and the command line (tiny random pairs)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from vision_models import IMAGE, PAIRS, PATCH, pair_model, save_pair, zero_queries_and_keys

from conftest import bpe_tokenizer, invoke_cli, one_error, tolerance
from probe.architectures.towers import is_pair, tower_class, tower_weights
from probe.entries.towers import analyze_towers, split_pair, towers_of
from probe.loading.models import from_pretrained_objects
from probe.loading.pixels import PixelProcessor
from probe.runs.analysis import analyze
from probe.sites import head_name

TEXTS = ["a house under the sun", "two dogs on a hill"]


def picture(seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (IMAGE, IMAGE, 3), dtype=np.uint8), "RGB")


def towers(kind: str, uniform: bool = False):
    pair = pair_model(kind)
    if uniform:
        zero_queries_and_keys(pair)
    return pair, towers_of(pair, bpe_tokenizer(), PixelProcessor.from_settings({}, pair.config.vision_config), kind)


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_each_tower_computes_what_the_pair_computes(kind):
    pair = pair_model(kind)
    assert is_pair(pair.config, type(pair)) and not is_pair(pair.config.vision_config)
    parts = split_pair(pair)
    assert [type(parts[t]).__name__ for t in ("text", "vision")] == list(PAIRS[kind][1:])
    ids = bpe_tokenizer()(TEXTS[:1], return_tensors="pt")["input_ids"]
    pixels = torch.randn(1, 3, IMAGE, IMAGE)
    with torch.no_grad():
        assert torch.equal(parts["text"](input_ids=ids).last_hidden_state,
                           pair.text_model(input_ids=ids).last_hidden_state)
        assert torch.equal(parts["vision"](pixel_values=pixels).last_hidden_state,
                           pair.vision_model(pixel_values=pixels).last_hidden_state)


def test_tower_weights_take_the_prefix_that_holds_every_key():
    state = {"a.x": 1, "a.y": 2, "b.x": 3, "b.y": 4, "b.z": 5}
    assert tower_weights(state, ["x", "y", "z"]) == {"x": 3, "y": 4, "z": 5}
    with pytest.raises(ValueError, match="no prefix"):
        tower_weights(state, ["x", "w"])
    with pytest.raises(ValueError, match="no tower model class"):
        tower_class(torch.nn.Linear, pair_model("clip").config.text_config)


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_one_run_holds_both_towers_named_by_tower(kind):
    pair, t = towers(kind, uniform=True)
    res = analyze_towers(t, TEXTS, [picture(1), picture(2)])
    heads = res.heads
    assert list(heads["stack"]) == ["text"] * 8 + ["vision"] * 8 and (heads["kind"] == "self").all()
    alone = analyze(t.text, TEXTS).heads  # the text tower's rows are its own analysis
    text = heads[heads["stack"] == "text"].reset_index(drop=True)
    for col in ("first", "prev", "entropy", "distance"):
        np.testing.assert_allclose(text[col], alone[col], **tolerance("scaled"))
    vision = heads[heads["stack"] == "vision"]
    specials = len(t.vision.tokenizer.specials)
    n = specials + (IMAGE // PATCH) ** 2
    np.testing.assert_allclose(vision["patch_share"], (n - specials) / n, **tolerance("probability"))
    np.testing.assert_allclose(vision["distance_ratio"], 1.0, **tolerance("scaled"))
    assert text["grid_distance"].isna().all() and len(res.results["image_maps"]) == 2
    assert res.model["name"] == kind and set(res.model["towers"]) == {"text", "vision"}
    assert head_name(heads.iloc[9], int(heads.iloc[9]["head"])) == "vision L0H1"


def test_a_pair_needs_both_inputs():
    from probe.errors import InputError, UnsupportedArchitectureError
    from probe.loading.models import spec_for

    pair, t = towers("clip")
    with pytest.raises(InputError, match="both text"):
        analyze_towers(t, TEXTS, [])
    with pytest.raises(UnsupportedArchitectureError, match="dual encoder"):
        from_pretrained_objects(pair, bpe_tokenizer())
    assert spec_for(t.text.model, bpe_tokenizer()).kind == "encoder"


def test_cli_analyzes_a_pair_in_one_run(tmp_path):
    from PIL import Image

    folder = save_pair("siglip", tmp_path / "siglip")
    image = tmp_path / "a.png"
    Image.fromarray(np.zeros((40, 48, 3), dtype=np.uint8), "RGB").save(image)
    r = invoke_cli("analyze", "--model", folder, "--image", image, "--text", TEXTS[0], "--text", TEXTS[1],
                   "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert "2 sequences (--text) with the text tower and 1 image with the vision tower" in r.output
    heads = pd.read_csv(tmp_path / "r" / "heads.csv")
    assert list(heads["stack"].unique()) == ["text", "vision"] and len(heads) == 16
    assert heads.loc[heads["stack"] == "vision", "grid_distance"].notna().all()
    page = (tmp_path / "r" / "index.html").read_text()
    assert 'id="image-attention"' in page and "vision L1H3" in page
    assert json.loads((tmp_path / "r" / "run.json").read_text())["model"]["towers"]["vision"]["name"].endswith(
        "(vision tower)")
    for args in (["--text", "hi"], ["--image", image]):
        one_error(invoke_cli("analyze", "--model", folder, *args, "--out", tmp_path / "x"), 1, "dual encoder")
