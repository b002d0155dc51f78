"""Options and option parsers that several commands share."""

from __future__ import annotations

from collections.abc import Callable

import click

from .. import validate
from ..errors import InputError, ProbeError
from ..loading import DTYPES
from ..models import DEFAULT_MODEL


def click_callback(check: Callable) -> Callable:
    """A click option callback running ``check(value)``; its InputError becomes a usage error
    (one line, exit status 2)."""

    def callback(ctx, param, value):
        if value is None:
            return value
        try:
            result = check(value)
        except InputError as exc:
            raise click.BadParameter(str(exc)) from None
        return value if result is None else result

    return callback


def stacked(*options):
    """One decorator applying ``options`` (click options) so that they are listed in the order given."""
    def apply(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn
    return apply


def model_option(fn=None, *, default: str = DEFAULT_MODEL):
    """``--model/-m``: an alias, a Hub id, a local folder or a .gguf file (``default``: the command's
    default model; ``@model_option`` or ``@model_option(default="smollm2")``)."""
    def add(f):
        return click.option("--model", "-m", "model_name", default=default, show_default=True,
                            help="Alias (probe models), Hugging Face Hub id, local folder or .gguf file.")(f)

    return add(fn) if fn is not None else add


def placement_options(fn):
    """--device, --dtype and --device-map (where and how the weights sit)."""
    fn = click.option("--device-map", type=click.Choice(["auto"]), default=None,
                      help="Spread the layers over the devices present, offloading to CPU and disk what "
                           "does not fit (accelerate).")(fn)
    fn = dtype_option(fn)
    return device_option(fn)


def dtype_option(fn):
    """``--dtype``: the parameter dtype to load the model in (None: the model's own,
    :func:`probe.models.load_model`)."""
    return click.option("--dtype", type=click.Choice(DTYPES), default=None,
                        help="Parameter dtype to load the model in [default: float32 for the embedded models; "
                             "a Hub model's or folder's own declared dtype]. Statistics are computed in float32 "
                             "and summed in float64 whatever it is.")(fn)


def model_placement(fn):
    """--dtype and --device (commands that load one model without a device map)."""
    return device_option(dtype_option(fn))


def device_option(fn):
    """``--device``: cpu, cuda, mps or auto."""
    return click.option("--device", type=click.Choice(["cpu", "cuda", "mps", "auto"]), default=None,
                        help="Where the model runs [default: cpu; auto: cuda when present]. The statistics are "
                             "computed on that device.")(fn)


def limit_option(help: str = "Use at most N sequences."):
    """``--limit/-n``: at most N sequences (>= 1); used as ``@limit_option()``."""
    return click.option("--limit", "-n", type=int, default=None, callback=click_callback(validate.limit),
                        help=help)


def _assignments(values: tuple[str, ...], what: str) -> dict[str, float]:
    """``NAME=NUMBER`` items as a dict (a usage error names the item)."""
    out = {}
    for item in values:
        name, sep, number = item.partition("=")
        try:
            value = float(number)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected {what}=VALUE with a number VALUE") from None
        if not sep:
            raise click.BadParameter(f"{item!r}: expected {what}=VALUE")
        out[name] = value
    return out


def parse_thresholds(ctx, param, values: tuple[str, ...]) -> dict[str, float]:
    """``--threshold LABEL=VALUE`` (repeatable), checked by :func:`probe.validate.thresholds`."""
    try:
        return validate.thresholds(_assignments(values, "LABEL"))
    except ProbeError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_health(ctx, param, values: tuple[str, ...]) -> dict[str, float]:
    """``--health-threshold CHECK=VALUE`` (repeatable), checked by
    :func:`probe.patterns.health.health_thresholds`."""
    from ..patterns.health import health_thresholds

    out = _assignments(values, "CHECK")
    try:
        health_thresholds(out)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return out
