"""Options and error wording shared by the commands that drive llama.cpp (`generate`, `constrain`, `server`, `kv`)."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from llmkit.commands._common import bundle, settings

if TYPE_CHECKING:
    from llmkit.llama.sampling import SamplingParams

_MODEL = [
    click.option("-m", "--model", "model_path", help="GGUF model (default: LLMKIT_MODEL or the packaged SmolLM2-135M-Instruct)."),
    click.option("-c", "--ctx-size", "n_ctx", default=None, type=int,
                 help="Context size in tokens (default: min(2048, training context); 0: the training context)."),
    click.option("-t", "--threads", type=int, help="CPU threads (default: the cores idle right now, measured over 50 ms)."),
    click.option("--ctk", "cache_type_k", default="f16", show_default=True, help="KV cache type for K (f16, q8_0, q4_0, ...)."),
    click.option("--ctv", "cache_type_v", default="f16", show_default=True, help="KV cache type for V."),
    click.option("--flash-attn", is_flag=True),
]
_LOADING = [
    click.option("-b", "--batch-size", default=512, show_default=True, type=int),
    click.option("--mlock", is_flag=True),
    click.option("--no-mmap", is_flag=True),
    click.option("-ngl", "--n-gpu-layers", default=0, show_default=True, type=int, help="Passed through (no-op on CPU builds)."),
]


def model_options(loading: bool = False):
    """-m, -c, -t, --ctk, --ctv, --flash-attn (with `loading` also -b, --mlock, --no-mmap, -ngl);
    the command receives `model_path` and `opts`, a runtime.ModelOptions."""

    def decorate(f):
        @functools.wraps(f)
        def run(*args, n_ctx, threads, cache_type_k, cache_type_v, flash_attn, batch_size=512, mlock=False,
                no_mmap=False, n_gpu_layers=0, **kwargs):
            from llmkit.llama.runtime import ModelOptions

            opts = ModelOptions(n_ctx=n_ctx, n_threads=threads, n_batch=batch_size, cache_type_k=cache_type_k,
                                cache_type_v=cache_type_v, flash_attn=flash_attn, use_mlock=mlock,
                                use_mmap=not no_mmap, n_gpu_layers=n_gpu_layers, verbose=settings().debug)
            return f(*args, opts=opts, **kwargs)

        for opt in reversed(_MODEL + (_LOADING if loading else [])):
            run = opt(run)
        return run

    return decorate


_SAMPLING = [
    click.option("-n", "--n-predict", default=128, show_default=True, type=int, help="Tokens to generate."),
    click.option("--temp", default=0.8, show_default=True, type=float, help="Temperature (0 = greedy)."),
    click.option("--top-k", default=40, show_default=True, type=int),
    click.option("--top-p", default=0.95, show_default=True, type=float),
    click.option("--min-p", default=0.05, show_default=True, type=float),
    click.option("--repeat-penalty", default=1.0, show_default=True, type=float),
    click.option("--seed", type=int, default=None, help="Random seed (default: random)."),
    click.option("--stop", multiple=True,
                 help="Stop when this text appears (repeatable; \\n, \\t, \\r and \\\\ are read as escapes, as llama.cpp "
                      "reads them)."),
    click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens."),
]


@dataclass
class Sampling:
    """What the sampling options say: llama.cpp's sampler settings plus length and stop conditions."""

    params: "SamplingParams"
    n_predict: int
    stop: tuple[str, ...]
    ignore_eos: bool

    def server_fields(self) -> dict:
        """The same settings as llama-server's /completion fields."""
        p = self.params
        return {"n_predict": self.n_predict, "temperature": p.temp, "top_k": p.top_k, "top_p": p.top_p,
                "min_p": p.min_p, "repeat_penalty": p.repeat_penalty, **({"seed": p.seed} if p.seed is not None else {}),
                **({"stop": list(self.stop)} if self.stop else {}), **({"ignore_eos": True} if self.ignore_eos else {})}


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", "'": "'", '"': '"'}


def unescape(text: str) -> str:
    """`--stop "\\n\\n"` as two newlines: a shell passes the backslashes through, and llama.cpp reads them as
    escapes; any other backslash stays as written."""
    import re

    return re.sub(r"\\([nrt\\'\"])", lambda m: _ESCAPES[m.group(1)], text)


def sampling_options(n_predict: int = 128, eos: bool = True):
    """-n, --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed, --stop and (with `eos`) --ignore-eos,
    llama.cpp's meanings; the command receives `sampling`, a validated Sampling."""
    options = [click.option("-n", "--n-predict", default=n_predict, show_default=True, type=int,
                            help="Tokens to generate.")] + _SAMPLING[1:(None if eos else -1)]

    def decorate(f):
        @functools.wraps(f)
        def run(*args, n_predict, temp, top_k, top_p, min_p, repeat_penalty, seed, stop, ignore_eos=False, **kwargs):
            from llmkit.errors import OptionError
            from llmkit.llama.sampling import SamplingParams

            params = SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                                    seed=seed)
            params.validate()
            if n_predict <= 0:
                raise OptionError("{n_predict} must be a positive number of tokens, got {value}.", value=n_predict)
            return f(*args, sampling=Sampling(params, n_predict, tuple(map(unescape, stop)), ignore_eos), **kwargs)

        for opt in reversed(options):
            run = opt(run)
        return run

    return decorate


_DRAFT = [
    click.option("--draft-model", "draft_path", help="Draft GGUF for speculative decoding (same vocabulary)."),
    click.option("--draft-max", default=8, show_default=True, type=int, help="Most draft tokens per step."),
    click.option("--draft-min", default=0, show_default=True, type=int,
                 help="Fewest draft tokens per step; 0 lets the adaptive length skip drafting where it does not pay, "
                      "--draft-min N --draft-max N always drafts N."),
    click.option("--fixed-draft", is_flag=True, hidden=True),  # deprecated: --draft-min N --draft-max N
    click.option("--lookup", default=0, type=int, help="Prompt-lookup drafting with n-grams up to N (no draft model)."),
]


def _drafting(draft_path, draft_max, draft_min, fixed_draft, lookup):
    from llmkit.commands.deprecated import REMOVED_IN
    from llmkit.llama.draft import DraftOptions

    if fixed_draft:
        click.echo(f"Note: `llmkit generate --fixed-draft` is now `--draft-min {draft_max} --draft-max {draft_max}`; "
                   f"the old spelling works until llmkit {REMOVED_IN}.", err=True)
    draft_min = draft_max if fixed_draft else draft_min  # what the note says the old flag now means
    return DraftOptions(path=draft_path, lookup=lookup, max=draft_max, min=draft_min, adaptive=draft_min != draft_max)


# --draft-model, --draft-max, --draft-min, --lookup (and the old --fixed-draft): the command receives
# `drafting`, a llama.draft.DraftOptions
draft_options = bundle("drafting", _DRAFT, _drafting)


def chat_options(f):
    f = click.option("--system", help="System message for --chat.")(f)
    return click.option("--chat", is_flag=True, help="Wrap the prompt in the model's own chat template.")(f)


def server_slot_option(f):
    return click.option("--slot", "slot_id", type=int, default=0, show_default=True, help="With --server: the server slot.")(f)


def stats_line(d: dict) -> str:
    """The statistics line generate and constrain print on stderr."""
    return (f"prompt {d['prompt_tokens']} tok, prefill {d['prefill_s'] * 1000:.0f} ms | generated {d['generated_tokens']} tok "
            f"in {d['decode_s']:.2f} s = {d['tokens_per_s']:.1f} tok/s | stop: {d['stop_reason']}")


def check_memory(path: str, opts) -> None:
    """Refuse a context whose memory cannot be had before the model loads; warn once about a context
    past the model's training context."""
    from llmkit.commands._common import Output
    from llmkit.kv.plan import check_fits
    from llmkit.llama.runtime import check_cache_types, check_model_file

    check_cache_types(opts)  # bad settings and a missing or foreign file are reported as such, not as a plan's failure
    for note in check_fits(path, opts, gguf=check_model_file(path)):
        Output().warn(note)


def open_for_prompt(model_path, opts, prompt: str, chat: bool, system: str | None):
    """Open the model (default: the packaged one) and tokenize the prompt, wrapped in its chat template
    with --chat: (path, model, prompt as evaluated, tokens)."""
    from llmkit.errors import BadInput
    from llmkit.llama import runtime

    path = model_path or runtime.default_model_path()
    check_memory(path, opts)
    model = runtime.open_model(path, opts)
    if chat:
        from llmkit.llama.chat import NoChatTemplate, chat_prompt

        try:
            prompt = chat_prompt(model, prompt, system)
        except NoChatTemplate:
            raise BadInput("this model has no chat template (tokenizer.chat_template). Drop --chat and write the "
                           "prompt yourself.") from None
    return path, model, prompt, model.tokenize(prompt.encode("utf-8"), add_bos=runtime.add_bos(model), special=chat)


@contextmanager
def server_errors():
    """Say which option to check when a llama-server cannot be reached or a slot id is wrong."""
    from llmkit.errors import BadInput
    from llmkit.llama.server import BadSlotId, ServerDown

    try:
        yield
    except ServerDown as e:
        raise BadInput(f"{e} Start it, or check --server.") from None
    except BadSlotId as e:
        raise BadInput(f"--slot must be a slot number >= 0, got {e.slot_id}.") from None
