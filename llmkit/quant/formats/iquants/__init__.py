"""The i-quants, one module per type:

- IQ4_NL, IQ4_XS (`iq4.py`: their non-linear 4-bit table and block scales), numpy searches like the
  K-quants (IQ4_XS is a `kquants.kquant` super-block);
- the lattice i-quants IQ1_S/IQ1_M, IQ2_XXS/XS/S, IQ3_XXS/S: groups of weights are points of ggml's
  grids, searched only by compiled numba kernels on whole rows. `lattice.py` is what they share, the
  families `iq1.py`, `iq2.py`, `iq3.py` pick their kernels, `iq2grid.py`/`iq3grid.py` build the grids'
  search tables, and `_kernels_iq1/2/3.py` are the numba kernels (imported only through
  `jit.load_kernels`, so numba stays out of the CLI).

May import: the shared modules of `llmkit.quant.formats` (`base`, `numerics`, `packing`, `search`,
`jit`, `_kernels`, `ggml_lib` for the grids), `kquants.kquant`, `llmkit.config`, `llmkit.errors`.
Importing this package imports no type: `base.get_format` imports a type's module on first use.
"""
