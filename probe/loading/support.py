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
import re
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


#: The analyses of ``probe/data/features.tsv`` (the feature x type matrix), in its column order, with the
#: short header ``probe models --features`` prints: capture, verification, value-weighted statistics,
#: ablation, activation patching of z, q, k, v and the pattern, direct logit attribution, composition,
#: ``probe circuit``, ``probe path``, attention steps and the model view.
FEATURES = {"capture": "cap", "verify": "ver", "value_weighted": "vw", "ablation": "abl", "patch_z": "z",
            "patch_q": "q", "patch_k": "k", "patch_v": "v", "patch_pattern": "pat", "dla": "dla",
            "composition": "comp", "circuit": "circ", "path": "path", "steps": "steps", "views": "view"}
#: A cell of the matrix whose analysis ran (verify: and passed); any other cell is the reason it did not.
RAN = "ran"


def _text(name: str = "models.tsv") -> str:
    return resources.files("probe").joinpath(f"data/{name}").read_text(encoding="utf-8")


def _rows(name: str) -> list[dict[str, str]]:
    lines = [line for line in _text(name).splitlines(keepends=True) if not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("".join(lines)), delimiter="\t"))


def model_types() -> list[dict[str, str]]:
    """The rows of the table shipped with probe, in the order of the type names.

    Returns:
        one dict per model type with the keys of :data:`COLUMNS` (strings; empty where not recorded).
    """
    return _rows("models.tsv")


def feature_rows() -> list[dict[str, str]]:
    """The rows of the feature x type matrix shipped with probe (``probe/data/features.tsv``, written by
    ``tools/feature_matrix.py``): every text type of the models table and the image and speech types probe
    knows, each analysis of :data:`FEATURES` tried on a tiny random model.

    Returns:
        one dict per type: ``type``, ``kind`` (``decoder``, ``encoder``, ``encoder-decoder``, ``image``,
        ``speech``), each feature's cell (:data:`RAN` or the one-line reason) and ``seconds``.
    """
    return _rows("features.tsv")


def table_version(name: str = "models.tsv") -> str | None:
    """The transformers version the shipped table (``models.tsv`` or ``features.tsv``) was made with (its stamp
    line), or None if unstamped."""
    first = _text(name).split("\n", 1)[0]
    return first[len(STAMP):].strip() if first.startswith(STAMP) else None


def version_note(installed: str, name: str = "models.tsv") -> str | None:
    """One line for a user whose transformers differs from the table's, or None where they agree: the
    table's rows say what probe did on the version it was made with; a release adds model types and moves
    families between probe's paths (Falcon onto the attention interface in 5.25)."""
    made = table_version(name)
    if made == installed:
        return None
    tool = "feature_matrix" if name == "features.tsv" else "models_table"
    return (f"note: this table was made with transformers {made or 'an unstamped version'}; transformers {installed} "
            "is installed, whose model types and statuses may differ: from a checkout of probe, "
            f"'python tools/{tool}.py' remakes it for the installed version (docs/contributing.md)")


def status_counts(rows: list[dict[str, str]]) -> dict[str, Counter]:
    """How many types of each kind have each status: ``{kind: Counter(status)}``, plus ``"all"``."""
    out: dict[str, Counter] = {}
    for r in rows:
        out.setdefault(r["kind"], Counter())[r["status"]] += 1
        out.setdefault("all", Counter())[r["status"]] += 1
    return out


#: The kinds of the matrix's image and speech rows (the others are text types).
MEDIA_KINDS = ("image", "speech")


def general_reason(row: dict[str, str], feature: str) -> str:
    """A refused cell's reason with the type's tiny model (``tiny-TYPE``) and the type's name (as a word of
    its own) written ``TYPE``, so that one reason of many types reads as one."""
    text = row[feature].replace(f"tiny-{row['type']}", "TYPE")
    return re.sub(rf"(?<![\w-]){re.escape(row['type'])}(?![\w-])", "TYPE", text)


def reason_numbers(rows: list[dict[str, str]]) -> dict[str, int]:
    """Each distinct reason of the matrix (:func:`general_reason`) numbered 1, 2 ... by how many cells give
    it, most first (ties in the reasons' order), as the matrix shows them."""
    c = Counter(general_reason(r, f) for r in rows for f in FEATURES if r[f] != RAN)
    return {reason: i for i, (reason, _) in enumerate(sorted(c.items(), key=lambda x: (-x[1], x[0])), 1)}


def feature_cells(row: dict[str, str], numbers: dict[str, int]) -> list[str]:
    """A matrix row's cells as the matrix shows them: ``+`` where the feature ran, else its reason's number
    (``numbers``: :func:`reason_numbers`), in :data:`FEATURES` order (``probe models --features``, docs/models.md)."""
    return ["+" if row[f] == RAN else str(numbers[general_reason(row, f)]) for f in FEATURES]


def type_note(row: dict[str, str]) -> str:
    """A models-table row's note: verify's largest difference where the type works, else why it is refused
    (``probe models --all``, docs/models.md)."""
    return f"verify max difference {row['max_diff']}" if row["status"] == "works" else row["reason"]


def feature_counts(rows: list[dict[str, str]]) -> dict[str, dict[str, int]]:
    """How many types each feature ran on: ``{feature: {"text": n, "media": n}}`` (media: image and speech)."""
    return {f: {"text": sum(r[f] == RAN for r in rows if r["kind"] not in MEDIA_KINDS),
                "media": sum(r[f] == RAN for r in rows if r["kind"] in MEDIA_KINDS)} for f in FEATURES}
