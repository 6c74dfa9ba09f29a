"""Mixed-adapter batches by a stacked gather of LoRA factors per row (punica / S-LoRA style).

Each row ``b`` of a batch uses its own adapter ``idx[b]``. For every LoRA-wrapped ``Linear`` the forward
becomes

    y = base(x) + ((x @ A[idx]^T) @ (s * B[idx])^T)        # x (B, T, in), A (N, r, in), B (N, out, r)

computed with two ``torch.bmm`` over the whole batch, where ``A``/``B`` stack the factors of the ``N``
adapters in use and ``s = alpha / r`` is each adapter's PEFT scaling. This is the batched-gather LoRA of
Punica (Chen et al. 2023, arXiv 2310.18547, "SGMV") and S-LoRA (Sheng et al. 2023, arXiv 2311.03285),
written with plain torch ops. PEFT's own ``adapter_names=`` path instead loops over adapters with a
sub-batch index and an in-place scatter per adapter and per layer.

Inference only: the factors are gathered under ``no_grad`` when the context opens, so no gradient reaches
the adapters through this path (training uses PEFT's normal forward with one active adapter). Dropout is
not applied (generation runs in eval mode).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Gather the per-row factors once per context (fast) while they take at most this many bytes in total;
# beyond it, gather on every forward call instead (bounded memory for long batches on large models).
GATHER_ONCE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class _RowFactors:
    """Factors of one layer for the rows of a batch.

    Attributes:
        a_t: ``(B, in, r)`` when gathered once, else the stack ``(N, in, r)``.
        b_t: ``(B, r, out)`` scaled by ``alpha / r``, when gathered once, else the stack ``(N, r, out)``.
        index: ``(B,)`` adapter index per row, used when not gathered once.
        gathered: whether ``a_t``/``b_t`` are already per row.
    """

    a_t: torch.Tensor
    b_t: torch.Tensor
    index: torch.Tensor
    gathered: bool


def lora_linear_layers(model: nn.Module) -> list[Any]:
    """All PEFT LoRA layers of ``model``, in module order.

    Raises:
        TypeError: a LoRA layer is not a plain ``Linear`` (embeddings, convolutions are not supported).
    """
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    layers: list[Any] = []
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            if not isinstance(module, LoraLinear):
                raise TypeError(
                    f"stacked LoRA supports Linear layers only; {name} is {type(module).__name__}"
                )
            layers.append(module)
    return layers


def _stack_factors(layer: Any, names: Sequence[str], index: torch.Tensor, gather_once: bool) -> _RowFactors:
    for name in names:
        if name not in layer.lora_A:
            raise KeyError(f"adapter {name!r} has no factors in a LoRA layer; it has {list(layer.lora_A)}")
        if name in getattr(layer, "lora_variant", {}):
            raise ValueError(f"adapter {name!r} is a LoRA variant (e.g. DoRA); only plain LoRA is supported")
    a_t = torch.stack([layer.lora_A[n].weight.transpose(0, 1) for n in names])  # (N, in, r)
    b_t = torch.stack(
        [layer.lora_B[n].weight.transpose(0, 1) * layer.scaling[n] for n in names]
    )  # (N, r, out)
    if gather_once:
        return _RowFactors(a_t[index].contiguous(), b_t[index].contiguous(), index, True)
    return _RowFactors(a_t.contiguous(), b_t.contiguous(), index, False)


def _stacked_forward(
    layer: Any, factors: _RowFactors, x: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    result = layer.base_layer(x, *args, **kwargs)  # (B, T, out)
    if layer.disable_adapters:  # inside PEFT's disable_adapter() (LoRAPopulation.reference): the base alone
        return result
    if x.dim() != 3 or x.shape[0] != factors.index.shape[0]:
        raise ValueError(
            f"stacked LoRA was set up for {factors.index.shape[0]} rows but got input of shape {tuple(x.shape)}"
        )
    a_t, b_t = factors.a_t, factors.b_t
    if not factors.gathered:
        a_t, b_t = a_t.index_select(0, factors.index), b_t.index_select(0, factors.index)
    hidden = torch.bmm(x.to(a_t.dtype), a_t)  # (B, T, r); PEFT casts the input to the adapter dtype too
    if result.dtype == b_t.dtype:
        return torch.baddbmm(result, hidden, b_t)  # result + hidden @ b_t in one kernel, (B, T, out)
    return (result + torch.bmm(hidden, b_t)).to(result.dtype)


@contextmanager
def stacked_lora(model: nn.Module, row_adapters: Sequence[str]) -> Iterator[None]:
    """Within the context, every forward of ``model`` applies adapter ``row_adapters[b]`` to row ``b``
    (none while PEFT's ``disable_adapter()`` is on, as PEFT's own forward).

    The LoRA layers' ``forward`` is overridden per instance and restored on exit, even on error. Batches
    fed to the model inside the context must have exactly ``len(row_adapters)`` rows in that order.

    Args:
        model: a PEFT model whose LoRA layers hold every adapter named in ``row_adapters``.
        row_adapters: one adapter name per batch row.

    Raises:
        KeyError: an adapter name is not in the model.
        ValueError: a layer is merged or uses a LoRA variant.
    """
    names = list(dict.fromkeys(row_adapters))
    layers = lora_linear_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA layers")
    if not names:  # an empty batch: nothing to set up
        yield
        return
    first = layers[0].lora_A[names[0]].weight
    index = torch.tensor(
        [names.index(a) for a in row_adapters], dtype=torch.long, device=first.device
    )  # (B,)
    ranks = {layer.lora_A[n].weight.shape[0] for layer in layers for n in names if n in layer.lora_A}
    if len(ranks) > 1:
        raise ValueError(
            f"stacked LoRA needs one rank for all adapters in a batch, got ranks {sorted(ranks)}"
        )
    per_row_bytes = sum((layer.in_features + layer.out_features) for layer in layers) * ranks.pop()
    per_row_bytes *= first.element_size()
    gather_once = per_row_bytes * len(row_adapters) <= GATHER_ONCE_BYTES
    patched: list[Any] = []
    try:
        with torch.no_grad():
            for layer in layers:
                if layer.merged:
                    raise ValueError("stacked LoRA needs unmerged adapters; call unmerge_adapter() first")
                factors = _stack_factors(layer, names, index, gather_once)
                layer.forward = _bind(layer, factors)
                patched.append(layer)
        yield
    finally:
        for layer in patched:
            del layer.forward  # the instance attribute goes; the class's forward is back


def _bind(layer: Any, factors: _RowFactors) -> Any:
    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("adapter_names", None)
        return _stacked_forward(layer, factors, x, *args, **kwargs)

    return forward
