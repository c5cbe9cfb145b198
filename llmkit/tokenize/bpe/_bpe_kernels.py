"""Compiled (numba) kernels of byte-level BPE encoding: pre-tokenizer, merge loop, word cache, output.

Imported only to compile (`native.build`): every kernel is a C-callable `cfunc` over raw pointers and
allocates nothing, so the compiled code needs neither numba nor numpy at run time and can be linked
into a shared library once and loaded with ctypes afterwards. All buffers come from the caller.

Pre-tokenizers (`kind`): 0 GPT-2 (' ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+' after the
contractions), 1 Llama-3 (digits in groups of up to 3) and 2 Qwen2 (single digits): the regexes'
alternatives written out as a scan over code points with a class table (bit 1 letter, 2 number,
4 whitespace, as the `regex` module defines them). The merge loop is HF's: a min-heap of
(rank, position) over a linked list of symbols, so a word of n bytes costs O(n log n).
"""

from __future__ import annotations

from numba import carray, cfunc, njit
from numba import types as T

P8 = T.CPointer(T.uint8)
P32 = T.CPointer(T.int32)
P64 = T.CPointer(T.int64)
L_, N_, S_ = 1, 2, 4
FNV_OFFSET = -3750763034362895579  # 0xcbf29ce484222325 as int64
FNV_PRIME = 1099511628211
KEY_MAX = 255  # longest word kept in the cache (bytes)


@njit
def _cont(b):
    return (b & 0xC0) == 0x80


@njit
def decode_utf8(t, i, end):
    """(code point, byte length) at t[i]; an invalid byte is (-1, 1), a code point of no class."""
    b0 = t[i]
    if b0 < 0x80:
        return np_int(b0), 1
    if 0xC2 <= b0 < 0xE0 and i + 1 < end and _cont(t[i + 1]):
        return ((np_int(b0) & 0x1F) << 6) | (np_int(t[i + 1]) & 0x3F), 2
    if 0xE0 <= b0 < 0xF0 and i + 2 < end and _cont(t[i + 1]) and _cont(t[i + 2]):
        cp = ((np_int(b0) & 0x0F) << 12) | ((np_int(t[i + 1]) & 0x3F) << 6) | (np_int(t[i + 2]) & 0x3F)
        if cp >= 0x800:
            return cp, 3
    if 0xF0 <= b0 < 0xF5 and i + 3 < end and _cont(t[i + 1]) and _cont(t[i + 2]) and _cont(t[i + 3]):
        cp = (((np_int(b0) & 0x07) << 18) | ((np_int(t[i + 1]) & 0x3F) << 12) | ((np_int(t[i + 2]) & 0x3F) << 6)
              | (np_int(t[i + 3]) & 0x3F))
        if 0x10000 <= cp <= 0x10FFFF:
            return cp, 4
    return -1, 1


@njit
def np_int(x):
    return T.int64(x)


@njit
def _at(t, i, end, cls):
    """(class, code point, byte length) at t[i]; ASCII without a call (numba does not inline calls)."""
    b = t[i]
    if b < 0x80:
        return np_int(cls[b]), np_int(b), 1
    cp, n = decode_utf8(t, i, end)
    return (0 if cp < 0 else np_int(cls[cp])), cp, n


@njit
def _run(t, i, end, cls, mask, want):
    """End of the run from i of code points whose class & mask == want."""
    while i < end:
        b = t[i]
        if b < 0x80:
            if (cls[b] & mask) != want:
                break
            i += 1
        else:
            cp, n = decode_utf8(t, i, end)
            c = 0 if cp < 0 else cls[cp]
            if (c & mask) != want:
                break
            i += n
    return i


@njit
def _crlf_run(t, i, end):
    while i < end and (t[i] == 10 or t[i] == 13):
        i += 1
    return i


@njit
def _lower(b):
    return b + 32 if 65 <= b <= 90 else b


@njit
def _contraction(t, i, end, fold):
    """End of a contraction ('s 't 're 've 'm 'll 'd) at t[i] == "'", or -1; fold: any case."""
    j = i + 1
    if j >= end:
        return -1
    c = _lower(t[j]) if fold else t[j]
    if c == 115 or c == 116 or c == 109 or c == 100:  # s t m d
        return j + 1
    if fold == 2 and t[j] == 0xC5 and j + 1 < end and t[j + 1] == 0xBF:  # U+017F folds to 's'
        return j + 2
    if j + 1 < end:
        c2 = _lower(t[j + 1]) if fold else t[j + 1]
        if (c == 114 and c2 == 101) or (c == 118 and c2 == 101) or (c == 108 and c2 == 108):  # re ve ll
            return j + 2
    return -1


@njit
def _spaces(t, i, end, cls, crlf):
    """The whitespace alternatives at i: '\\s*[\\r\\n]+' (crlf), then '\\s+(?!\\S)', then '\\s+'."""
    j = i
    last = i
    last_nl = -1
    while j < end:
        b = t[j]
        if b < 0x80:
            if (cls[b] & S_) == 0:
                break
            if b == 10 or b == 13:
                last_nl = j
            last = j
            j += 1
        else:
            cp, n = decode_utf8(t, j, end)
            if cp < 0 or (cls[cp] & S_) == 0:
                break
            last = j
            j += n
    if crlf and last_nl >= 0:
        return last_nl + 1
    if j == end or last == i:
        return j
    return last


@njit
def _next_gpt2(t, i, end, cls):
    c, cp, n = _at(t, i, end, cls)
    if cp == 39:
        j = _contraction(t, i, end, 0)
        if j > 0:
            return j
    if cp == 32 and i + 1 < end:
        c2, _cp2, n2 = _at(t, i + 1, end, cls)
        if c2 & L_:
            return _run(t, i + 1 + n2, end, cls, L_, L_)
        if c2 & N_:
            return _run(t, i + 1 + n2, end, cls, N_, N_)
        if c2 == 0:
            return _run(t, i + 1 + n2, end, cls, 7, 0)
    if c & L_:
        return _run(t, i + n, end, cls, L_, L_)
    if c & N_:
        return _run(t, i + n, end, cls, N_, N_)
    if c == 0:
        return _run(t, i + n, end, cls, 7, 0)
    return _spaces(t, i, end, cls, False)


@njit
def _next_llama3(t, i, end, cls, max_digits, fold):
    c, cp, n = _at(t, i, end, cls)
    if cp == 39:
        j = _contraction(t, i, end, fold)
        if j > 0:
            return j
    if c & L_:
        return _run(t, i + n, end, cls, L_, L_)
    if cp != 10 and cp != 13 and (c & (L_ | N_)) == 0 and i + n < end:
        c2, _cp2, n2 = _at(t, i + n, end, cls)
        if c2 & L_:
            return _run(t, i + n + n2, end, cls, L_, L_)
    if c & N_:
        j = i + n
        k = 1
        while k < max_digits and j < end:
            c2, _cp2, n2 = _at(t, j, end, cls)
            if (c2 & N_) == 0:
                break
            j += n2
            k += 1
        return j
    if cp == 32 and i + 1 < end:
        c2, _cp2, n2 = _at(t, i + 1, end, cls)
        if c2 == 0:
            return _crlf_run(t, _run(t, i + 1 + n2, end, cls, 7, 0), end)
    if c == 0:
        return _crlf_run(t, _run(t, i + n, end, cls, 7, 0), end)
    return _spaces(t, i, end, cls, True)


@njit
def next_piece(t, i, end, cls, kind):
    """End of the pre-tokenizer piece that starts at t[i], under pattern `kind` (0 GPT-2; 1-4 the
    Llama-3 family, by how many digits group and how contractions fold)."""
    if kind == 0:
        return _next_gpt2(t, i, end, cls)
    if kind == 1:
        return _next_llama3(t, i, end, cls, 3, 1)
    if kind == 2:
        return _next_llama3(t, i, end, cls, 1, 1)
    if kind == 3:
        return _next_llama3(t, i, end, cls, 3, 2)
    return _next_llama3(t, i, end, cls, 1, 2)


# -- hash tables ------------------------------------------------------------------------------------
@njit
def _mix(h):
    h ^= (h >> 33) & 0x7FFFFFFF
    h *= -49064778989728563  # 0xff51afd7ed558ccd
    h ^= (h >> 33) & 0x7FFFFFFF
    return h


@njit
def _pair_rank(pkey, prank, mask, a, b):
    key = (np_int(a) << 32) | np_int(b)
    s = _mix(key) & mask
    while True:
        k = pkey[s]
        if k == key:
            return np_int(prank[s])
        if k == -1:
            return -1
        s = (s + 1) & mask


@njit
def hash_bytes(t, s, e):
    """FNV-1a of t[s:e], made odd: never 0, which marks an empty slot of the word cache."""
    h = FNV_OFFSET
    for k in range(s, e):
        h = (h ^ np_int(t[k])) * FNV_PRIME
    return h | 1


@cfunc(T.int64(P32, P32, P32, T.int64, P64, P32, T.int64), error_model="numpy", cache=True)
def build_pairs(pa, pb, pr, n, pkey_p, prank_p, cap):
    """Fill the open-addressing table (a, b) -> rank from n merges (cap: a power of two > 2n)."""
    a, b, r = carray(pa, n), carray(pb, n), carray(pr, n)
    pkey, prank = carray(pkey_p, cap), carray(prank_p, cap)
    mask = cap - 1
    for s in range(cap):
        pkey[s] = -1
    for k in range(n):
        key = (np_int(a[k]) << 32) | np_int(b[k])
        s = _mix(key) & mask
        while pkey[s] != -1 and pkey[s] != key:
            s = (s + 1) & mask
        if pkey[s] == -1:  # the first merge of a pair wins, as when the model was loaded
            pkey[s] = key
            prank[s] = r[k]
    return 0


@cfunc(T.int64(P8, P64, T.int64, P32, T.int64), error_model="numpy", cache=True)
def build_vocab(tb_p, toff_p, n, vslot_p, cap):
    """Fill the table token bytes -> token index (for ignore_merges) from n tokens' byte strings."""
    toff = carray(toff_p, n + 1)
    tb = carray(tb_p, toff[n])
    vslot = carray(vslot_p, cap)
    mask = cap - 1
    for s in range(cap):
        vslot[s] = -1
    for k in range(n):
        s = hash_bytes(tb, toff[k], toff[k + 1]) & mask
        while vslot[s] != -1:
            s = (s + 1) & mask
        vslot[s] = k
    return 0


@njit
def _vocab_lookup(t, s, e, tb, toff, vslot, vmask):
    h = hash_bytes(t, s, e) & vmask
    n = e - s
    while True:
        k = vslot[h]
        if k == -1:
            return -1
        if toff[k + 1] - toff[k] == n:
            same = True
            for q in range(n):
                if tb[toff[k] + q] != t[s + q]:
                    same = False
                    break
            if same:
                return k
        h = (h + 1) & vmask


# -- the merge loop ---------------------------------------------------------------------------------
# A 4-ary min-heap: half the levels of a binary one, so a pop touches fewer cache lines of a large
# heap (a long word holds one entry per position); the keys (rank, position) are unique up to equal
# entries, so any min-heap pops them in the same order.
@njit
def _heap_push(heap, hs, v):
    k = hs
    while k > 0:
        p = (k - 1) >> 2
        if heap[p] <= v:
            break
        heap[k] = heap[p]
        k = p
    heap[k] = v
    return hs + 1


@njit
def _heap_pop(heap, hs):
    top = heap[0]
    hs -= 1
    v = heap[hs]
    k = 0
    while True:
        c = 4 * k + 1
        if c >= hs:
            break
        m = c
        end = min(c + 4, hs)
        for q in range(c + 1, end):
            if heap[q] < heap[m]:
                m = q
        if heap[m] >= v:
            break
        heap[k] = heap[m]
        k = m
    heap[k] = v
    return top, hs


@njit
def _merge_word(t, s, e, byte_id, pkey, prank, pmask, new_of, sc, sprev, snext, slen, heap, out, o):
    """HF's BPE merge loop on the bytes t[s:e]; writes the ids at out[o:], returns the new o (or -1
    when a byte has no token).

    The queue of (rank, position) entries is a FIFO beside a heap: an entry not smaller than the
    FIFO's last goes to the FIFO in O(1), any other to the heap, and a pop takes the smaller of the
    two fronts, so entries come out in the same order as from one heap. In a long word most entries
    arrive in order (one rank after another, left to right), so it stays linear where a heap alone
    pays log n per entry. heap: 2 x (3 n) slots, the heap's then the FIFO's."""
    n = e - s
    for k in range(n):
        i = byte_id[t[s + k]]
        if i < 0:
            return -1
        sc[k] = i
        sprev[k] = k - 1
        snext[k] = k + 1
        slen[k] = 1
    snext[n - 1] = -1
    hs = 0
    f0 = heap.shape[0] // 2  # the FIFO's slots: heap[f0:]
    fh = f0
    ft = f0
    for k in range(n - 1):
        r = _pair_rank(pkey, prank, pmask, sc[k], sc[k + 1])
        if r >= 0:
            heap[ft] = (r << 32) | k  # ascending positions of any ranks: not always in order
            if ft > f0 and heap[ft] < heap[ft - 1]:
                hs = _heap_push(heap, hs, heap[ft])
            else:
                ft += 1
    while hs > 0 or fh < ft:
        if fh < ft and (hs == 0 or heap[fh] <= heap[0]):
            top = heap[fh]
            fh += 1
        else:
            top, hs = _heap_pop(heap, hs)
        r = top >> 32
        pos = top & 0xFFFFFFFF
        if slen[pos] == 0:
            continue
        nx = snext[pos]
        if nx == -1:
            continue
        r2 = _pair_rank(pkey, prank, pmask, sc[pos], sc[nx])
        if r2 < 0 or new_of[r2] != new_of[r]:
            continue  # an outdated entry
        sc[pos] = new_of[r]
        slen[pos] += slen[nx]
        slen[nx] = 0
        nn = snext[nx]
        snext[pos] = nn
        if nn != -1:
            sprev[nn] = pos
            r4 = _pair_rank(pkey, prank, pmask, sc[pos], sc[nn])
            if r4 >= 0:
                v = (r4 << 32) | pos
                if fh < ft and v < heap[ft - 1]:
                    hs = _heap_push(heap, hs, v)
                else:
                    if fh == ft:
                        fh = f0
                        ft = f0
                    heap[ft] = v
                    ft += 1
        p = sprev[pos]
        if p >= 0:
            r3 = _pair_rank(pkey, prank, pmask, sc[p], sc[pos])
            if r3 >= 0:
                v = (r3 << 32) | p
                if fh < ft and v < heap[ft - 1]:
                    hs = _heap_push(heap, hs, v)
                else:
                    if fh == ft:
                        fh = f0
                        ft = f0
                    heap[ft] = v
                    ft += 1
    k = 0
    while k != -1:
        out[o] = sc[k]
        o += 1
        k = snext[k]
    return o


# -- the word cache: FNV hash, linear probing, keys and ids in arenas -------------------------------
@njit
def _cache_get(t, i, j, chash, cmeta, cmask, karena, varena, out, o):
    """Copy the cached ids of the word t[i:j] to out[o:]; returns their number, or -1 (not cached)."""
    n = j - i
    h = hash_bytes(t, i, j)
    s = h & cmask
    while chash[s] != 0:
        if chash[s] == h and (cmeta[s] & 0xFF) == n:
            ko = (cmeta[s] >> 8) & 0xFFFFFF
            same = True
            for q in range(n):
                if karena[ko + q] != t[i + q]:
                    same = False
                    break
            if same:
                vo = cmeta[s] >> 40
                vl = (cmeta[s] >> 32) & 0xFF
                for q in range(vl):
                    out[o + q] = varena[vo + q]
                return vl
        s = (s + 1) & cmask
    return -1


@njit
def _cache_put(t, i, j, chash, cmeta, cmask, karena, kcap, varena, vcap, st, ids, o, vl):
    """Remember ids[o:o + vl] for the word t[i:j]; a full cache starts afresh."""
    n = j - i
    if st[0] + n > kcap or st[1] + vl > vcap or 2 * (st[2] + 1) > cmask + 1:
        for q in range(cmask + 1):
            chash[q] = 0
        st[0] = 0
        st[1] = 0
        st[2] = 0
    h = hash_bytes(t, i, j)
    s = h & cmask
    while chash[s] != 0:
        s = (s + 1) & cmask
    chash[s] = h
    cmeta[s] = (st[1] << 40) | (np_int(vl) << 32) | (st[0] << 8) | n
    for q in range(n):
        karena[st[0] + q] = t[i + q]
    for q in range(vl):
        varena[st[1] + q] = ids[o + q]
    st[0] += n
    st[1] += vl
    st[2] += 1


# -- encoding a batch of lines ----------------------------------------------------------------------
ENC_SIG = T.int64(
    P8, P64, T.int64, T.int64,  # text, line offsets (n_lines + 1), n_lines, first line
    P8, P32, P64, P32, T.int64, P32, T.int64,  # class table, byte ids, pair keys/ranks/cap, new id per rank/count
    P8, P64, T.int64, P32, T.int64, T.int64,  # token bytes/offsets/count, vocab slots/cap, flags (kind, ignore_merges)
    P64, P64, T.int64, P8, T.int64, P32, T.int64,  # cache: hashes, meta, cap, key arena/cap, id arena/cap
    P64,  # state: [keys used, ids used, entries, scratch needed]
    P32, P64, P32, P64, T.int64,  # scratch: symbols (4 x cap int32), queue (6 x cap), out ids, out line ends, cap
)


@cfunc(ENC_SIG, error_model="numpy", cache=True)
def encode_lines(text_p, loff_p, n_lines, first, cls_p, byte_id_p, pkey_p, prank_p, pcap, new_p, n_new,
                 tb_p, toff_p, n_tok, vslot_p, vcap, flags,
                 ch_p, cm_p, ccap, ka_p, kcap, va_p, vcap2, st_p,
                 scratch_p, heap_p, out_p, lend_p, scap):
    """Encode lines first.. of text; returns n_lines when done, the line to resume from after st[3]
    was set to the scratch a longer word needs, or -(line + 1) when a byte has no token."""
    loff = carray(loff_p, n_lines + 1)
    t = carray(text_p, loff[n_lines])
    cls = carray(cls_p, 0x110000)
    byte_id = carray(byte_id_p, 256)
    pkey, prank = carray(pkey_p, pcap), carray(prank_p, pcap)
    new_of = carray(new_p, n_new)
    toff = carray(toff_p, n_tok + 1)
    tb = carray(tb_p, toff[n_tok])
    vslot = carray(vslot_p, vcap)
    chash, cmeta = carray(ch_p, ccap), carray(cm_p, ccap)
    karena, varena = carray(ka_p, kcap), carray(va_p, vcap2)
    st = carray(st_p, 4)
    scratch = carray(scratch_p, 4 * scap)
    heap = carray(heap_p, 6 * scap)
    sc, sprev, snext, slen = scratch[:scap], scratch[scap:2 * scap], scratch[2 * scap:3 * scap], scratch[3 * scap:]
    lend = carray(lend_p, n_lines)
    out = carray(out_p, loff[n_lines] + 1)
    kind = flags & 0xFF
    ignore_merges = (flags >> 8) & 1
    pmask, vmask, cmask = pcap - 1, vcap - 1, ccap - 1
    o = lend[first - 1] if first > 0 else 0
    for li in range(first, n_lines):
        i, end = loff[li], loff[li + 1]
        while i < end:
            j = next_piece(t, i, end, cls, kind)
            n = j - i
            if n <= KEY_MAX:
                vl = _cache_get(t, i, j, chash, cmeta, cmask, karena, varena, out, o)
                if vl >= 0:
                    o += vl
                    i = j
                    continue
            elif n > scap:
                st[3] = n
                return li
            o0 = o
            tok = -1
            if ignore_merges:
                tok = _vocab_lookup(t, i, j, tb, toff, vslot, vmask)
            if tok >= 0:
                out[o] = tok
                o += 1
            else:
                o = _merge_word(t, i, j, byte_id, pkey, prank, pmask, new_of, sc, sprev, snext, slen, heap, out, o)
                if o < 0:
                    return -(li + 1)
            if n <= KEY_MAX:
                _cache_put(t, i, j, chash, cmeta, cmask, karena, kcap, varena, vcap2, st, out, o0, o - o0)
            i = j
        lend[li] = o
    return n_lines


@cfunc(T.int64(P32, P64, T.int64, P8, T.int64), error_model="numpy", cache=True)
def format_ids(ids_p, lend_p, n_lines, buf_p, cap):
    """Write each line's ids as decimal text, separated by spaces, one line each; returns the bytes
    written (cap must be at least 11 per id plus 1 per line)."""
    lend = carray(lend_p, n_lines)
    ids = carray(ids_p, lend[n_lines - 1] if n_lines > 0 else 0)
    buf = carray(buf_p, cap)
    o = 0
    k = 0
    for li in range(n_lines):
        first = True
        while k < lend[li]:
            if not first:
                buf[o] = 32
                o += 1
            first = False
            v = np_int(ids[k])
            start = o
            while True:
                buf[o] = 48 + v % 10
                o += 1
                v //= 10
                if v == 0:
                    break
            a, b = start, o - 1
            while a < b:
                x = buf[a]
                buf[a] = buf[b]
                buf[b] = x
                a += 1
                b -= 1
            k += 1
        buf[o] = 10
        o += 1
    return o


KERNELS = {"build_pairs": build_pairs, "build_vocab": build_vocab, "encode_lines": encode_lines,
           "format_ids": format_ids}
