"""`llmkit quant ppl` against llama.cpp's own llama-perplexity (the binary scripts/build_llama_server.sh
builds from the same llama.cpp as the Python binding), on the same tiny F32 model, text and options:

- plain perplexity: the tool's "Final estimate: PPL = X +/- Y" and llmkit's figure are the same
  string, for its default layout (16 chunks of 128 side by side, flash attention, ubatches of 512)
  and for the layouts that change the logits' last bits (-b, -ub, -fa), with and without BOS;
- --kl-divergence-base vs --save-logits: byte-identical files (tokens, scales, levels);
- --kl-divergence vs --kld: every statistic it prints, digit for digit, on its file and on ours.

llama-perplexity prints through llama.cpp's asynchronous logger (common/log.cpp): a thread writes the
queued lines, and the logger is leaked on purpose, never flushed at exit. On a busy machine the
process ends before that thread has run, and the last lines, the final figures among them, are lost
although the tool exits 0 (measured here with two busy-looping processes on the 2 cores: 9-16 of 20
runs lost "Final estimate"). This made the old interchange test flaky under load ("'Mean    KLD'
not in llama-perplexity's output"). The tool is therefore run with a small preloaded library whose
exit handler waits until the process's other threads are asleep (the log thread sleeps once its
queue is empty): 0 of 20 lost under the same load. Without a C compiler, runs whose output lacks the
final line are repeated.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip("llama_cpp")
from ggufmake import write_tiny_llama  # noqa: E402
from serverutil import server_binary  # noqa: E402

N_CTX = 128


LINGER_C = r"""
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* is any other thread of this process running or runnable? */
static int others_busy(void) {
    char path[64], buf[512];
    long self = syscall(SYS_gettid);
    int busy = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long tid = atol(e->d_name);
        if (tid <= 0 || tid == self) continue;
        snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(buf, sizeof buf, f)) {
            char *p = strrchr(buf, ')');
            if (p && p[1] == ' ' && p[2] == 'R') busy = 1;
        }
        fclose(f);
    }
    if (d) closedir(d);
    return busy;
}

/* at exit: wait until the other threads have slept for 3 polls of 10 ms (at most 10 s) */
__attribute__((destructor)) static void linger(void) {
    for (int i = 0, quiet = 0; i < 1000 && quiet < 3; i++) {
        usleep(10000);
        quiet = others_busy() ? 0 : quiet + 1;
    }
}
"""


@pytest.fixture(scope="module")
def llama_perplexity(tmp_path_factory):
    """Run the llama-perplexity binary: fn(*args, last=line) -> its whole output, with `last` in it."""
    exe = str(Path(server_binary()).with_name("llama-perplexity"))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    d = tmp_path_factory.mktemp("linger")
    (d / "linger.c").write_text(LINGER_C)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc and subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(d / "linger.so"), str(d / "linger.c")],
                             capture_output=True).returncode == 0:
        env["LD_PRELOAD"] = str(d / "linger.so")

    def run(*args, last: str) -> str:
        for _ in range(8):
            p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=600, env=env)
            assert p.returncode == 0, p.stderr[-2000:]
            out = p.stdout + p.stderr
            if last in out:
                return out
        pytest.fail(f"llama-perplexity's output never reached {last!r} in 8 runs (its log thread is not flushed "
                    f"at exit; preloaded: {env.get('LD_PRELOAD')}): {out[-2000:]}")

    return run


def with_bos(src: Path, dst: Path) -> Path:
    """A copy of a tiny model whose vocabulary adds BOS (tokenizer.ggml.add_bos_token = true)."""
    data = bytearray(src.read_bytes())
    key = b"tokenizer.ggml.add_bos_token"
    at = data.index(key) + len(key)
    assert int.from_bytes(data[at:at + 4], "little") == 7  # GGUF bool
    data[at + 4] = 1
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="module")
def setup(tmp_path_factory, kernel_small):
    d = tmp_path_factory.mktemp("pplref")
    base = write_tiny_llama(d / "base.gguf", seed=5, n_embd=64, n_ff=128, n_ctx=512)
    bos = with_bos(base, d / "bos.gguf")
    r = run_cli(["quant", str(base),"--type", "Q4_0", "-o", str(d / "q4_0.gguf"), "--pure"])
    assert r.exit_code == 0, r.stderr
    text = d / "text.txt"
    text.write_text(kernel_small.read_text(encoding="utf-8")[:6000] + "\n", encoding="utf-8")
    return d, base, bos, text


def test_the_bos_copy_really_adds_bos(setup):
    from llmkit.quant.quality.scoring import Scorer

    d, base, bos, text = setup
    with Scorer(str(base), N_CTX) as a, Scorer(str(bos), N_CTX) as b:
        assert (a.add_bos, b.add_bos) == (False, True)
        assert b.tokenize("hello")[0] == b.bos and a.tokenize("hello")[0] != a.bos


FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")


# (llama-perplexity's flags, llmkit's): the default layout puts 16 chunks of 128 in one batch of 2048,
# cut into ubatches of 512 (32 tokens of each chunk a step); -b 128 evaluates one chunk at a time;
# -b 64 cuts each chunk into two batches; -ub 2048 takes the 16 chunks in one step; -fa off swaps
# the attention kernel. With flash attention each layout gives different logits' last bits, and the
# tool's figure with them: 165962.5755 (default), 165968.7287 (-b 128), 165969.5949 (-fa off).
LAYOUTS = [
    ([], []),
    (["-b", 128], ["-b", 128]),
    (["-b", 64], ["--batch-size", 64]),
    (["-ub", 2048], ["--ubatch-size", 2048]),
    (["-fa", "off"], ["--flash-attn", "off"]),
    (["-fa", "on", "-b", 384, "--chunks", 7], ["--flash-attn", "on", "-b", 384, "--chunks", 7]),
]


@pytest.mark.parametrize("model", ["base", "bos"])
@pytest.mark.parametrize("theirs,ours", LAYOUTS, ids=lambda a: " ".join(map(str, a)) or "defaults")
def test_perplexity_is_llama_perplexitys_to_the_printed_digit(setup, llama_perplexity, model, theirs, ours):
    d, base, bos, text = setup
    path = base if model == "base" else bos
    out = llama_perplexity("-m", path, "-f", text, "-c", N_CTX, "-t", 1, *theirs, last="Final estimate")
    ppl, unc = FINAL.search(out).groups()
    r = run_cli(["quant", "ppl", "-m", str(path), str(text), "-c", str(N_CTX), "--threads", "1", *map(str, ours)])
    assert r.exit_code == 0, r.stderr
    assert f"PPL {ppl} ± {unc}\t" in r.stdout, (out[-500:], r.stdout)
    got = json.loads(run_cli(["quant", "ppl", "-m", str(path), str(text), "-c", str(N_CTX), "--json",
                              *map(str, ours)]).stdout)
    assert (f"{got['ppl']:.4f}", f"{got['ppl_uncertainty']:.5f}") == (ppl, unc)
    n_chunks = int(re.search(r"calculating perplexity over (\d+) chunks", out).group(1))
    assert (got["chunks"], got["tokens_scored"]) == (n_chunks, n_chunks * (N_CTX - 1 - N_CTX // 2))


@pytest.mark.parametrize("model", ["base", "bos"])
def test_base_files_are_byte_identical(setup, llama_perplexity, tmp_path, model):
    d, base, bos, text = setup
    path = base if model == "base" else bos
    cpp, ours = tmp_path / "cpp.kld", tmp_path / "ours.kld"
    out = llama_perplexity("-m", path, "-f", text, "-c", N_CTX, "--kl-divergence-base", cpp,
                               last="Final estimate")
    r = run_cli(["quant", "ppl", "-m", str(path), "--save-logits", str(ours), str(text), "-c", str(N_CTX)])
    assert r.exit_code == 0, r.stderr
    assert cpp.read_bytes() == ours.read_bytes()
    # in this mode the tool's log-softmax is float, not double: its printed figure differs from the
    # plain run's in the last digits, and ours follows it
    ppl, unc = FINAL.search(out).groups()
    assert f"PPL {ppl} ± {unc}\t" in r.stdout


def _ours_as_printed(o: dict) -> dict:
    """llmkit's --kld --json figures in llama-perplexity's printf formats, keyed by its labels."""
    k, dp = o["kld"], o["delta_p"]
    rows = {
        "Mean PPL(Q)": f"{o['ppl']['value']:10.6f} ± {o['ppl']['uncertainty']:10.6f}",
        "Mean PPL(base)": f"{o['ppl_base']['value']:10.6f} ± {o['ppl_base']['uncertainty']:10.6f}",
        "Cor(ln(PPL(Q)), ln(PPL(base)))": f"{100 * o['correlation']:6.2f}%",
        "Mean ln(PPL(Q)/PPL(base))": f"{o['ln_ppl_ratio']:10.6f} ± {o['ln_ppl_ratio_uncertainty']:10.6f}",
        "Mean    KLD": f"{k['mean']:10.6f} ± {k['uncertainty']:10.6f}",
        "Maximum KLD": f"{k['max']:10.6f}", "Minimum KLD": f"{k['min']:10.6f}", "Median  KLD": f"{k['p50']:10.6f}",
        "Mean    Δp": f"{100 * dp['mean']:6.3f} ± {100 * dp['uncertainty']:5.3f} %",
        "Maximum Δp": f"{100 * dp['max']:6.3f}%", "Minimum Δp": f"{100 * dp['min']:6.3f}%",
        "Median  Δp": f"{100 * dp['p50']:6.3f}%",
        "RMS Δp": f"{100 * dp['rms']:6.3f} ± {100 * dp['rms_uncertainty']:5.3f} %",
        "Same top p": f"{100 * o['same_top_p']['value']:6.3f} ± {100 * o['same_top_p']['uncertainty']:5.3f} %",
    }
    for p in ("99.9", "99", "95", "90", "10", "5", "1", "0.1"):
        rows[f"{float(p):4.1f}%   KLD".strip()] = f"{k['p' + p]:10.6f}"
    for p in ("99.9", "99", "95", "90", "75", "25", "10", "5", "1", "0.1"):
        rows[f"{float(p):4.1f}%   Δp".strip()] = f"{100 * dp['p' + p]:6.3f}%"
    return rows


def test_files_interchange_with_llama_perplexity(setup, llama_perplexity, tmp_path):
    """llama-perplexity --kl-divergence on its base file and on ours prints what `--kld` reports, digit
    for digit (this test used to live in test_quant_kld.py with loose bounds, comparing two layouts)."""
    d, base, bos, text = setup
    cpp, ours = tmp_path / "cpp.kld", tmp_path / "ours.kld"
    llama_perplexity("-m", base, "-f", text, "-c", N_CTX, "--kl-divergence-base", cpp, last="Final estimate")
    assert run_cli(["quant", "ppl", "-m", str(base), "--save-logits", str(ours), str(text), "-c",
                    str(N_CTX)]).exit_code == 0
    for base_file in (cpp, ours):
        out = llama_perplexity("-m", d / "q4_0.gguf", "--kl-divergence-base", base_file, "--kl-divergence",
                                   "-c", N_CTX, last="Same top p:")
        theirs = {}
        for line in out.splitlines():
            m = re.match(r"(?:[\d.]+ I )?(.+?)\s*: (.+)$", line)
            if m:
                theirs[m.group(1).strip()] = m.group(2).strip()
        r = run_cli(["quant", "ppl", "-m", str(d / "q4_0.gguf"), "--kld", str(base_file), "--json"])
        assert r.exit_code == 0, r.stderr
        mine = _ours_as_printed(json.loads(r.stdout))
        assert len(mine) == 32
        diff = {label: (theirs.get(label), v.strip()) for label, v in mine.items() if theirs.get(label) != v.strip()}
        assert not diff, diff


def test_batch_options_are_checked(setup):
    d, base, bos, text = setup
    r = run_cli(["quant", "ppl", "-m", str(base), str(text), "-c", str(N_CTX), "-b", "0"])
    assert r.exit_code == 1 and "--batch-size 0" in r.stderr and "2048" in r.stderr
    r = run_cli(["quant", "ppl", "-m", str(base), str(text), "-c", str(N_CTX), "--flash-attn", "maybe"])
    assert r.exit_code == 2
