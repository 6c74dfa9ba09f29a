"""Token batches of the GRPO learner: tokenising prompts and completions, and per-token log-probs with each
distinct prompt run once (its KV cache shared by the completions of its group)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from transformers import DynamicCache

from agents.generation import cache_kwarg
from agents.grpo_loss import token_log_probs

__all__ = [
    "TokenBatch",
    "encode_batch",
    "only_trainable",
    "pad_tokens",
    "shared_prefix_logps",
    "truncated_rows",
]


@dataclass
class TokenBatch:
    """Token tensors: each distinct prompt once (left-padded), completions right-padded, one per row."""

    prompt_ids: torch.Tensor  # (U, P) distinct prompts
    prompt_mask: torch.Tensor  # (U, P)
    prompt_index: torch.Tensor  # (N,) row -> distinct prompt
    completion_ids: torch.Tensor  # (N, C)
    completion_mask: torch.Tensor  # (N, C) float, 1 on real completion tokens


def encode_batch(
    tokenizer: Any,
    prompts: Sequence[str],
    completions: Sequence[str],
    completion_ids: Sequence[Sequence[int]] | None,
    max_new_tokens: int,
) -> TokenBatch:
    """Tokenise: prompt with the tokenizer's special tokens; completion as generated, or re-tokenised.

    Generated ids (`completion_ids`) are used as they are (the stop token included when generation stopped
    on one). Without them the completion text is re-tokenised without special tokens; one shorter than
    max_new_tokens stopped, and the tokenizer's EOS (a stop token) is appended so that stopping is
    trained too.
    """
    tok = tokenizer
    cap = max_new_tokens
    position = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
    distinct = list(position)
    prompt_index = torch.tensor([position[p] for p in prompts], dtype=torch.long)
    # as generation tokenises them: special-token text in a prompt (a teacher's task) stays text
    encoded = [
        list(x) for x in tok(distinct, add_special_tokens=True, split_special_tokens=True)["input_ids"]
    ]
    if any(not x for x in encoded):
        raise ValueError("a prompt encodes to no tokens; the learner needs at least one prompt token")
    prompt_ids = pad_tokens(encoded, tok.pad_token_id, "left")
    if completion_ids is not None:
        comp_ids = [list(x)[:cap] for x in completion_ids]
    else:
        comp_ids = [
            list(x)[:cap]
            for x in tok(list(completions), add_special_tokens=False, split_special_tokens=True)["input_ids"]
        ]
        comp_ids = [[*x, tok.eos_token_id] if len(x) < cap else x for x in comp_ids]
    completion = pad_tokens(comp_ids, tok.pad_token_id, "right")
    return TokenBatch(prompt_ids[0], prompt_ids[1], prompt_index, completion[0], completion[1].float())


def truncated_rows(batch: TokenBatch, stops: Sequence[int]) -> torch.Tensor:
    """(N,) bool: the completions none of whose real tokens is a stop id (cut at the budget). Padding is
    not looked at: a tokenizer's pad id is often its EOS."""
    stop = torch.tensor(list(stops), dtype=batch.completion_ids.dtype)
    return ~(torch.isin(batch.completion_ids, stop) & (batch.completion_mask > 0)).any(dim=-1)


def shared_prefix_logps(
    model: Any, device: torch.device, batch: TokenBatch, rows: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per-token log-probs (b, C) of the completion tokens of `rows` under the active model.

    Shared-prefix forward: each distinct prompt runs once, its KV cache is gathered to the rows that
    share it (a GRPO group shares one prompt), then the completions run on top of it. Gradients flow
    through the cache, so this equals the forward of every full sequence with G times less prompt work.
    Positions count real tokens only, so padding shifts nothing (as in generation).
    """
    distinct, inverse = torch.unique(batch.prompt_index[rows], return_inverse=True)
    inverse = inverse.to(device)
    p_ids, p_mask = (
        batch.prompt_ids[distinct].to(device),
        batch.prompt_mask[distinct].to(device),
    )  # (u, P)
    c_ids = batch.completion_ids[rows].to(device)  # (b, C)
    cache, key = DynamicCache(), cache_kwarg(model)
    prefix = model(
        input_ids=p_ids,
        attention_mask=p_mask,
        position_ids=(p_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
        **{key: cache},
    )
    cache.batch_select_indices(inverse)
    c_len = c_ids.size(1)
    out = model(
        input_ids=c_ids,
        attention_mask=torch.cat([p_mask[inverse], batch.completion_mask[rows].to(device).long()], dim=1),
        position_ids=p_mask.sum(-1, keepdim=True)[inverse] + torch.arange(c_len, device=device),
        use_cache=True,
        **{key: cache},
    )
    # Token t of the completion is predicted by the prompt's last position (t = 0) or completion t - 1.
    logits = torch.cat([prefix.logits[:, -1:, :][inverse], out.logits[:, : c_len - 1, :]], dim=1)  # (b, C, V)
    return token_log_probs(logits.float() / temperature, c_ids).cpu()


def pad_tokens(
    rows: list[list[int]], pad_id: int, side: Literal["left", "right"]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token lists to one length; returns (ids, mask), both (len(rows), max_len) long tensors."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


@contextlib.contextmanager
def only_trainable(model: nn.Module, params: list[nn.Parameter]) -> Iterator[None]:
    """Let gradients flow into `params` only (base weights and other adapters frozen), then restore flags."""
    keep = {id(p) for p in params}
    before = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in before:
        p.requires_grad_(id(p) in keep)
    try:
        yield
    finally:
        for p, flag in before:
            p.requires_grad_(flag)
