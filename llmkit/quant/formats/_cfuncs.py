"""C-callable numba kernels of the plain formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) and the F16 reader,
for the linked library of `native.py`. Each wraps the loop of `_kernels.py` itself, compiled again
without numba's cache so that its whole LLVM module can be linked; the bytes are those loops'.
Imported only to build the library (it imports numba)."""

from __future__ import annotations

from numba import carray, cfunc, njit
from numba import types as T

from llmkit.quant.formats import _kernels as K

P8, P16, P32 = T.CPointer(T.uint8), T.CPointer(T.uint16), T.CPointer(T.uint32)
PF = T.CPointer(T.float32)
BLOCK_SIG = T.int64(PF, T.int64, P8)  # (x: n_blocks x 32 float32, n_blocks, out: n_blocks x type_size)
F16_SIG = T.int64(P16, P32, T.int64, P32)  # (halves, table, n, out) -> how many are Inf/NaN
TYPE_SIZES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24}


def _block_kernel(name: str):
    loop = njit(nogil=True, fastmath=False, error_model="numpy")(getattr(K, name).py_func)
    size = TYPE_SIZES[name]

    def kernel(x_p, n_blocks, out_p):
        loop(carray(x_p, (n_blocks, 32)), carray(out_p, (n_blocks, size)))
        return 0

    return cfunc(BLOCK_SIG, error_model="numpy")(kernel)


_f16 = njit(nogil=True, fastmath=False, error_model="numpy")(K.f16_to_f32.py_func)


@cfunc(F16_SIG, error_model="numpy")
def f16_to_f32(h_p, table_p, n, out_p):
    return _f16(carray(h_p, n), carray(table_p, 65536), carray(out_p, n))


KERNELS = {**{name: _block_kernel(name) for name in TYPE_SIZES}, "f16_to_f32": f16_to_f32}
