"""`llmkit quant`: quantize GGUF models like llama.cpp (same bytes) and measure what it cost.

One module per command family: `quantize.py` (the default command, the whole pipeline),
`imatrix.py` (calibration), `evaluate.py` (compare, ppl, inspect), `sweep.py` (many points measured
against the base); the group in `base.py`.
Commands parse, call one library function and emit; heavy imports happen inside them.
"""

from llmkit.commands.quant import evaluate, imatrix, quantize, sweep  # noqa: F401  (they register their commands)
from llmkit.commands.quant.base import group

__all__ = ["group"]
