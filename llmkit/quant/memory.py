"""What a run needs in memory against what the machine has: a run that cannot fit is refused before
anything is read or written, with the figures (the write layer, GPTQ's Hessians)."""

from __future__ import annotations


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gib(n: int) -> str:
    """Bytes as GiB with one decimal: 1.5 GiB."""
    return f"{n / 2**30:.1f} GiB"
