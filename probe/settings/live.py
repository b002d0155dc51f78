"""The settings of ``probe live`` and of each of its requests, written with the fields of :mod:`.fields` so
that a bound and its message are written once:

- :class:`LiveSettings`: the server's options (``--host``, ``--port``, ``--max-chars``, ``--max-tokens``);
  the command's options are made from these fields (tests/test_settings.py holds the two together) and
  :class:`probe.live.session.LiveSession` takes the object.
- One class per route of the page (:data:`REQUESTS`): :class:`EditRequest`, :class:`HeadRequest`,
  :class:`AblateRequest`, :class:`PatchRequest`. The server builds them from a request's JSON with
  :meth:`~probe.settings.fields.Settings.from_mapping` (an unknown field, a missing one, a value out of its
  bound: one line, status 400), the session from its arguments: the same checks whichever door. Fields
  shared with a run kind are that kind's (``top`` and ``query`` are ``probe why``'s, the ablation is
  checked as ``probe effects --ablation`` first), so one bad value gives one message from the command line,
  the Python call and the live server.

What needs the model (a layer or head out of range, a query row past the text, a text over the caps) is
checked by the session once the model is loaded, with the library's own lines. No heavy library here.
"""

from __future__ import annotations

import numbers

from .. import bounds
from ..errors import InputError
from .fields import OptionConflict, Settings, setting, settings_class
from .kinds import query_setting, top_setting

#: The ablations the live page runs (``probe effects --ablation`` also has resample, which needs a corpus).
LIVE_ABLATIONS = ("zero", "mean")


def _text(what: str):
    """The check of a text of a request: a non-empty string (its caps are the session's, with the model)."""

    def check(value):
        if not isinstance(value, str):
            raise InputError(f"{what} must be a string, got {type(value).__name__}")
        bounds.texts(value, what)
        return value

    return check


def _index(name: str):
    return lambda v: bounds.positive_int(name, v, 0)


def live_ablation(value) -> str:
    """The live page's ablation: checked as ``probe effects --ablation`` checks a kind (the same line for an
    unknown one), then one of :data:`LIVE_ABLATIONS`.

    Raises:
        InputError: an unknown ablation (the effects line), or resample (named with the two it takes).
    """
    if not isinstance(value, str):
        raise InputError(f"ablation must be a string, one of {', '.join(LIVE_ABLATIONS)}; got {value!r}")
    kinds = bounds.ablation_kinds(bounds.listed(value))
    if len(kinds) != 1 or kinds[0] not in LIVE_ABLATIONS:
        raise InputError(f"the live page ablates with one of {', '.join(LIVE_ABLATIONS)}, got {value!r}")
    return kinds[0]


def head_pairs(value) -> tuple[tuple[int, int], ...]:
    """A request's heads: ``[[layer, head], ...]`` as a tuple of int pairs, each once, in order (their range is
    the model's, checked by the session).

    Raises:
        InputError: not a list of pairs of integers >= 0.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InputError("heads must be a list of [layer, head] pairs")
    out: list[tuple[int, int]] = []
    for pair in value:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in pair)):
            raise InputError(f"each head is a [layer, head] pair of integers, got {pair!r}")
        lh = (bounds.positive_int("layer", pair[0], 0), bounds.positive_int("head", pair[1], 0))
        if lh not in out:
            out.append(lh)
    return tuple(out)


@settings_class
class LiveSettings(Settings):
    """``probe live``: where the page is served and the caps of a request's text
    (:class:`probe.live.session.LiveSession`, :func:`probe.live.server.make_app`)."""

    kind = "live"

    host: str = setting("127.0.0.1", doc="The address to serve on (another than 127.0.0.1 or localhost: a warning).",
                        bound="an address of this machine", option="--host")
    port: int = setting(8765, doc="The port to serve on (0: a free one).", unit="port", bound="0 to 65535",
                        check=lambda v: bounds.int_range("--port", v, 0, 65535), option="--port")
    max_chars: int = setting(2000, doc="Most characters of a text the page takes.", unit="characters",
                             bound=">= 1", check=lambda v: bounds.positive_int("--max-chars", v),
                             option="--max-chars")
    max_tokens: int | None = setting(None, doc="Most tokens of a text the page runs [default: 128, or the model's "
                                               "limit where lower].", unit="tokens",
                                     bound=">= 2, <= the model's limit",
                                     check=lambda v: bounds.positive_int("--max-tokens", v, 2),
                                     option="--max-tokens")


@settings_class
class EditRequest(Settings):
    """``POST /api/edit`` (:meth:`probe.live.session.LiveSession.edit`): a text and the layer drawn."""

    kind = "edit"

    text: str = setting(doc="The text.", bound="non-empty, within the caps", check=_text("text"))
    layer: int = setting(0, doc="The layer whose head view comes back.", unit="layer index",
                         bound="a layer of the model", check=_index("layer"))


@settings_class
class HeadRequest(Settings):
    """``POST /api/head`` (:meth:`probe.live.session.LiveSession.head`): one head's steps and ``why`` at a
    query row; ``query`` and ``top`` are ``probe why``'s fields."""

    kind = "head"

    text: str = setting(doc="The text.", bound="non-empty, within the caps", check=_text("text"))
    layer: int = setting(doc="The head's layer.", unit="layer index", bound="a layer of the model",
                         check=_index("layer"))
    head: int = setting(doc="The head within its layer.", unit="head index", bound="a head of the model",
                        check=_index("head"))
    query: int | None = query_setting()
    top: int = top_setting()


@settings_class
class AblateRequest(Settings):
    """``POST /api/ablate`` (:meth:`probe.live.session.LiveSession.ablate`): heads switched off."""

    kind = "ablate"

    text: str = setting(doc="The text.", bound="non-empty, within the caps", check=_text("text"))
    heads: tuple = setting((), doc="The heads switched off, [[layer, head], ...] (none: the model as it is).",
                           bound="heads of the model", check=head_pairs)
    ablation: str = setting("zero", doc="zero: the heads' outputs set to 0; mean: to their mean over the built-in "
                                        "sample text.", bound="zero or mean", check=live_ablation)
    layer: int = setting(0, doc="The layer whose maps come back (after the ablation).", unit="layer index",
                         bound="a layer of the model", check=_index("layer"))


@settings_class
class PatchRequest(Settings):
    """``POST /api/patch`` (:meth:`probe.live.session.LiveSession.patch`): a clean and a corrupted text."""

    kind = "patch"

    text: str = setting(doc="The clean text.", bound="non-empty, within the caps", check=_text("text"))
    corrupted: str = setting(doc="The corrupted text (as many tokens as the clean one).",
                             bound="non-empty, within the caps", check=_text("corrupted text"))
    answer: str | None = setting(None, doc="The answer token [default: the clean text's most probable next token].")
    wrong: str | None = setting(None, doc="The wrong answer [default: the corrupted text's most probable next "
                                          "token].")

    def check_together(self) -> None:
        if (self.answer is None) != (self.wrong is None):
            raise OptionConflict("give both answer and wrong, or neither")


#: Each route's request settings, by the route's name (``/api/<name>``; ``info`` takes none).
REQUESTS: dict[str, type[Settings]] = {cls.kind: cls for cls in (EditRequest, HeadRequest, AblateRequest,
                                                                PatchRequest)}
