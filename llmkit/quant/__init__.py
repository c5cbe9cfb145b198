"""Quantize GGUF weights to llama.cpp's formats, byte-identical to llama.cpp's own quantizer, and
measure what it cost. Sub-packages in the order data flows through them:

- `formats/`      the tensor types: per-type numerics, packing, scale searches, numba kernels
- `calibration/`  running the model over text: importance matrices, GPTQ's Hessians
- `plan/`         which type each tensor gets: llama.cpp's rules and mixes (llama-quant.cpp)
- `rounding/`     error-compensating rounding into the formats (GPTQ)
- `write/`        the output file: tensors converted in parallel, laid out as llama.cpp does
- `budget/`       per-tensor types under a size budget: measured errors, KLD probes, the solver
- `quality/`      what it cost: per-tensor error statistics, perplexity, KL divergence
- `options.py`    a run's options (QuantOptions), declared once, checked once, passed whole
- `memory.py`     what the machine has: runs that cannot fit are refused before they start
- `pipeline.py`   one call for a whole run: Hessians -> allocation -> GPTQ -> write

Each sub-package's docstring says what it may import; nothing in `llmkit.quant` imports click, rich
or `llmkit.commands`. This `__init__` imports nothing, so `import llmkit.quant.formats` stays light.
"""
