"""A KV-cached decoding loop with seeded sampling from a local ``torch.Generator``.

Hugging Face's ``generate`` samples from the global torch RNG; this loop takes the generator explicitly, so
a fixed seed reproduces the same texts without touching global state. Left padding plus explicit
``position_ids`` (from the attention mask) make padded rows decode exactly as they would unpadded. Rows
that repeat a (prompt, adapter) pair, as a GRPO group does, share one prefill, and the KV cache appends in
place (``agents.kv_cache``); neither changes a generated token.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable, Collection, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from agents.base import no_cudnn_attention

logger = logging.getLogger(__name__)


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
    # (a top_p that float32 rounds to 0 dropped every token, and sampling failed on NaN: a robustness review)
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def choose_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> torch.Tensor:
    """Pick one token per row: argmax when ``temperature == 0`` (or below float32's smallest normal number, the
    same in the limit), else sample softmax(logits / T).

    Args:
        logits: ``(B, V)`` next-token logits.
        temperature: 0 for greedy decoding, > 0 to sample.
        top_p: nucleus mass for sampling.
        generator: the local generator that drives sampling.

    Returns:
        ``(B,)`` token ids.
    """
    # a temperature float32 holds as 0 (5e-324) is greedy decoding, its limit: dividing by it gave NaN
    if temperature < torch.finfo(torch.float32).tiny:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # shifted to a maximum of 0 first: logits / T overflowed to inf (and the softmax to NaN) for a tiny T
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    probs = filter_top_p(scaled, top_p).softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


RowSetup = Callable[[Sequence[int]], AbstractContextManager[dict[str, Any]]]
"""Configures the model for a batch made of the given rows (indices into the prompts) and yields the extra
keyword arguments of every forward call on that batch (e.g. PEFT's ``adapter_names``)."""


def _no_setup(rows: Sequence[int]) -> AbstractContextManager[dict[str, Any]]:
    return nullcontext({})


def share_rows(prompts: Sequence[str], row_keys: Sequence[Hashable] | None) -> tuple[list[int], list[int]]:
    """Rows that can share one prompt prefill: those with the same prompt and the same key (adapter).

    Args:
        prompts: one prompt per row.
        row_keys: one key per row (e.g. the adapter name); ``None`` when every row runs the same model.

    Returns:
        ``(first, inverse)``: ``first[u]`` is the first row of distinct (prompt, key) ``u``, in order of first
        appearance; ``inverse[b]`` is the distinct index of row ``b`` (so ``first[inverse[b]]`` has the same
        prompt and key as ``b``).
    """
    keys = list(zip(prompts, row_keys if row_keys is not None else [None] * len(prompts), strict=True))
    position: dict[tuple[str, Hashable], int] = {}
    inverse = [position.setdefault(key, len(position)) for key in keys]
    first = [0] * len(position)
    for row in reversed(range(len(keys))):
        first[inverse[row]] = row
    return first, inverse


_warned_context: weakref.WeakSet[Any] = weakref.WeakSet()  # models already warned about (not their ids:
# an id is reused once its model is freed)


def warn_past_context(model: Any, prompt_tokens: int, max_new_tokens: int) -> None:
    """Logs once per model when a row can run past the positions the model was trained on (RoPE models
    still run there, with degraded output; nothing is cut): in generation, and in a GRPO update."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and prompt_tokens + max_new_tokens > limit and model not in _warned_context:
        _warned_context.add(model)
        logger.warning(
            "a prompt of %d tokens plus up to %d new tokens runs past the model's max_position_embeddings "
            "(%d): positions beyond it were never trained",
            prompt_tokens,
            max_new_tokens,
            limit,
        )


@torch.no_grad()
def decode_tokens(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float = 1.0,
    ignore_eos: bool = False,
    row_keys: Sequence[Hashable] | None = None,
    row_setup: RowSetup | None = None,
    share_prefill: bool = True,
) -> list[list[int]]:
    """Generate one continuation per prompt with a KV cache; returns the generated token ids.

    Rows with the same prompt and the same ``row_keys`` entry (a GRPO group: one prompt, one adapter)
    share one prefill: each distinct (prompt, key) runs once, then its KV cache, attention mask and
    positions are copied to the rows that share it before the first token is chosen. Each row's logits are
    those of its own prompt either way, and the sampler draws for all ``B`` rows in row order at every step,
    so the texts are those of the unshared batch (``share_prefill=False``), provided the prompt forward
    gives each row the same numbers at batch ``U`` as at batch ``B``, as row-wise kernels do (the test suite
    checks it on CPU).

    Args:
        model: a causal LM (plain or PEFT-wrapped).
        tokenizer: its tokenizer; must have a pad token (prompts are padded on the left whatever its
            ``padding_side``).
        prompts: the prompts (the batch).
        max_new_tokens: generation budget per row.
        temperature: 0 for greedy, > 0 to sample.
        seed: seed of the local sampling generator.
        top_p: nucleus mass.
        ignore_eos: keep generating past EOS (benchmarks use it to fix the token count).
        row_keys: one key per row naming the model configuration it runs under (e.g. its adapter); rows
            whose keys differ never share a prefill. ``None``: every row runs the same model.
        row_setup: configures the model for a batch of rows and yields extra forward keyword arguments
            (see :data:`RowSetup`); ``None``: the model is used as it is.
        share_prefill: run each distinct (prompt, key) prefill once; ``False`` runs every row's prompt.

    Returns:
        Per row, the generated ids up to and including the first stop token (``stop_token_ids``; all
        ``max_new_tokens`` of them when ``ignore_eos`` or when the row never stopped).
    """
    if not prompts or max_new_tokens == 0:
        return [[] for _ in prompts]
    try:
        from agents.kv_cache import growing_cache  # imports transformers
    except ImportError:  # a transformers release without cache layers (< 4.56): the concatenating cache
        from transformers import DynamicCache as growing_cache

    setup = row_setup or _no_setup
    first, inverse = share_rows(prompts, row_keys)
    every_row = range(len(prompts))
    shared = share_prefill and len(first) < len(prompts)
    device = next(model.parameters()).device
    prefill_rows = first if shared else every_row
    # prompts hold text others wrote (a teacher's task): "</s>" in it is text, not the EOS token
    # left padding whatever the tokenizer's own setting: the positions and the last-position logits rely on it
    enc = tokenizer(
        [prompts[i] for i in prefill_rows],
        return_tensors="pt",
        padding=True,
        padding_side="left",
        split_special_tokens=True,
    ).to(device)
    warn_past_context(model, int(enc["attention_mask"].sum(dim=1).max()), max_new_tokens)
    state = _DecodeState(growing_cache(), cache_kwarg(model), enc["attention_mask"], enc["input_ids"])
    steps: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        generator=torch.Generator(device=device).manual_seed(seed),
        stops=stop_token_ids(model, tokenizer),
        pad=tokenizer.pad_token_id,
        ignore_eos=ignore_eos,
    )
    # the key length grows at every token: keep attention off cuDNN's per-shape graphs (see its docstring)
    with no_cudnn_attention(device):
        if not shared:
            with setup(every_row) as extra:
                return _decode_steps(model, state, _forward(model, state, extra), extra, **steps)
        with setup(first) as extra:
            logits = _forward(model, state, extra)  # (U, V)
        index = torch.tensor(inverse, dtype=torch.long, device=device)  # (B,)
        state.cache.batch_select_indices(index)  # every row gets its own copy of its prompt's cache
        state.mask, state.positions = state.mask[index], state.positions[index]
        with setup(every_row) as extra:
            return _decode_steps(model, state, logits[index], extra, **steps)


@dataclass
class _DecodeState:
    """What the decoding steps carry: the cache and its keyword, the attention mask and next positions."""

    cache: Any
    key: str
    mask: torch.Tensor  # (B, L) 1 on real tokens, prompt then generated
    input_ids: torch.Tensor  # (B, P) the prompt, then (B, 1) the last chosen token
    positions: torch.Tensor = field(init=False)  # (B, P) then (B, 1)

    def __post_init__(self) -> None:
        self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)  # left padding shifts each row's positions


def _forward(model: Any, state: _DecodeState, extra: dict[str, Any]) -> torch.Tensor:
    """One forward of ``state.input_ids`` on top of the cache; returns the next-token logits ``(B, V)``."""
    out = model(
        input_ids=state.input_ids,
        attention_mask=state.mask,
        position_ids=state.positions,
        use_cache=True,
        logits_to_keep=1,
        **{state.key: state.cache},
        **extra,
    )
    return out.logits[:, -1, :]


def _decode_steps(
    model: Any,
    state: _DecodeState,
    logits: torch.Tensor,
    extra: dict[str, Any],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    stops: tuple[int, ...],
    pad: int,
    ignore_eos: bool,
) -> list[list[int]]:
    """Choose a token per row from ``logits`` (B, V), feed it back, repeat; rows are cut after their first
    stop token (``stop_token_ids``)."""
    finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)  # (B,)
    stop = torch.tensor(stops, dtype=torch.long, device=logits.device)
    generated = []
    for step in range(max_new_tokens):
        tokens = choose_tokens(logits, temperature, top_p, generator)  # (B,)
        tokens = tokens.masked_fill(finished, pad)
        generated.append(tokens)
        if not ignore_eos:
            finished |= torch.isin(tokens, stop)
            if bool(finished.all()):
                break
        if step + 1 == max_new_tokens:
            break
        state.input_ids = tokens[:, None]  # (B, 1)
        state.mask = torch.cat([state.mask, torch.ones_like(state.input_ids)], dim=1)
        state.positions = state.positions[:, -1:] + 1
        logits = _forward(model, state, extra)
    rows = torch.stack(generated, dim=1).tolist()  # (B, T)
    if not ignore_eos:
        rows = [_cut_after_stop(row, stops) for row in rows]
    return rows


def _cut_after_stop(row: list[int], stops: tuple[int, ...]) -> list[int]:
    for i, token in enumerate(row):
        if token in stops:
            return row[: i + 1]
    return row


def stop_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids generation stops on: the tokenizer's EOS and every id of the model's
    ``generation_config.eos_token_id`` (an int or a list), as ``transformers``' ``generate`` stops. Chat
    models list more than one there (an end-of-turn token beside the end of text)."""
    found = [tokenizer.eos_token_id]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found += configured if isinstance(configured, list | tuple) else [configured]
    return tuple(dict.fromkeys(int(i) for i in found if isinstance(i, int) and not isinstance(i, bool)))


def texts_of(
    tokenizer: Any, rows: Sequence[Sequence[int]], stops: Collection[int] | None = None
) -> list[str]:
    """Decode generated ids to text: special tokens removed, and a row's final token dropped when it is one of
    ``stops`` (default: the tokenizer's EOS; pass ``stop_token_ids(model, tokenizer)``: a stop id of the
    model's generation config that is not a special token kept its text in the completion, an audit)."""
    ends = {tokenizer.eos_token_id} if stops is None else set(stops)
    return tokenizer.batch_decode(
        [row[:-1] if row and row[-1] in ends else row for row in rows], skip_special_tokens=True
    )


def decode(model: Any, tokenizer: Any, prompts: Sequence[str], **kwargs: Any) -> list[str]:
    """Generate one continuation per prompt with a KV cache; returns the texts.

    Args:
        model: a causal LM (plain or PEFT-wrapped).
        tokenizer: its tokenizer; must have a pad token (prompts are padded on the left whatever its
            ``padding_side``).
        prompts: the prompts (the batch).
        **kwargs: as :func:`decode_tokens` (``max_new_tokens``, ``temperature`` and ``seed`` required).

    Returns:
        The decoded continuations (special tokens removed, text after the first EOS dropped).
    """
    return texts_of(
        tokenizer, decode_tokens(model, tokenizer, prompts, **kwargs), stop_token_ids(model, tokenizer)
    )
