"""The types under 2.5 bits for models trained for them, and FP4: the ternary TQ1_0 and TQ2_0
(`ternary.py`: the trits and scale they share), Q1_0 (a sign bit per weight), Q2_0 (levels
-1, 0, 1 from the same trits), and MXFP4 (E2M1 codes under an E8M0 exponent; its numba kernel
`_kernels_fp4.py`, imported only through `jit.load_kernels`).

May import: the shared modules of `llmkit.quant.formats` (`base`, `numerics`, `packing`, `jit`) and
`llmkit.errors`; no other family. Importing this package imports no type: `base.get_format` imports
a type's module on first use.
"""
