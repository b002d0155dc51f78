"""Attention flow over images: the flow of uniform attention against its closed form, a planted hot
patch in the flow overlay, and the solve limit (tiny random vision models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from vision_models import IMAGE, PATCH, tiny_vision, vision_config, zero_queries_and_keys

from conftest import tolerance
from probe.images import analyze_images, heat_cells, show_image
from probe.images.maps import ImageExample
from probe.measures.flow import flow_values
from probe.measures.rollout import residual_maps


def picture(seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8), "RGB")


def uniform_flow(N: int, L: int, i: int, j: int) -> float:
    """Max flow from (L, i) to (0, j) when every layer's map is uniform: ``A~ = a J + b I`` with
    a = 1 / (2N), b = 1/2. A cut: the edge (L, i) -> (L-1, j) and, in each lower layer, the N - 1
    edges (l, t) -> (l-1, j), t != j: a + (L-1)(N-1) a (plus b when i = j: the edge i -> i holds
    a + b); the sink's own inflow, 1, bounds it too."""
    a, b = 1 / (2 * N), 0.5
    return min(1.0, a * (1 + (L - 1) * (N - 1)) + (b if i == j else 0.0))


@pytest.mark.parametrize("N,L", [(3, 1), (3, 3), (5, 2), (5, 3), (17, 3), (17, 4)])
def test_flow_of_uniform_maps_equals_the_closed_form(N, L):
    probs = np.full((L, 1, N, N), 1 / N)
    raw = flow_values(residual_maps(probs))
    want = np.array([[uniform_flow(N, L, i, j) for j in range(N)] for i in range(N)])
    np.testing.assert_allclose(raw, want, rtol=1e-12, atol=1e-14)


def uniform_vit(layers: int):
    """A tiny ViT (4 x 4 grid, [CLS]) of ``layers`` layers with queries and keys zeroed."""
    import transformers as tr

    from probe.loading.models import from_pretrained_objects
    from probe.loading.pixels import PixelProcessor

    config = vision_config("vit")
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = tr.AutoModel.from_config(config).eval()
    zero_queries_and_keys(model)
    return from_pretrained_objects(model, PixelProcessor.from_settings({}, config), name="uniform vit")


def test_flow_overlay_of_a_uniform_vit_is_the_closed_form():
    """3 layers, N = 17 tokens: the class token's flow row is F(CLS, j) / sum_j F(CLS, j)."""
    L = 3
    lm = uniform_vit(L)
    res = analyze_images(lm, [picture()], example_tokens=None)
    ex = res.results["image_maps"][0]
    N = 1 + (IMAGE // PATCH) ** 2
    raw = np.array([uniform_flow(N, L, 0, j) for j in range(N)])
    np.testing.assert_allclose(ex.flow(), raw / raw.sum(), **tolerance("probability"))
    assert ex.flow_solves == N and ex.flow_note() == ""


def test_mean_flow_of_a_model_without_a_class_token():
    """SigLIP (no [CLS]) draws the mean over every query row of the normalised flow: T^2 solves
    (256 for the 4 x 4 grid), and under uniform attention every key gets 1/N."""
    lm = tiny_vision("siglip", uniform=True)
    ex = analyze_images(lm, [picture()], example_tokens=None).results["image_maps"][0]
    N = (IMAGE // PATCH) ** 2
    assert ex.query is None and ex.flow_solves == N * N
    np.testing.assert_allclose(ex.flow(), np.full(N, 1 / N), **tolerance("probability"))


def test_a_planted_hot_patch_is_hottest_in_the_flow_overlay():
    """Queries all ones, keys zero except at patch (1, 2) (a hook on the key projection): the most
    flow from [CLS] reaches that patch, and its pixels are the hottest of the flow overlay."""
    lm = tiny_vision("vit", uniform=True)
    planted = 1 + 1 * 4 + 2

    def plant(module, args, output):
        output = output.clone()
        output[:, planted] += 4.0
        return output

    handles = []
    for layer in lm.model.layers:
        with torch.no_grad():
            layer.attention.q_proj.bias.fill_(1.0)
        handles.append(layer.attention.k_proj.register_forward_hook(plant))
    try:
        res = analyze_images(lm, [picture()], example_tokens=None)
    finally:
        for h in handles:
            h.remove()
    ex = res.results["image_maps"][0]
    heat = ex.patches(ex.flow())
    assert np.unravel_index(np.argmax(heat), heat.shape) == (1, 2)
    cells = heat_cells(heat, ex.pixels.shape[:2])
    assert np.array_equal(np.argwhere(cells == 1.0)[[0, -1]], [[8, 16], [15, 23]])
    assert 'alt="flow of [CLS] over the patches"' in show_image(res).html


def test_flow_above_the_solve_limit_is_left_out_and_the_page_says_why():
    lm = tiny_vision("vit")
    res = analyze_images(lm, [picture()], flow_limit=16, example_tokens=None)  # 17 tokens: 17 solves
    ex = res.results["image_maps"][0]
    assert ex.flow() is None
    assert ex.flow_note() == ("flow left out: [CLS]'s row needs 17 maximum-flow solves over 17 tokens, "
                              "above the limit of 16")
    html = show_image(res).html
    assert "flow of" not in html and "flow left out" in html and html.count("<img") == 2 + 2 * 5
    wider = ImageExample(ex.index, ex.name, ex.pixels, ex.grid, ex.specials, ex.query, ex.rows, ex.means, 17)
    np.testing.assert_allclose(wider.flow().sum(), 1.0, rtol=1e-12)
