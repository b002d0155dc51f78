"""The views' static files (``probe/view/static``), read once and inlined into every view."""

from __future__ import annotations

from functools import cache
from importlib import resources

from markupsafe import Markup

from ..report.page import template_environment

#: The Content-Security-Policy a page holding probe's views needs: nothing loaded; inline script and style only
#: (and pictures inside the page: an image's attention, PNG data URIs).
VIEW_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


@cache
def package_static(folder: str, name: str) -> str:
    """A file of ``probe/<folder>``, read as UTF-8 to be inlined into a page (views, the live page).

    Raises:
        RuntimeError: the file holds a closing script or style tag (it could end its element).
    """
    text = resources.files("probe").joinpath(f"{folder}/{name}").read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise RuntimeError(f"{name} must not contain a closing script/style tag")
    return text


def view_static(name: str) -> str:
    """A file of ``probe/view/static`` (inlined into every view); as :func:`package_static`."""
    return package_static("view/static", name)


def view_page(body: str, title: str) -> str:
    """A whole offline page around views' fragments, under :data:`VIEW_CSP`: the one wrapper of every
    view's ``save`` (``report/templates/view_page.html.j2``; the title is escaped, the body is HTML).

    Args:
        body: HTML fragments (:func:`probe.view.html.render_fragment` and the others), inserted as they are.
        title: the page's title, plain text.
    """
    page = template_environment().get_template("view_page.html.j2")
    return page.render(csp=Markup(VIEW_CSP), title=title, body=Markup(body)) + "\n"  # the policy: a constant
