"""The K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-weight super-blocks of sub-blocks with their own
scales; one module each) and what they share (`kquant.py`: the super-block format, the 6-bit packed
scale/min pairs of Q4_K/Q5_K and their searches). Their compiled kernels are the shared ones
(`formats/_kernels.py`).

May import: the shared modules of `llmkit.quant.formats` (`base`, `numerics`, `packing`, `search`)
and `llmkit.errors`; no other family (`iquants.iq4_xs` builds on `kquant.py`, not the reverse).
Importing this package imports no type: `base.get_format` imports a type's module on first use.
"""
