"""bf16 embedding with OpenVINO: the fused ONNX graph the ONNX Runtime path runs (`model-fp32.onnx`),
compiled by OpenVINO's CPU plugin with bf16 matrix products. ONNX Runtime's x86 kernels have no bf16,
while CPUs with bf16 matrix units (Intel AMX) multiply bf16 several times faster than fp32, and the
products accumulate in fp32, so the vectors stay within rounding of the fp32 ones (min cosine and
speed: docs/design/rag-models.md). Only bulk embedding uses it: compiling the graph costs more than a
query, so queries keep ONNX Runtime's fast-starting fp32 session.
"""

from __future__ import annotations

import os
from pathlib import Path


def openvino_installed() -> bool:
    """Is the OpenVINO runtime importable (the `rag` extra installs it)?"""
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def native_bf16() -> bool:
    """Does OpenVINO choose bf16 by itself on this CPU? It does where the CPU has bf16 matrix units
    (AMX), and keeps fp32 elsewhere, where bf16 would save little and round the same."""
    from llmkit.native import cpu_flags

    flags = cpu_flags()  # importing OpenVINO to ask costs ~0.3 s, which a CPU without AMX need not pay
    if not openvino_installed() or (flags and "amx_bf16" not in flags):
        return False
    import openvino as ov

    try:
        return ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT") == ov.Type.bf16
    except RuntimeError:  # no CPU plugin for this machine
        return False


class OpenVinoSession:
    """The one call of an onnxruntime session OnnxEncoder makes (`run`), on a graph OpenVINO compiled
    with bf16 products; compiled graphs are cached beside the export, so a later index starts faster."""

    def __init__(self, model_path: Path, threads: int, cache_dir: Path | None = None):
        import openvino as ov

        core = ov.Core()
        if cache_dir is not None:
            try:
                os.makedirs(cache_dir, exist_ok=True)
                core.set_property({"CACHE_DIR": str(cache_dir)})
            except OSError:
                pass  # a read-only cache only costs compiling again next time
        self.compiled = core.compile_model(str(model_path), "CPU", {"INFERENCE_PRECISION_HINT": "bf16",
                                                                   "INFERENCE_NUM_THREADS": str(threads)})
        self.request = self.compiled.create_infer_request()

    def run(self, outputs, feeds: dict):
        """[the first output] for these inputs (onnxruntime's `run` as OnnxEncoder calls it)."""
        return [self.request.infer(feeds)[0].copy()]
