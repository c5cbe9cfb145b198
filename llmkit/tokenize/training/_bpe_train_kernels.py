"""Compiled (numba) kernel of BPE training: `bpe.BPEMerges` (HF BpeTrainer's loop) over flat arrays.

Like the other kernels, an allocation-free `cfunc` over caller-owned buffers (see `native`); when a
pool is too small for the next merge it returns before touching anything and the caller grows it.

The loop is the Python one step for step. A heap entry is (count when pushed, pair, sequence number)
and carries its own list of the words where the pair was made, as HF's entries carry their sets;
entries come out by the highest count, then the smallest pair of ids, then the oldest; an entry
whose count is out of date goes back with the current count and a new sequence number (or is
dropped at zero), and the loop stops below `min_frequency`. Merging an entry's pair visits its
words (in corpus order), moves their counts from the neighbouring pairs to the pairs made with the
new token, and pushes one new entry per pair made, holding the words where it was made. The
merged pair's own count is left as it is, as HF leaves it.

Buffers, in the kernel's argument order (`bpe_train_native` declares the same list):
  words:   sym (int32: every word's symbols), woff (int64, W+1), wlen (int32, W), wcnt (int64, W)
  tokens:  tcp (int32 code points of every token's text), toff (int64, V+1), ttab (int32 hash slots)
  pairs:   pa, pb (int32), pc (int64 count), nwhead (int32: words where it was made this step),
           pkey (int64), pidx (int32): the (a, b) -> pair id table
  entries: ecount (int64), epair (int32), eseq (int64), ehead (int32: its words), heap (int32)
  lists:   wn_word, wn_next (int32): the words of the entries and of nwhead, singly linked
  work:    wlist, wstamp (int32, W), tlist (int32, pairs), merges (int32, 3 per merge)
  st (int64, ST_*), caps (int64, CAP_*), steps (merges this call; < 0: the first call)
"""

from __future__ import annotations

from numba import carray, cfunc, njit
from numba import types as T

from llmkit.tokenize.bpe._bpe_kernels import P32, P64, np_int
from llmkit.tokenize.training._train_kernels import heapsort, joined_token

(ST_VOCAB, ST_PAIRS, ST_WN, ST_ENTRIES, ST_HEAP, ST_MERGES, ST_TEXT, ST_STAMP, ST_NEED, ST_SEQ,
 ST_PHASE, ST_J, ST_NW, ST_NEW, ST_ASK) = range(15)
N_ST = 15
CAP_P, CAP_PH, CAP_WN, CAP_E, CAP_TEXT, CAP_TT, CAP_V, CAP_W, CAP_M, CAP_MINF, CAP_N = range(11)
MORE, DONE, FULL_POOLS, FULL_TEXT, FULL_MERGES = 0, 1, 2, 3, 4

BPE_SIG = T.int64(
    P32, P64, P32, P64,  # words
    P32, P64, P32,  # tokens
    P32, P32, P64, P32, P64, P32,  # pairs
    P64, P32, P64, P32, P32,  # entries
    P32, P32,  # lists
    P32, P32, P32, P32,  # work
    P64, P64, T.int64)  # st, caps, steps


@njit
def _first(e, f, ecount, epair, eseq, pa, pb):
    """Entry e comes out before f: the higher count, then the smaller pair, then the older."""
    if ecount[e] != ecount[f]:
        return ecount[e] > ecount[f]
    p, q = epair[e], epair[f]
    if pa[p] != pa[q]:
        return pa[p] < pa[q]
    if pb[p] != pb[q]:
        return pb[p] < pb[q]
    return eseq[e] < eseq[f]


@njit
def _down(heap, k, n, ecount, epair, eseq, pa, pb):
    e = heap[k]
    while True:
        c = 2 * k + 1
        if c >= n:
            break
        if c + 1 < n and _first(heap[c + 1], heap[c], ecount, epair, eseq, pa, pb):
            c += 1
        if not _first(heap[c], e, ecount, epair, eseq, pa, pb):
            break
        heap[k] = heap[c]
        k = c
    heap[k] = e


@njit
def _push(e, heap, st, ecount, epair, eseq, pa, pb):
    k = st[ST_HEAP]
    st[ST_HEAP] = k + 1
    while k > 0:
        up = (k - 1) >> 1
        if not _first(e, heap[up], ecount, epair, eseq, pa, pb):
            break
        heap[k] = heap[up]
        k = up
    heap[k] = e


@njit
def _pop(heap, st, ecount, epair, eseq, pa, pb):
    n = st[ST_HEAP] - 1
    st[ST_HEAP] = n
    if n > 0:
        heap[0] = heap[n]
        _down(heap, 0, n, ecount, epair, eseq, pa, pb)


@njit
def _pair(a, b, pa, pb, pc, nwhead, pkey, pidx, phmask, st):
    """The id of pair (a, b), created with count 0 when new."""
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
    pa[q], pb[q], pc[q], nwhead[q] = a, b, 0, -1
    return q


@njit
def _note(q, wi, nwhead, wn_word, wn_next, tlist, st):
    """Word wi made pair q this step: in q's list once (a word's pairs are made together)."""
    h = nwhead[q]
    if h == -1:
        tlist[st[ST_NEED]] = q
        st[ST_NEED] += 1
    elif wn_word[h] == wi:
        return
    n = st[ST_WN]
    st[ST_WN] = n + 1
    wn_word[n] = wi
    wn_next[n] = h
    nwhead[q] = n


@njit
def _flush(pc, nwhead, tlist, ecount, epair, eseq, ehead, heap, pa, pb, st):
    """One entry per pair noted this step (in the order they were first made), if its count is positive."""
    for j in range(st[ST_NEED]):
        q = tlist[j]
        if pc[q] > 0:
            e = st[ST_ENTRIES]
            st[ST_ENTRIES] = e + 1
            ecount[e], epair[e], ehead[e], eseq[e] = pc[q], q, nwhead[q], st[ST_SEQ]
            st[ST_SEQ] += 1
            _push(e, heap, st, ecount, epair, eseq, pa, pb)
        nwhead[q] = -1
    st[ST_NEED] = 0


@njit
def _merge_word(wi, a, b, new, sym, woff, wlen, wcnt, pa, pb, pc, nwhead, pkey, pidx, phmask, wn_word, wn_next,
                tlist, st):
    """pieces.merge_pair on word wi in one pass: each (a, b) becomes `new`, left to right."""
    base, n, c = woff[wi], wlen[wi], wcnt[wi]
    r = 0
    w = 0
    while r < n:
        if r + 1 < n and sym[base + r] == a and sym[base + r + 1] == b:
            if w > 0:
                left = sym[base + w - 1]
                pc[_pair(left, a, pa, pb, pc, nwhead, pkey, pidx, phmask, st)] -= c
                q = _pair(left, new, pa, pb, pc, nwhead, pkey, pidx, phmask, st)
                pc[q] += c
                _note(q, wi, nwhead, wn_word, wn_next, tlist, st)
            sym[base + w] = new
            if r + 2 < n:
                right = sym[base + r + 2]
                pc[_pair(b, right, pa, pb, pc, nwhead, pkey, pidx, phmask, st)] -= c
                q = _pair(new, right, pa, pb, pc, nwhead, pkey, pidx, phmask, st)
                pc[q] += c
                _note(q, wi, nwhead, wn_word, wn_next, tlist, st)
            w += 1
            r += 2
        else:
            sym[base + w] = sym[base + r]
            w += 1
            r += 1
    wlen[wi] = w


@cfunc(BPE_SIG, error_model="numpy", cache=True)
def bpe_run(sym_p, woff_p, wlen_p, wcnt_p, tcp_p, toff_p, ttab_p, pa_p, pb_p, pc_p, nwhead_p, pkey_p, pidx_p,
            ecount_p, epair_p, eseq_p, ehead_p, heap_p, wn_word_p, wn_next_p, wlist_p, wstamp_p, tlist_p, merges_p,
            st_p, caps_p, steps):
    """Up to `steps` merges: DONE (the vocabulary is full, no entry is left or the best count is below
    min_frequency), MORE, or FULL_* when a pool is too small to go on (st[ST_ASK]: the free room it
    needs; grow, call again: a merge stopped half-way resumes at its next word, ST_PHASE). steps < 0:
    the first call, which counts every word's pairs and pushes one entry per pair (FULL_POOLS when
    they do not fit: grow and call again on fresh tables)."""
    caps = carray(caps_p, 11)
    cp, ce, W, V = caps[CAP_P], caps[CAP_E], caps[CAP_W], caps[CAP_V]
    st = carray(st_p, N_ST)
    sym, woff, wlen, wcnt = carray(sym_p, caps[CAP_N]), carray(woff_p, W + 1), carray(wlen_p, W), carray(wcnt_p, W)
    tcp, toff, ttab = carray(tcp_p, caps[CAP_TEXT]), carray(toff_p, V + 1), carray(ttab_p, caps[CAP_TT])
    pa, pb, pc, nwhead, tlist = carray(pa_p, cp), carray(pb_p, cp), carray(pc_p, cp), carray(nwhead_p, cp), carray(tlist_p, cp)
    pkey, pidx = carray(pkey_p, caps[CAP_PH]), carray(pidx_p, caps[CAP_PH])
    ecount, epair, eseq, ehead, heap = (carray(ecount_p, ce), carray(epair_p, ce), carray(eseq_p, ce),
                                        carray(ehead_p, ce), carray(heap_p, ce))
    wn_word, wn_next = carray(wn_word_p, caps[CAP_WN]), carray(wn_next_p, caps[CAP_WN])
    wlist, wstamp, merges = carray(wlist_p, W), carray(wstamp_p, W), carray(merges_p, 3 * caps[CAP_M])
    phmask = caps[CAP_PH] - 1
    if steps < 0:
        for wi in range(W):
            base, n, c = woff[wi], wlen[wi], wcnt[wi]
            for j in range(n - 1):
                if st[ST_PAIRS] + 1 >= cp or st[ST_WN] + 1 >= caps[CAP_WN]:
                    st[ST_ASK] = 1
                    return FULL_POOLS
                q = _pair(sym[base + j], sym[base + j + 1], pa, pb, pc, nwhead, pkey, pidx, phmask, st)
                pc[q] += c
                _note(q, wi, nwhead, wn_word, wn_next, tlist, st)
        if st[ST_NEED] > ce:
            st[ST_ASK] = st[ST_NEED]
            return FULL_POOLS
        _flush(pc, nwhead, tlist, ecount, epair, eseq, ehead, heap, pa, pb, st)
        return MORE
    minf = caps[CAP_MINF]
    done = 0
    while done < steps or st[ST_PHASE] != 0:
        if st[ST_PHASE] == 0:
            if st[ST_VOCAB] >= V or st[ST_HEAP] == 0:
                return DONE
            e = heap[0]
            p = epair[e]
            cur = pc[p]
            if ecount[e] != cur:  # out of date: back with the current count, or dropped at zero
                if cur > 0:
                    ecount[e] = cur
                    eseq[e] = st[ST_SEQ]
                    st[ST_SEQ] += 1
                    _down(heap, 0, st[ST_HEAP], ecount, epair, eseq, pa, pb)
                else:
                    _pop(heap, st, ecount, epair, eseq, pa, pb)
                continue
            if cur < 1 or cur < minf:
                return DONE
            a, b = pa[p], pb[p]
            if st[ST_TEXT] + (toff[a + 1] - toff[a]) + (toff[b + 1] - toff[b]) > caps[CAP_TEXT]:
                return FULL_TEXT
            if st[ST_MERGES] >= caps[CAP_M]:
                return FULL_MERGES
            _pop(heap, st, ecount, epair, eseq, pa, pb)
            new = joined_token(a, b, tcp, toff, ttab, caps[CAP_TT] - 1, tcp, 0, st)
            m = st[ST_MERGES]
            merges[3 * m], merges[3 * m + 1], merges[3 * m + 2] = a, b, new
            st[ST_MERGES] = m + 1
            stamp = st[ST_STAMP] + 1
            st[ST_STAMP] = stamp
            nw = 0
            k = ehead[e]
            while k != -1:
                wi = wn_word[k]
                if wstamp[wi] != stamp:
                    wstamp[wi] = stamp
                    wlist[nw] = wi
                    nw += 1
                k = wn_next[k]
            heapsort(wlist, nw)
            st[ST_PHASE], st[ST_J], st[ST_NW], st[ST_NEW] = 1, 0, nw, new
        m = st[ST_MERGES] - 1
        a, b, new = merges[3 * m], merges[3 * m + 1], st[ST_NEW]
        if st[ST_PHASE] == 1:
            for j in range(st[ST_J], st[ST_NW]):
                wi = wlist[j]
                ask = 2 * wlen[wi] + 2
                if st[ST_PAIRS] + ask >= cp or st[ST_WN] + ask >= caps[CAP_WN]:
                    st[ST_J] = j
                    st[ST_ASK] = ask
                    return FULL_POOLS
                _merge_word(wi, a, b, new, sym, woff, wlen, wcnt, pa, pb, pc, nwhead, pkey, pidx, phmask, wn_word,
                            wn_next, tlist, st)
            st[ST_PHASE] = 2
        if st[ST_ENTRIES] + st[ST_NEED] >= ce:
            st[ST_ASK] = st[ST_NEED] + 1
            return FULL_POOLS
        _flush(pc, nwhead, tlist, ecount, epair, eseq, ehead, heap, pa, pb, st)
        st[ST_PHASE] = 0
        done += 1
    return DONE if (st[ST_VOCAB] >= V or st[ST_HEAP] == 0) else MORE


KERNELS = {"bpe_run": bpe_run}
