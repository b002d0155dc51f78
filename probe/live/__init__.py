"""Live: type a text and watch every head, step and source change, in a browser (``probe live``,
:mod:`probe.live.server`) or a notebook (:class:`probe.live.widget.Explorer`), both answered by one
:class:`probe.live.session.LiveSession` holding the loaded model."""
