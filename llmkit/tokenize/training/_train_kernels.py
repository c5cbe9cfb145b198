"""Compiled (numba) kernels of training: counting pre-tokenized words, and WordPiece's merge loop.

Like `bpe._bpe_kernels`, every kernel is an allocation-free `cfunc` over caller-owned buffers (see
`native`). A kernel that runs out of room returns a code and the position to resume from; the
caller grows the buffers and calls again, so the state lives in the caller's arrays.

Counting: text is cut into words as the trainers' pre-tokenizers do (`mode` 0: byte-level BPE's
pattern per line, the same scan as encoding; 1: BERT's normalizer and pre-tokenizer), and each
distinct word's bytes and count are kept in first-seen order, which the trainers' tie rules need.

WordPiece: `wordpiece.WordPieceMerges` with flat arrays: pairs by id in a hash table, the words that
hold a pair and the pairs that hold a token as linked lists in pools, and one heap entry per pair
whose key is the pair's score when it was last rescored: the pairs the Python loop pushes again are
rescored here, and a popped pair whose score moved since is rescored and put back, as that loop
does with an out-of-date entry, so pairs are merged in the same order.
"""

from __future__ import annotations

from numba import carray, cfunc, njit
from numba import types as T

from llmkit.tokenize.bpe._bpe_kernels import P8, P32, P64, decode_utf8, hash_bytes, next_piece, np_int

# BERT classes (one byte per code point): whitespace, dropped (control/unassigned), CJK, punctuation
B_WS, B_DROP, B_CJK, B_PUNCT = 1, 2, 4, 8
FULL = 1  # a buffer is full: grow it and call again from the returned position


# -- counting words ---------------------------------------------------------------------------------
@njit
def _add_word(w, s, e, slots, smask, arena, woff, wcount, whash, st):
    """Count the word w[s:e]; returns False when the arena, the word arrays or the table are full."""
    n = e - s
    h = hash_bytes(w, s, e)
    k = h & smask
    while slots[k] != -1:
        i = slots[k]
        if whash[i] == h and woff[i + 1] - woff[i] == n:
            o = woff[i]
            same = True
            for q in range(n):
                if arena[o + q] != w[s + q]:
                    same = False
                    break
            if same:
                wcount[i] += 1
                return True
        k = (k + 1) & smask
    nw = st[0]
    if woff[nw] + n > st[1] or nw + 1 >= st[2] or 2 * (nw + 1) > smask + 1:
        return False
    o = woff[nw]
    for q in range(n):
        arena[o + q] = w[s + q]
    woff[nw + 1] = o + n
    wcount[nw] = 1
    whash[nw] = h
    slots[k] = nw
    st[0] = nw + 1
    return True


@njit
def _bert_next(t, i, end, bcls, buf):
    """From t[i]: (end of the scan, bytes of the next word written to buf, or 0 when none)."""
    nb = 0
    while i < end:
        b = t[i]
        if b < 0x80:
            c, n = np_int(bcls[b]), 1
        else:
            cp, n = decode_utf8(t, i, end)
            c = 0 if cp < 0 else np_int(bcls[cp])
        if c & B_WS:
            if nb > 0:
                return i + n, nb
        elif c & B_DROP:
            pass
        elif c & (B_CJK | B_PUNCT):
            if nb > 0:
                return i, nb
            for q in range(n):
                buf[q] = t[i + q]
            return i + n, n
        else:
            for q in range(n):
                buf[nb + q] = t[i + q]
            nb += n
        i += n
    return i, nb


COUNT_SIG = T.int64(P8, T.int64, T.int64, T.int64, T.int64, P8, P8, P32, T.int64, P8, P64, P64, P64, P64, P8)


@cfunc(COUNT_SIG, error_model="numpy", cache=True)
def count_words(text_p, n, start, mode, kind, cls_p, bcls_p, slots_p, scap, arena_p, woff_p, wcount_p, whash_p,
                st_p, buf_p):
    """Count the words of text[start:n]; returns n when done, else the position to resume from after
    growing (st: [words, arena capacity, word capacity])."""
    t = carray(text_p, n)
    cls = carray(cls_p, 0x110000)
    bcls = carray(bcls_p, 0x110000)
    st = carray(st_p, 3)
    slots = carray(slots_p, scap)
    arena = carray(arena_p, st[1])
    woff = carray(woff_p, st[2] + 1)
    wcount, whash = carray(wcount_p, st[2]), carray(whash_p, st[2])
    buf = carray(buf_p, n + 4)
    smask = scap - 1
    i = start
    while i < n:
        if mode == 0:  # byte-level BPE: the encoder's pre-tokenizer, each line on its own
            line_end = i
            while line_end < n and t[line_end] != 10:
                line_end += 1
            line_end = min(n, line_end + 1)
            while i < line_end:
                j = next_piece(t, i, line_end, cls, kind)
                if not _add_word(t, i, j, slots, smask, arena, woff, wcount, whash, st):
                    return i
                i = j
        else:
            j, nb = _bert_next(t, i, n, bcls, buf)
            if nb > 0 and not _add_word(buf, 0, nb, slots, smask, arena, woff, wcount, whash, st):
                return i
            i = j
    return n


@cfunc(T.int64(P32, T.int64, P64, T.int64), error_model="numpy", cache=True)
def rehash_words(slots_p, scap, whash_p, n_words):
    """Rebuild the word table (after it grew) from the words' hashes."""
    slots = carray(slots_p, scap)
    whash = carray(whash_p, n_words + 1)
    smask = scap - 1
    for k in range(scap):
        slots[k] = -1
    for i in range(n_words):
        k = whash[i] & smask
        while slots[k] != -1:
            k = (k + 1) & smask
        slots[k] = i
    return 0




# -- WordPiece's merge loop -------------------------------------------------------------------------
# The loop's buffers, in the order the kernels take them (`native` declares the same list):
#   words:  sym (int32: every word's symbols), woff (int64, W+1), wlen (int32, W), wcnt (int64, W)
#   tokens: tcp (int32 code points of every token's text), toff (int64, V+1), ttab (int32 hash slots),
#           freq (int64, V)
#   pairs:  pa, pb (int32), pc (int64 count), fsw, fsi (int32: first seen, word and position),
#           psc (float64 score), hpos (int32 heap position), pflag (int32: in its tokens' lists),
#           pkey (int64), pidx (int32): the (a, b) -> pair id table
#   lists:  whead, wn_word, wn_next (the words holding a pair); ohead, on_pair, on_next (the pairs
#           holding a token): singly linked, prepended
#   work:   heap (int32 pair ids), wlist, wstamp (int32, W), tlist, tstamp (int32, P), merges (3 x V)
#   st (int64, ST_*), caps (int64, CAP_*), prefix (int32 code points), steps (merges this call)
PF64 = T.CPointer(T.float64)
ST_VOCAB, ST_PAIRS, ST_WN, ST_ON, ST_HEAP, ST_MERGES, ST_TEXT, ST_STAMP, ST_NEED = range(9)
CAP_P, CAP_PH, CAP_WN, CAP_ON, CAP_TEXT, CAP_TT, CAP_V, CAP_W, CAP_PREFIX, CAP_MINF, CAP_N = range(11)
MORE, DONE, FULL_PAIRS, FULL_TEXT = 0, 1, 2, 3

WP_SIG = T.int64(
    P32, P64, P32, P64,  # words
    P32, P64, P32, P64,  # tokens
    P32, P32, P64, P32, P32, PF64, P32, P32, P64, P32,  # pairs
    P32, P32, P32, P32, P32, P32,  # lists
    P32, P32, P32, P32, P32, P32,  # work
    P64, P64, P32, T.int64)  # st, caps, prefix, steps


@njit
def _better(p, q, psc, fsw, fsi, pa, pb):
    """Pair p comes before q: the higher score, then seen first, then the smaller ids."""
    if psc[p] != psc[q]:
        return psc[p] > psc[q]
    if fsw[p] != fsw[q]:
        return fsw[p] < fsw[q]
    if fsi[p] != fsi[q]:
        return fsi[p] < fsi[q]
    if pa[p] != pa[q]:
        return pa[p] < pa[q]
    return pb[p] < pb[q]


@njit
def _sift(heap, hpos, k, n, psc, fsw, fsi, pa, pb):
    """Move heap[k] up or down to its place in heap[:n]."""
    p = heap[k]
    while k > 0:
        up = (k - 1) >> 1
        q = heap[up]
        if not _better(p, q, psc, fsw, fsi, pa, pb):
            break
        heap[k] = q
        hpos[q] = k
        k = up
    while True:
        c = 2 * k + 1
        if c >= n:
            break
        if c + 1 < n and _better(heap[c + 1], heap[c], psc, fsw, fsi, pa, pb):
            c += 1
        if not _better(heap[c], p, psc, fsw, fsi, pa, pb):
            break
        heap[k] = heap[c]
        hpos[heap[c]] = k
        k = c
    heap[k] = p
    hpos[p] = k


@njit
def _heap_remove(heap, hpos, st, p, psc, fsw, fsi, pa, pb):
    k = hpos[p]
    if k < 0:
        return
    n = st[ST_HEAP] - 1
    st[ST_HEAP] = n
    hpos[p] = -1
    if k < n:
        heap[k] = heap[n]
        hpos[heap[k]] = k
        _sift(heap, hpos, k, n, psc, fsw, fsi, pa, pb)


@njit
def _rescore(q, thr, pc, freq, pa, pb, psc, fsw, fsi, heap, hpos, st):
    """Put pair q in the heap at its current score, or take it out when its count is below thr."""
    if pc[q] < thr:
        _heap_remove(heap, hpos, st, q, psc, fsw, fsi, pa, pb)
        return
    psc[q] = float(pc[q]) / float(freq[pa[q]] * freq[pb[q]])
    k = hpos[q]
    if k < 0:
        k = st[ST_HEAP]
        st[ST_HEAP] = k + 1
        heap[k] = q
    _sift(heap, hpos, k, st[ST_HEAP], psc, fsw, fsi, pa, pb)


@njit
def _pair(a, b, wi, pos, pa, pb, pc, fsw, fsi, hpos, pflag, pkey, pidx, phmask, whead, st):
    """The id of pair (a, b), created (first seen at word wi, position pos) when new."""
    key = (np_int(a) << 32) | np_int(b)
    s = (key * -7046029254386353131) & phmask
    while pkey[s] != -1:
        if pkey[s] == key:
            return pidx[s]
        s = (s + 1) & phmask
    q = st[ST_PAIRS]
    st[ST_PAIRS] = q + 1
    pkey[s] = key
    pidx[s] = q
    pa[q], pb[q], pc[q], fsw[q], fsi[q] = a, b, 0, wi, pos
    hpos[q], pflag[q], whead[q] = -1, 0, -1
    return q


@njit
def _prepend(head, node_val, node_next, st, which, owner, value):
    n = st[which]
    st[which] = n + 1
    node_val[n] = value
    node_next[n] = head[owner]
    head[owner] = n


@njit
def _own(q, pa, pb, pflag, ohead, on_pair, on_next, st):
    """Enter pair q in the lists of the pairs holding its tokens (a set: once while it is there)."""
    if (pflag[q] & 1) == 0:
        pflag[q] |= 1
        _prepend(ohead, on_pair, on_next, st, ST_ON, pa[q], q)
    if (pflag[q] & 2) == 0:
        pflag[q] |= 2
        _prepend(ohead, on_pair, on_next, st, ST_ON, pb[q], q)


@njit
def heapsort(x, n):
    """Sort x[:n] in place (the words a merge visits, in corpus order)."""
    for start in range((n - 2) // 2, -1, -1):
        _sift_int(x, start, n)
    for end in range(n - 1, 0, -1):
        x[0], x[end] = x[end], x[0]
        _sift_int(x, 0, end)


@njit
def _sift_int(x, k, n):
    v = x[k]
    while True:
        c = 2 * k + 1
        if c >= n:
            break
        if c + 1 < n and x[c + 1] > x[c]:
            c += 1
        if x[c] <= v:
            break
        x[k] = x[c]
        k = c
    x[k] = v


@njit
def _merge_in_word(wi, a, b, new, sym, woff, wlen, wcnt, freq, pa, pb, pc, fsw, fsi, hpos, pflag, pkey, pidx, phmask,
                   whead, wn_word, wn_next, ohead, on_pair, on_next, tlist, tstamp, stamp, st):
    """pieces.merge_pair on word wi, in one pass: every (a, b) becomes `new`, the neighbours' pairs
    move to the new token; each pair made is noted for the word, its tokens' lists and rescoring."""
    base, n, c = woff[wi], wlen[wi], wcnt[wi]
    r = 0
    w = 0
    while r < n:
        if r + 1 < n and sym[base + r] == a and sym[base + r + 1] == b:
            made_left = -1
            if w > 0:
                left = sym[base + w - 1]
                pc[_pair(left, a, wi, w - 1, pa, pb, pc, fsw, fsi, hpos, pflag, pkey, pidx, phmask, whead, st)] -= c
                made_left = _pair(left, new, wi, w - 1, pa, pb, pc, fsw, fsi, hpos, pflag, pkey, pidx, phmask, whead, st)
                pc[made_left] += c
            sym[base + w] = new
            made_right = -1
            if r + 2 < n:
                right = sym[base + r + 2]
                pc[_pair(b, right, wi, w, pa, pb, pc, fsw, fsi, hpos, pflag, pkey, pidx, phmask, whead, st)] -= c
                made_right = _pair(new, right, wi, w, pa, pb, pc, fsw, fsi, hpos, pflag, pkey, pidx, phmask, whead, st)
                pc[made_right] += c
            for q in (made_left, made_right):
                if q >= 0:
                    _prepend(whead, wn_word, wn_next, st, ST_WN, q, wi)
                    _own(q, pa, pb, pflag, ohead, on_pair, on_next, st)
                    if tstamp[q] != stamp:
                        tstamp[q] = stamp
                        tlist[st[ST_NEED]] = q
                        st[ST_NEED] += 1
            w += 1
            r += 2
        else:
            sym[base + w] = sym[base + r]
            w += 1
            r += 1
    merged = (n - w) * c
    freq[a] -= merged
    freq[b] -= merged
    freq[new] += merged
    wlen[wi] = w


@njit
def joined_token(a, b, tcp, toff, ttab, ttmask, prefix, plen, st):
    """The id of the token a + b (b without its prefix), added after the others when it is new."""
    o = st[ST_TEXT]
    n = 0
    for k in range(toff[a], toff[a + 1]):
        tcp[o + n] = tcp[k]
        n += 1
    sb, eb = toff[b], toff[b + 1]
    has = eb - sb >= plen
    for k in range(plen):
        if has and tcp[sb + k] != prefix[k]:
            has = False
    if has:
        sb += plen
    for k in range(sb, eb):
        tcp[o + n] = tcp[k]
        n += 1
    h = np_int(-3750763034362895579)
    for k in range(n):
        h = (h ^ np_int(tcp[o + k])) * 1099511628211
    s = h & ttmask
    while ttab[s] != -1:
        t = ttab[s]
        if toff[t + 1] - toff[t] == n:
            same = True
            for k in range(n):
                if tcp[toff[t] + k] != tcp[o + k]:
                    same = False
                    break
            if same:
                return t
        s = (s + 1) & ttmask
    t = st[ST_VOCAB]
    st[ST_VOCAB] = t + 1
    toff[t + 1] = o + n
    st[ST_TEXT] = o + n
    ttab[s] = t
    return t


@njit
def _init(caps, st, sym, woff, wlen, wcnt, tcp, toff, ttab, freq, pa, pb, pc, fsw, fsi, psc, hpos, pflag, pkey, pidx,
          whead, wn_word, wn_next, ohead, on_pair, on_next, heap):
    """Count every word's pairs in corpus order (a pair is first seen where it first occurs), fill the
    tokens' text table and the heap; the tables must be empty (-1) and the counts zero."""
    cp, W = caps[CAP_P], caps[CAP_W]
    phmask, ttmask = caps[CAP_PH] - 1, caps[CAP_TT] - 1
    for t in range(st[ST_VOCAB]):  # the initial tokens' texts
        h = np_int(-3750763034362895579)
        for k in range(toff[t], toff[t + 1]):
            h = (h ^ np_int(tcp[k])) * 1099511628211
        s = h & ttmask
        while ttab[s] != -1:
            s = (s + 1) & ttmask
        ttab[s] = t
    for wi in range(W):
        base, n, c = woff[wi], wlen[wi], wcnt[wi]
        for j in range(n):
            freq[sym[base + j]] += c
        for j in range(n - 1):
            if st[ST_PAIRS] + 1 >= cp or st[ST_WN] + 1 >= caps[CAP_WN] or st[ST_ON] + 2 >= caps[CAP_ON]:
                return FULL_PAIRS
            q = _pair(sym[base + j], sym[base + j + 1], wi, j, pa, pb, pc, fsw, fsi, hpos, pflag, pkey, pidx, phmask,
                      whead, st)
            pc[q] += c
            if whead[q] == -1 or wn_word[whead[q]] != wi:
                _prepend(whead, wn_word, wn_next, st, ST_WN, q, wi)
            _own(q, pa, pb, pflag, ohead, on_pair, on_next, st)
    thr = max(1, caps[CAP_MINF])
    for q in range(st[ST_PAIRS]):
        _rescore(q, thr, pc, freq, pa, pb, psc, fsw, fsi, heap, hpos, st)
    return MORE


@njit
def _touch_live(t, ohead, on_pair, on_next, pc, pa, pb, pflag, tlist, tstamp, stamp, st):
    """Keep only the live pairs in token t's list (as the Python loop's set does) and touch them."""
    prev = -1
    k = ohead[t]
    while k != -1:
        q = on_pair[k]
        nxt = on_next[k]
        if pc[q] > 0:
            if tstamp[q] != stamp:
                tstamp[q] = stamp
                tlist[st[ST_NEED]] = q
                st[ST_NEED] += 1
            prev = k
        else:
            if pa[q] == t:
                pflag[q] &= ~1
            if pb[q] == t:
                pflag[q] &= ~2
            if prev == -1:
                ohead[t] = nxt
            else:
                on_next[prev] = nxt
        k = nxt


@cfunc(WP_SIG, error_model="numpy", cache=True)
def wp_run(sym_p, woff_p, wlen_p, wcnt_p, tcp_p, toff_p, ttab_p, freq_p, pa_p, pb_p, pc_p, fsw_p, fsi_p, psc_p,
           hpos_p, pflag_p, pkey_p, pidx_p, whead_p, wn_word_p, wn_next_p, ohead_p, on_pair_p, on_next_p,
           heap_p, wlist_p, wstamp_p, tlist_p, tstamp_p, merges_p, st_p, caps_p, prefix_p, steps):
    """Up to `steps` merges: DONE (the vocabulary is full or no pair is left), MORE, or FULL_* before a
    merge that would not fit (grow, then call again: nothing of that merge was done). steps < 0:
    the first call, which counts the pairs and fills the heap (see _init)."""
    caps = carray(caps_p, 11)
    cp, W, V = caps[CAP_P], caps[CAP_W], caps[CAP_V]
    st = carray(st_p, 9)
    sym, woff, wlen, wcnt = carray(sym_p, caps[CAP_N]), carray(woff_p, W + 1), carray(wlen_p, W), carray(wcnt_p, W)
    tcp, toff, ttab, freq = carray(tcp_p, caps[CAP_TEXT]), carray(toff_p, V + 1), carray(ttab_p, caps[CAP_TT]), carray(freq_p, V)
    pa, pb, pc, fsw, fsi = carray(pa_p, cp), carray(pb_p, cp), carray(pc_p, cp), carray(fsw_p, cp), carray(fsi_p, cp)
    psc, hpos, pflag = carray(psc_p, cp), carray(hpos_p, cp), carray(pflag_p, cp)
    pkey, pidx, whead = carray(pkey_p, caps[CAP_PH]), carray(pidx_p, caps[CAP_PH]), carray(whead_p, cp)
    wn_word, wn_next = carray(wn_word_p, caps[CAP_WN]), carray(wn_next_p, caps[CAP_WN])
    ohead, on_pair, on_next = carray(ohead_p, V), carray(on_pair_p, caps[CAP_ON]), carray(on_next_p, caps[CAP_ON])
    heap, wlist, wstamp = carray(heap_p, cp), carray(wlist_p, W), carray(wstamp_p, W)
    tlist, tstamp, merges = carray(tlist_p, cp), carray(tstamp_p, cp), carray(merges_p, 3 * V)
    prefix = carray(prefix_p, max(1, caps[CAP_PREFIX]))
    if steps < 0:
        return _init(caps, st, sym, woff, wlen, wcnt, tcp, toff, ttab, freq, pa, pb, pc, fsw, fsi, psc, hpos, pflag,
                     pkey, pidx, whead, wn_word, wn_next, ohead, on_pair, on_next, heap)
    phmask, ttmask, thr = caps[CAP_PH] - 1, caps[CAP_TT] - 1, max(1, caps[CAP_MINF])
    for _ in range(steps):
        if st[ST_VOCAB] >= V or st[ST_HEAP] == 0:
            return DONE
        p = heap[0]
        if pc[p] < thr:
            _heap_remove(heap, hpos, st, p, psc, fsw, fsi, pa, pb)
            continue
        a, b = pa[p], pb[p]
        if psc[p] != float(pc[p]) / float(freq[a] * freq[b]):
            # a pair holding a token that already existed and just grew more frequent was not rescored
            # (nor is it in the Python loop): its entry goes back with the current score first
            _rescore(p, thr, pc, freq, pa, pb, psc, fsw, fsi, heap, hpos, st)
            continue
        stamp = st[ST_STAMP] + 1
        st[ST_STAMP] = stamp  # used up even when the merge waits for room: the marks below are spent
        nw = 0
        room = 0
        k = whead[p]
        while k != -1:
            wi = wn_word[k]
            if wstamp[wi] != stamp:
                wstamp[wi] = stamp
                wlist[nw] = wi
                nw += 1
                room += wlen[wi]
            k = wn_next[k]
        if st[ST_PAIRS] + 2 * room >= cp or st[ST_WN] + 2 * room >= caps[CAP_WN] or st[ST_ON] + 4 * room >= caps[CAP_ON]:
            return FULL_PAIRS
        if st[ST_TEXT] + (toff[a + 1] - toff[a]) + (toff[b + 1] - toff[b]) > caps[CAP_TEXT]:
            return FULL_TEXT
        new = joined_token(a, b, tcp, toff, ttab, ttmask, prefix, caps[CAP_PREFIX], st)
        m = st[ST_MERGES]
        if m < V:  # the first V merges, for inspection (a repeated token adds none to the vocabulary)
            merges[3 * m], merges[3 * m + 1], merges[3 * m + 2] = a, b, new
        st[ST_MERGES] = m + 1
        whead[p] = -1
        heapsort(wlist, nw)
        st[ST_NEED] = 0
        for j in range(nw):
            _merge_in_word(wlist[j], a, b, new, sym, woff, wlen, wcnt, freq, pa, pb, pc, fsw, fsi, hpos, pflag, pkey,
                           pidx, phmask, whead, wn_word, wn_next, ohead, on_pair, on_next, tlist, tstamp, stamp, st)
        pc[p] = 0
        _heap_remove(heap, hpos, st, p, psc, fsw, fsi, pa, pb)
        for t in (a, b):  # scores rise for every pair holding a part whose frequency just fell
            if freq[t] > 0:
                _touch_live(t, ohead, on_pair, on_next, pc, pa, pb, pflag, tlist, tstamp, stamp, st)
        for j in range(st[ST_NEED]):
            q = tlist[j]
            if pc[q] > 0:
                _rescore(q, thr, pc, freq, pa, pb, psc, fsw, fsi, heap, hpos, st)
            else:
                _heap_remove(heap, hpos, st, q, psc, fsw, fsi, pa, pb)
    return DONE if (st[ST_VOCAB] >= V or st[ST_HEAP] == 0) else MORE


@cfunc(T.int64(P32, P32, T.int64, P64, P32, T.int64), error_model="numpy", cache=True)
def rehash_pairs(pa_p, pb_p, n, pkey_p, pidx_p, cap):
    """Rebuild the (a, b) -> pair id table (after it grew) from the pairs."""
    pa, pb = carray(pa_p, n + 1), carray(pb_p, n + 1)
    pkey, pidx = carray(pkey_p, cap), carray(pidx_p, cap)
    mask = cap - 1
    for s in range(cap):
        pkey[s] = -1
    for q in range(n):
        key = (np_int(pa[q]) << 32) | np_int(pb[q])
        s = (key * -7046029254386353131) & mask
        while pkey[s] != -1:
            s = (s + 1) & mask
        pkey[s] = key
        pidx[s] = q
    return 0


KERNELS = {"count_words": count_words, "rehash_words": rehash_words, "wp_run": wp_run,
           "rehash_pairs": rehash_pairs}
