"""Write the CSVs that ``tests/test_baseline.py`` compares against: ``probe effects`` and ``probe patch`` on
tiny GPT-2 and LLaMA model folders (``conftest.save_tiny``), their effects.csv, label_effects.csv,
patch.csv, composition.csv and heads.csv, under ``tests/data/baseline/<kind>-<command>/``; with
``--real``, also heads.csv of ``probe analyze`` on the embedded minilm and smollm2
(:data:`REAL_ARGS`, minutes), under ``tests/data/baseline/<alias>-analyze/``.

Run from the repository root: ``python tests/data/make_baseline.py [--real]`` (regenerate only when a
change is meant to change these numbers, and say so in the commit). The stored files were made at commit
a93c0aa, before the causal methods were rebuilt on one weight convention, so the test shows they did not
move.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from click.testing import CliRunner  # noqa: E402

from conftest import save_tiny  # noqa: E402
from probe.cli import main  # noqa: E402

KINDS = ("gpt2", "llama")
FILES = ("effects.csv", "label_effects.csv", "patch.csv", "composition.csv", "heads.csv")
TEXTS = ("The cat sat on the mat and looked at the dog.",
         "When Mary and John went to the store, John gave a drink to Mary.",
         "A quick brown fox jumps over the lazy dog every morning.",
         "The river runs to the sea, and the sea is never full.")
PAIRS = ("clean\tcorrupted\tanswer\twrong\n"
         "The cat and the dog ran to\tThe dog and the cat ran to\t the\t a\n"
         "When Mary and John went to the store, John gave a drink to\t"
         "When Mary and John went to the store, Mary gave a drink to\t Mary\t John\n")


def commands(model: Path, root: Path) -> dict[str, list[str]]:
    """The two commands' arguments (without ``--out``) for a model folder; inputs written under ``root``."""
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 2), encoding="utf-8")
    pairs = root / "pairs.tsv"
    pairs.write_text(PAIRS, encoding="utf-8")
    return {"effects": ["effects", "--model", str(model), "--corpus", str(corpus), "--seeds", "5",
                        "--ablation", "zero,mean,resample", "--no-progress"],
            "patch": ["patch", "--model", str(model), "--pairs", str(pairs), "--rope-offsets", "2",
                      "--no-progress"]}


def run_all(root: Path) -> dict[str, Path]:
    """Run both commands on both kinds; the run folders by ``<kind>-<command>``."""
    outs = {}
    for kind in KINDS:
        model = save_tiny(kind, root / kind)
        for name, args in commands(model, root).items():
            out = root / f"{kind}-{name}-run"
            res = CliRunner().invoke(main, [*args, "--out", str(out)])
            if res.exit_code != 0:
                raise RuntimeError(f"{kind} {name}: {res.output}") from res.exception
            outs[f"{kind}-{name}"] = out
    return outs


#: The embedded models and the arguments of their ``probe analyze`` baseline.
REALS = ("minilm", "smollm2")
REAL_ARGS = ("--limit", "16", "--no-progress")


def run_real(alias: str, out: Path) -> Path:
    """``probe analyze --model ALIAS`` on the built-in sample (:data:`REAL_ARGS`); the run folder."""
    res = CliRunner().invoke(main, ["analyze", "--model", alias, *REAL_ARGS, "--out", str(out)])
    if res.exit_code != 0:
        raise RuntimeError(f"{alias}: {res.output}") from res.exception
    return out


def main_() -> None:
    if "--real" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            for alias in REALS:
                dest = HERE / "baseline" / f"{alias}-analyze"
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run_real(alias, Path(tmp) / alias) / "heads.csv", dest / "heads.csv")
    with tempfile.TemporaryDirectory() as tmp:
        for key, out in run_all(Path(tmp)).items():
            dest = HERE / "baseline" / key
            dest.mkdir(parents=True, exist_ok=True)
            for name in FILES:
                if (out / name).exists():
                    shutil.copyfile(out / name, dest / name)


if __name__ == "__main__":
    main_()
