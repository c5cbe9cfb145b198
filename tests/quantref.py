"""llama.cpp's quantizer as the reference of the quant tests: the `llama-quantize` binary run one way
(llamatools.run_tool, 2 threads; `binary_outcome` where it may refuse), its --dry-run type log and
its own list of file types, plus `setup`, the module fixture several test_quant* files share (a
K-quant-shaped model with its imatrix in both formats)."""

from __future__ import annotations

import re
import subprocess

import pytest

from llamatools import run_tool, tool


def quantize_args(src, dst, ftype: str, imatrix=None, extra=()) -> list[str]:
    """llama-quantize's arguments: [EXTRA] [--imatrix FILE] SRC DST FTYPE 2 (DST None: --dry-run)."""
    out = ["--dry-run", str(src)] if dst is None else [str(src), str(dst)]
    return [*map(str, extra), *(["--imatrix", str(imatrix)] if imatrix else []), *out, ftype, "2"]


def binary_quantize(src, dst, ftype: str, imatrix=None, extra=()) -> subprocess.CompletedProcess:
    """llama-quantize SRC DST FTYPE with 2 threads; a failure fails the test with its stderr."""
    return run_tool("llama-quantize", *quantize_args(src, dst, ftype, imatrix, extra), timeout=600)


def same_file_as_binary(src, d, ftype: str, imatrix=None, tag: str = "") -> int:
    """llama-quantize and `llmkit quant --json` on the same input: whole files equal (metadata included)
    and the same count of tensors that fell back to another type; returns that count."""
    import json

    from conftest import run_cli

    ref, ours = d / f"bin-{tag}-{ftype}.gguf", d / f"ours-{tag}-{ftype}.gguf"
    p = binary_quantize(src, ref, ftype, imatrix)
    r = run_cli(["quant", str(src), "--type", ftype, "-o", str(ours), "--json"]
                + (["--imatrix", str(imatrix)] if imatrix else []))
    assert r.exit_code == 0, r.stderr
    assert ours.read_bytes() == ref.read_bytes(), f"{tag} {ftype} (imatrix {imatrix}) differs from llama-quantize"
    fell = re.search(r"(\d+) of \d+ tensor\(s\) required fallback", p.stderr + p.stdout)
    fallbacks = json.loads(r.stdout)["fallbacks"]
    assert fallbacks == (int(fell.group(1)) if fell else 0)
    ref.unlink(), ours.unlink()
    return fallbacks


def binary_outcome(src, dst, ftype: str, imatrix=None, extra=()) -> subprocess.CompletedProcess:
    """llama-quantize where it may refuse (run_tool would fail the test): its process, whatever the outcome."""
    return subprocess.run([tool("llama-quantize"), *quantize_args(src, dst, ftype, imatrix, extra)], capture_output=True,
                          text=True, timeout=600)


def binary_refuses(src, dst, ftype: str, imatrix=None, extra=()) -> str:
    """Run llama-quantize where it must fail: the test fails if it succeeds; returns its log."""
    p = binary_outcome(src, dst, ftype, imatrix, extra)
    assert p.returncode != 0, f"llama-quantize {ftype} succeeded where it should refuse"
    return p.stdout + p.stderr


def dry_run_types(src, ftype: str, imatrix=None, extra=()) -> tuple[dict, bool]:
    """llama-quantize --dry-run: {tensor: type} from its per-tensor log (nothing is quantized), and
    whether it warns that the real run would need an imatrix."""
    p = binary_quantize(src, None, ftype, imatrix, extra)
    log = p.stdout + p.stderr
    types = {}
    for m in re.finditer(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =[^(\n]*(?:\((\S+)\))?$",
                         log, re.M):
        types[m.group(1)] = (m.group(3) or m.group(2)).upper()
    assert types, log[-2000:]
    return types, "will require an imatrix" in log


def listed_file_types() -> tuple[dict[str, int], dict[str, str]]:
    """The file types `llama-quantize --help` offers: {name: llama_ftype number} and {alias: target}
    (its lines `  15  or  Q4_K_M  : ...` and `  15  or  Q4_K    : alias for Q4_K_M`). The help exits
    with status 1, so it is run directly rather than through run_tool."""
    p = subprocess.run([tool("llama-quantize"), "--help"], capture_output=True, text=True, timeout=60)
    types, aliases = {}, {}
    for m in re.finditer(r"^\s*(\d+)\s+or\s+(\S+)\s*:\s*(.*)$", p.stdout + p.stderr, re.M):
        alias = re.match(r"alias for (\S+)", m.group(3))
        if alias:
            aliases[m.group(2)] = alias.group(1)
        else:
            types[m.group(2)] = int(m.group(1))
    assert len(types) > 30, (p.stdout + p.stderr)[-2000:]
    return types, aliases


def legacy_copy(src, dst):
    """The GGUF imatrix `src` written in llama-imatrix's legacy .dat layout (values = mean x ncall)."""
    import struct

    import numpy as np

    from llmkit.quant.calibration.imatrix import load_imatrix

    imx = load_imatrix(str(src))
    ncall = imx.chunk_count
    out = [struct.pack("<i", len(imx))]
    for name, v in imx.items():
        b = name.encode()
        out += [struct.pack("<i", len(b)), b, struct.pack("<ii", ncall, len(v)), (v * np.float32(ncall)).astype("<f4").tobytes()]
    ds = b"legacy-" + imx.datasets[0].encode()
    out += [struct.pack("<i", ncall), struct.pack("<i", len(ds)), ds]
    dst.write_bytes(b"".join(out))
    return dst


@pytest.fixture(scope="module")
def setup(tmp_path_factory, kernel_small):
    """A model whose matrices all have K-quant rows (256 / 512 wide), its GGUF imatrix (llmkit), the
    same imatrix as a legacy .dat file, and the calibration text."""
    from conftest import run_cli
    from ggufmake import write_tiny_llama

    d = tmp_path_factory.mktemp("qbin")
    base = write_tiny_llama(d / "base.gguf", n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=2, seed=11,
                            outliers=True)
    imx = d / "imatrix.gguf"
    r = run_cli(["quant", "imatrix", "-m", str(base), "--text", str(kernel_small), "-o", str(imx), "-c", "128",
                 "--chunks", "6"])
    assert r.exit_code == 0, r.stderr
    return d, base, imx, legacy_copy(imx, d / "imatrix.dat")


def awkward_rows(n: int, rng):
    """(n, 512) float32 normal rows, 5 % zeros, whose first seven rows hold what quantizers get wrong:
    all zeros, negative zeros, tiny and subnormal scales, a scale whose reciprocal overflows (C's cast of
    an infinite level; MXFP4's exponent wraps), a scale beyond fp16, and exact halves (roundf's ties)."""
    import numpy as np

    x = rng.standard_normal((n, 512)).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = 0.0
    x[0] = 0.0
    x[1, :256] = -0.0
    x[2] *= np.float32(1e-30)
    x[3] *= np.float32(1e-38)
    x[4] = np.float32(1e-42) * np.sign(x[4])
    x[5] *= np.float32(3e4)
    x[6] = np.round(x[6] * 4) / 4
    return x


def assert_blocks_equal_ggml(f, x, ours, imatrix=None) -> None:
    """`ours` (format f's blocks of the float32 rows x) equals ggml's quantizer, row by row, and decodes
    bit for bit as ggml's dequantizer does."""
    import numpy as np

    from llmkit.quant.formats import ggml_lib

    ref = ggml_lib.quantize(f.type_id, x, imatrix) if imatrix is not None else ggml_lib.quantize(f.type_id, x)
    bad = np.flatnonzero((ours != ref).any(axis=1))
    assert not len(bad), f"{f.name}: rows {bad.tolist()} differ from ggml"
    with np.errstate(all="ignore"):
        back = f.dequantize(ours.reshape(-1), x.size)
    theirs = ggml_lib.dequantize(f.type_id, ours.reshape(-1), x.size)
    assert np.array_equal(back.view(np.uint32), theirs.view(np.uint32))

