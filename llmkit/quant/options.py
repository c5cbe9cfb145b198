"""The options of one quantization run (`QuantOptions`), declared once: the command builds it, the
pipeline and the write layer read it whole. Its checks are the only ones (`check`): problems are
OptionErrors naming the option as `{field}`, which a front end spells as its own flag."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from llmkit.errors import OptionError
from llmkit.quant.plan.rules import Overrides

METHODS = ("rtn", "gptq")
HESSIAN_CTX, HESSIAN_CHUNKS = 256, 16  # GPTQ's calibration unless n_ctx / chunks are given
Progress = Callable[[str, int, int, str], None]  # (stage, done, total, note)


@dataclass
class QuantOptions:
    """What a run does besides its input and output paths.

    - `ftype`: llama.cpp's file type (Q4_K_M, ...), or a size budget instead: `target_bpw` bits per
      weight or `target_size` bytes for the whole file (the budget chooses every tensor's type).
    - llama-quantize's choices: `pure`, `imatrix` (a loaded importance matrix), `allow_requantize`,
      `overrides` (output / token-embedding / pattern types).
    - `method`: "rtn" (llama.cpp's rounding, byte-identical) or "gptq", whose Hessians come from
      `hessian_path` or are collected from `calib_text` (`chunks` x `n_ctx` tokens: 16 x 256 unless
      given; for a budget's probes 4 x 32); `damp`, `refit`, `shrink` (default rounding.gptq.SHRINK)
      steer GPTQ.
    - `threads` (default: every core), `measure` (per-tensor error statistics in the report),
      `progress` (stage, done, total, note) and `notice` (one line before a compiled kernel's first
      compilation) for the caller.
    """

    ftype: str | None = None
    pure: bool = False
    imatrix: dict | None = None
    allow_requantize: bool = False
    threads: int | None = None
    measure: bool = False
    overrides: Overrides | None = None
    target_bpw: float | None = None
    target_size: int | None = None
    calib_text: str | None = None
    n_ctx: int | None = None
    chunks: int | None = None
    method: str = "rtn"
    hessian_path: str | None = None
    damp: float = 0.01
    refit: bool = True
    shrink: float | None = None
    progress: Progress | None = None
    notice: Callable[[str], None] | None = None

    @property
    def budgeted(self) -> bool:
        """A size budget chooses the types."""
        return self.target_bpw is not None or self.target_size is not None

    @property
    def hessian_calibration(self) -> tuple[int, int]:
        """(tokens per chunk, chunks) of calibration text GPTQ collects its Hessians over."""
        return self.n_ctx or HESSIAN_CTX, self.chunks or HESSIAN_CHUNKS

    @property
    def saved_hessians(self) -> bool:
        """GPTQ's Hessians are read from an existing file rather than collected."""
        return bool(self.hessian_path) and os.path.exists(self.hessian_path)

    def check(self) -> QuantOptions:
        """Every check on the options alone; returns self."""
        if self.budgeted and self.ftype:
            raise OptionError("{ftype} and {target_bpw}/{target_size} exclude each other: the budget chooses the types.")
        if not self.budgeted and not self.ftype:
            raise OptionError("give {ftype}, or a budget with {target_bpw} / {target_size}.")
        if self.target_bpw is not None and self.target_size is not None:
            raise OptionError("give {target_bpw} or {target_size}, not both.")
        if self.method not in METHODS:
            raise OptionError("unknown rounding {method} {value!r}; use one of {choices}.", value=self.method,
                              choices=", ".join(METHODS))
        if self.method == "gptq" and self.calib_text is None and not self.saved_hessians:
            raise OptionError("{method} gptq needs {calib_text} (or an existing {hessian_path} file).")
        return self
