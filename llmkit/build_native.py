"""`python -m llmkit.build_native`, what scripts/install.sh runs once: link every kernel library llmkit
has (the tokenizers', the plain quantizers'), so later runs load them without numba.

It sits beside `doctor.py`, above the packages whose kernels it links: `llmkit.native` only links and
loads libraries, and imports neither `llmkit.quant` nor `llmkit.tokenize`."""

from __future__ import annotations


def build_all() -> list[str]:
    """Build every linked library; the names of those that could not be built (no numba, no C
    compiler)."""
    from llmkit.quant.formats import native as quant_native
    from llmkit.tokenize import native as tokenize_native

    failed = []
    if not tokenize_native.build():
        failed.append("tokenize-kernels")
    if not quant_native.build():
        failed.append(quant_native.NAME)
    return failed


if __name__ == "__main__":
    missing = build_all()
    if missing:
        raise SystemExit(f"could not build {', '.join(missing)} (numba or a C compiler missing); "
                         "llmkit runs without them, slower on small inputs")
