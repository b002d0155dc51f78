"""The live page as a notebook widget: :class:`Explorer` (anywidget), the page of ``probe live`` drawn in
Jupyter, JupyterLab, VS Code or Colab, its requests answered by a :class:`~probe.live.session.LiveSession`
in the kernel through the widget's messages (:func:`probe.live.api.answer`), with no server of its own.

    explorer = probe.Explorer(lm, "The cat sat on the mat.")
    explorer            # the last line of a cell: the widget

The widget's module (:func:`probe.live.page.widget_module`) holds the views and the app; it loads nothing
from outside. The notebook host's own widget runtime (ipywidgets' manager: JupyterLab and Notebook 7 ship
it, VS Code's and Colab's load it from their own servers) is the host's, not probe's.
"""

from __future__ import annotations

import anywidget
import traitlets

from .api import answer
from .page import styles, widget_module
from .session import LiveSession


class Explorer(anywidget.AnyWidget):
    """A live explorer of one model in a notebook: type a text, see every head's label and statistics, the
    head and model views, a head's steps and ``why``, heads switched off and patching.

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel` (an encoder or a decoder), or a
            :class:`~probe.live.session.LiveSession` to share.
        text: the text the explorer opens on.

    Attributes:
        session: the :class:`~probe.live.session.LiveSession` answering it.

    Raises:
        InputError: an encoder-decoder model (:class:`~probe.live.session.LiveSession`).
    """

    _esm = traitlets.Unicode(widget_module()).tag(sync=True)
    _css = traitlets.Unicode(styles()).tag(sync=True)
    text = traitlets.Unicode("The cat sat on the mat because it was tired.").tag(sync=True)

    def __init__(self, lm, text: str | None = None, **kwargs) -> None:
        self.session = lm if isinstance(lm, LiveSession) else LiveSession(lm)
        if text is not None:
            kwargs["text"] = self.session.check_text(text)
        super().__init__(**kwargs)
        self.on_msg(self._on_message)

    def request(self, route: str, body: dict, on_progress=None) -> tuple[int, dict]:
        """One request as the page sends it: ``(status, answer)`` (:func:`probe.live.api.answer`);
        ``on_progress`` is given the progress after each patched pass, or None."""
        return answer(self.session, route, body, on_progress)

    def _on_message(self, widget, content, buffers) -> None:
        if not isinstance(content, dict) or "id" not in content:
            return
        # the kernel is busy until the answer: the page is sent each patched pass's progress instead of asking
        status, out = self.request(str(content.get("route")), content.get("body") or {},
                                   lambda snap: self.send({"progress": snap}))
        self.send({"id": content["id"], "status": status, "body": out})


__all__ = ["Explorer"]
