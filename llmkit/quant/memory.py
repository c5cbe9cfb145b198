"""Memory figures as the quant layers word them (what the machine has: llmkit.machine)."""

from __future__ import annotations


def gib(n: int) -> str:
    """Bytes as GiB with one decimal: 1.5 GiB."""
    return f"{n / 2**30:.1f} GiB"
