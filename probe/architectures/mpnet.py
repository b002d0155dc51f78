"""MPNet's behaviour rules (the spec's ``position_bias`` and ``position_offset`` fields; Song et al.
2020, "MPNet: Masked and Permuted Pre-training for Language Understanding").

* Relative position bias: every head adds a learned scalar per bucket of the relative position
  j - i, T5's bidirectional buckets (:func:`~probe.architectures.position_bias.t5_buckets`: keys
  after the query in the upper half, exact small offsets, logarithmic ones up to the largest
  distance). Unlike T5 the one table [buckets, heads] lives in the encoder (not in its first layer)
  and serves every layer, and the bucketing uses 32 buckets and a largest distance of 128 whatever
  the config says (transformers' ``MPNetEncoder.compute_position_bias`` calls the bucketing with its
  defaults; ``relative_attention_num_buckets`` only sizes the table).
* Positions: the embeddings number tokens from row ``padding_idx + 1`` = 2, ``padding_idx`` fixed
  at 1 in the model (not read from the config), RoBERTa's way.
"""

from __future__ import annotations

import torch

from .position_bias import PositionBias, t5_bias

#: The buckets and the largest distance MPNet's bucketing uses (fixed in the model, not in the config).
MPNET_BUCKETS, MPNET_MAX_DISTANCE = 32, 128
#: The embeddings' padding row; real tokens are numbered from the row after it.
MPNET_PADDING_ROW = 1


def mpnet_offset(config) -> int:
    """MPNet: the position table's rows before the first token, ``padding_idx + 1`` = 2 (the model
    fixes ``padding_idx`` at 1)."""
    return MPNET_PADDING_ROW + 1


def shared_bias_table(config) -> str | None:
    """MPNet's refusal of head removal (the spec's ``removal_refusal`` rule): the encoder computes one
    bias [batch, heads, query, key] from its table for every layer, so a layer with fewer heads than
    the table no longer fits it."""
    return ("adds one relative position bias, from a table of all heads shared by every layer, to each layer's "
            "scores; a layer with heads removed would no longer fit it")


def _mpnet(module, n_query, n_key, past, key_positions, device, content=None) -> torch.Tensor | None:
    """MPNet's learned bias of the bucket of j - i, [1, heads, query, key]: the encoder's table
    (``module.bias_table``), bidirectional buckets, positions counted 0, 1, ... over the whole
    sequence (padding included, as the model does)."""
    table = module.bias_table
    if table is None:
        return None
    return t5_bias(table.weight, n_query, n_key, past, True, MPNET_BUCKETS, MPNET_MAX_DISTANCE)


#: MPNet's relative position bias: T5's bidirectional buckets, one table shared by the encoder's layers.
MPNET_RELATIVE = PositionBias("mpnet", _mpnet)
