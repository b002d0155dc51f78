"""``probe models``: the model aliases and which embedded models are installed."""

from __future__ import annotations

import click

from .group import main


@main.command("models")
def models_command() -> None:
    """List model aliases and which embedded models are installed."""
    from ..models import list_models

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
