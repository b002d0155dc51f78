"""``python -m probe ...`` (also under ``torchrun -m probe`` and ``accelerate launch -m probe``)."""

from .cli import entry

entry()
