"""The supported-models table: which model types of transformers probe has been shown to run on.

``probe/data/models.tsv`` holds one row per model type of the transformers version it was made
with (its first line, ``# transformers X.Y.Z``, says which: :func:`table_version`): probe run on a
tiny random model of the type (``tools/models_table.py`` in the repository writes it and
``docs/models.md``): ``works`` (probe's verification passed and ``probe.analyze`` ran), ``refused``
with the first line of the reason, or ``out of scope`` (no text model).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from importlib import resources

#: The columns of ``probe/data/models.tsv``: the type (``config.model_type``), its kind (``encoder``,
#: ``decoder``, ``encoder-decoder`` or ``not text``), the status, the reason for a refusal, whether
#: ``probe.analyze`` ran on its own (``ran``, ``refused``, empty where probe did not get that far), the
#: largest difference verification saw and the seconds the try took.
COLUMNS = ("type", "kind", "status", "reason", "analyze", "max_diff", "seconds")
STATUSES = ("works", "refused", "out of scope")


#: The first line of ``models.tsv``: the transformers version the table was made with.
STAMP = "# transformers "


def _text() -> str:
    return resources.files("probe").joinpath("data/models.tsv").read_text(encoding="utf-8")


def model_types() -> list[dict[str, str]]:
    """The rows of the table shipped with probe, in the order of the type names.

    Returns:
        one dict per model type with the keys of :data:`COLUMNS` (strings; empty where not recorded).
    """
    lines = [line for line in _text().splitlines(keepends=True) if not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("".join(lines)), delimiter="\t"))


def table_version() -> str | None:
    """The transformers version the shipped table was made with (its stamp line), or None if unstamped."""
    first = _text().split("\n", 1)[0]
    return first[len(STAMP):].strip() if first.startswith(STAMP) else None


def version_note(installed: str) -> str | None:
    """One line for a user whose transformers differs from the table's, or None where they agree: the
    table's rows say what probe did on the version it was made with; a release adds model types and moves
    families between probe's paths (Falcon onto the attention interface in 5.25)."""
    made = table_version()
    if made == installed:
        return None
    return (f"note: this table was made with transformers {made or 'an unstamped version'}; transformers {installed} "
            "is installed, whose model types and statuses may differ: from a checkout of probe, "
            "'python tools/models_table.py' remakes it for the installed version (docs/contributing.md)")


def status_counts(rows: list[dict[str, str]]) -> dict[str, Counter]:
    """How many types of each kind have each status: ``{kind: Counter(status)}``, plus ``"all"``."""
    out: dict[str, Counter] = {}
    for r in rows:
        out.setdefault(r["kind"], Counter())[r["status"]] += 1
        out.setdefault("all", Counter())[r["status"]] += 1
    return out
