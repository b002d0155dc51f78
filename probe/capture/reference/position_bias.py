"""Position biases added to attention scores (ALiBi, T5's relative position bias): defined in
:mod:`probe.architectures.position_bias` with the rule each architecture's spec chooses, and
re-exported here, their old home."""

from ...architectures.position_bias import alibi_bias, alibi_slopes, t5_bias, t5_buckets

__all__ = ["alibi_bias", "alibi_slopes", "t5_bias", "t5_buckets"]
