"""What verifying a batch costs a target model on this machine, kept across runs.

The adaptive draft length needs T(b) for the batch sizes it may verify; measuring them takes timed
batches. Every run keeps the sizes it timed itself, so a later run of the same model with the same
threads knows T(2), T(3), … as well as T(1) and T(k_max + 1), and where they rule drafting out (a
batch costs about as much as its tokens one by one) decodes plainly from the start and never loads a
draft model. Figures older than a week are measured again (a machine's load and builds change).
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


def _fresh(entry) -> dict[int, tuple[float, float]]:
    """{b: (seconds, when timed)} of one entry, without figures too old or malformed."""
    out: dict[int, tuple[float, float]] = {}
    if not isinstance(entry, dict) or not isinstance(entry.get("t"), dict):
        return out
    now = time.time()
    for b, v in entry["t"].items():
        try:
            seconds, when = float(v[0]), float(v[1])
            if seconds > 0 and now - when < MAX_AGE_S:
                out[int(b)] = (seconds, when)
        except (TypeError, ValueError, IndexError, KeyError):
            continue
    return out


def load(model, batch: int) -> dict[int, float] | None:
    """{b: T(b) in seconds} as timed for this model file and thread count, or None without T(1) and
    T(batch) (the two a drafting decision needs)."""
    key = _key(model, batch)
    got = {b: s for b, (s, _) in _fresh(_read().get(key) if key else None).items()}
    return got if 1 in got and batch in got else None


def save(model, batch: int, timed: dict[int, float]) -> None:
    """Keep the costs this run timed itself (others keep their own dates, so figures only read are not
    made new); a cache that cannot be written is only a lost shortcut."""
    key = _key(model, batch)
    if not key or not timed:
        return
    from llmkit.io import atomic_write_text

    d = _read()
    kept = _fresh(d.get(key))
    now = time.time()
    kept.update({b: (s, now) for b, s in timed.items()})
    d[key] = {"t": {str(b): [s, w] for b, (s, w) in sorted(kept.items())}}
    try:
        _path().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_path(), json.dumps(d, indent=0))
    except OSError:
        pass
