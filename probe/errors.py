"""Errors a user can cause. The CLI turns each into one line on stderr and a non-zero exit."""


class ProbeError(Exception):
    """Base class of every error caused by user input (bad path, unknown model, empty text ...)."""


class ModelLoadError(ProbeError):
    """A model could not be found or loaded (unknown name, missing folder, offline Hub)."""


class UnsupportedArchitectureError(ProbeError):
    """The model's ``model_type`` has no entry in :data:`probe.architectures.SPECS`."""


class InputError(ProbeError):
    """What the user can fix: a bad option, a missing or malformed file, an empty or too long text, a
    head or layer out of range (docs/contributing.md: the refusal rule). A programming mistake is a
    ``ValueError`` or ``TypeError`` instead."""


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
