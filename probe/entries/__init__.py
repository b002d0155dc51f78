"""The library's entries of a run: what a command does, as one Python call (``analyze_run``), the notebook
views that run the model and hand the views what they draw (``show``, ``model_view``, ``rollout_view``),
and a dual encoder analysed as its two towers. They sit above the analyses, the report and the views,
and below the command line; the loop they run is :mod:`probe.runs`."""
