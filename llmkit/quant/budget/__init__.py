"""Per-tensor types under a size budget: what every candidate type costs each tensor
(`measure.py`), how much the output cares about each kind of tensor (`probe.py`: KLD probes with
calibration text, cached; without text `priors.py`: each kind's share of the bytes as llama.cpp's
own mixes split them), and the allocation that minimises the predicted error within the budget
(`allocate.py`).

May import: `llmkit.quant.formats`, `plan`, `calibration`, `rounding` (GPTQ-measured errors),
`write` and `quality` (a probe writes trial files and measures their KLD), `llmkit.gguf`,
`llmkit.io`, `llmkit.errors`. Nothing imports `budget` but `pipeline.py`.
"""
