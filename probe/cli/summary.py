"""The lines ``probe analyze`` prints when its run is written: the summary (labels, counts, where the
time went), the health and coreference/syntax lines, and the notes."""

from __future__ import annotations

import os

import click

from ..util import plural


def summary(result, verification: dict | None, annotated: bool, loading_notes: list[str]) -> None:
    """The summary line (labels, counts, where the time went), the coreference/syntax lines, notes."""
    counts = ", ".join(f"{n} {label}" for label, n in result.label_counts("primary").items())
    trunc = ""
    if result.counts["truncated"]:  # and why: the model's limit, or --max-length
        limit = result.settings.get("max_length")
        why = "the model's limit" if limit == result.model.get("max_length") else "--max-length"
        trunc = f", {result.counts['truncated']} truncated" + (f" at {limit} tokens ({why})" if limit else "")
    verdict = "" if verification is None else f"; verify {'PASS' if verification['passed'] else 'FAIL'}"
    t = result.timings
    parts = [("start-up", t["startup_s"] + t["input_s"]), ("model load", t["model_load_s"])]
    if "circuits_s" in t:
        parts.append(("circuit probe", t["circuits_s"]))
    parts.append(("analysis", t["analyze_s"]))
    if "verify_s" in t:
        parts.append(("verify", t["verify_s"]))
    if "rollout_s" in t:
        parts.append(("rollout", t["rollout_s"]))
    parts += [("report", t["report_s"]), ("other", t["other_s"])]
    shown = _rounded_parts([v for _, v in parts], t["total_s"])
    from ..report import audio_run  # deferred: the report imports torch; the command line starts without it

    n, length = result.counts["sequences"], result.counts["tokens"]
    read = (f"{plural(n, 'clip')}, {plural(length, 'encoder frame')}" if audio_run(result)  # as the page's run table
            else f"{plural(n, 'sequence')}, {plural(length, 'token')}")
    click.echo(f"{plural(len(result.heads), 'head')} by primary label ({counts}) from "
               f"{read}{trunc}{verdict} in {t['total_s']:.1f} s "
               f"({', '.join(f'{name} {value:.1f} s' for (name, _), value in zip(parts, shown))})")
    from ..patterns.health import health_of, summary_line

    if result.results.get("health") is not None:  # what the report's health section and run.json say
        click.echo(summary_line(health_of(result)))
    if annotated:
        from ..linguistic.report import summary_lines

        for line in summary_lines(result):
            click.echo(line)
    for note in result.notes:
        if note not in loading_notes:  # loading notes (e.g. "loaded the cached copy") stay in run.json
            click.echo(f"note: {note}", err=True)


def _rounded_parts(values: list[float], total: float) -> list[float]:
    """Round parts to 0.1 s so that the shown parts add up to the shown total (largest remainder)."""
    tenths = [v * 10 for v in values]
    shown = [int(x) for x in tenths]
    missing = round(total * 10) - sum(shown)
    for i in sorted(range(len(values)), key=lambda i: tenths[i] - shown[i], reverse=True)[:max(0, missing)]:
        shown[i] += 1
    return [x / 10 for x in shown]


def report_line(folder) -> None:
    """Say where the run's page is: ``Report: <folder>/index.html``, the folder as an absolute path (a
    relative ``reports/...`` is hard to find from another folder): joined to the current folder as the
    operating system names it (``os.path.abspath``), links in the given path left as they are."""
    click.echo(f"Report: {os.path.join(os.path.abspath(folder), 'index.html')}")
