"""What verifying a batch costs a target model on this machine, kept across runs.

The adaptive draft length needs T(1) and T(k_max + 1); measuring them takes a timed batch in every
prefill. Where they rule drafting out (a batch costs about as much as its tokens one by one), a later
run of the same model with the same threads decodes plainly from the start and never loads a draft
model. Figures older than a week are measured again (a machine's load and builds change).
"""

from __future__ import annotations

import json
import os
import time

MAX_AGE_S = 7 * 86400


def _key(model, batch: int) -> str | None:
    try:
        st = os.stat(model.model_path)
    except (OSError, AttributeError, TypeError):
        return None
    return f"{os.path.basename(model.model_path)}|{st.st_size}|{st.st_mtime_ns}|t{model.n_threads}|b{batch}"


def _path():
    from llmkit import config

    return config.cache_dir("verify-cost.json")


def _read() -> dict:
    try:
        d = json.loads(_path().read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def load(model, batch: int) -> tuple[float, float] | None:
    """(T(1), T(batch)) in seconds, as timed for this model file and thread count, or None."""
    key = _key(model, batch)
    e = _read().get(key) if key else None
    try:
        if e and time.time() - float(e["when"]) < MAX_AGE_S and e["t1"] > 0 and e["tb"] > 0:
            return float(e["t1"]), float(e["tb"])
    except (KeyError, TypeError, ValueError):
        pass
    return None


def save(model, batch: int, t1: float, tb: float) -> None:
    """Keep the timed costs; a cache that cannot be written is only a lost shortcut."""
    key = _key(model, batch)
    if not key:
        return
    from llmkit.io import atomic_write_text

    d = _read()
    d[key] = {"t1": t1, "tb": tb, "when": time.time()}
    try:
        _path().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_path(), json.dumps(d, indent=0))
    except OSError:
        pass
