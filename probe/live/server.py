"""The live page's web server: a Starlette app (served by uvicorn, :func:`serve`) around one
:class:`~probe.live.session.LiveSession`, safe by default.

- Bound to 127.0.0.1 unless told otherwise (``probe live --host`` warns).
- A random token (:func:`new_token`, ``secrets``) is required by every request, as Jupyter does: the
  ``token`` query parameter (the printed address carries it) or the ``X-Probe-Token`` header (the page
  sends it). Without it: 401; a wrong one: 403.
- The ``Host`` header must name the address served (a page of another site that rebinds its name to
  127.0.0.1 is refused) and an ``Origin`` header, where the browser sends one, must be the page's own:
  another site open in the same browser cannot drive the model (403).
- A request body is at most :data:`MAX_BODY` bytes (413), JSON (``Content-Type: application/json``,
  415), UTF-8 text (400 for a binary body), a JSON object (400); text length is capped by the session.
- Every answer is JSON; every refusal one line, ``{"error": "..."}``.

Routes: ``GET /`` the page (:mod:`probe.live.page`: views and app inlined, nothing loaded from outside),
``GET /api/info``, ``GET /api/progress?page=...`` (what runs now, answered while the model works),
``POST /api/edit | head | ablate | patch`` (:mod:`probe.live.api`). Model work runs in a worker thread, one
forward pass at a time (the session's lock).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..errors import InputError
from .api import READS, ROUTES, answer
from .page import PAGE_CSP, page_html
from .session import LiveSession

#: Most bytes of a request body.
MAX_BODY = 64 * 1024
#: The header that carries the token.
TOKEN_HEADER = "x-probe-token"
#: Hosts that need no --host option.
LOCAL_HOSTS = ("127.0.0.1", "localhost")
#: Addresses that serve every address of the machine (``--host 0.0.0.0``, ``--host ::``).
ANY_ADDRESS = ("0.0.0.0", "::")


def _ip(text: str):
    """``text`` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), or None for a name."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def new_token() -> str:
    """A random token of 32 bytes, URL-safe (``secrets.token_urlsafe``)."""
    return secrets.token_urlsafe(32)


class BadRequest(Exception):
    """A request refused before the session sees it: ``status`` and the one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers={"Cache-Control": "no-store"})


class Guard:
    """ASGI middleware: the token, Host and Origin checks in front of every route.

    Args:
        app: the app it guards. token: the required token. hosts: the ``host:port`` forms the
            ``Host`` header may take (and ``http://`` + them, an ``Origin``). any_address: served on every
            address of the machine (0.0.0.0, ::): a ``Host`` that is the IP address (not a name) the
            connection reached, with the port served, is this server's too (a page that rebinds its name
            sends that name, never an address literal).
    """

    def __init__(self, app, token: str, hosts: set[str], any_address: bool = False) -> None:
        self.app, self.token, self.hosts, self.any_address = app, token, set(hosts), any_address

    def _reached(self, host: str, request: Request) -> bool:
        """Whether ``host`` is the address and port this connection reached (``any_address`` only)."""
        server = request.scope.get("server")
        if not self.any_address or not server:
            return False
        name, _, port = host.rpartition(":")
        if not port.isdigit() or int(port) != server[1]:
            return False
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        here, asked = _ip(str(server[0])), _ip(name)
        return here is not None and asked == here

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        refusal = self.refusal(request)
        if refusal is not None:
            return await refusal(scope, receive, send)
        return await self.app(scope, receive, send)

    def refusal(self, request: Request) -> Response | None:
        """The response refusing ``request``, or None to let it through."""
        host = request.headers.get("host", "")
        hosts = self.hosts | ({host} if self._reached(host, request) else set())
        if host not in hosts:
            return _error(403, f"host {host!r} is not this server's address")
        origin = request.headers.get("origin")
        if origin is not None and origin not in {f"http://{h}" for h in hosts}:
            return _error(403, f"origin {origin!r} is not this page's: another site cannot drive the model")
        given = request.headers.get(TOKEN_HEADER) or request.query_params.get("token")
        if not given:
            return _error(401, "no token: open the address probe live printed (it carries ?token=...)")
        if not secrets.compare_digest(given.encode(), self.token.encode()):
            return _error(403, "wrong token: open the address probe live printed")
        return None


async def _body(request: Request):
    """The request's JSON body.

    Raises:
        BadRequest: too large (413), not JSON (415), binary (400), malformed or nested too deeply (400).
    """
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
        shown = f"{int(length):,} bytes" if length.isdigit() else f"{length[:40]!r} bytes long"
        raise BadRequest(413, f"the request body is {shown}; at most {MAX_BODY:,}")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest(415, f"the request body must be JSON (Content-Type: application/json), got "
                              f"{kind or 'none'!r}")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise BadRequest(413, f"the request body is over {MAX_BODY:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(400, "the request body is binary, not UTF-8 JSON text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(400, f"malformed JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:  # [[[[...]]]] deeper than the parser's stack
        raise BadRequest(400, "malformed JSON: nested too deeply") from None


def make_app(session: LiveSession, token: str, hosts: set[str] | None = None, any_address: bool = False) -> Guard:
    """The live app for ``session``: the page and the API behind the :class:`Guard`.

    Args:
        session: the model session. token: the token every request must carry.
        hosts: the ``host:port`` forms of the address served (default: 127.0.0.1 and localhost with
            no port, and ``testserver``, Starlette's TestClient's). any_address: served on 0.0.0.0 or ::
            (:class:`Guard`: the address each connection reached is accepted as its ``Host``).
    """
    hosts = hosts or {"127.0.0.1", "localhost", "testserver"}

    async def index(request: Request) -> Response:
        return HTMLResponse(page_html(), headers={
            "Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer"})

    async def api(request: Request) -> Response:
        route = request.path_params["route"]
        if route not in ROUTES:
            return _error(404, f"no route /api/{route}; routes: {', '.join('/api/' + r for r in ROUTES)}")
        if request.method == "GET":
            if route not in READS:
                return _error(405, f"/api/{route} takes POST with a JSON body")
            body = {"page": request.query_params["page"]} if "page" in request.query_params else {}
        elif route in READS:
            return _error(405, f"/api/{route} takes GET")
        else:
            try:
                body = await _body(request)
            except BadRequest as e:
                return _error(e.status, str(e))
        status, out = await run_in_threadpool(answer, session, route, body)
        return JSONResponse(out, status_code=status, headers={"Cache-Control": "no-store"})

    async def missing(request: Request, exc) -> Response:
        code = getattr(exc, "status_code", 404)
        return _error(code, "no such page" if code == 404 else "method not allowed")

    app = Starlette(routes=[Route("/", index), Route("/api/{route}", api, methods=["GET", "POST"])],
                    exception_handlers={404: missing, 405: missing})
    return Guard(app, token, hosts, any_address=any_address)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one).

    Raises:
        InputError: the port is in use, or the address cannot be bound (one line).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno in (98, 48, 10048):
            raise InputError(f"port {port} on {host} is in use; choose another with --port") from None
        raise InputError(f"cannot listen on {host} port {port} ({e.strerror}): check --host and --port") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def served_hosts(host: str, port: int) -> set[str]:
    """The ``Host`` header values of ``host:port``: the host as given, and 127.0.0.1 and localhost where
    it is one of them (or 0.0.0.0 or ::, every address of the machine: with ::1 for ::; the machine's other
    addresses are accepted per connection, :class:`Guard`'s ``any_address``)."""
    names = {host}
    if host in (*LOCAL_HOSTS, *ANY_ADDRESS):
        names |= set(LOCAL_HOSTS)
    if host == "::":
        names.add("::1")
    return {f"{n}:{port}" for n in names} | {f"[{n}]:{port}" for n in names if ":" in n}


def server(app, sock: socket.socket):
    """A uvicorn server of ``app`` on the bound ``sock`` (``.run(sockets=[sock])`` serves until Ctrl-C)."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


__all__ = ["ANY_ADDRESS", "MAX_BODY", "TOKEN_HEADER", "Guard", "bind", "make_app", "new_token", "served_hosts",
           "server"]
