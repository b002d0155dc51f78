"""Circuits: the graph of a decoder's heads and MLPs, edge attribution (EAP, EAP-IG) and circuits
evaluated by running them (faithfulness against random circuits). One idea per module: ``graph``
(nodes, inputs, edges and their count), ``wiring`` (the modules, and each head's inputs recomputed from
a stream of its own), ``forward`` (one pass with every input fed separately), ``feeds`` (what a pass
records or adds), ``checked`` (the graph checked by one short pass), ``attribution`` (edge scores),
``evaluate`` (circuit passes, faithfulness), ``paths`` (path patching), ``names`` (what ``probe path``'s
names decide before torch is imported), ``run`` (``probe circuit`` as a function),
``report`` (its report section)."""
