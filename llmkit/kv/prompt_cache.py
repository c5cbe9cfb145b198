"""Prompt caching with slot files: save an evaluated prompt, continue from a slot, and keep a
directory of slots from which the one sharing the longest prefix with a new prompt is restored."""

from __future__ import annotations

import hashlib
import os
import time

from llmkit.errors import BadInput, OptionError
from llmkit.kv.slots import list_slots, model_fingerprint, read_header, restore_slot, save_raw, save_slot
from llmkit.llama import runtime
from llmkit.llama.cache import common_prefix, eval_no_logits


def prompt_cache_kind(path: str) -> str:
    """'file' for a slot file to continue from, 'dir' for a directory of slots (made if missing); a
    missing path that names a slot file (.slot, .bin) is an error rather than a new directory."""
    if os.path.isfile(path):
        return "file"
    if not os.path.exists(path) and path.endswith((".slot", ".bin")):
        raise BadInput(f"no slot file '{path}'. Save one first (llmkit kv save), or pass a directory to keep a "
                       "prompt cache in.")
    return "dir"


def restore_best(model, model_path: str, opts, tokens: list[int], slot_dir: str) -> str | None:
    """Restore the slot in slot_dir (made if missing) that shares the longest prefix with `tokens`
    and was saved with the same model and cache types; its path, or None when none shares any."""
    os.makedirs(slot_dir, exist_ok=True)
    fp = model_fingerprint(model_path)
    best, best_n = None, 0
    for p, h, _ in list_slots(slot_dir):
        if h.model_fingerprint != fp or (h.cache_type_k, h.cache_type_v) != (opts.cache_type_k, opts.cache_type_v):
            continue
        ids = h.tokens if h.tokens is not None else read_header(p, tokens=True)[0].tokens
        n = common_prefix(ids, tokens)
        if n > best_n:
            best, best_n = p, n
    if best is not None:
        restore_slot(model, best, model_path, opts)
    return best


def save_to_dir(model, model_path: str, opts, slot_dir: str, text: str) -> tuple[str, int]:
    """Save the model's evaluated tokens into slot_dir under a name derived from them; (path, tokens)."""
    ids = [int(t) for t in model.input_ids[:model.n_tokens]]
    path = os.path.join(slot_dir, hashlib.sha1(str(ids).encode()).hexdigest()[:16] + ".slot")
    save_slot(model, path, model_path, opts, text=text)
    return path, len(ids)


class PromptCache:
    """`generate --prompt-cache PATH`: a slot file to continue from, or a directory of slots from which
    the one sharing the longest prefix is restored and into which the new state is saved."""

    def __init__(self, path: str):
        self.path = path
        self.directory = prompt_cache_kind(path) == "dir"

    def restore(self, model, model_path: str, opts, tokens: list[int]) -> str:
        """Load the cached state into the model before generating; a note saying what was restored."""
        if not self.directory:
            restore_slot(model, self.path, model_path, opts)
            return f"restored {self.path};"
        best = restore_best(model, model_path, opts, tokens, self.path)
        return f"restored {best};" if best else "no cached prefix;"

    def save(self, model, model_path: str, opts, text: str) -> str:
        """After generating: save the new state into a directory cache (a slot file is left as it was)."""
        if not self.directory:
            return ""
        saved, n_saved = save_to_dir(model, model_path, opts, self.path, text)
        return f" saved {saved} ({n_saved} tokens);"


def save_prompt(model_path: str | None, opts, text: str, output: str, raw: bool = False) -> tuple[int, float]:
    """Evaluate `text` and save its KV state to `output` (llama.cpp's own format with `raw`);
    returns (tokens saved, prefill seconds)."""
    path = model_path or runtime.default_model_path()
    model = runtime.open_model(path, opts)
    tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    if len(tokens) >= model.n_ctx():
        raise OptionError("the prompt has {n} tokens but the context holds {ctx}. Raise {n_ctx}.",
                          n=len(tokens), ctx=model.n_ctx())
    t = time.perf_counter()
    eval_no_logits(model, tokens)
    dt = time.perf_counter() - t
    n_saved = save_raw(model, output) if raw else save_slot(model, output, path, opts, text=text).n_tokens
    return n_saved, dt


def continue_slot(model_path: str | None, opts, slot: str, prompt: str, n_predict: int, temp: float, on_text=None):
    """Restore `slot` and generate after its tokens plus `prompt`, evaluating only the new tokens;
    returns (model path, text, GenerateStats)."""
    from llmkit.llama.generate import Generator
    from llmkit.llama.sampling import SamplingParams

    path = model_path or runtime.default_model_path()
    model = runtime.open_model(path, opts)
    hdr = restore_slot(model, slot, path, opts)
    tokens = hdr.tokens + model.tokenize(prompt.encode("utf-8"), add_bos=False, special=True) if prompt else list(hdr.tokens)
    text, st = Generator(model, SamplingParams(temp=temp)).run(tokens, n_predict, on_text=on_text, reuse_cache=True)
    return path, text, st
