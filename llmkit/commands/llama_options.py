"""Options and error wording shared by the commands that drive llama.cpp (`generate`, `kv`)."""

from __future__ import annotations

import functools
from contextlib import contextmanager

import click

from llmkit.commands._common import settings

_MODEL = [
    click.option("-m", "--model", "model_path", help="GGUF model (default: LLMKIT_MODEL or the packaged SmolLM2-135M-Instruct)."),
    click.option("-c", "--ctx-size", "n_ctx", default=None, type=int, help="Context size in tokens (default: min(2048, training context))."),
    click.option("-t", "--threads", type=int, help="CPU threads (default: the idle cores, i.e. cores minus the current load)."),
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


def server_slot_option(f):
    return click.option("--slot", "slot_id", type=int, default=0, show_default=True, help="With --server: the server slot.")(f)


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


# `generate`'s options that act on the in-process model only: a server runs its own model, cache and drafting
LOCAL_ONLY = {"model_path": "-m/--model", "chat": "--chat", "system": "--system", "context_shift": "--context-shift",
              "keep": "--keep", "draft_path": "--draft-model", "draft_max": "--draft-max", "draft_min": "--draft-min",
              "fixed_draft": "--fixed-draft", "lookup": "--lookup", "slot_path": "--slot", "slot_dir": "--slot-dir",
              "cache_reuse": "--cache-reuse"}


def refuse_local_only(local_only: dict) -> None:
    """With --server, an option only the in-process path honours is a usage error (not silently dropped)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [flag for name, flag in local_only.items()
             if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)]
    if given:
        raise click.UsageError(f"{', '.join(given)} act on the in-process model and do nothing with --server: drop "
                               f"{'them' if len(given) > 1 else 'it'} (start llama-server with its own -m, -md, "
                               "--ctx-size and slot options; chat messages go in a --batch file).")
