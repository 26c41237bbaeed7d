"""`SlotKVCache`: the target's KV cache as preallocated per-request slots.

Why not HF's `DynamicCache` per request: the verify forward is batched across requests whose
contexts differ in length, and rejected drafts must be dropped every round. Here every running
request owns a slot (a row of one `[S, nkv, capacity, hd]` buffer per layer) and a valid length;
a forward writes its Q new keys at each row's own offset, and the caller passes a 4D mask that
lets query j of row r see keys `k <= start[r] + j`. Rejecting drafts is then free: the valid
length simply stops short of them and the next round overwrites the stale keys. No copies, no
cropping, no left-padding shuffles.

HF attention calls `cache.update(k, v, layer_idx, ...)` and nothing else when the mask is given
already built, so this class overrides only that (it subclasses `Cache` for `isinstance` checks).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class SlotKVCache(Cache):
    """Per-layer keys/values `[S, nkv, capacity, hd]`; call `bind` before every forward.

    Invariant: for a bound row r, keys at positions < start[r] are that request's valid context;
    anything at >= start[r] is stale and must be masked (the caller's mask does it).
    """

    def __init__(
        self,
        num_layers: int,
        slots: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kv_bucket: int = 64,
    ):
        # Deliberately no super().__init__: the base class manages lazily grown layer objects,
        # which this cache replaces with fixed buffers.
        self.layers = []
        self.capacity, self.kv_bucket = capacity, kv_bucket
        shape = (slots, num_kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._rows: torch.Tensor | None = None
        self._row_slice: slice | None = None
        self._write_pos: torch.Tensor | None = None
        self.kv_len = 0

    def bind(self, rows: list[int], start: torch.Tensor, q_len: int) -> int:
        """Select the slots and write offsets of the next forward.

        rows: slot of each batch row (R); start: [R] int64 first position written per row;
        q_len: Q. Returns K, the key length the forward will attend over (bucketed to
        `kv_bucket` so shapes repeat; always <= capacity).
        """
        need = int(start.max()) + q_len
        if need > self.capacity:
            raise RuntimeError(f"KV cache overflow: need {need} positions, have {self.capacity}")
        self.kv_len = min(round_up(need, self.kv_bucket), self.capacity)
        device = self.keys[0].device
        # Contiguous slots (the common case: lowest-free-slot allocation) read through a view.
        contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
        self._row_slice = slice(rows[0], rows[0] + len(rows)) if contiguous else None
        self._rows = torch.tensor(rows, dtype=torch.long, device=device)
        self._write_pos = start.to(device).view(-1, 1) + torch.arange(q_len, device=device)
        return self.kv_len

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """key/value_states: [R, nkv, Q, hd] -> this layer's keys/values [R, nkv, K, hd]."""
        rows = self._rows.view(-1, 1)
        # Advanced indices split by a slice put their broadcast dims first: [R, Q, nkv, hd].
        self.keys[layer_idx][rows, :, self._write_pos] = key_states.transpose(1, 2)
        self.values[layer_idx][rows, :, self._write_pos] = value_states.transpose(1, 2)
        if self._row_slice is not None:
            k = self.keys[layer_idx][self._row_slice, :, : self.kv_len]
            v = self.values[layer_idx][self._row_slice, :, : self.kv_len]
        else:
            k = self.keys[layer_idx].index_select(0, self._rows)[:, :, : self.kv_len]
            v = self.values[layer_idx].index_select(0, self._rows)[:, :, : self.kv_len]
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Only consulted by HF when position_ids are missing; the engine always passes them.
        return 0

    def copy_slot(self, src: int, dst: int) -> None:
        """Duplicate a slot (used by tests and for request forking)."""
        for buf in (*self.keys, *self.values):
            buf[dst].copy_(buf[src])


def attention_mask(
    start: torch.Tensor, q_len: int, kv_len: int, sliding_window: int | None = None
) -> torch.Tensor:
    """[R, 1, Q, K] bool, True = may attend: query j of row r (position start[r]+j) sees keys at
    positions <= start[r]+j (and > start[r]+j-window for sliding layers)."""
    q_pos = start.view(-1, 1, 1) + torch.arange(q_len, device=start.device).view(1, -1, 1)
    k_pos = torch.arange(kv_len, device=start.device).view(1, 1, -1)
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        allowed &= k_pos > q_pos - sliding_window
    return allowed.unsqueeze(1)
