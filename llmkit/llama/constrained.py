"""Grammar- or schema-constrained generation through llama.cpp's own sampler chain."""

from __future__ import annotations

import time
from pathlib import Path

from llmkit.errors import BadInput
from llmkit.llama.generate import GenerateStats
from llmkit.llama.sampling import SamplingParams


def generate_constrained(model, tokens, n_predict: int, params: SamplingParams, grammar=None, grammar_file=None,
                         json_schema=None, stop=(), on_text=None):
    """Stream a completion whose text must match a GBNF grammar or a JSON schema."""
    import json

    from llama_cpp import LlamaGrammar

    try:
        if json_schema:
            json.loads(json_schema)
            g = LlamaGrammar.from_json_schema(json_schema, verbose=False)
        else:
            text = Path(grammar_file).read_text(encoding="utf-8") if grammar_file else grammar
            g = LlamaGrammar.from_string(text, verbose=False)
    except (ValueError, OSError) as e:
        raise BadInput(f"the grammar/schema cannot be used ({e}). Check its syntax.") from None
    st = GenerateStats(prompt_tokens=len(tokens))
    t0 = time.perf_counter()
    parts = []
    for chunk in model.create_completion(prompt=tokens, max_tokens=n_predict, temperature=params.temp,
                                         top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                                         repeat_penalty=params.repeat_penalty, seed=params.seed,
                                         stop=list(stop) or None, grammar=g, stream=True):
        c = chunk["choices"][0]
        piece = c.get("text", "")
        if piece:
            parts.append(piece)
            st.generated_tokens += 1
            if on_text:
                on_text(piece)
        if c.get("finish_reason"):
            st.stop_reason = c["finish_reason"]
    st.decode_s = time.perf_counter() - t0
    return "".join(parts), st
