"""Images: processor, batches and token labels, the grid measures against closed forms under
uniform attention, rollout, overlays, the report section and the CLI (tiny random vision models)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from vision_models import IMAGE, PATCH, VISION, save_vision, tiny_vision

from conftest import assert_same_run, tolerance
from probe.cli import main
from probe.entries.notebook import show
from probe.images import GridAttention, analyze_images, heat_cells, images, overlay, show_image
from probe.images.overlay import ALPHA, heat_colour
from probe.loading.pixels import PixelProcessor, patch_label

ROOT = Path(__file__).resolve().parents[1]


def picture(width: int = 40, height: int = 40, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


@pytest.fixture(scope="module")
def uniform_runs():
    """kind -> (model, result) of two images under uniform attention, whole maps kept."""
    out = {}
    for kind in VISION:
        lm = tiny_vision(kind, uniform=True)
        out[kind] = lm, analyze_images(lm, [picture(seed=1), picture(seed=2)], n_examples=2, example_tokens=None)
    return out


# ----------------------------------------------------------------------------- processor, batches


def test_pixels_equal_an_independent_resize_and_normalisation():
    settings = {"size": {"height": 32, "width": 32}, "resample": 3, "rescale_factor": 1 / 255,
                "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.25, 0.3]}
    lm = tiny_vision("vit")
    p = PixelProcessor.from_settings(settings, lm.model.config)
    im = picture(50, 30)
    want = np.asarray(im.resize((32, 32), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    want = (want - np.array([0.4, 0.5, 0.6], dtype=np.float32)) / np.array([0.2, 0.25, 0.3], dtype=np.float32)
    got = p.pixel_values(p.resized(im)).numpy()
    np.testing.assert_allclose(got, want.transpose(2, 0, 1), rtol=1e-6, atol=1e-6)


def test_shortest_edge_then_centre_crop():
    """CLIP-style settings: the shorter edge to 40 pixels, then the centre 32 x 32."""
    lm = tiny_vision("clip")
    p = PixelProcessor.from_settings({"size": {"shortest_edge": 40}, "do_center_crop": True,
                                      "crop_size": {"height": 32, "width": 32}, "resample": 0}, lm.model.config)
    im = picture(80, 40)
    want = im.resize((80, 40), Image.Resampling.NEAREST).crop((24, 4, 56, 36))
    assert p.resized(im).size == (32, 32)
    assert np.array_equal(np.asarray(p.resized(im)), np.asarray(want))


@pytest.mark.parametrize("kind", list(VISION))
def test_tokens_are_the_specials_then_the_patches_row_by_row(kind):
    lm = tiny_vision(kind)
    specials = VISION[kind][1]
    assert lm.tokenizer.specials == specials
    batch = next(images(lm, [picture()]).iter_batches())
    R = C = IMAGE // PATCH
    labels = lm.tokenizer.convert_ids_to_tokens(batch.input_ids[0].tolist())
    assert labels[:len(specials)] == list(specials)
    assert labels[len(specials):] == [f"patch ({p // C}, {p % C})" for p in range(R * C)]
    assert batch.special[0].tolist() == [True] * len(specials) + [False] * (R * C)
    with torch.no_grad():
        out = lm.model(**batch.model_inputs())
    assert out.last_hidden_state.shape[1] == len(specials) + R * C  # the model's own sequence length


@pytest.mark.parametrize("kind", ["vit", "dinov2_with_registers", "siglip"])
def test_a_non_square_size_gives_its_grid(kind):
    lm = tiny_vision(kind)
    res = analyze_images(lm, [picture(60, 40)], image_size=(32, 48), example_tokens=None)
    ex = res.results["image_maps"][0]
    s = len(VISION[kind][1])
    assert ex.grid == (4, 6) and ex.pixels.shape == (32, 48, 3)
    assert res.examples[0].probs.shape[-1] == s + 24
    assert lm.tokenizer.convert_ids_to_tokens(res.examples[0].ids)[s + 7] == patch_label(1, 1)  # p = 7: r 1, c 1


def test_bad_images_are_one_line_errors(tmp_path):
    from probe.errors import InputError

    lm = tiny_vision("vit")
    (tmp_path / "bad.png").write_text("not an image")
    with pytest.raises(InputError, match="cannot read image"):
        analyze_images(lm, [tmp_path / "bad.png"])
    with pytest.raises(InputError, match="not found"):
        analyze_images(lm, [tmp_path / "missing.png"])
    with pytest.raises(InputError, match="multiple of the patch side"):
        analyze_images(lm, [picture()], image_size=(30, 32))


# ----------------------------------------------------------------------------- uniform attention


def uniform_measures(specials: tuple[str, ...], R: int, C: int) -> dict[str, float]:
    """The grid measures of attention 1/N on every key, from the definitions (loops, no tensors)."""
    N = len(specials) + R * C
    cells = [(p // C, p % C) for p in range(R * C)]
    dist, local, row, col = [], [], [], []
    for rq, cq in cells:
        dist.append(sum(math.hypot(rq - rk, cq - ck) for rk, ck in cells) / (R * C))  # mass P/N cancels
        local.append(sum(abs(rq - rk) <= 1 and abs(cq - ck) <= 1 for rk, ck in cells) / N)
        row.append(sum(rk == rq and ck != cq for rk, ck in cells) / N)
        col.append(sum(ck == cq and rk != rq for rk, ck in cells) / N)
    n_reg = specials.count("[REG]")
    return {"grid_distance": np.mean(dist), "cls_share": 1 / N if "[CLS]" in specials else float("nan"),
            "register_share": n_reg / N if n_reg else float("nan"), "local_share": np.mean(local),
            "row_share": np.mean(row), "column_share": np.mean(col), "patch_share": R * C / N}


@pytest.mark.parametrize("kind", list(VISION))
def test_uniform_attention_gives_the_closed_forms(kind, uniform_runs):
    lm, res = uniform_runs[kind]
    specials = VISION[kind][1]
    R = C = IMAGE // PATCH
    N = len(specials) + R * C
    for ex in res.examples:  # every weight 1/N
        np.testing.assert_allclose(ex.probs, np.full_like(ex.probs, 1 / N), **tolerance("probability"))
    want = uniform_measures(specials, R, C)
    for column, value in want.items():
        got = res.heads[column].to_numpy()
        if math.isnan(value):
            assert np.isnan(got).all(), column
        else:
            np.testing.assert_allclose(got, value, rtol=1e-6, err_msg=column)
    np.testing.assert_allclose(res.heads["distance_ratio"], 1.0, rtol=1e-6)
    assert all("global" in labels.split(";") for labels in res.heads["labels"])  # distance as far as uniform


@pytest.mark.parametrize("kind", ["vit", "dinov2_with_registers", "siglip"])
def test_rollout_of_uniform_attention(kind, uniform_runs):
    """A~ = 0.5 J/N + 0.5 I with J/N idempotent: R = 0.5^L I + (1 - 0.5^L) J/N."""
    lm, res = uniform_runs[kind]
    ex = res.results["image_maps"][0]
    L, N = lm.geometry.n_layers, ex.rows.shape[-1]
    want = np.full(N, (1 - 0.5 ** L) / N)
    if ex.query is not None:
        want[ex.query] += 0.5 ** L
    else:  # no class token: the mean of R's rows
        want += 0.5 ** L / N
    np.testing.assert_allclose(ex.rollout(), want, **tolerance("probability"))
    assert ex.query_name == ("[CLS]" if VISION[kind][1] else "mean over queries")


def test_grid_measures_merge_like_one_pass(uniform_runs):
    lm = tiny_vision("deit")
    items = [picture(seed=s) for s in range(3)]
    whole = GridAttention(lm.sites, 4, lm.tokenizer.specials)
    parts = [GridAttention(lm.sites, 4, lm.tokenizer.specials) for _ in range(2)]
    from probe.runs.analysis import run

    run(lm, images(lm, items).iter_batches(2), [whole])
    run(lm, images(lm, items[:1]).iter_batches(), [parts[0]])
    run(lm, images(lm, items[1:]).iter_batches(), [parts[1]])
    merged = parts[0].merge(parts[1]).result()
    pd.testing.assert_frame_equal(merged, whole.result(), rtol=1e-9)
    assert whole.result()["register_share"].isna().all()  # DeiT's distillation token is not a register


def test_a_head_that_looks_at_its_neighbours_is_local():
    """Hand-built maps: every patch puts all its weight on itself and its 8-neighbourhood."""
    from probe.images.batches import Images
    from probe.images.grid import grid_geometry

    lm = tiny_vision("vit")
    batch = next(Images(lm.tokenizer, [picture()]).iter_batches())
    R = C = 4
    local = grid_geometry(R, C)["local"]
    probs = torch.zeros(1, 4, 17, 17, dtype=torch.float64)
    probs[:, :, 0, 0] = 1
    probs[0, :, 1:, 1:] = local / local.sum(-1, keepdim=True)
    acc = GridAttention(lm.sites, 4, lm.tokenizer.specials)
    acc.update(lm.sites[0], probs, batch)
    row = acc.result().iloc[0]
    assert row["local_share"] == pytest.approx(1.0) and row["cls_share"] == 0
    assert ("local" in {lab for _, _, lab, _ in acc.head_labels()})
    cells = [(p // C, p % C) for p in range(R * C)]
    want = np.mean([np.mean([math.hypot(a - c, b - d) for c, d in cells if abs(a - c) <= 1 and abs(b - d) <= 1])
                    for a, b in cells])
    assert row["grid_distance"] == pytest.approx(want)


# ----------------------------------------------------------------------------- pictures


def test_a_hot_patch_shows_where_it_was_planted():
    pixels = np.full((32, 48, 3), 40, dtype=np.uint8)
    heat = np.zeros((4, 6))
    heat[2, 5] = 0.7
    cells = heat_cells(heat, (32, 48))
    ys, xs = np.nonzero(cells)
    assert (ys.min(), ys.max(), xs.min(), xs.max()) == (16, 23, 40, 47)  # rows 16-23, columns 40-47: patch (2, 5)
    out = overlay(pixels, heat)
    hot = np.round(((1 - ALPHA) * 40 / 255 + ALPHA * heat_colour(np.array(1.0))) * 255)
    assert np.array_equal(out[20, 44], hot.astype(np.uint8))
    changed = np.any(out != pixels, axis=-1)
    assert np.array_equal(changed, cells > 0)  # cold patches show the image unchanged


def test_a_model_whose_keys_favour_one_patch_lights_it_up():
    """Queries all ones, keys zero except at the planted patch (1, 2) (a hook on the key projection):
    every row's weight goes to that patch, and the [CLS] overlay is hottest on its pixels."""
    lm = tiny_vision("vit", uniform=True)
    planted = 1 + 1 * 4 + 2  # [CLS], then p = r * C + c

    def plant(module, args, output):
        output = output.clone()
        output[:, planted] += 4.0
        return output

    handles = []
    for layer in lm.model.layers:
        att = layer.attention
        with torch.no_grad():
            att.q_proj.bias.fill_(1.0)
        handles.append(att.k_proj.register_forward_hook(plant))
    try:
        res = analyze_images(lm, [picture()], example_tokens=None)
    finally:
        for h in handles:
            h.remove()
    ex = res.results["image_maps"][0]
    heat = ex.patches(ex.rows[0].mean(0))
    assert np.unravel_index(np.argmax(heat), heat.shape) == (1, 2)
    cells = heat_cells(heat, ex.pixels.shape[:2])
    assert np.array_equal(np.argwhere(cells == 1.0)[[0, -1]], [[8, 16], [15, 23]])  # pixels of patch (1, 2)


def test_show_image_and_the_report_section(tmp_path):
    from probe.report import write_run

    lm = tiny_vision("dinov2_with_registers")
    res = analyze_images(lm, [picture(), picture(seed=3)])
    view = show_image(res, 1)
    html = view._repr_html_()
    assert html.count("<img") == 3 + 2 * (1 + 4)  # image, rollout, flow; per layer the mean and 4 heads
    assert "http" not in html.replace("http-equiv", "")
    head_view = show(res, example=1, tokenizer=lm.tokenizer)  # probe.show: the head view and the pictures below
    assert head_view.images == view.html and head_view.to_html().count("<img") == html.count("<img")
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    page = (path / "index.html").read_text()
    assert 'id="image-attention"' in page and page.count("data:image/png;base64,") >= 2 * 12
    record = json.loads((path / "run.json").read_text())
    rollout = np.array(record["image-attention"]["images"][0]["rollout"])
    assert rollout.shape == (4, 4)
    flow = np.array(record["image-attention"]["images"][0]["flow"])
    ex = res.results["image_maps"][0]
    np.testing.assert_allclose(flow, np.round(ex.patches(ex.flow()), 6))
    heads = pd.read_csv(path / "heads.csv")
    assert {"grid_distance", "cls_share", "register_share", "local_share", "row_share", "column_share"} <= set(heads)


def test_views_of_an_image_run_label_its_tokens_without_a_tokenizer(tmp_path):
    """probe.show / probe.model_view of an image analysis, no tokenizer given: the tokens are the model's special
    tokens ([CLS], registers) then ``patch (r, c)`` row by row, the processor's own labels; nothing asks for a
    tokenizer (before, the views raised "a tokenizer is needed")."""
    import probe

    lm = tiny_vision("dinov2_with_registers")
    res = analyze_images(lm, [picture(), picture(seed=3)], n_examples=2, example_tokens=None)
    for example in (0, 1):
        ex = res.examples[example]
        want = lm.tokenizer.convert_ids_to_tokens(ex.ids)
        rows, cols = lm.tokenizer.grid()
        specials = list(lm.tokenizer.specials)
        assert want == specials + [patch_label(r, c) for r in range(rows) for c in range(cols)]
        assert specials == ["[CLS]", "[REG]", "[REG]", "[REG]"]
        view = show(res, example=example)
        assert view.data["tokens"] == want
        model_view = probe.model_view(res, example=example)
        assert model_view.head_view.data["tokens"] == want
    from probe.report import write_run

    page = (write_run(res, None, tmp_path / "run") / "index.html").read_text(encoding="utf-8")  # no tokenizer either
    assert "patch (0, 0)" in page


# ----------------------------------------------------------------------------- command line


def test_cli_analyzes_an_image_and_refuses_bad_input(tmp_path):
    folder = save_vision("vit", tmp_path / "vit")
    good = tmp_path / "a.png"
    picture(48, 32).save(good)
    (tmp_path / "bad.jpg").write_text("nope")
    runner = CliRunner()
    r = runner.invoke(main, ["analyze", "--model", str(folder), "--image", str(good), "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert "Analyzing 1 image (--image)" in r.output
    heads = pd.read_csv(tmp_path / "r" / "heads.csv")
    assert len(heads) == 8 and heads["grid_distance"].notna().all()
    cases = [(["--image", str(tmp_path / "bad.jpg")], "cannot read image"),
             (["--image", str(tmp_path / "none.png")], "not found"),
             ([], "is an image model"),
             (["--image", str(good), "--text", "hello"], "not both"),
             (["--image", str(good), "--image-size", "big"], "HEIGHTxWIDTH"),
             (["--images", str(tmp_path / "vit")], "no image in"),
             (["--image", str(good), "--verify"], "does not run on images or audio")]
    for args, message in cases:
        r = runner.invoke(main, ["analyze", "--model", str(folder), *args, "--out", str(tmp_path / "x")])
        assert r.exit_code != 0 and message in r.output, (args, r.output)
        assert r.output.strip().startswith("Error:") and "Traceback" not in r.output
    r = runner.invoke(main, ["verify", "--model", str(folder)])  # commands that read text refuse in one line
    assert r.exit_code != 0 and "reads images, not text" in r.output and "Traceback" not in r.output


def test_the_example_image_is_the_script_s(tmp_path):
    """examples/make_shapes.py draws examples/shapes.png exactly (the committed file is its output)."""
    out = tmp_path / "shapes.png"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_shapes.py"), str(out)], check=True)
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(Image.open(ROOT / "examples" / "shapes.png")))


@pytest.mark.browser
def test_image_section_renders_in_chromium_without_errors_or_requests(tmp_path, chromium):
    from conftest import watched_page
    from probe.report import write_run

    lm = tiny_vision("vit")
    res = analyze_images(lm, [ROOT / "examples" / "shapes.png"])
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    with watched_page(chromium, path / "index.html") as (page, messages, requests):
        page.wait_for_function("document.body.getAttribute('data-figures-drawn') !== null")
        shown = page.evaluate("[...document.querySelectorAll('.img-att-section img')]"
                              ".filter(i => i.complete && i.naturalWidth > 0).length")
        assert shown == 3 + 2 * 5
        page.locator(".img-att-section").screenshot(path=str(tmp_path / "images.png"))
        assert messages == []
        assert [u for u in requests if not u.startswith(("data:", "file:"))] == []


def test_analyze_run_on_an_image_folder_writes_the_command_s_run_folder(tmp_path):
    """probe.analyze_run(model, images=FOLDER) is `probe analyze --model MODEL --images FOLDER` in one call:
    the same files, the same heads.csv byte for byte, the same run.json but for the times."""
    import probe

    folder = save_vision("vit", tmp_path / "vit")
    photos = tmp_path / "photos"
    photos.mkdir()
    picture(48, 32, seed=3).save(photos / "a.png")
    picture(40, 40, seed=4).save(photos / "b.png")
    r = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--images", str(photos), "--out",
                                  str(tmp_path / "cmd")])
    assert r.exit_code == 0, r.output
    result, out = probe.analyze_run(str(folder), images=str(photos), out=tmp_path / "lib")
    assert out == tmp_path / "lib" and len(result.heads) == 8
    assert_same_run(tmp_path / "cmd", out)

