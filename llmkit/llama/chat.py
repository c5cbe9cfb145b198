"""Chat prompts from the model's own template (GGUF `tokenizer.chat_template`, Jinja2)."""

from __future__ import annotations

from llmkit.errors import BadInput


class NoChatTemplate(BadInput):
    def __init__(self):
        super().__init__("this model has no chat template (tokenizer.chat_template). Write the prompt in the "
                         "model's own format instead.")


def token_text(model, tok: int) -> str:
    """The text of one token id ('' for a negative id)."""
    import llama_cpp

    if tok < 0:
        return ""
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    raw = llama_cpp.llama_vocab_get_text(vocab, tok)
    return raw.decode("utf-8", "replace") if raw else ""


def chat_prompt(model, user: str, system: str | None = None) -> str:
    """Render [system?, user] with the model's template and the assistant turn opened."""
    template = model.metadata.get("tokenizer.chat_template")
    if not template:
        raise NoChatTemplate()
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    fmt = Jinja2ChatFormatter(template=template, eos_token=token_text(model, model.token_eos()),
                              bos_token=token_text(model, model.token_bos()), add_generation_prompt=True)
    return fmt(messages=messages).prompt
