"""The legacy 32-weight block types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (one module each) and what the
4- and 5-bit ones share (`block32.py`: the symmetric and with-minimum blocks of 32). Their compiled
kernels are the shared ones (`formats/_kernels.py`, linked into `formats/native.py`'s library).

May import: the shared modules of `llmkit.quant.formats` (`base`, `numerics`, `packing`, `search`)
and `llmkit.errors`; no other family. Importing this package imports no type: `base.get_format`
imports a type's module on first use, and the class registers itself then.
"""
