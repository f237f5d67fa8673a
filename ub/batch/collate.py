"""Arrow list columns to right-padded torch tensors (numpy scatter over the Arrow buffers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ub.errors import UbError

if TYPE_CHECKING:  # (torch is imported where tensors are made: reading a config needs no torch)
    import torch


@dataclass
class Collated:
    """Padded numpy-backed tensors of a batch and its token counts (see :class:`Batch`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    lengths: torch.Tensor
    prompt_tokens: int
    completion_tokens: int
    truncated: int
    truncated_tokens: int
    truncated_no_completion: int


def _list_parts(column: pa.ChunkedArray | pa.Array, name: str, rows: pa.Table
                ) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, flat values) of a list column, straight from its offsets: no per-row loop."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count:
        i = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        where = (f"game {rows['game_id'][i].as_py()} turn {rows['turn'][i].as_py()}"
                 if "game_id" in rows.column_names else f"row {i}")
        raise UbError(f"{where} is a model decision without {name}: the steps shard is "
                      "incomplete; rerun its rollout")
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    return np.diff(offsets).astype(np.int64), values


def collate(rows: pa.Table, pad_token_id: int = 0, max_train_len: int | None = None) -> Collated:
    """Right-padded tensors from ``rows``' ``prompt_token_ids``, ``completion_token_ids`` and
    ``completion_logprobs`` (numpy scatter over the Arrow buffers).

    A sequence longer than ``max_train_len`` keeps its first ``max_train_len`` tokens of
    prompt + completion (the completion is cut first; a prompt that alone exceeds the limit
    leaves no completion token, and the row then contributes nothing to the loss).
    """
    p_len, p_val = _list_parts(rows["prompt_token_ids"], "prompt_token_ids", rows)
    c_len, c_val = _list_parts(rows["completion_token_ids"], "completion_token_ids", rows)
    l_len, l_val = _list_parts(rows["completion_logprobs"], "completion_logprobs", rows)
    bad = np.flatnonzero(l_len != c_len)
    if len(bad):
        i = int(bad[0])
        raise UbError(f"row {i} has {c_len[i]} completion tokens but {l_len[i]} logprobs: the "
                      "steps shard is inconsistent")
    n = len(p_len)
    full = p_len + c_len
    keep = np.minimum(full, max_train_len) if max_train_len is not None else full
    width = int(keep.max()) if n else 0
    input_ids = np.full((n, width), pad_token_id, dtype=np.int64)
    completion_mask = np.zeros((n, width), dtype=np.float32)
    logprobs = np.zeros((n, width), dtype=np.float32)

    # prompt tokens: row r, position j < keep[r]
    row = np.repeat(np.arange(n), p_len)
    pos = np.arange(len(p_val)) - np.repeat(np.cumsum(p_len) - p_len, p_len)
    ok = pos < keep[row]
    input_ids[row[ok], pos[ok]] = p_val[ok]
    # completion tokens: after the prompt
    row = np.repeat(np.arange(n), c_len)
    pos = p_len[row] + np.arange(len(c_val)) - np.repeat(np.cumsum(c_len) - c_len, c_len)
    ok = pos < keep[row]
    input_ids[row[ok], pos[ok]] = c_val[ok]
    completion_mask[row[ok], pos[ok]] = 1.0
    logprobs[row[ok], pos[ok]] = l_val[ok]

    attention_mask = (np.arange(width)[None, :] < keep[:, None]).astype(np.int64)
    cut = full > keep
    import torch

    return Collated(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention_mask),
        completion_mask=torch.from_numpy(completion_mask),
        behaviour_logprobs=torch.from_numpy(logprobs),
        lengths=torch.from_numpy(keep.astype(np.int64)),
        prompt_tokens=int(np.minimum(p_len, keep).sum()),
        completion_tokens=int(completion_mask.sum()),
        truncated=int(cut.sum()),
        truncated_tokens=int((full - keep).sum()),
        truncated_no_completion=int((cut & (p_len >= keep) & (c_len > 0)).sum()),
    )
