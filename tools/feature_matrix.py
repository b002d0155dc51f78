"""The feature x type matrix: every analysis of probe tried on a tiny random model of every type.

Usage (from the repository root)::

    python tools/feature_matrix.py                   # every type: probe/data/features.tsv, docs/models.md's matrix
    python tools/feature_matrix.py --out DIR         # write features.tsv and models.md under DIR instead
    python tools/feature_matrix.py --types llama,vit # only these types (printed, nothing written)
    python tools/feature_matrix.py --render          # docs/models.md's matrix from probe/data/features.tsv
    python tools/feature_matrix.py --update dbrx,vit # rerun these types, their rows replaced in both

The types are the text types of ``tools/models_table.py`` (the ``not text`` ones left out) and the
image and speech types probe knows (``tools/try_features.py``: :func:`other_types`). Each type runs in a
worker process (``tools/workers.py``, the loop ``tools/models_table.py`` runs too): a build over ``BUILD_CAP``
seconds or a feature over :data:`FEATURE_CAP` stops the worker; that feature's cell says ``timed out`` and
the features after it ``not tried``, and the type is tried once more at the end in a fresh worker.
docs/models.md keeps the matrix between ``models_table.BEGIN`` and ``END`` (``tools/models_table.py`` keeps
that block when it rewrites the page).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's probe, not an installed one
from models_table import BEGIN, BUILD_CAP, END, STAMP, _cell, splice  # noqa: E402 - the folder of this script first
from tiny_models import ROOT, text_types  # noqa: E402
from workers import Outcome, Runner, run_types  # noqa: E402

#: The matrix's columns after ``type`` and ``kind`` (``tools/try_features.py``'s FEATURES and
#: ``probe.loading.support.FEATURES``, repeated here; a test checks they agree), and their short headers.
FEATURES = ("capture", "verify", "value_weighted", "ablation", "patch_z", "patch_q", "patch_k", "patch_v",
            "patch_pattern", "dla", "composition", "circuit", "path", "steps", "views")
SHORT = ("cap", "ver", "vw", "abl", "z", "q", "k", "v", "pat", "dla", "comp", "circ", "path", "steps", "view")
COLUMNS = ("type", "kind", *FEATURES, "seconds")
FEATURE_CAP = 60.0
RAN = "ran"
IMAGE_SPEECH = ("image", "speech")


def blank(model_type: str, kind: str, cells: dict, default: str, seconds: float) -> dict:
    """A row of ``cells``, ``default`` in the features not among them."""
    return {"type": model_type, "kind": kind, **{f: cells.get(f, default) for f in FEATURES},
            "seconds": f"{seconds:.1f}"}


def row_of(model_type: str, kind: str, outcome: Outcome) -> dict:
    """A type's row: the worker's, or the cells it reported before it was stopped, the feature it was stopped
    at saying why and the features after it ``not tried``."""
    if outcome.row is not None:
        return outcome.row
    if not outcome.built and outcome.why == "timed out":
        return blank(model_type, kind, {}, f"timed out: building took over {BUILD_CAP:.0f} s", outcome.seconds)
    cells = dict(outcome.cells)
    stuck = FEATURES[len(cells)]
    why = f"timed out: took over {FEATURE_CAP:.0f} s" if outcome.why == "timed out" else outcome.why
    cells[stuck] = why
    return blank(model_type, kind, cells, f"not tried: the worker was stopped at {stuck} ({why})", outcome.seconds)


def _stopped(r: dict) -> bool:
    return any(r[f].startswith(("timed out", "crashed")) for f in FEATURES)


def matrix(types: list[tuple[str, str]], echo=print) -> list[dict]:
    """A row for every ``(model_type, kind)``, each in a worker process (``tools/workers.py``: a build over
    ``BUILD_CAP`` or a feature over :data:`FEATURE_CAP` stops it); a type whose worker was stopped is tried once
    more at the end in a fresh worker (a busy machine slows one try, not two)."""
    return run_types(types, Runner("try_features", "try_features", BUILD_CAP, FEATURE_CAP), row_of, _stopped, echo,
                     lambda r: f"{sum(r[f] == RAN for f in FEATURES)} of {len(FEATURES)} ran, {r['seconds']} s")


def all_types() -> list[tuple[str, str]]:
    """The text types (``tools/tiny_models.py``, ``not text`` left out) and the image and speech types."""
    sys.path.insert(0, str(ROOT))
    from try_features import other_types  # deferred: it imports probe (seconds); the types list does not

    return [t for t in text_types() if t[1] != "not text"] + other_types()


def write_tsv(rows: list[dict], path: Path, version: str) -> None:
    """``probe/data/features.tsv``: the stamp line (``# transformers VERSION``), then :data:`COLUMNS`."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(f"{STAMP}{version}\n")
        w = csv.DictWriter(f, COLUMNS, delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def read_tsv(path: Path) -> list[dict]:
    """The rows of a matrix written by :func:`write_tsv` (its stamp line skipped)."""
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"))


def markdown_block(rows: list[dict], version: str) -> str:
    """The matrix's block of docs/models.md, ``BEGIN`` to ``END``."""
    from probe.loading.support import feature_cells, feature_counts, reason_numbers  # deferred: after ROOT on the path

    n_text = sum(r["kind"] not in IMAGE_SPEECH for r in rows)
    numbers = reason_numbers(rows)
    c = feature_counts(rows)
    lines = [
        BEGIN, "", "## Feature x type matrix", "",
        f"Each analysis of probe tried on a tiny random model of each of the {n_text} text types above and",
        f"{len(rows) - n_text} image and speech types (transformers {version}; `tools/try_features.py` builds",
        "them: the same tiny configs, one or two short texts, two prompt pairs, an image of 40 x 40 pixels or half a",
        "second of audio). **+**: it ran (verify: it ran and passed); a number: it was refused, for the reason of",
        "that number below (TYPE stands for the type's tiny model). Encoders are built bare (`AutoModel`,",
        "as probe loads a checkpoint without its masked-LM head), so the analyses that compare answer",
        "logits refuse them. `probe models --features` prints the same matrix. Regenerate it (and",
        "`probe/data/features.tsv`) with `python tools/feature_matrix.py` (each type in a worker process, a",
        f"feature stopped after {FEATURE_CAP:.0f} s; about 16 minutes on 2 busy cores); a test reruns a sample",
        "of seven types and the slow tier every row.", "",
        "| feature | what runs | text types | image and speech |", "| --- | --- | --- | --- |",
    ]
    what = {"capture": "probe.capture_attention (images, speech: probe.analyze of one input)",
            "verify": "probe.verify passes", "value_weighted": "value-weighted statistics (_by_norm, norm_mass)",
            "ablation": "probe.head_effects (zero ablation)", "patch_z": "patching each head's output z",
            "patch_q": "patching queries", "patch_k": "patching keys", "patch_v": "patching values",
            "patch_pattern": "patching attention patterns", "dla": "direct logit attribution",
            "composition": "Q/K/V composition scores", "circuit": "`probe circuit` (EAP)",
            "path": "`probe path` (L0H0 -> logits)", "steps": "probe.attention_steps", "views": "probe.model_view"}
    lines += [f"| {f} ({s}) | {what[f]} | {c[f]['text']} of {n_text} | {c[f]['media']} of {len(rows) - n_text} |"
              for f, s in zip(FEATURES, SHORT)]
    lines += ["", "| type | kind | " + " | ".join(SHORT) + " |",
              "| --- | --- | " + " | ".join(["---"] * len(SHORT)) + " |"]
    for r in rows:
        cells = feature_cells(r, numbers)
        lines.append(f"| `{r['type']}` | {r['kind']} | " + " | ".join(cells) + " |")
    lines += ["", "Reasons:", ""]
    lines += [f"{n}. {_cell(reason)}" for reason, n in numbers.items()]
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import transformers  # deferred: its version only (the workers import it for the work)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder for models.md and features.tsv (default: docs/, probe/data/)")
    p.add_argument("--types", help="comma-separated model types: run only these, print, write nothing")
    p.add_argument("--update", help="comma-separated model types: rerun only these and replace their rows in "
                                    "probe/data/features.tsv and docs/models.md")
    p.add_argument("--render", action="store_true",
                   help="write docs/models.md's matrix from probe/data/features.tsv as it is (no model is run)")
    args = p.parse_args(argv)
    if args.update:  # only these types rerun, their rows replaced in the committed matrix
        tsv = ROOT / "probe" / "data" / "features.tsv"
        version = tsv.read_text(encoding="utf-8").split("\n", 1)[0][len(STAMP):].strip()
        if version != transformers.__version__:
            print(f"Error: features.tsv was made with transformers {version}; {transformers.__version__} is installed")
            return 1
        wanted = set(args.update.split(","))
        fresh = {(r["type"], r["kind"]): r for r in matrix([t for t in all_types() if t[0] in wanted])}
        write_tsv([fresh.get((r["type"], r["kind"]), r) for r in read_tsv(tsv)], tsv, version)
        args.render = True
    if args.render:
        tsv = ROOT / "probe" / "data" / "features.tsv"
        md_path = ROOT / "docs" / "models.md"
        version = tsv.read_text(encoding="utf-8").split("\n", 1)[0][len(STAMP):].strip()
        md_path.write_text(splice(md_path.read_text(encoding="utf-8"), markdown_block(read_tsv(tsv), version)),
                           encoding="utf-8")
        print(f"wrote {md_path}")
        return 0
    types = all_types()
    if args.types:
        wanted = set(args.types.split(","))
        types = [t for t in types if t[0] in wanted]
    start = time.monotonic()
    rows = matrix(types, echo=lambda s: print(s, flush=True))
    print(f"{len(rows)} types in {time.monotonic() - start:.0f} s")
    from probe.loading.support import feature_counts  # deferred: after ROOT on the path

    for f, c in feature_counts(rows).items():
        print(f"  {f}: {c['text']} text, {c['media']} image/speech")
    if args.types:
        for r in rows:
            for f in FEATURES:
                print(f"{r['type']}\t{f}\t{r[f]}")
        return 0
    md_path = (args.out / "models.md") if args.out else ROOT / "docs" / "models.md"
    tsv_path = (args.out / "features.tsv") if args.out else ROOT / "probe" / "data" / "features.tsv"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    page = md_path.read_text(encoding="utf-8") if md_path.exists() else (ROOT / "docs" / "models.md").read_text(
        encoding="utf-8")
    md_path.write_text(splice(page, markdown_block(rows, transformers.__version__)), encoding="utf-8")
    write_tsv(rows, tsv_path, transformers.__version__)
    print(f"wrote {md_path} and {tsv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
