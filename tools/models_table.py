"""The supported-models table: probe run on a tiny random model of every text model type.

Usage (from the repository root)::

    python tools/models_table.py                  # every type: docs/models.md, probe/data/models.tsv
    python tools/models_table.py --out DIR        # write both files under DIR instead
    python tools/models_table.py --types llama,t5 # only these types (printed, nothing written)
    python tools/models_table.py --update dbrx,t5 # rerun these types, their rows replaced in both files

Each type runs in a worker process (``tools/workers.py``: one at a time, in sorted order): a build that
takes more than :data:`BUILD_CAP` seconds, or a verify and analysis more than :data:`RUN_CAP`, is stopped
and recorded as ``timed out`` (and tried once more at the end); a worker that dies is recorded with its
exit code and replaced.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's probe, not an installed one
from tiny_models import ROOT, text_types  # noqa: E402 - the folder of this script first
from workers import Outcome, Runner, run_types  # noqa: E402

BUILD_CAP, RUN_CAP = 20.0, 120.0
COLUMNS = ("type", "kind", "status", "reason", "analyze", "max_diff", "seconds")
KINDS = ("decoder", "encoder", "encoder-decoder", "not text")
#: The tsv's first line before the version (``probe.loading.support.STAMP``, which reads it; a test checks
#: they agree): not imported, so that this process does not import probe.
STAMP = "# transformers "
OUT_OF_SCOPE = "not text: out of scope here (vision, speech or multimodal)"
#: The markers of docs/models.md's block that ``tools/feature_matrix.py`` writes (kept when this table is rewritten).
BEGIN, END = "<!-- feature matrix: begin -->", "<!-- feature matrix: end -->"


def runner() -> Runner:
    """The worker loop (``tools/workers.py``) running ``try_model.try_type`` under this table's caps."""
    return Runner("try_model", "try_type", BUILD_CAP, RUN_CAP)


def row_of(model_type: str, kind: str, outcome: Outcome) -> dict:
    """A type's row: the worker's, or ``refused`` with why the worker was stopped."""
    from try_model import row  # deferred: probe's import (seconds) only where a type is tried

    if outcome.row is not None:
        return outcome.row
    why = outcome.why
    if why == "timed out":
        what = f"verify and analyze took over {RUN_CAP:.0f} s" if outcome.built else \
            f"building took over {BUILD_CAP:.0f} s"
        why = f"timed out: {what}"
    return row(model_type, kind, "refused", why, seconds=outcome.seconds)


def table(types: list[tuple[str, str]], echo=print) -> list[dict]:
    """A row for every ``(model_type, kind)``: ``not text`` ones out of scope, the others tried (each in a worker
    process, ``tools/workers.py``; a type that timed out is tried once more at the end in a fresh worker)."""
    from try_model import row  # deferred: probe's import (seconds) only where a type is tried

    tried = [t for t in types if t[1] != "not text"]
    rows = iter(run_types(tried, runner(), row_of, lambda r: r["reason"].startswith("timed out"), echo,
                          lambda r: f"{r['status']} {r['reason']} {r['seconds']} s"))
    return [row(t, kind, "out of scope", OUT_OF_SCOPE) if kind == "not text" else next(rows) for t, kind in types]


def write_tsv(rows: list[dict], path: Path, version: str) -> None:
    """``probe/data/models.tsv``: the stamp line (``# transformers VERSION``), then the :data:`COLUMNS`,
    one row per type."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(f"{STAMP}{version}\n")
        w = csv.DictWriter(f, COLUMNS, delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def read_tsv(path: Path) -> list[dict]:
    """The rows of a table written by :func:`write_tsv` (its stamp line skipped)."""
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"))


def counts(rows: list[dict]) -> dict:
    """``{kind: Counter(status)}`` and ``"all"``."""
    out = {kind: Counter(r["status"] for r in rows if r["kind"] == kind) for kind in KINDS}
    out["all"] = Counter(r["status"] for r in rows)
    return out


def _cell(text: str) -> str:
    """Plain text safe in a Markdown table cell."""
    text = text.replace("\\", "\\\\").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")
    for ch in "|_*[]":
        text = text.replace(ch, "\\" + ch)
    return text


def reasons(rows: list[dict], top: int = 10, chars: int = 150) -> list[tuple[str, int]]:
    """The most common refusal reasons, the type name left out (``unsupported architecture 'TYPE'``)
    and cut to ``chars`` characters."""
    def general(r):
        text = r["reason"].replace(f"'{r['type']}'", "'TYPE'").replace(r["type"], "TYPE")
        return text if len(text) <= chars else text[:chars - 3] + "..."

    return Counter(general(r) for r in rows if r["status"] == "refused").most_common(top)


def markdown(rows: list[dict], version: str) -> str:
    """``docs/models.md``: the counts by kind, the top reasons, one table row per text model type."""
    c = counts(rows)
    text_rows = [r for r in rows if r["kind"] != "not text"]
    lines = [
        "# Supported models", "",
        f"probe run on a tiny random model of every text model type of transformers {version}: a",
        "2-layer, 64-wide model built from the type's default config with `torch.manual_seed(0)`, paired",
        "with a test tokenizer, wrapped with `probe.from_pretrained_objects`, checked with `probe.verify`",
        "(probe's from-scratch attention against the model's) and measured with `probe.analyze` on three",
        "short texts. **works**: both ran and verify passed; **refused**: the first line of the error",
        "probe raised (or why no tiny model could be built). `probe models --all` prints the same table.",
        "A tiny random model shows that probe's code runs and agrees with the model's attention; a real",
        "checkpoint of the type can still differ in settings the default config does not use.", "",
        "Regenerate it (and its copy `probe/data/models.tsv`) with `python tools/models_table.py`; a",
        "slow test checks that the statuses below are still true.", "",
        f"**{c['all']['works']} work, {c['all']['refused']} refused** of {len(text_rows)} text model types;",
        f"{c['all']['out of scope']} other types (vision, speech, multimodal) are out of scope here.",
        f"`probe.analyze` alone ran on {sum(r['analyze'] == 'ran' for r in rows)} types (capture and statistics,",
        "whether or not verification could check them).", "",
        "| kind | works | refused |", "| --- | --- | --- |",
    ]
    lines += [f"| {kind} | {c[kind]['works']} | {c[kind]['refused']} |" for kind in KINDS[:3]]
    lines += ["", "Most common refusals:", ""]
    lines += [f"- {n} x {_cell(reason)}" for reason, n in reasons(rows)]
    lines += ["", "| type | kind | status | why / notes |", "| --- | --- | --- | --- |"]
    from probe.loading.support import type_note  # deferred: probe's import only where a page is written

    for r in text_rows:
        lines.append(f"| `{r['type']}` | {r['kind']} | {r['status']} | {_cell(type_note(r))} |")
    lines += ["", "Out of scope here (no text auto class, or images, audio or video in the config): "
              + ", ".join(f"`{r['type']}`" for r in rows if r["kind"] == "not text") + ".", ""]
    return "\n".join(lines)


def status_column(md: str) -> dict[str, str]:
    """``{type: status}`` read back from a :func:`markdown` page's table (the feature matrix after
    :data:`BEGIN` left out)."""
    out = {}
    for line in md.split(BEGIN)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            out[cells[0].strip("`")] = cells[2]
    return out


def splice(page: str, block: str) -> str:
    """``page`` with its :data:`BEGIN` ... :data:`END` block replaced by ``block`` (appended if it has none)."""
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return page.rstrip("\n") + "\n\n" + block + "\n"


def block_of(page: str) -> str | None:
    """The :data:`BEGIN` ... :data:`END` block of ``page`` (markers included), or None."""
    if BEGIN not in page or END not in page:
        return None
    return BEGIN + page.split(BEGIN, 1)[1].split(END, 1)[0] + END


def write_page(rows: list[dict], md_path: Path, version: str) -> None:
    """docs/models.md (or ``md_path``) from ``rows``, the feature matrix's block kept."""
    page = markdown(rows, version)
    old = block_of(md_path.read_text(encoding="utf-8")) if md_path.exists() else None
    md_path.write_text(splice(page, old) if old else page, encoding="utf-8")


def update(wanted: list[str], version: str) -> int:
    """``--update``: rerun ``wanted`` types, their rows replaced in probe/data/models.tsv and docs/models.md."""
    tsv = ROOT / "probe" / "data" / "models.tsv"
    made = tsv.read_text(encoding="utf-8").split("\n", 1)[0][len(STAMP):].strip()
    if made != version:
        print(f"Error: models.tsv was made with transformers {made}; {version} is installed")
        return 1
    fresh = {(r["type"], r["kind"]): r for r in table([t for t in text_types() if t[0] in set(wanted)],
                                                     echo=lambda s: print(s, flush=True))}
    rows = [fresh.get((r["type"], r["kind"]), r) for r in read_tsv(tsv)]
    write_tsv(rows, tsv, version)
    write_page(rows, ROOT / "docs" / "models.md", version)
    print(f"wrote {tsv} and docs/models.md: {dict(counts(rows)['all'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    import transformers  # deferred: its version only (the workers import it for the work)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder for models.md and models.tsv (default: docs/, probe/data/)")
    p.add_argument("--types", help="comma-separated model types: run only these, print, write nothing")
    p.add_argument("--every", type=int, default=1, help="every n-th text type only (a deterministic sample)")
    p.add_argument("--update", help="comma-separated model types: rerun only these and replace their rows in "
                                    "probe/data/models.tsv and docs/models.md")
    args = p.parse_args(argv)
    if args.update:
        return update(args.update.split(","), transformers.__version__)
    types = text_types()
    if args.types:
        wanted = set(args.types.split(","))
        types = [t for t in types if t[0] in wanted]
    elif args.every > 1:
        text = [t for t in types if t[1] != "not text"]
        types = [t for t in types if t[1] == "not text"] + text[::args.every]
        types.sort()
    start = time.monotonic()
    rows = table(types, echo=lambda s: print(s, flush=True))
    print(f"{len(rows)} types in {time.monotonic() - start:.0f} s: {dict(counts(rows)['all'])}")
    if args.types:
        return 0
    md_path = (args.out / "models.md") if args.out else ROOT / "docs" / "models.md"
    tsv_path = (args.out / "models.tsv") if args.out else ROOT / "probe" / "data" / "models.tsv"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    write_page(rows, md_path, transformers.__version__)  # the feature matrix kept
    write_tsv(rows, tsv_path, transformers.__version__)
    print(f"wrote {md_path} and {tsv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
