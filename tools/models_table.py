"""The supported-models table: probe run on a tiny random model of every text model type.

Usage (from the repository root)::

    python tools/models_table.py                  # every type: docs/models.md, probe/data/models.tsv
    python tools/models_table.py --out DIR        # write both files under DIR instead
    python tools/models_table.py --types llama,t5 # only these types (printed, nothing written)

Each type runs in a worker process (one at a time, in sorted order): a build that takes more than
:data:`BUILD_CAP` seconds, or a verify and analysis more than :data:`RUN_CAP`, is stopped and
recorded as ``timed out``; a worker that dies is recorded with its exit code and replaced. The
worker is replaced every :data:`RECYCLE` types so that memory stays flat.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import queue
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import ROOT, text_types  # noqa: E402 - the folder of this script first

BUILD_CAP, RUN_CAP, RECYCLE = 20.0, 120.0, 40
COLUMNS = ("type", "kind", "status", "reason", "analyze", "max_diff", "seconds")
KINDS = ("decoder", "encoder", "encoder-decoder", "not text")
#: The tsv's first line before the version (``probe.loading.support.STAMP``, which reads it; a test checks
#: they agree): not imported, so that this process does not import probe.
STAMP = "# transformers "
OUT_OF_SCOPE = "not text: out of scope here (vision, speech or multimodal)"
#: The markers of docs/models.md's block that ``tools/feature_matrix.py`` writes (kept when this table is rewritten).
BEGIN, END = "<!-- feature matrix: begin -->", "<!-- feature matrix: end -->"


def _worker(jobs, results) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(ROOT))
    import torch  # deferred: only the worker process imports torch, transformers and probe
    from try_model import try_type  # deferred: the worker's own path is set above

    torch.set_num_threads(1)
    while True:
        job = jobs.get()
        if job is None:
            return
        model_type, kind = job
        results.put(("row", try_type(model_type, kind, built=lambda: results.put(("built", None)))))


def _start_worker(ctx, target):
    """A daemon process of ``target(jobs, results)`` and its two queues."""
    jobs, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=target, args=(jobs, results), daemon=True)
    proc.start()
    return proc, jobs, results


class Runner:
    """One worker process at a time, replaced after a time-out, a crash or :data:`RECYCLE` types."""

    def __init__(self, target=_worker):
        self.ctx = mp.get_context("spawn")
        self.target = target  # the worker's loop: jobs in, ("built", None) and ("row", row) messages out
        self.proc, self.done = None, 0

    def _start(self):
        self.proc, self.jobs, self.results = _start_worker(self.ctx, self.target)
        self.done = 0

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.proc = None

    def _wait(self, cap: float, first_cap: float):
        """The next message, or None after ``cap`` seconds (``first_cap`` while the worker starts)."""
        deadline = time.monotonic() + cap
        while True:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    return ("died", self.proc.exitcode)
                if time.monotonic() > deadline:
                    return None

    def run(self, model_type: str, kind: str) -> dict:
        from try_model import row  # deferred: probe's import (seconds) only where a type is tried

        if self.proc is None or self.done >= RECYCLE:
            self.stop()
            self._start()
            start_cap = 120.0  # the worker imports torch, transformers and probe first
        else:
            start_cap = 0.0
        self.done += 1
        start = time.monotonic()
        self.jobs.put((model_type, kind))
        msg = self._wait(BUILD_CAP + start_cap, start_cap)
        if msg is not None and msg[0] == "built":
            msg = self._wait(RUN_CAP, 0.0)
            what = f"verify and analyze took over {RUN_CAP:.0f} s"
        else:
            what = f"building took over {BUILD_CAP:.0f} s"
        if msg is None:
            self.stop()
            return row(model_type, kind, "refused", f"timed out: {what}", seconds=time.monotonic() - start)
        if msg[0] == "died":
            self.stop()
            return row(model_type, kind, "refused", f"crashed: the worker process exited with code {msg[1]}",
                       seconds=time.monotonic() - start)
        return msg[1]


def table(types: list[tuple[str, str]], echo=print) -> list[dict]:
    """A row for every ``(model_type, kind)``: ``not text`` ones out of scope, the others tried. A type that
    timed out is tried once more at the end in a fresh worker (a busy machine slows one try, not two)."""
    from try_model import row  # deferred: probe's import (seconds) only where a type is tried

    runner, rows = Runner(), []
    try:
        for i, (model_type, kind) in enumerate(types, 1):
            r = (row(model_type, kind, "out of scope", OUT_OF_SCOPE) if kind == "not text"
                 else runner.run(model_type, kind))
            rows.append(r)
            if kind != "not text":
                echo(f"[{i}/{len(types)}] {model_type} ({kind}): {r['status']} {r['reason']} {r['seconds']} s")
        for i, r in enumerate(rows):
            if r["reason"].startswith("timed out"):
                runner.stop()  # a fresh worker for each retry
                rows[i] = runner.run(r["type"], r["kind"])
                echo(f"[again] {r['type']} ({r['kind']}): {rows[i]['status']} {rows[i]['reason']} "
                     f"{rows[i]['seconds']} s")
    finally:
        runner.stop()
    return rows


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
    for r in text_rows:
        note = f"verify max difference {r['max_diff']}" if r["status"] == "works" else _cell(r["reason"])
        lines.append(f"| `{r['type']}` | {r['kind']} | {r['status']} | {note} |")
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


def main(argv: list[str] | None = None) -> int:
    import transformers  # deferred: its version only (the workers import it for the work)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder for models.md and models.tsv (default: docs/, probe/data/)")
    p.add_argument("--types", help="comma-separated model types: run only these, print, write nothing")
    p.add_argument("--every", type=int, default=1, help="every n-th text type only (a deterministic sample)")
    args = p.parse_args(argv)
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
    page = markdown(rows, transformers.__version__)
    old = block_of(md_path.read_text(encoding="utf-8")) if md_path.exists() else None
    md_path.write_text(splice(page, old) if old else page, encoding="utf-8")  # the feature matrix kept
    write_tsv(rows, tsv_path, transformers.__version__)
    print(f"wrote {md_path} and {tsv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
