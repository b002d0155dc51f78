"""Errors a user can cause. The CLI turns each into one line on stderr and a non-zero exit."""


import re

#: A run of characters without whitespace longer than this is cut when a message echoes it (a path is shorter).
ECHO_LIMIT = 300
#: Characters kept of such a run.
ECHO_KEPT = 80
#: A message longer than this keeps its start and its end.
MESSAGE_LIMIT = 2000


def cut_long(message: str) -> str:
    """``message`` with every long value it echoes cut, so that one line stays one line: each run of
    non-whitespace characters longer than :data:`ECHO_LIMIT` keeps its first :data:`ECHO_KEPT`
    characters and says how long it was (``'LLLL... [80,000 characters]``), and a message still
    longer than :data:`MESSAGE_LIMIT` keeps its start and its last 300 characters. The one place
    user values are shortened: every :class:`ProbeError` and every error line of the command line
    pass through it."""
    def cut(m: re.Match) -> str:
        run = m.group(0)
        return f"{run[:ECHO_KEPT]}... [{len(run):,} characters]"

    message = re.sub(rf"\S{{{ECHO_LIMIT + 1},}}", cut, message)
    if len(message) > MESSAGE_LIMIT:
        n = len(message)
        message = f"{message[:MESSAGE_LIMIT - 400]} ... [{n - MESSAGE_LIMIT + 100:,} characters] ... {message[-300:]}"
    return message


class ProbeError(Exception):
    """Base class of every error caused by user input (bad path, unknown model, empty text ...). Its
    text cuts the long values it echoes (:func:`cut_long`)."""

    def __str__(self) -> str:
        return cut_long(super().__str__())


class ModelLoadError(ProbeError):
    """A model could not be found or loaded (unknown name, missing folder, offline Hub)."""


class UnsupportedArchitectureError(ProbeError):
    """The model's ``model_type`` has no entry in :data:`probe.architectures.SPECS`."""


class InputError(ProbeError):
    """What the user can fix: a bad option, a missing or malformed file, an empty or too long text, a
    head or layer out of range (docs/contributing.md: the refusal rule). A programming mistake is a
    ``ValueError`` or ``TypeError`` instead."""


class UsageInputError(InputError):
    """Options that do not go together (``--transcript`` without ``--audio``), found by the library: the
    command line answers it as a usage error, exit status 2, as it answers its own."""


class UnsupportedAnalysisError(ProbeError):
    """An analysis was asked of a kind of model or site it does not measure (its rule:
    :meth:`probe.measures.accumulators.Accumulator.refusal`)."""


class CaptureError(ProbeError):
    """Attention probabilities could not be captured (e.g. a custom attention returning none)."""


class InterfaceError(UnsupportedArchitectureError):
    """A model's attention passes probe's attention function something it does not compute (an unknown
    keyword argument that could change the maths), or a structure probe cannot discover."""


class ModelForwardError(ProbeError):
    """A model's own forward pass raised an exception during one of probe's steps (discovery, capture,
    verification ...): the model, not probe, refused its input (an X-MOD model with no language id).
    Built by :func:`probe.capture.failures.forward_failures`."""
