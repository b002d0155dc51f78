"""The documentation: README.md and docs/*.md.

- every ```python block runs as pasted, in a fresh interpreter started in the repository root,
  unless the line before it says ``<!-- not run: REASON -->`` (a Hub model, a file of your own);
- every relative link points at a file that exists, and every ``#anchor`` at a heading of that
  file (the slug GitHub and mkdocs both give it);
- ``mkdocs build --strict`` (mkdocs.yml, with the API reference from the docstrings) succeeds
  offline, where mkdocs and mkdocstrings are installed (the ``test`` extra installs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(\S.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def code_blocks(path: Path) -> list[tuple[int, str, str, str | None]]:
    """(line number, language, code, not-run reason or None) of each fenced block of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        before = lines[start - 1] if start > 0 else ""
        reason = NOT_RUN.search(before)
        blocks.append((start + 1, m.group(1), "\n".join(body) + "\n", reason.group(1) if reason else None))
        i += 1
    return blocks


def python_blocks() -> list:
    out = []
    for page in PAGES:
        for line, lang, code, reason in code_blocks(page):
            if lang == "python":
                out.append(pytest.param(code, reason, id=f"{page.relative_to(ROOT)}:{line}"))
    return out


def slug(heading: str) -> str:
    """The anchor of a Markdown heading: lower case, punctuation other than - and _ removed,
    spaces to hyphens (GitHub's rule; mkdocs' default gives the same on the headings checked by
    :func:`test_heading_slugs_agree`)."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """Python-Markdown's toc slugify (mkdocs' default), for comparison."""
    text = re.sub(r"[`*]", "", heading.strip())
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def headings(path: Path) -> list[str]:
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def test_pages_exist():
    names = {p.name for p in PAGES}
    for page in ("statistics.md", "verification.md", "encoder-decoder.md", "pruning.md", "patterns.md",
                 "api.md", "architecture.md", "contributing.md", "reference.md"):
        assert page in names, page


def test_no_block_writes_into_the_repository_root():
    """A block that saves a file writes it under reports/ (ignored by git) or to an absolute path."""
    for page in PAGES:
        for line, _, code, _ in code_blocks(page):
            for name in re.findall(r"""\.save\(\s*["']([^"']+)["']""", code):
                assert name.startswith(("reports/", "/")), (page.name, line, name)


def test_a_not_run_block_imports_what_it_uses():
    """Issue 27 item 14: a block pasted alone into a fresh interpreter had no ``import probe``."""
    for page in PAGES:
        for line, lang, code, reason in code_blocks(page):
            if lang == "python" and reason is not None and re.search(r"\bprobe\.", code):
                assert re.search(r"^(import probe|from probe)", code, re.M), (page.name, line)
            if lang == "python" and reason is not None and re.search(r"\blm\b", code):
                assert re.search(r"^lm = ", code, re.M), (page.name, line)


def test_every_not_run_block_says_why():
    """A not-run marker names its reason and stands on the line just before a ```python block
    (blocks in other languages are shown, never run)."""
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("<!-- not run"):
                assert NOT_RUN.fullmatch(line.strip()), (page.name, i + 1, "say why: <!-- not run: REASON -->")
                assert i + 1 < len(lines) and lines[i + 1].startswith("```python"), (page.name, i + 1)


#: A not-run block whose reason says one of these is skipped even in the slow tier: it states a cost of
#: minutes, or it loads a model from the Hugging Face Hub (no network here or in CI).
SKIPPED_EVEN_SLOW = ("minutes", "Hub model")


@pytest.mark.slow
@pytest.mark.parametrize("code,reason", python_blocks())
def test_python_block_runs_as_pasted(code, reason, tmp_path):
    """Every block runs as pasted in a fresh interpreter, the not-run ones included (they load an
    embedded model: this is the tier that has them), except one that states a cost of minutes or
    loads a Hub model."""
    if reason is not None and any(word in reason for word in SKIPPED_EVEN_SLOW):
        pytest.skip(f"marked not run: {reason}")
    env = {**os.environ, "MPLBACKEND": "Agg"}  # `python -c` in the root imports this checkout's probe
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def test_heading_slugs_agree():
    """The anchors links use are the same on GitHub and in the mkdocs build."""
    for page in PAGES:
        for h in headings(page):
            assert slug(h) == mkdocs_slug(h), (page.name, h)


def test_relative_links_resolve():
    bad = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                bad.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
                bad.append(f"{page.name}: {target} (no such heading)")
    assert not bad, bad


def test_the_index_lists_every_page_once_in_the_nav_s_order():
    """docs/index.md's table of pages listed "Rollout and flow" twice and left out the image and speech pages:
    it links every page of docs/ but itself exactly once, as mkdocs.yml's nav does."""
    table = re.findall(r"^\| \[[^\]]+\]\(([\w-]+\.md)\) \|", (ROOT / "docs" / "index.md").read_text(encoding="utf-8"),
                       re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert sorted(table) == pages, (sorted(set(pages) - set(table)), [p for p in table if table.count(p) > 1])
    nav = re.findall(r"^  - [^:]+: ([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    assert sorted(p for p in nav if p != "index.md") == pages


def test_mkdocs_build_strict(tmp_path):
    """The documentation site builds with every warning an error (broken links, missing anchors,
    pages left out of the nav), offline."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "statistics" / "index.html").exists()
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    assert 'id="probe.runs.analysis.analyze"' in reference  # the API reference, read from the docstrings


def test_code_blocks_reads_fences_and_not_run_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# T\n\n```python\nx = 1\n```\n\n<!-- not run: needs a Hub model -->\n"
                    "```python\nload('bert')\n```\n\n```bash\nprobe analyze\n```\n", encoding="utf-8")
    assert code_blocks(page) == [(3, "python", "x = 1\n", None), (8, "python", "load('bert')\n", "needs a Hub model"),
                                 (12, "bash", "probe analyze\n", None)]
    heading = "Head distance and redundancy"
    assert slug(heading) == "head-distance-and-redundancy" == mkdocs_slug(heading)
    assert slug("`probe analyze`") == "probe-analyze"


#: How far README.md's count of fast tests may lag the collected count (a share of the collected count).
COUNT_LAG = 0.05


def test_readme_s_count_of_fast_tests_is_within_5_percent_of_the_collected_count():
    """README.md said "1,809 tests" for the fast tier when 2,068 were collected: its figure is held to the
    count ``pytest --collect-only`` gives for the fast tier's marker expression, within :data:`COUNT_LAG`
    either way (a lag of a few tests between releases is fine; a figure a tenth behind is stale)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"The fast tier alone \(no model, or tiny random ones; ([\d,]+) tests in", readme)
    assert m is not None, "README.md's sentence on the fast tier's count of tests is gone"
    stated = int(m.group(1).replace(",", ""))
    assert '`python -m pytest -q -m "not slow and not browser"`' in readme[m.end():m.end() + 400]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow and not browser",
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    counted = re.search(r"^(\d+)(?:/\d+)? tests? collected", out.stdout, re.M)
    assert counted is not None, out.stdout[-2000:] + out.stderr[-2000:]
    collected = int(counted.group(1))
    assert abs(stated - collected) <= COUNT_LAG * collected, (
        f"README.md says {stated:,} fast tests; {collected:,} are collected: set the figure (and its time) again")



def test_live_page_s_security_policy_is_the_one_served():
    """docs/live.md quotes the live page's Content-Security-Policy whole: the header the server sends
    (``probe.live.page.PAGE_CSP``; the page had gained base-uri, form-action and frame-ancestors)."""
    from probe.live.page import PAGE_CSP

    text = " ".join((ROOT / "docs" / "live.md").read_text(encoding="utf-8").split())
    assert f"Content-Security-Policy of `{PAGE_CSP}`" in text
