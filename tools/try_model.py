"""Run probe on one tiny random model: build it, wrap it, verify it, analyze a few texts.

:func:`try_type` returns one row of the supported-models table (``tools/models_table.py``): the
status ``works`` (verify passed and ``probe.analyze`` ran) or ``refused`` with the one-line reason.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from tiny_models import build

import probe.loading.models as pm
from probe.errors import ProbeError
from probe.runs.analysis import analyze
from probe.text.sequence import Text
from probe.verification import verify

TEXTS = ("The cat sat on the mat.", "A dog barked twice at night, then slept.", "Hello world.")
TARGETS = ("Le chat est assis.", "Un chien a aboyé.", "Bonjour.")
REASON_CHARS = 300


def one_line(exc: BaseException) -> str:
    """The first line of an error, at most :data:`REASON_CHARS` characters; a probe error as it reads,
    any other exception (a crash inside probe or transformers) prefixed with its class name."""
    lines = str(exc).strip().splitlines()
    text = lines[0].strip().split("; supported model types")[0] if lines else ""  # not the list of 18
    if not isinstance(exc, ProbeError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def row(model_type: str, kind: str, status: str, reason: str = "", max_diff: float | None = None,
        seconds: float = 0.0, analyzed: str = "") -> dict:
    """One row of the table (the columns of ``probe/data/models.tsv``; ``analyzed``: ``ran``, ``refused``
    or empty where probe did not get that far)."""
    return {"type": model_type, "kind": kind, "status": status, "reason": reason, "analyze": analyzed,
            "max_diff": "" if max_diff is None else f"{max_diff:.1e}", "seconds": f"{seconds:.1f}"}


def try_type(model_type: str, kind: str, built: Callable[[], None] = lambda: None) -> dict:
    """Build a tiny ``model_type`` model and run probe on it (a fresh try, memory freed after).

    Args:
        model_type: a ``config.model_type`` of the installed transformers.
        kind: ``"encoder"``, ``"decoder"`` or ``"encoder-decoder"``.
        built: called once the model is built (the table's runner times the build with it).

    Returns:
        :func:`row`: ``works`` with verify's largest difference, or ``refused`` and why.
    """
    start = time.perf_counter()
    try:
        model, tok = build(model_type, kind)
    except Exception as exc:  # noqa: BLE001 - any failure of the config or model class is the row's reason
        return row(model_type, kind, "refused", f"could not build a tiny model: {one_line(exc)}",
                   seconds=time.perf_counter() - start)
    built()
    try:
        return _probe(model, tok, model_type, kind, start)
    except Exception as exc:  # noqa: BLE001 - each type in its own try: one failure is one row
        return row(model_type, kind, "refused", one_line(exc), seconds=time.perf_counter() - start)
    finally:
        del model, tok
        gc.collect()


def _probe(model, tok, model_type: str, kind: str, start: float) -> dict:
    """Verify, then analyze even where verify refused (the ``analyze`` column: capture may work alone)."""
    lm = pm.from_pretrained_objects(model, tok, name=f"tiny-{model_type}")
    why, max_diff = "", None
    try:
        result = verify(lm)
        max_diff = result.max_abs_diff
        if not result.passed:
            why = f"verify failed: max difference {result.max_abs_diff:.1e}"
    except Exception as exc:  # noqa: BLE001 - the refusal is the row's reason; analyze is still tried
        why = one_line(exc)
    texts = ([Text(s, target=t) for s, t in zip(TEXTS, TARGETS)] if kind == "encoder-decoder" else list(TEXTS))
    try:
        analyze(lm, texts, batch_size=2)
        analyzed = "ran"
    except Exception as exc:  # noqa: BLE001 - as above
        why, analyzed = why or one_line(exc), "refused"
    return row(model_type, kind, "refused" if why else "works", why, max_diff, time.perf_counter() - start,
               analyzed)
