"""A KV cache for the decoding loop that appends in place instead of concatenating.

transformers' ``DynamicLayer.update`` concatenates, copying a layer's whole cache at every decoded token: the
traffic grows with the square of the length, and on CPU it was the largest single cost of decoding (more than
the attention itself in a profile of ``bench/grpo.py``'s generation). Here each layer keeps its keys and
values in a buffer with room to spare; a token is written into the next free slot and the cache is a view of
the filled part. The buffer doubles when full (amortised linear), so the numbers are exactly those of the
concatenating cache, read by attention through a strided view.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import transformers
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

logger = logging.getLogger(__name__)
_warned = False


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` (``(B, H, T, D)``) are views of a larger buffer.

    Selecting rows (``batch_select_indices``, repeats allowed) gathers them straight into a new buffer. Any
    other replacement of ``keys`` (``reorder_cache``) moves the layer to a new buffer on its next update;
    ``crop`` keeps the buffer and the next update overwrites the cropped slots.
    """

    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``(B, H, t, D)`` keys/values; returns the whole cached keys and values (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # initialised above
        buffer = self._key_buffer
        fits = (
            buffer is not None
            and buffer.shape[-2] >= end
            and buffer.shape[:2] == key_states.shape[:2]
            and (length == 0 or keys.data_ptr() == buffer.data_ptr())
        )
        if not fits:
            self._key_buffer = _grown(keys, key_states, length, end)
            self._value_buffer = _grown(values, value_states, length, end)
        key_buffer, value_buffer = self._key_buffer, self._value_buffer
        assert key_buffer is not None and value_buffer is not None
        key_buffer[:, :, length:end] = key_states
        value_buffer[:, :, length:end] = value_states
        self.keys, self.values = key_buffer[:, :, :end], value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` of the batch (repeats allowed), with room for as many tokens again."""
        length = self.get_seq_length()
        if length == 0:
            return
        assert self.keys is not None and self.values is not None  # they hold `length` positions
        self._key_buffer = _gathered(self.keys, indices, length)
        self._value_buffer = _gathered(self.values, indices, length)
        self.keys = self._key_buffer[:, :, :length]
        self.values = self._value_buffer[:, :, :length]


def _grown(old: torch.Tensor, new: torch.Tensor, length: int, end: int) -> torch.Tensor:
    """A buffer for ``end`` positions or twice the current ``length``, holding ``old``'s first ``length``."""
    batch, heads, _, dim = new.shape
    buffer = new.new_empty((batch, heads, max(end, 2 * length), dim))
    if length:
        buffer[:, :, :length] = old
    return buffer


def _gathered(old: torch.Tensor, indices: torch.Tensor, length: int) -> torch.Tensor:
    _, heads, _, dim = old.shape
    buffer = old.new_empty((indices.shape[0], heads, 2 * length, dim))
    torch.index_select(old, 0, indices.to(old.device), out=buffer[:, :, :length])
    return buffer


def growing_cache() -> DynamicCache:
    """An empty ``DynamicCache`` (what models accept as their cache) whose layers are :class:`GrowingLayer`.

    The layer hook (``layer_class_to_replicate``) is recent transformers API; where the installed release
    lacks it, this returns a plain ``DynamicCache`` (the same numbers, concatenated at each token) and logs
    one warning.
    """
    global _warned
    cache = DynamicCache()
    try:
        Cache.__init__(cache, layer_class_to_replicate=GrowingLayer)
    except TypeError as error:
        if not _warned:
            _warned = True
            logger.warning("transformers %s has no cache layer hook (%s): decoding uses DynamicCache, slower",
                           transformers.__version__, error)  # fmt: skip
        return DynamicCache()
    return cache
