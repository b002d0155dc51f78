"""Options and option parsers that several commands share."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import click
from click.core import ParameterSource

from .. import bounds
from ..errors import InputError, ProbeError
from ..settings import OptionConflict

#: The default model (``probe.loading.models.DEFAULT_MODEL``, which imports torch: not read here so that
#: ``probe --help`` starts without it; tests/test_start_up.py checks the two agree).
DEFAULT_MODEL = "minilm"


def click_callback(check: Callable) -> Callable:
    """A click option callback running ``check(value)``; its InputError becomes a usage error
    (one line, exit status 2)."""

    def callback(ctx, param, value):
        if value is None or ctx.get_parameter_source(param.name) is ParameterSource.DEFAULT:
            return value  # a default is valid as written (and checking it would import the library)
        try:
            result = check(value)
        except InputError as exc:
            raise click.BadParameter(str(exc)) from None
        return value if result is None else result

    return callback


def check_files(*files: tuple[str | None, str]) -> None:
    """Refuse a missing input file before any library is imported (a second, not the import of torch
    and transformers), with the library's own words (:func:`probe.text.corpus.iter_lines`): ``files`` are
    ``(path or None, what)`` pairs.

    Raises:
        click.ClickException: ``{what} not found: {path}`` or ``{what} is a folder, not a file: {path}``
            (exit status 1).
    """
    for path, what in files:
        if path is None:
            continue
        if not os.path.exists(path):
            raise click.ClickException(f"{what} not found: {path}")
        if os.path.isdir(path):
            raise click.ClickException(f"{what} is a folder, not a file: {path}")


def stacked(*options):
    """One decorator applying ``options`` (click options) so that they are listed in the order given."""
    def apply(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn
    return apply


def run_folder_options(fn):
    """``--out/-o`` (the run folder, default a new ``reports/<model>-<time>``) and ``--force``."""
    return stacked(
        click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
                     help="Run folder [default: a new reports/<model>-<time>]."),
        click.option("--force", is_flag=True, help="Replace probe's own files in an --out folder probe wrote."),
    )(fn)


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
    :func:`probe.loading.models.load_model`)."""
    return click.option("--dtype", type=click.Choice(bounds.DTYPES), default=None,
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
    return click.option("--limit", "-n", type=int, default=None, callback=click_callback(bounds.limit),
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
    if not values:
        return {}
    try:
        return bounds.thresholds(_assignments(values, "LABEL"))
    except ProbeError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_health(ctx, param, values: tuple[str, ...]) -> dict[str, float]:
    """``--health-threshold CHECK=VALUE`` (repeatable), checked by
    :func:`probe.patterns.health.health_thresholds`."""
    if not values:
        return {}
    from ..rules import health_thresholds  # no heavy library: answered before torch is imported

    out = _assignments(values, "CHECK")
    try:
        health_thresholds(out)
    except ProbeError as exc:
        raise click.BadParameter(str(exc)) from None
    return out


def setting_option(cls, name: str, *decls: str, **kw):
    """A click option for field ``name`` of the settings class ``cls`` (:mod:`probe.settings`): its default
    and its check are the field's (a check's InputError is a usage error, exit status 2), its choices shown
    as the metavar; ``decls`` are the option's names, ``kw`` click's other arguments (help, flags ...).

    A tuple default of an option that takes one value is shown comma-separated (``--ablation zero,mean``).
    """
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if "default" in kw:
        raise TypeError(f"--{name}: the default is the settings field's")
    default = None if field.default is dataclasses.MISSING else field.default
    if isinstance(default, tuple) and not kw.get("multiple"):
        default = ",".join(map(str, default))
    meta = field.metadata
    if meta.get("choices"):
        kw.setdefault("metavar", "[" + "|".join(meta["choices"]) + "]")
    if (meta.get("check") or meta.get("choices")) and "callback" not in kw and not kw.get("is_flag"):
        kw["callback"] = click_callback(lambda v: cls.check_field(name, v))
        annotation = str(field.type).split(" |")[0]
        if annotation in ("int", "float") and "type" not in kw:
            kw["type"] = {"int": int, "float": float}[annotation]
    if field.default is dataclasses.MISSING:  # a required field: click says it is missing
        return click.option(*decls, name, **kw)
    return click.option(*decls, name, default=default, **kw)


def build(cls, values: dict):
    """The command's settings object from its parsed options (the fields of ``cls`` among ``values``):
    options that do not go together are a usage error (exit status 2); a value out of bounds is the
    library's one ``Error:`` line (exit status 1, :func:`probe.cli.group.user_errors`).

    Raises:
        click.UsageError: :class:`~probe.settings.OptionConflict`; InputError: another bad value.
    """
    try:
        return cls(**cls.pick(values))
    except OptionConflict as exc:
        raise click.UsageError(str(exc)) from None
