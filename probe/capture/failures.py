"""Exceptions raised inside a model's own forward pass, told apart from probe's own, as one line.

A model's code can refuse the input probe gives it (X-MOD raises ``ValueError: Input language
unknown`` when no language id is given and its config names no default language). Such an exception
is the user's to fix (another model, a setting in its config), not a bug in probe, so the command
answers it in one line naming probe's step and the model's reason (:class:`~probe.errors.ModelForwardError`).

An exception is the model's when its traceback passes through a module's forward call
(``torch.nn.Module.__call__``) and no frame inside that call is in probe's package: the model's modelling
code (transformers, or code shipped with the model) raised it, or torch raised it for that code. An
exception that passed through probe's attention function, hooks, listeners or reference modules keeps its
traceback (a bug in probe, or a user's callback that probe called), and a :class:`~probe.errors.ProbeError`
passes as it is.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import ModelForwardError, ProbeError

_PROBE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MODULE_CALL = os.path.join("torch", "nn", "modules", "module.py")

#: (words in the model's message, lowercase; what the user can do) for the reasons probe can explain.
HINTS = (
    (("language",), "the model needs a language id for each input (lang_ids), which probe does not pass: set "
                    "\"default_language\" in its config.json{languages}"),
)


def from_model(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside a model's own forward pass (see the module's docstring)."""
    if isinstance(exc, (ProbeError, KeyboardInterrupt, SystemExit, GeneratorExit)) or not isinstance(exc, Exception):
        return False
    files = [os.path.abspath(frame.f_code.co_filename) for frame, _ in traceback.walk_tb(exc.__traceback__)]
    call = next((i for i, f in enumerate(files) if f.endswith(_MODULE_CALL)), None)
    if call is None:
        return False
    # inside the outermost module call, no frame of probe's: an exception that passed through probe's attention
    # function, hooks or listeners (a bug in probe, or a user's callback probe called) is not the model's
    return not any(f.startswith(_PROBE) for f in files[call + 1:])


def reason(exc: BaseException, model=None) -> str:
    """The model's reason in one line: the exception's type and first line, and what to do where probe knows."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else "(no message)"
    if len(first) > 300:
        first = first[:297] + "..."
    text = f"{type(exc).__name__}: {first}"
    for words, hint in HINTS:
        if all(w in first.lower() for w in words):
            config = getattr(model, "config", None)
            names = list(getattr(config, "languages", None) or [])
            text += "; " + hint.format(languages=f" (one of {', '.join(map(str, names))})" if names else "")
    return text


def failure(step: str, exc: BaseException, model=None) -> ModelForwardError:
    """The one-line error for ``exc``, raised inside the model's forward pass during ``step``."""
    who = f"{type(model).__name__}'s" if model is not None else "the model's"
    return ModelForwardError(f"{step} failed inside {who} own forward pass: {reason(exc, model)}")


@contextmanager
def forward_failures(step: str, model=None) -> Iterator[None]:
    """Context manager: an exception raised inside the model's own forward pass (:func:`from_model`)
    leaves as :class:`~probe.errors.ModelForwardError` naming ``step`` (e.g. ``"discovery (one short
    forward pass to find the attention modules)"``) and the model's reason; any other passes unchanged.

    Raises:
        ModelForwardError: see above (the original exception is its ``__cause__``).
    """
    try:
        yield
    except Exception as exc:
        if from_model(exc):
            raise failure(step, exc, model) from exc
        raise

