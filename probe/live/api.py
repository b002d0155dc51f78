"""The live page's requests and answers, one definition for the server (HTTP, :mod:`probe.live.server`) and
the notebook widget (its messages, :mod:`probe.live.widget`): each route's fields, their checks, the
session method that answers, and the status of each kind of failure.

A request is a JSON object: the route's fields, checked by the route's request settings
(:data:`probe.settings.REQUESTS`, built with ``from_mapping``: the bounds and lines ``probe why`` and
``probe effects`` use for the same values), and optionally ``page`` (a string the page picked) and
``seq`` (its request number, increasing): a request overtaken by a newer one of the same page and route
before its turn at the model is dropped (status 409, ``{"stale": true}``). Statuses: 200 the answer;
400 a value refused (one line, the settings' or the session's: an unknown field, an unknown head, a query
position out of range, a text over the cap ...); 409 stale; 422 an analysis the model does not support
(the library's line); 500 a failure inside the model (the line says which; the server keeps serving).

``progress`` is answered at once, without waiting for the model (:class:`~probe.live.work.Work`): what the
session is computing now, its steps done and its estimate. A patch request stops at its next patched pass
when a newer patch or edit request of the same page arrives (:class:`~probe.live.work.Superseded`,
answered 409 as a stale one).
"""

from __future__ import annotations

import dataclasses
import logging
import traceback

from ..errors import InputError, ProbeError
from ..settings import REQUESTS
from .session import LiveSession
from .work import Superseded

log = logging.getLogger("probe")

#: Each route and the session method that answers it (its fields: :data:`probe.settings.REQUESTS`).
ROUTES: dict[str, str] = {"info": "info", "edit": "edit", "head": "head", "ablate": "ablate", "patch": "patch",
                          "progress": "progress"}
#: Routes answered without the model (no lock, no wait): read with GET.
READS = ("info", "progress")
#: Fields of every request that the session does not read.
CONTROL = ("page", "seq")


def fields(route: str, body) -> dict:
    """The session's keyword arguments of a request to ``route``, checked by the route's request settings
    (:meth:`~probe.settings.fields.Settings.from_mapping`).

    Raises:
        InputError: not a JSON object, a missing or unknown field, a value out of its bound (the settings'
            line), a bad ``page`` or ``seq``.
    """
    if not isinstance(body, dict):
        raise InputError(f"the request body must be a JSON object, got {type(body).__name__}")
    if "seq" in body and (isinstance(body["seq"], bool) or not isinstance(body["seq"], int)):
        raise InputError(f"seq must be an integer, got {body['seq']!r}")
    if "page" in body and not isinstance(body["page"], str):
        raise InputError(f"page must be a string, got {body['page']!r}")
    given = {k: v for k, v in body.items() if k not in CONTROL}
    if route not in REQUESTS:  # info, progress
        if given:
            raise InputError(f"/api/{route} takes no fields, got {', '.join(map(repr, given))}")
        return {}
    request = REQUESTS[route].from_mapping(given)
    args = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
    if route == "patch":
        args["clean"] = args.pop("text")
    return args


def _superseding(session: LiveSession, page: str | None, seq: int | None, on_progress):
    """The patch request's ``progress(done, total)``: tells ``on_progress`` (the widget) the session's
    progress, and raises :class:`Superseded` once a newer patch or edit request of ``page`` has arrived."""
    edits = session.latest.seq(page, "edit") if page is not None else None

    def progress(done: int, total: int) -> None:
        if on_progress is not None:
            on_progress(session.work.snapshot(page))
        if page is None or seq is None:
            return
        edit = session.latest.seq(page, "edit")
        if session.latest.stale(page, "patch", seq) or (edit is not None and (edits is None or edit > edits)):
            raise Superseded
    return progress


def answer(session: LiveSession, route: str, body, on_progress=None) -> tuple[int, dict]:
    """``(status, JSON-ready dict)`` of one request: the session's answer, or ``{"error": one line}``.

    The model work runs under ``session.lock`` (one forward pass at a time); a request made stale while
    it waited is dropped before it runs, a patch request made stale while it runs is stopped at its next
    patched pass. ``progress`` is answered at once (:meth:`~probe.live.work.Work.snapshot` for the body's
    ``page``). ``on_progress``: a callable given the progress snapshot after each patched pass (the widget
    sends it to the page), or None.
    """
    if route not in ROUTES:
        return 404, {"error": f"no route /api/{route}; routes: {', '.join('/api/' + r for r in ROUTES)}"}
    try:
        args = fields(route, body)
    except InputError as e:
        return 400, {"error": str(e)}
    page, seq = body.get("page"), body.get("seq")
    if route == "progress":  # without the lock: answered while the model works
        return 200, session.progress(page)
    if page is not None and seq is not None:
        session.latest.note(page, route, seq)
    with session.lock:
        if page is not None and seq is not None and session.latest.stale(page, route, seq):
            return 409, {"stale": True, "seq": seq, "error": "a newer request of this page replaced it"}
        if route == "patch":
            args["progress"] = _superseding(session, page, seq, on_progress)
        try:
            with session.work.running(route, page):
                out = getattr(session, ROUTES[route])(**args)
        except Superseded:
            return 409, {"stale": True, "seq": seq, "error": "a newer request of this page replaced it"}
        except InputError as e:
            return 400, {"error": str(e)}
        except ProbeError as e:
            return 422, {"error": str(e)}
        except Exception as e:  # a failure inside the model: said in the page, the server goes on
            log.debug("live: %s failed:\n%s", route, traceback.format_exc())
            return 500, {"error": f"the model failed on /api/{route}: {type(e).__name__}: {e}".splitlines()[0]}
    if seq is not None:
        out = {**out, "seq": seq}
    return 200, out
