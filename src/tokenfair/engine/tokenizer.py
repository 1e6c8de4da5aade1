"""Tokenizer construction from GGUF metadata, and chat-template rendering.

``tokenizer_from_gguf_fields`` rebuilds a ``tokenizers`` byte-level BPE tokenizer from
``tokenizer.ggml.tokens`` / ``tokenizer.ggml.merges``; token ids are the GGUF list
indices, and control tokens (type 3) become special added tokens so that markers such
as ``<|im_start|>`` encode to one id and are skipped when decoding with
``skip_special_tokens=True``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

GGUF_TOKEN_TYPE_CONTROL = 3
GGUF_TOKEN_TYPE_USER_DEFINED = 4

# llama.cpp pre-tokenizer names whose regex is GPT-2's after splitting digits one by one.
_DIGIT_SPLITTING_PRETOKENIZERS = {"smollm", "starcoder", "refact"}


def tokenizer_from_gguf_fields(fields: Mapping[str, Any]) -> Tokenizer | None:
    """Build the tokenizer from decoded GGUF key/values; None for non-BPE vocabularies."""
    if fields.get("tokenizer.ggml.model") != "gpt2":
        return None
    tokens: Sequence[str] = fields["tokenizer.ggml.tokens"]
    token_types: Sequence[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(merge.split(" ", 1)) for merge in fields.get("tokenizer.ggml.merges", [])]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if fields.get("tokenizer.ggml.pre") in _DIGIT_SPLITTING_PRETOKENIZERS:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    special = [t for t, ty in zip(tokens, token_types) if ty == GGUF_TOKEN_TYPE_CONTROL]
    user_defined = [t for t, ty in zip(tokens, token_types) if ty == GGUF_TOKEN_TYPE_USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in user_defined])
    return tokenizer


def render_chatml(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """Plain ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
    ``<|im_start|>assistant\\n`` when ``add_generation_prompt``. No default system prompt."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def apply_chat_template(
    messages: Sequence[Mapping[str, str]],
    template: str | None = None,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """Render ``messages`` with the model's Jinja ``template`` (sandboxed), or with
    ``render_chatml`` when no template is known. SmolLM2's own template is ChatML plus a
    default system message when the conversation does not start with one."""
    if template is None:
        return render_chatml(messages, add_generation_prompt)
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=list(messages),
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
    )
