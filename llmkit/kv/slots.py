"""KV slots on disk: one sequence's llama.cpp state plus a header that says what it belongs to.

File layout (version 2): b"LLMKSLOT", u32 format version, u32 header length, the JSON header (model
fingerprint, n_ctx, cache types, the number of tokens and their hash, created), the token ids as
little-endian int32, then the llama.cpp per-sequence state blob (`llama_state_seq_get_data`).
Keeping the ids out of the JSON lets a directory of large slots be listed without decoding them;
version 1 files (ids inside the JSON, no separate section) are still read. The header is checked
before llama.cpp sees the blob: llama.cpp can crash or silently mis-load state from another model
or other settings.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from llmkit.errors import BadFileFormat, BadInput, OptionError
from llmkit.bounded import load_json
from llmkit.io import disk_error

MAGIC = b"LLMKSLOT"
VERSION = 2
MAX_HEADER = 64 << 20


@dataclass
class SlotHeader:
    format: str
    version: int
    model_fingerprint: str
    model_path: str
    n_ctx: int
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    tokens: list[int] | None  # None until read (read_header(..., tokens=True))
    created: str
    text: str = ""
    n_tokens: int = -1
    tokens_sha: str = ""  # sha256 of the ids as little-endian int32 (version 2)

    def __post_init__(self):
        if self.n_tokens < 0 and isinstance(self.tokens, list):
            self.n_tokens = len(self.tokens)


def _tokens_sha(ids) -> str:
    return hashlib.sha256(ids.tobytes()).hexdigest()[:32]


def model_fingerprint(path: str) -> str:
    """sha256 over the GGUF header, metadata and tensor table (the first 4 MiB) plus the file size."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(4 << 20))
    return h.hexdigest()[:32]


def save_slot(model, path: str, model_path: str, opts, text: str = "", seq_id: int = 0) -> SlotHeader:
    """Write the model's sequence state (its evaluated tokens and their KV) to `path` atomically,
    straight from llama.cpp's buffer to the file (no copy of the state in Python objects)."""
    import llama_cpp
    import numpy as np

    from llmkit.io import atomic_file

    n = model.n_tokens
    if n == 0:
        raise BadInput("nothing to save: the prompt produced no tokens.")
    size = llama_cpp.llama_state_seq_get_size(model.ctx, seq_id)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(model.ctx, buf, size, seq_id)
    if written == 0:
        raise BadInput("llama.cpp returned an empty state for this sequence; nothing was saved.")
    ids = np.asarray(model.input_ids[:n], dtype="<i4")
    hdr = SlotHeader(format="llmkit-kv-slot", version=VERSION, model_fingerprint=model_fingerprint(model_path),
                     model_path=os.path.abspath(model_path), n_ctx=int(model.n_ctx()), cache_type_k=opts.cache_type_k,
                     cache_type_v=opts.cache_type_v, flash_attn=bool(opts.flash_attn), tokens=None,
                     created=time.strftime("%Y-%m-%dT%H:%M:%S"), text=text, n_tokens=n, tokens_sha=_tokens_sha(ids))
    head = json.dumps({k: v for k, v in asdict(hdr).items() if k != "tokens"}, ensure_ascii=False).encode()
    with atomic_file(path) as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(head)) + head)
        f.write(ids.tobytes())
        f.write(memoryview(buf).cast("B")[:written])
    hdr.tokens = ids.tolist()
    return hdr


def read_header(path: str, tokens: bool = False) -> tuple[SlotHeader, int]:
    """The slot's header and the byte offset of the state blob; refuses foreign files. The token ids
    are read only when asked for (`tokens`), or when a version 1 file keeps them in the JSON."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            pre = f.read(16)
            if len(pre) < 16 or pre[:8] != MAGIC:
                raise BadFileFormat(f"'{path}' is not an llmkit KV slot file (bad magic). Save one with `llmkit kv save`.")
            version, n = struct.unpack("<II", pre[8:])
            if version > VERSION:
                raise BadFileFormat(f"'{path}' is a slot of format version {version}; this llmkit reads {VERSION}. Upgrade llmkit.")
            if n > MAX_HEADER or n > size - 16:
                raise BadFileFormat(f"'{path}' is truncated or corrupt (header length {n}).")
            raw = f.read(n)
            hdr = _parse_header(raw, path, version)
            off = 16 + n
            if version >= 2:
                if off + 4 * hdr.n_tokens > size:
                    raise BadFileFormat(f"'{path}' is truncated ({hdr.n_tokens} tokens declared). Save the slot again.")
                if tokens:
                    hdr.tokens = _read_ids(f, hdr, path)
                off += 4 * hdr.n_tokens
    except OSError as e:
        raise BadInput(f"cannot read slot '{path}': {e.strerror}. Check the path.") from None
    return hdr, off


def _parse_header(raw: bytes, path: str, version: int) -> SlotHeader:
    try:
        d = load_json(raw, f"the header of '{path}'")
        if version >= 2:
            d["tokens"] = None
        hdr = SlotHeader(**{k: d[k] for k in SlotHeader.__dataclass_fields__ if k in d})
    except (ValueError, TypeError, KeyError) as e:
        raise BadFileFormat(f"'{path}' has a corrupt header ({str(e)[:80]}).") from None
    problem = _header_problem(hdr)
    if problem:
        raise BadFileFormat(f"'{path}' has a corrupt header ({problem}). Save the slot again.")
    return hdr


def _read_ids(f, hdr: SlotHeader, path: str) -> list[int]:
    """The token section of a version 2 slot (the file positioned at it), checked against its hash."""
    import numpy as np

    ids = np.frombuffer(f.read(4 * hdr.n_tokens), dtype="<i4")
    if len(ids) != hdr.n_tokens or _tokens_sha(ids) != hdr.tokens_sha or (len(ids) and ids.min() < 0):
        raise BadFileFormat(f"'{path}' has corrupt token ids (they do not match the header's hash). Save the slot again.")
    return ids.tolist()


_FIELD_TYPES = {"format": str, "model_fingerprint": str, "model_path": str, "n_ctx": int, "cache_type_k": str,
                "cache_type_v": str, "flash_attn": bool, "created": str, "text": str}


def _header_problem(hdr: SlotHeader) -> str:
    """What is wrong with a parsed header's field types ('' when nothing): checked before any
    field reaches llama.cpp (an id it does not know aborts the process)."""
    for name, kind in _FIELD_TYPES.items():
        v = getattr(hdr, name)
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            return f"{name} is {type(v).__name__}, not {kind.__name__}"
    if hdr.tokens is not None and (not isinstance(hdr.tokens, list)
                                   or not all(type(t) is int and 0 <= t < 1 << 31 for t in hdr.tokens)):
        return "tokens is not a list of token ids"
    if type(hdr.n_tokens) is not int or hdr.n_tokens < 0 or not isinstance(hdr.tokens_sha, str):
        return "n_tokens is not a count"
    return ""


def check_compatible(hdr: SlotHeader, path: str, model, model_path: str, opts) -> None:
    """Refuse a slot from another model or with settings whose state layout differs."""
    fp = model_fingerprint(model_path)
    if hdr.model_fingerprint != fp:
        raise BadInput(f"slot '{path}' was saved with a different model ({hdr.model_path}). "
                       "Use the same model file, or save a new slot.")
    if (hdr.cache_type_k, hdr.cache_type_v) != (opts.cache_type_k, opts.cache_type_v):
        raise OptionError("slot '{path}' has KV cache types {k}/{v}; pass {cache_type_k} {k} {cache_type_v} {v}.",
                          path=path, k=hdr.cache_type_k, v=hdr.cache_type_v)
    if bool(hdr.flash_attn) != bool(opts.flash_attn):
        raise OptionError("slot '{path}' was saved {how} {flash_attn}; use the same setting to restore it.",
                          path=path, how="with" if hdr.flash_attn else "without")
    if hdr.n_tokens >= model.n_ctx():
        raise OptionError("slot '{path}' holds {n} tokens, more than the context ({ctx}). Raise {n_ctx}.",
                          path=path, n=hdr.n_tokens, ctx=model.n_ctx())
    if hdr.n_tokens and max(hdr.tokens) >= model.n_vocab():
        raise BadInput(f"slot '{path}' contains token ids outside this model's vocabulary; it was saved with another model.")


def restore_slot(model, path: str, model_path: str, opts, seq_id: int = 0) -> SlotHeader:
    """Load a slot into the model's sequence and set its token history. The state goes from a
    copy-on-write mapping of the file straight to llama.cpp (no copy of it in Python objects)."""
    import mmap

    import llama_cpp

    if is_raw_state(path):
        n = restore_raw(model, path, seq_id)
        return SlotHeader("llama.cpp-state", 0, "", "", int(model.n_ctx()), opts.cache_type_k, opts.cache_type_v,
                          bool(opts.flash_attn), [int(t) for t in model.input_ids[:n]], "")
    hdr, off = read_header(path, tokens=True)
    check_compatible(hdr, path, model, model_path, opts)
    model.reset()
    model._ctx.kv_cache_clear()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size - off
        if size <= 0:
            raise BadFileFormat(f"'{path}' holds no state after its header (truncated). Save the slot again.")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
            buf = (ctypes.c_uint8 * size).from_buffer(mm, off)
            try:
                got = llama_cpp.llama_state_seq_set_data(model.ctx, buf, size, seq_id)
            finally:
                del buf  # the mapping cannot close while a ctypes view of it exists
    if got == 0:
        raise BadFileFormat(f"llama.cpp refused the state in '{path}' (corrupt or from another llama.cpp build).")
    n = hdr.n_tokens
    model.input_ids[:n] = hdr.tokens
    model.n_tokens = n
    return hdr


def list_slots(directory: str) -> list[tuple[str, SlotHeader, int]]:
    """(path, header, file size) for every readable slot file in a directory."""
    out = []
    d = Path(directory)
    if not d.is_dir():
        raise BadInput(f"'{directory}' is not a directory.")
    for p in sorted(d.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            try:
                hdr, _ = read_header(str(p))
            except (BadFileFormat, BadInput):
                continue
            out.append((str(p), hdr, p.stat().st_size))
    return out


# ---- llama.cpp's own sequence-state files (what llama-server writes to --slot-save-path) -------

RAW_MAGIC = 0x67677371  # 'ggsq'


def is_raw_state(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and struct.unpack("<I", head)[0] == RAW_MAGIC


def server_tokens_decode(t: list[int]) -> list[int]:
    """llama-server stores its prompt as [-1, 1, n, tok_1..tok_n, 0] in the state file's token list
    (a text-only chunk list); plain llama.cpp files hold the tokens themselves.

    >>> server_tokens_decode([-1, 1, 2, 7, 8, 0]), server_tokens_decode([7, 8])
    ([7, 8], [7, 8])
    """
    if len(t) >= 3 and t[0] == -1 and 0 <= t[2] <= len(t) - 3:
        return t[3:3 + t[2]]
    return t


def server_tokens_encode(t: list[int]) -> list[int]:
    return [-1, 1, len(t), *t, 0]


def read_raw_tokens(path: str, n_vocab: int, n_ctx: int) -> list[int]:
    """The token list of a llama.cpp state file, bounds-checked before llama.cpp reads it."""
    import numpy as np

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            raise BadFileFormat(f"'{path}' is a truncated llama.cpp state file.")
        _, _version, n = struct.unpack("<III", head)
        if n >= n_ctx + 8:
            raise OptionError("'{path}' holds {n} tokens, more than the context ({ctx}). Raise {n_ctx}.",
                              path=path, n=n, ctx=n_ctx)
        if 12 + 4 * n > size:
            raise BadFileFormat(f"'{path}' is a truncated llama.cpp state file ({n} tokens declared).")
        toks = np.array(server_tokens_decode(np.frombuffer(f.read(4 * n), dtype="<i4").tolist()), dtype=np.int64)
    if len(toks) and (toks.min() < 0 or toks.max() >= n_vocab):
        raise BadInput(f"'{path}' contains token ids outside this model's vocabulary; it was saved with another model.")
    return [int(t) for t in toks]


def restore_raw(model, path: str, seq_id: int = 0) -> int:
    """Load a llama-server slot file (llama.cpp's format: no model check is possible beyond ids)."""
    import llama_cpp

    n_ctx = model.n_ctx()
    toks = read_raw_tokens(path, model.n_vocab(), n_ctx)
    model.reset()
    model._ctx.kv_cache_clear()
    cap = n_ctx + 8
    out = (llama_cpp.llama_token * cap)()
    count = ctypes.c_size_t(0)
    got = llama_cpp.llama_state_seq_load_file(model.ctx, path.encode(), seq_id, out, cap, ctypes.byref(count))
    if got == 0 or server_tokens_decode(list(out[:count.value])) != toks:
        raise BadFileFormat(f"llama.cpp refused the state in '{path}': another model, or other settings "
                            "(llama-server turns flash attention on: restore with flash attention).")
    model.input_ids[:len(toks)] = toks
    model.n_tokens = len(toks)
    return len(toks)


def save_raw(model, path: str, seq_id: int = 0) -> int:
    """Write the sequence in llama.cpp's state format with llama-server's token list, for its slots."""
    import llama_cpp

    n = model.n_tokens
    if n == 0:
        raise BadInput("nothing to save: the prompt produced no tokens.")
    enc = server_tokens_encode([int(t) for t in model.input_ids[:n]])
    toks = (llama_cpp.llama_token * len(enc))(*enc)
    from llmkit.io import new_file_mode, remove_stale_temps

    remove_stale_temps(path)
    mode = new_file_mode(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.slot.tmp")  # the pattern remove_stale_temps knows
    after = f"Nothing was changed (an earlier '{name}' is intact)"
    try:
        try:  # created here, so a read-only or full disk is reported with its reason (llama.cpp gives none)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))
            need = llama_cpp.llama_state_seq_get_size(model.ctx, seq_id) + 4 * len(enc) + 64
            st = os.statvfs(head or ".")
            if st.f_bavail * st.f_frsize < need:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
        except OSError as e:
            raise (disk_error(path, e, after=after) or e) from None
        if llama_cpp.llama_state_seq_save_file(model.ctx, tmp.encode(), seq_id, toks, len(enc)) == 0:
            st = os.statvfs(head or ".")
            why = os.strerror(errno.ENOSPC) if st.f_bavail * st.f_frsize < need else "llama.cpp could not write it"
            raise BadInput(f"cannot write '{path}': {why}. {after}; free some space or choose a writable directory.")
        os.chmod(tmp, mode)
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise (disk_error(path, e, after=after) or e) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return n
