"""The live page as one HTML document and as the notebook widget's module: the view modules of
``probe/view/static`` (the report's own files, :func:`probe.view.assets.view_static`) and the app
(``probe/live/static/live.js``, ``live.css``), inlined: the page loads nothing from anywhere, and talks only
to the server it came from (``connect-src 'self'``)."""

from __future__ import annotations

from functools import cache

from ..view.assets import package_static, view_static

#: The view modules the live page draws with, in load order (each registers its draw function in probeViews).
VIEW_MODULES = ("headview", "modelview", "stepview")

#: The page's Content-Security-Policy: inline script and style only, requests to its own server only.
PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def live_static(name: str) -> str:
    """A file of ``probe/live/static``; as :func:`probe.view.assets.package_static`."""
    return package_static("live/static", name)


def styles() -> str:
    """Every view's style sheet and the app's, in one."""
    return "\n".join([*(view_static(f"{m}.css") for m in VIEW_MODULES), live_static("live.css")])


def scripts() -> str:
    """Every view module and the app, in one script (they register into ``probeViews``)."""
    return "\n;\n".join([*(view_static(f"{m}.js") for m in VIEW_MODULES), live_static("live.js")])


@cache
def page_html() -> str:
    """The page ``GET /`` answers: it reads the token from its own address, sends it as a header and starts
    the app (``probeViews.live``)."""
    start = ('(function () { var q = new URLSearchParams(location.search), token = q.get("token") || ""; '
             'probeViews.live(document.getElementById("probe-live"), probeViews.httpTransport("/", token), '
             'q.get("text") || "The cat sat on the mat because it was tired."); })();')
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<title>probe live</title><link rel=\"icon\" href=\"data:,\">"
            f"<style>body {{ margin: 8px; }}\n{styles()}</style></head>"
            f"<body><div id=\"probe-live\" class=\"probe-live\"></div><script>{scripts()}\n;\n{start}</script>"
            "</body></html>\n")


def widget_module() -> str:
    """The notebook widget's ES module (anywidget): the same views and app, drawn into the widget's element,
    the requests sent as the widget's messages (``{id, route, body}``, answered ``{id, status, body}``)."""
    return (scripts() + "\n;\n" + live_static("widget.js"))


__all__ = ["PAGE_CSP", "VIEW_MODULES", "live_static", "page_html", "scripts", "styles", "widget_module"]
