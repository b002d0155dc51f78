"""``probe analyze`` on a dual encoder (CLIP, SigLIP): its text tower on the text and its vision
tower on the images, one run (:mod:`probe.entries.towers`)."""

from __future__ import annotations

import time

import click

from ..errors import InputError


def is_pair_model(model_name: str) -> bool:
    """Whether ``model_name`` is a dual encoder on this machine (its config read without weights;
    a Hub id not yet downloaded reads as False, and loading it then says what it is)."""
    from ..architectures.towers import is_pair
    from ..loading.models import peek_config

    config = peek_config(model_name)
    return config is not None and is_pair(config)


def analyze_pair(model_name: str, texts, source: str, paths: list[str] | None, out, *, force: bool, dtype,
                 timings: dict, started: float, **analysis) -> None:
    """Load the pair's towers, analyse the text and the images, write one run folder, print the summary.

    Raises:
        InputError: no image, or no text given with ``--text`` / ``--corpus``.
    """
    from ..entries.towers import analyze_towers, load_towers
    from ..report import write_run
    from ..util import plural
    from .summary import summary

    if not paths or source == "built-in sample":
        raise InputError(f"{model_name} is a dual encoder (text and vision towers): give images (--image, --images) "
                         "and text (--text, --corpus) together")
    t = time.perf_counter()
    towers = load_towers(model_name, dtype=dtype)
    timings["model_load_s"] = time.perf_counter() - t
    texts = list(texts)
    click.echo(f"Analyzing {plural(len(texts), 'sequence')} ({source}) with the text tower and "
               f"{plural(len(paths), 'image')} with the vision tower of {model_name}: "
               f"{towers.text.geometry.n_layers} + {towers.vision.geometry.n_layers} layers", err=True)
    result = analyze_towers(towers, texts, paths, **analysis)
    result.settings["input"] = f"{source} and images"
    path = write_run(result, towers.text.tokenizer, out, force=force, timings=timings, started=started)
    summary(result, None, False, towers.text.notes)
    click.echo(f"Report: {path / 'index.html'}")
