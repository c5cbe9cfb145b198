"""Importance matrices: llama.cpp's two file formats, and collecting one by running a model.

An imatrix holds, for every weight matrix, the mean squared activation of each input column over
calibration text. Quantizers then weight each weight's error by how strongly its column is driven,
so the error that matters to the model's outputs shrinks (activation-aware quantization).

Formats: GGUF (`NAME.in_sum2` = sum of x^2 per column and matrix, `NAME.counts` = tokens seen;
value = in_sum2 / counts) and the legacy `.dat` (int32 entry count; per entry: name, ncall, nval,
nval float32 sums; value = sum / ncall), both read as llama-quantize does.
"""

from __future__ import annotations

import os
import struct
from typing import Callable

import numpy as np

from llmkit.errors import BadFileFormat, BadInput


class Imatrix(dict):
    """{tensor name: per-column importance (float32)}, plus what llama-quantize records about the
    file in the quantized model: the path as given (`source`), the datasets and the chunk count."""

    def __init__(self, data=(), source: str | None = None, datasets: list[str] | None = None, chunk_count: int = 0):
        super().__init__(data)
        self.source, self.datasets, self.chunk_count = source, list(datasets or []), chunk_count


def load_imatrix(path: str) -> Imatrix:
    """{tensor name: per-column importance (float32)} from a GGUF or legacy .dat imatrix, with its
    datasets and chunk count (as llama-quantize's imatrix loader reads them)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise BadInput(f"cannot read the imatrix '{path}': {e.strerror}.") from None
    data = _load_gguf(path) if magic == b"GGUF" else _load_legacy(path)
    data.source = path
    if not data:
        raise BadFileFormat(f"the imatrix '{path}' holds no entries.")
    for name, v in data.items():
        if not np.isfinite(v).all():
            raise BadFileFormat(f"the imatrix '{path}' has non-finite values for '{name}'.")
    return data


def _load_gguf(path: str) -> Imatrix:
    from llmkit.gguf.reader import read_gguf

    g = read_gguf(path)
    by = {t.name: t for t in g.tensors}
    datasets = g.get("imatrix.datasets")
    out = Imatrix(datasets=[str(d) for d in datasets] if isinstance(datasets, (list, tuple)) else [],
                  chunk_count=int(g.get("imatrix.chunk_count") or 0))
    with open(path, "rb") as f:
        for name, t in by.items():
            if not name.endswith(".in_sum2"):
                continue
            base = name[: -len(".in_sum2")]
            c = by.get(base + ".counts")
            if c is None or t.type != 0 or c.type != 0:
                raise BadFileFormat(f"imatrix '{path}': '{base}' lacks F32 in_sum2/counts tensors.")
            f.seek(g.data_offset + t.offset)
            sums = np.frombuffer(f.read(t.nbytes), "<f4").astype(np.float32)
            f.seek(g.data_offset + c.offset)
            counts = np.frombuffer(f.read(c.nbytes), "<f4").astype(np.float32)
            ne0 = len(sums) // max(len(counts), 1)
            v = np.ones(len(sums), np.float32)
            for j, cnt in enumerate(counts):
                if cnt > 0:
                    v[j * ne0:(j + 1) * ne0] = sums[j * ne0:(j + 1) * ne0] / np.float32(cnt)
            out[base] = v
    return out


def _load_legacy(path: str) -> Imatrix:
    size = os.path.getsize(path)
    out = Imatrix()
    with open(path, "rb") as f:
        def read(n, what):
            b = f.read(n)
            if len(b) != n:
                raise BadFileFormat(f"the imatrix '{path}' is truncated ({what}).")
            return b

        (n_entries,) = struct.unpack("<i", read(4, "entry count"))
        if n_entries < 1 or n_entries > size // 12:
            raise BadFileFormat(f"'{path}' is not an imatrix file (entry count {n_entries}).")
        for _ in range(n_entries):
            (ln,) = struct.unpack("<i", read(4, "name length"))
            if not 0 < ln < 4096:
                raise BadFileFormat(f"the imatrix '{path}' has a bad name length {ln}.")
            name = read(ln, "name").decode("utf-8", "replace")
            ncall, nval = struct.unpack("<ii", read(8, "counts"))
            if nval < 1 or nval * 4 > size:
                raise BadFileFormat(f"the imatrix '{path}' has a bad value count {nval} for '{name}'.")
            sums = np.frombuffer(read(4 * nval, "values"), "<f4").astype(np.float32)
            out[name] = sums / np.float32(ncall) if ncall > 0 else sums
        tail = f.read(8)  # optional: int32 chunk count, int32 length + dataset name
        if len(tail) >= 4:
            out.chunk_count = struct.unpack("<i", tail[:4])[0]
        n_name = struct.unpack("<i", tail[4:])[0] if len(tail) == 8 else 0
        name = f.read(n_name) if n_name > 0 else b""
        if n_name > 0 and len(name) == n_name:  # a C string: up to its first NUL; bytes kept as they are
            out.datasets = [name.split(b"\0")[0].decode("utf-8", "surrogateescape")]
    return out


def collect_imatrix(model_path: str, text: str, n_ctx: int = 512, threads: int | None = None, max_chunks: int = 0,
                    progress: Callable[[int, int], None] | None = None
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """llama-imatrix's statistics: for every `blk.*` matrix multiplication, the squared input
    activations summed per column (float32 sums; for mixture-of-experts matrices, MUL_MAT_ID, per
    expert, from the tokens routed to it) and the tokens counted, over the full chunks of `text`
    (`calibration_pass`). Returns (sums, token counts per matrix, chunks)."""
    acc = _SquareSums()
    n = calibration_pass(model_path, text, acc, n_ctx, threads, max_chunks, progress)
    return {k: v.astype(np.float32) for k, v in acc.sums.items()}, acc.counts, n


def collect_gram(model_path: str, text: str, n_ctx: int = 512, threads: int | None = None, max_chunks: int = 0,
                 progress: Callable[[int, int], None] | None = None, only: Callable[[str], bool] | None = None,
                 layout_only: bool = False) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """GPTQ's statistics over the same pass: the whole second-moment matrix X^T X of each `blk.*`
    matrix's inputs (float32, ne0 x ne0; expert matrices are skipped), with the tokens counted.
    Matrices fed the same input in one evaluation (q/k/v, gate/up) share one array (the same object
    under each name). `only` (a test on matrix names) limits what is accumulated: GPTQ collects a few
    layers per pass to bound memory. With `layout_only` nothing is accumulated: each matrix maps to an
    empty (0, ne0) array, shared as its H would be (the Hessians' layout; one chunk is enough).
    Returns (sums, token counts per matrix, chunks)."""
    acc = _Grams(only, layout_only)
    n = calibration_pass(model_path, text, acc, n_ctx, threads, max_chunks, progress)
    for h in {id(v): v for v in acc.sums.values()}.values():
        _mirror_upper(h)
    for name, first in acc.aliases.items():
        acc.counts[name] = acc.counts[first]
    return acc.sums, acc.counts, n


def calibration_pass(model_path: str, text: str, acc, n_ctx: int, threads: int | None, max_chunks: int,
                     progress: Callable[[int, int], None] | None) -> int:
    """Run the model over `text` in full chunks of n_ctx tokens, cut as llama-imatrix cuts them, and hand
    every matrix multiplication's input to `acc` (its `wants(name, experts)`, `add(name, x, key)`,
    `add_experts(name, src0, src1, ids)` and `new_evaluation()`). Returns the chunks evaluated."""
    from llmkit.llama import runtime
    from llmkit.llama.evalcb import Decoder

    llm = runtime.open_model(model_path, runtime.ModelOptions(n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads))
    try:
        # llama-imatrix's chunks (tools/imatrix/imatrix.cpp): its -f reader drops the file's final
        # newline; the whole text is tokenized once with BOS, cut into full chunks of n_ctx tokens (the
        # rest is unused) and each chunk's first token is replaced by BOS
        text = text[:-1] if text.endswith("\n") else text
        toks = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        bos = runtime.add_bos(llm)
        if len(toks) < n_ctx:
            raise BadInput(f"the calibration text has {len(toks)} tokens, fewer than one chunk of {n_ctx}; give more "
                           "text or shorter chunks.")
        chunks = [toks[i * n_ctx:(i + 1) * n_ctx] for i in range(len(toks) // n_ctx)][:max_chunks or None]
        with Decoder(llm, n_ctx, 1, threads, callback=_matmul_inputs(acc)) as dec:
            for i, c in enumerate(chunks):
                seq = [llm.token_bos()] + c[1:] if bos else c
                acc.new_evaluation()
                dec.clear()
                # logits for every token, as llama-imatrix asks: otherwise the last layer only
                # runs for the final token and its matrices would get no statistics
                dec.decode([(tok, j, 0, True) for j, tok in enumerate(seq)], fetch=False)
                if progress:
                    progress(i + 1, len(chunks))
    finally:
        llm.close()  # now, not at garbage collection: GPTQ runs this once per group of layers
    return len(chunks)


def _matmul_inputs(acc):
    """The eval callback: for each MUL_MAT (or MUL_MAT_ID, experts) by a weight `acc` wants, its input
    rows as a (rows, ne0) float32 view of ggml's buffer, handed to `acc` while the graph runs."""
    from llmkit.llama.evalcb import GgmlTensor, op_ids, strided

    mul_mat, mul_mat_id = op_ids(b"MUL_MAT", b"MUL_MAT_ID")

    def on_tensor(t_ptr, ask):
        t = GgmlTensor.from_address(t_ptr)
        if t.op not in (mul_mat, mul_mat_id) or not t.src[0] or not t.src[1]:
            return False
        src0 = GgmlTensor.from_address(t.src[0])
        src1 = GgmlTensor.from_address(t.src[1])
        name = src0.weight_name()
        if t.op == mul_mat_id:  # experts: every routed token counts, whatever the batch (as llama-imatrix)
            if not acc.wants(name, True):
                return False
            if ask:
                return True
            if src1.type != 0 or src1.nb[0] != 4 or not src1.data or not t.src[2]:
                return True
            acc.add_experts(name, src0, src1, GgmlTensor.from_address(t.src[2]))
            return True
        if not name.startswith("blk.") or src1.type != 0 or src1.ne[1] < 16 or not acc.wants(name, False):
            return False
        if ask:
            return True
        ne0, rows = src1.ne[0], src1.ne[1] * src1.ne[2] * src1.ne[3]
        if src1.nb[0] != 4 or not src1.data:
            return True
        acc.add(name, strided(src1.data, (rows, ne0), (src1.nb[1], 4), np.float32), src1.data)
        return True

    return on_tensor


class _SquareSums:
    """llama-imatrix's accumulator: per matrix the sum of x^2 per column (float64), per expert for
    MUL_MAT_ID, and the tokens seen."""

    def __init__(self):
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, np.ndarray] = {}

    def wants(self, name: str, experts: bool) -> bool:
        return True

    def new_evaluation(self) -> None:
        pass

    def add(self, name: str, x: np.ndarray, data: int) -> None:
        x = x.astype(np.float64)
        acc = self.sums.setdefault(name, np.zeros(x.shape[1], np.float64))
        acc += (x * x).sum(axis=0)
        self.counts[name] = self.counts.get(name, np.zeros(1, np.int64)) + len(x)

    def add_experts(self, name, src0, src1, ids) -> None:
        """MUL_MAT_ID: ids [n_used, n_tokens] pick the expert of each (slot, token); src1 [cols, n_used or
        1, n_tokens] holds the inputs. Each expert's slice gets the squares of the inputs routed to it."""
        from llmkit.llama.evalcb import strided

        n_as, ne0, ne11, n_tok, n_ids = src0.ne[2], src1.ne[0], src1.ne[1], src1.ne[2], ids.ne[0]
        ex = strided(ids.data, (n_tok, n_ids), (ids.nb[1], ids.nb[0]), np.int32).reshape(-1)
        if ex.size == 0 or ex.min() < 0 or ex.max() >= n_as:
            return
        x = strided(src1.data, (n_tok, ne11, ne0), (src1.nb[2], src1.nb[1], 4), np.float32)
        slot = np.arange(n_ids) % ne11
        xs = x[:, slot, :].reshape(-1, ne0).astype(np.float64)  # row (token, slot) in ex's order
        acc = self.sums.setdefault(name, np.zeros(ne0 * n_as, np.float64)).reshape(n_as, ne0)
        np.add.at(acc, ex, xs * xs)
        self.counts[name] = self.counts.get(name, np.zeros(n_as, np.int64)) + np.bincount(ex, minlength=n_as)


class _Grams:
    """GPTQ's accumulator: per matrix x^T x of its inputs (float32, upper triangle until the pass ends),
    shared by the matrices that read the same input in one evaluation; no experts."""

    def __init__(self, only: Callable[[str], bool] | None, layout_only: bool):
        self.only, self.layout_only = only, layout_only
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, np.ndarray] = {}
        self.aliases: dict[str, str] = {}
        self.seen_inputs: dict[tuple, str] = {}  # (address, shape, first values) of this evaluation -> first matrix

    def wants(self, name: str, experts: bool) -> bool:
        return not experts and (self.only is None or self.only(name))

    def new_evaluation(self) -> None:
        self.seen_inputs.clear()

    def add(self, name: str, x: np.ndarray, data: int) -> None:
        rows, ne0 = x.shape
        x32 = np.ascontiguousarray(x)
        first = self.seen_inputs.setdefault((data, ne0, rows, x32[0, :8].tobytes()), name)
        if first != name:  # the same input as an earlier matrix of this evaluation: share its H
            self.sums.setdefault(name, self.sums[first])
            self.aliases[name] = first
            return
        if self.layout_only:
            self.sums.setdefault(name, np.empty((0, ne0), np.float32))
        else:
            if name not in self.sums:
                self.sums[name] = np.zeros((ne0, ne0), np.float32)
            _add_gram(self.sums[name], x32)
        self.counts[name] = self.counts.get(name, np.zeros(1, np.int64)) + rows


def _add_gram(h: np.ndarray, x: np.ndarray) -> None:
    """h += x^T x in place, (ne0, ne0) float32 from (rows, ne0) float32: BLAS's ssyrk, which computes
    one triangle (half of a general product's work) straight into h, with no temporary H-sized matrix
    per product. Only the upper triangle is kept; _mirror_upper finishes h.
    Without scipy, the general product (same sums, both triangles)."""
    try:
        from scipy.linalg.blas import ssyrk
    except ImportError:
        h += x.T @ x
        return
    # h as a Fortran array is h^T; it is symmetric, so ssyrk may write its lower triangle there (which
    # is h's upper one): C := x^T x + C with A = x^T (Fortran view of the C-ordered x, no copy)
    out = ssyrk(1.0, x.T, beta=1.0, c=h.T, trans=0, lower=1, overwrite_c=1)
    if not np.shares_memory(out, h):  # ssyrk copied (it does not with a Fortran-contiguous c)
        h[...] = out.T


def _mirror_upper(h: np.ndarray, block: int = 512) -> None:
    """Copy h's upper triangle onto its lower one (after _add_gram filled only the upper), a band of
    rows at a time (no n^2 index arrays)."""
    for r0 in range(0, len(h), block):
        r1 = min(len(h), r0 + block)
        h[r0:r1, :r0] = h[:r0, r0:r1].T
        sq = h[r0:r1, r0:r1]
        il = np.tril_indices(r1 - r0, -1)
        sq[il] = sq.T[il]


def save_imatrix(path: str, sums: dict[str, np.ndarray], counts: dict[str, np.ndarray], chunks: int, chunk_size: int,
                 dataset: str) -> None:
    """Write llama.cpp's GGUF imatrix format (readable by llama-quantize --imatrix)."""
    from llmkit.gguf.writer import write_gguf

    kvs = [("general.type", "str", "imatrix"), ("imatrix.datasets", "str[]", [dataset]),
           ("imatrix.chunk_count", "u32", chunks), ("imatrix.chunk_size", "u32", chunk_size)]
    tensors = []
    for name in sorted(sums):
        c = np.asarray(counts[name], np.float32).reshape(-1, 1)  # one count per matrix (expert)
        tensors.append((f"{name}.in_sum2", np.asarray(sums[name], np.float32).reshape(len(c), -1)))
        tensors.append((f"{name}.counts", c))
    write_gguf(path, kvs, tensors)
