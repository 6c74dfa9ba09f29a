"""A KV-cached decoding loop with seeded sampling from a local ``torch.Generator``.

Hugging Face's ``generate`` samples from the global torch RNG; this loop takes the generator explicitly, so
a fixed seed reproduces the same texts without touching global state. Left padding plus explicit
``position_ids`` (from the attention mask) make padded rows decode exactly as they would unpadded.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch


def cache_kwarg(model: Any) -> str:
    """Name of the KV-cache keyword of a (possibly PEFT-wrapped) causal LM's forward.

    transformers 5 calls it ``cache``; earlier releases ``past_key_values``.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(type(inner).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020, arXiv 1904.09751): keep the smallest set of tokens whose
    probability mass reaches ``top_p``; the others get ``-inf``.

    Args:
        logits: ``(B, V)`` tempered logits.
        top_p: mass to keep, in ``(0, 1]``.

    Returns:
        The filtered logits ``(B, V)`` (the most likely token is always kept).
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
    drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= top_p  # mass before the token already enough
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def choose_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> torch.Tensor:
    """Pick one token per row: argmax when ``temperature == 0``, else sample softmax(logits / T).

    Args:
        logits: ``(B, V)`` next-token logits.
        temperature: 0 for greedy decoding, > 0 to sample.
        top_p: nucleus mass for sampling.
        generator: the local generator that drives sampling.

    Returns:
        ``(B,)`` token ids.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = filter_top_p(logits.float() / temperature, top_p).softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def decode(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float = 1.0,
    ignore_eos: bool = False,
    forward_kwargs: Callable[[], dict[str, Any]] | None = None,
) -> list[str]:
    """Generate one continuation per prompt with a KV cache.

    Args:
        model: a causal LM (plain or PEFT-wrapped) already configured for the rows' adapters.
        tokenizer: its tokenizer; must have a pad token and pad on the left.
        prompts: the prompts (the batch).
        max_new_tokens: generation budget per row.
        temperature: 0 for greedy, > 0 to sample.
        seed: seed of the local sampling generator.
        top_p: nucleus mass.
        ignore_eos: keep generating past EOS (benchmarks use it to fix the token count).
        forward_kwargs: extra keyword arguments for every forward call (e.g. PEFT's ``adapter_names``).

    Returns:
        The decoded continuations (special tokens removed, text after the first EOS dropped).
    """
    if not prompts or max_new_tokens == 0:
        return ["" for _ in prompts]
    device = next(model.parameters()).device
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True).to(device)
    input_ids, mask = enc["input_ids"], enc["attention_mask"]  # (B, P)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P): left padding shifts each row's positions
    generator = torch.Generator(device=device).manual_seed(seed)
    extra = forward_kwargs or (lambda: {})
    from transformers import DynamicCache

    cache = DynamicCache()
    key = cache_kwarg(model)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)  # (B,)
    generated = []
    step_ids = input_ids
    for _ in range(max_new_tokens):
        out = model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{key: cache},
            **extra(),
        )
        tokens = choose_tokens(out.logits[:, -1, :], temperature, top_p, generator)  # (B,)
        tokens = tokens.masked_fill(finished, pad)
        generated.append(tokens)
        if not ignore_eos:
            finished |= tokens == eos
            if bool(finished.all()):
                break
        step_ids = tokens[:, None]  # (B, 1)
        mask = torch.cat([mask, torch.ones_like(step_ids)], dim=1)
        positions = positions[:, -1:] + 1
    rows = torch.stack(generated, dim=1).tolist()  # (B, T)
    if not ignore_eos:
        rows = [row[: row.index(eos)] if eos in row else row for row in rows]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
