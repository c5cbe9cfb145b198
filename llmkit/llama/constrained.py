"""Grammar- or schema-constrained generation through llama.cpp's own sampler chain."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.errors import BadInput, OptionError
from llmkit.llama.generate import GenerateStats
from llmkit.llama.sampling import SamplingParams


@dataclass(frozen=True)
class Grammar:
    """What the output must match: GBNF grammar text, or a JSON schema (text) that llama.cpp turns into one."""

    gbnf: str | None = None
    json_schema: str | None = None

    @classmethod
    def from_options(cls, grammar: str | None, grammar_file: str | None, json_schema: str | None) -> "Grammar":
        """Exactly one of a grammar, a grammar file, or a JSON schema (text, or @FILE); files are read here."""
        given = [x for x in (grammar, grammar_file, json_schema) if x]
        if len(given) != 1:
            raise OptionError("give exactly one of {grammar}, {grammar_file} or {json_schema}.")
        if grammar_file:
            return cls(gbnf=_read(grammar_file, "grammar file"))
        if grammar:
            return cls(gbnf=grammar)
        text = _read(json_schema[1:], "JSON schema file") if json_schema.startswith("@") else json_schema
        try:
            json.loads(text)
        except ValueError as e:
            raise OptionError("{json_schema} is not JSON ({why}). Check its syntax.", why=e) from None
        return cls(json_schema=text)

    def server_fields(self) -> dict:
        """The same constraint as llama-server's /completion fields."""
        if self.json_schema is not None:
            return {"json_schema": json.loads(self.json_schema)}
        return {"grammar": self.gbnf}

    def to_llama(self):
        """llama-cpp-python's LlamaGrammar for this grammar."""
        from llama_cpp import LlamaGrammar

        try:
            if self.json_schema is not None:
                return LlamaGrammar.from_json_schema(self.json_schema, verbose=False)
            return LlamaGrammar.from_string(self.gbnf, verbose=False)
        except ValueError as e:
            raise BadInput(f"the grammar/schema cannot be used ({e}). Check its syntax.") from None


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read the {what} '{path}' ({e}).") from None


def generate_constrained(model, tokens, n_predict: int, params: SamplingParams, grammar: Grammar, stop=(),
                         on_text=None):
    """Stream a completion whose text must match `grammar`; (text, GenerateStats)."""
    g = grammar.to_llama()
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
