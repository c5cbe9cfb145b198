"""Runs one format's hostile files through its reader in a fresh process, so peak memory (RSS) is
that reader's alone. Prints one JSON object per case, then a summary line:

    python tests/fuzz/driver.py read FORMAT DIR       every file in DIR (sorted)
    python tests/fuzz/driver.py mutate FORMAT N       N mutations of the format's valid seed (hypothesis)

A case's outcome is 'docs' (read), 'skipped' (a counted skip with its reason), 'refused' (an
LlmkitError: one line at the CLI), or 'escaped' (any other exception: a bug)."""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def rss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it does not inherit the parent's peak at fork)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_one(fmt: str, path: str) -> dict:
    """Read one file the way llmkit does for this format; never raises."""
    from llmkit.errors import LlmkitError

    t0 = time.perf_counter()
    try:
        if fmt == "tokenizer":
            from llmkit.tokenize.formats.hf import load_hf_json

            tok = load_hf_json(path)
            tok.encode("abc ab")
            out = {"outcome": "docs", "docs": 1}
        else:
            from llmkit.rag.read.documents import load_file
            from llmkit.rag.read.files import read_input

            data, skip = read_input(path)
            docs, skipped = ([], [skip]) if skip else load_file(path, data)
            if docs:
                out = {"outcome": "docs", "docs": len(docs), "skipped": [s.reason for s in skipped][:3]}
            else:
                out = {"outcome": "skipped", "reason": skipped[0].reason if skipped else "(nothing)"}
    except LlmkitError as e:
        msg = str(e)
        out = {"outcome": "refused", "message": msg, "one_line": "\n" not in msg}
    except BaseException as e:  # noqa: BLE001 - the point is to see anything that escapes
        out = {"outcome": "escaped", "error": f"{type(e).__name__}: {str(e)[:200]}", "tb": traceback.format_exc()[-1500:]}
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def run_read(fmt: str, directory: str) -> int:
    base = rss_mb()
    for p in sorted(Path(directory).iterdir()):
        r = read_one(fmt, str(p))
        r["case"] = p.name
        print(json.dumps(r), flush=True)
    print(json.dumps({"summary": True, "baseline_mb": round(base, 1), "peak_mb": round(rss_mb(), 1)}), flush=True)
    return 0


def mutate(seed: bytes, ops) -> bytes:
    """Apply byte-level mutations: flip, insert, delete, duplicate a slice, truncate."""
    b = bytearray(seed)
    for op, pos, chunk in ops:
        if not b:
            b += chunk
            continue
        i = pos % len(b)
        if op == "flip":
            b[i] ^= chunk[0] or 1
        elif op == "insert":
            b[i:i] = chunk
        elif op == "delete":
            del b[i:i + len(chunk) * 4]
        elif op == "dup":
            b[i:i] = b[i:i + 64] * (1 + chunk[0] % 8)
        elif op == "truncate":
            del b[i:]
    return bytes(b)


def run_mutate(fmt: str, n: int) -> int:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from crafted import FORMATS, seed_of, zip_bytes

    suffix = FORMATS[fmt][0]
    seed = seed_of(fmt)
    members = None
    if fmt in ("docx", "epub"):
        import zipfile

        with zipfile.ZipFile(io.BytesIO(seed)) as z:
            members = [(i.filename, z.read(i)) for i in z.infolist()]
    tmp = tempfile.mkdtemp(prefix="llmkit-fuzz-")
    path = os.path.join(tmp, "case" + suffix)
    stats = {"examples": 0, "worst_s": 0.0, "outcomes": {}, "escaped": []}
    base = rss_mb()
    ops = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "dup", "truncate"]),
                             st.integers(0, 1 << 30), st.binary(min_size=1, max_size=8)), min_size=1, max_size=6)

    @settings(max_examples=n, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(ops, st.integers(0, 1 << 16), st.booleans())
    def one(mutations, member, inner):
        if members and inner:  # mutate the XML inside the archive, then zip it again
            k = member % len(members)
            data = zip_bytes([(name, mutate(d, mutations) if j == k else d) for j, (name, d) in enumerate(members)])
        else:
            data = mutate(seed, mutations)
        with open(path, "wb") as f:
            f.write(data)
        r = read_one(fmt, path)
        stats["examples"] += 1
        stats["worst_s"] = max(stats["worst_s"], r["seconds"])
        stats["outcomes"][r["outcome"]] = stats["outcomes"].get(r["outcome"], 0) + 1
        if r["outcome"] == "escaped" or (r["outcome"] == "refused" and not r["one_line"]):
            stats["escaped"].append({"data": data[:300].hex(), **r})

    try:
        one()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"summary": True, "format": fmt, "baseline_mb": round(base, 1), "peak_mb": round(rss_mb(), 1),
                      **stats, "escaped": stats["escaped"][:3]}), flush=True)
    return 0


if __name__ == "__main__":
    mode, fmt, arg = sys.argv[1:4]
    sys.exit(run_read(fmt, arg) if mode == "read" else run_mutate(fmt, int(arg)))
