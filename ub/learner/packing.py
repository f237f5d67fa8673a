"""Shared prefixes, computed once: prefix-tree packing of a micro-batch for the transformer body.

A micro-batch's rows share long token prefixes (every prompt of a game starts with its rules,
and a seat's later prompts repeat its earlier moves). The body's output at a position depends
only on the tokens up to it and on its position, so rows that agree up to a position have the
same hidden state there: :func:`pack_rows` computes each distinct prefix once.

The rows' token sequences, sorted, make a trie (one node per distinct prefix), laid out in
depth-first order into packed rows of at most ``row_nodes`` nodes. A node's position id is its
depth (RoPE sees the row's own positions), and it attends to itself and its ancestors only,
which are exactly the tokens before it in every row through it: the body computes on the packed
rows what it computes on the unpacked ones, in another order of float sums. :func:`unpack`
gathers the packed hidden states back into the unpacked ``(b, L - 1, H)`` layout; its backward
adds up the gradient of every row that shares a node, as the rows' own gradients add up.

A packed row holds whole root-to-leaf paths: where a row's new nodes would pass ``row_nodes``,
the next packed row starts, with that row's prefix computed again (the ancestors a node attends
to must be in its packed row). A row longer than ``row_nodes`` gets a packed row of its own, as
long as the row. Packed rows are filled as evenly as their number allows: each is padded to the
widest. The attention mask is explicit, ``n x n`` per packed row, so attention costs
``n`` per node: :data:`PACKED_ROW_NODES` bounds it (measured: docs/algorithms.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ub.errors import UbError

PACKED_ROW_NODES = 256
"""Most nodes per packed row (a longer row excepted). Attention with an explicit mask costs
``n^2`` per packed row; fewer, shorter packed rows repeat more of the shared prefixes. The
fastest measured on the tiny model's real decisions (docs/algorithms.md)."""


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch's rows as a prefix tree, in packed rows for the transformer body.

    :param input_ids: (r, n) each node's token (padding slots: 0).
    :param position_ids: (r, n) each node's depth: its position in every row through it
        (padding slots: 0).
    :param attention_mask: (r, 1, n, n) bool, True where query node ``i`` attends to key node
        ``j``: ``j`` is ``i`` or one of its ancestors (a padding slot attends to itself only, so
        that no softmax is over nothing).
    :param index: (b, w) int64: where each (row, position) of the unpacked layout is in the
        flattened ``(r * n)`` packed nodes; ``r * n`` for a position past the row's length
        (:func:`unpack` puts zeros there).
    :param nodes: the real nodes (padding slots not counted): the tokens the body computes.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    index: torch.Tensor
    nodes: int


@dataclass(frozen=True)
class _Layout:
    """Packed rows as lists: each packed row's tokens and depths, and each unpacked row's path
    (the packed row it is in, and its nodes' slots there, position by position)."""

    tokens: list[list[int]]
    depths: list[list[int]]
    paths: dict[int, tuple[int, list[int]]]


def _shared_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


def _packed_row_starts(lengths: list[int], shared: list[int], capacity: int) -> list[int]:
    """Where packed rows start in a sorted sequence of rows (their ``lengths``, and ``shared``:
    each one's common prefix with the one before it), filled greedily up to ``capacity``
    nodes: a row adds its new nodes to the current packed row, or where they do not fit starts
    the next with all of its own (a longer row than ``capacity`` alone)."""
    starts: list[int] = []
    filled = 0
    for k, (length, common) in enumerate(zip(lengths, shared, strict=True)):
        new_nodes = length - common
        if not starts or (new_nodes and filled + new_nodes > capacity):
            starts.append(k)
            filled = length
        else:
            filled += new_nodes
    return starts


def _balanced_row_starts(lengths: list[int], shared: list[int], row_nodes: int) -> list[int]:
    """:func:`_packed_row_starts` into as few packed rows as ``row_nodes`` allows, at the
    smallest capacity that still gives that few: every packed row is padded to the widest, so
    evenly filled ones leave the least padding. (Rows cost no more nodes without the first of
    them, whose prefix they share: so greedy filling gives the fewest packed rows for a
    capacity, and no more for a larger one.)"""
    fewest = len(_packed_row_starts(lengths, shared, row_nodes))
    low, high = 1, row_nodes
    while low < high:
        middle = (low + high) // 2
        if len(_packed_row_starts(lengths, shared, middle)) <= fewest:
            high = middle
        else:
            low = middle + 1
    return _packed_row_starts(lengths, shared, high)


def _layout(sequences: list[list[int]], row_nodes: int) -> _Layout:
    """The trie of ``sequences`` in depth-first order, cut into packed rows of at most
    ``row_nodes`` nodes (a longer sequence: a packed row of its own).

    Sorted, each sequence shares with the trie built so far exactly its common prefix with the
    one before it, and adds its remaining tokens as new nodes below that prefix: appended in
    that order, the nodes are the trie's depth-first (pre-)order. A packed row's first sequence
    starts a trie of its own (the prefix it shared is computed again there). Ties keep the
    input order, so the layout is deterministic.
    """
    order = sorted((i for i, s in enumerate(sequences) if s), key=lambda i: sequences[i])
    ordered = [sequences[i] for i in order]
    shared = [0] + [_shared_prefix_length(a, b) for a, b in zip(ordered[1:], ordered, strict=False)]
    starts = set(_balanced_row_starts([len(s) for s in ordered], shared, row_nodes))
    tokens: list[list[int]] = []
    depths: list[list[int]] = []
    paths: dict[int, tuple[int, list[int]]] = {}
    path: list[int] = []  # the previous sequence's nodes' slots in the current packed row
    for k, (i, sequence) in enumerate(zip(order, ordered, strict=True)):
        common = shared[k]
        if k in starts:
            tokens.append([])
            depths.append([])
            common = 0
        row_tokens, row_depths = tokens[-1], depths[-1]
        first_new = len(row_tokens)
        path = path[:common] + list(range(first_new, first_new + len(sequence) - common))
        row_tokens.extend(sequence[common:])
        row_depths.extend(range(common, len(sequence)))
        paths[i] = (len(tokens) - 1, path)
    return _Layout(tokens, depths, paths)


def subtree_ends(depths: list[int]) -> list[int]:
    """For each node of a depth-first (pre-)order with these depths, the slot after the last
    node of its subtree: the first later node no deeper than it (else the end)."""
    ends = [len(depths)] * len(depths)
    open_nodes: list[int] = []  # the current path from the root: depths increase along it
    for slot, depth in enumerate(depths):
        while open_nodes and depths[open_nodes[-1]] >= depth:
            ends[open_nodes.pop()] = slot
        open_nodes.append(slot)
    return ends


def ancestry_mask(ends: torch.Tensor) -> torch.Tensor:
    """(r, n, n) bool: node ``i`` attends to node ``j`` where ``j``'s subtree holds ``i``, that is
    ``j <= i < ends[j]`` in depth-first order (``ends``: (r, n), :func:`subtree_ends`)."""
    slots = torch.arange(ends.shape[-1], device=ends.device)
    query, key = slots[:, None], slots[None, :]
    return (key <= query) & (query < ends[:, None, :])


def pack_rows(inputs: torch.Tensor, lengths: list[int], *,
                  row_nodes: int = PACKED_ROW_NODES, multiple: int = 1) -> PackedRows:
    """The prefix tree of a micro-batch's rows, in packed rows (see the module's docstring).

    :param inputs: (b, w) the model's input ids, right-padded.
    :param lengths: each row's real input length: its positions ``0 .. length - 1`` are packed
        (0: none; :func:`unpack` gives the others zeros).
    :param row_nodes: most nodes per packed row (a longer row: a packed row of its own).
    :param multiple: the packed width is padded up to a multiple of this (shapes that repeat).
    :returns: tensors on ``inputs``'s device.
    """
    rows, width = inputs.shape
    ids = inputs.tolist()
    layout = _layout([ids[b][:min(n, width)] for b, n in enumerate(lengths)], row_nodes)
    packed = max(1, len(layout.tokens))
    nodes = sum(len(t) for t in layout.tokens)
    slots = max((len(t) for t in layout.tokens), default=1)
    slots = -(-slots // multiple) * multiple
    input_ids = torch.zeros(packed, slots, dtype=torch.int64)
    position_ids = torch.zeros(packed, slots, dtype=torch.int64)
    # Padding slots end where they start: each attends to itself only.
    ends = torch.arange(1, slots + 1).repeat(packed, 1)
    for r, (row_tokens, row_depths) in enumerate(zip(layout.tokens, layout.depths, strict=True)):
        count = len(row_tokens)
        input_ids[r, :count] = torch.tensor(row_tokens)
        position_ids[r, :count] = torch.tensor(row_depths)
        ends[r, :count] = torch.tensor(subtree_ends(row_depths))
    index = torch.full((rows, width), packed * slots, dtype=torch.int64)
    for b, (r, path) in layout.paths.items():
        index[b, :len(path)] = r * slots + torch.tensor(path)
    device = inputs.device
    return PackedRows(input_ids.to(device), position_ids.to(device),
                      ancestry_mask(ends.to(device))[:, None], index.to(device), nodes)


def unpack(hidden: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """(r, n, H) hidden states of the packed rows -> (b, w, H) of the unpacked rows (zeros past
    each row's length). Its backward adds each position's gradient into its node: a shared
    node gets the sum over the rows that share it."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat = torch.cat([flat, flat.new_zeros(1, flat.shape[-1])])  # the slot past every row
    return flat.index_select(0, packed.index.flatten()).view(*packed.index.shape, -1)


def resolve_pack_prefixes(setting: bool | str, device: torch.device,
                          attn_implementation: str) -> bool:
    """Whether ``learner.pack_prefixes`` = ``setting`` packs on ``device`` with the attention
    implementation ``attn_implementation`` (resolved).

    ``auto``: on the CPU, where the body's compute is the learner's time and fewer tokens are
    faster; off on a GPU, where FlashAttention and cuDNN's attention run without a mask and
    over padded, repeating shapes (``pad_to_multiple``), and an explicit mask would take
    attention off them. Packing needs a 4D attention mask: ``sdpa`` or ``eager``.

    :raises UbError: ``true`` with ``flash_attention_2``, which takes no attention mask.
    """
    if attn_implementation == "flash_attention_2":
        if setting is True:
            raise UbError("learner.pack_prefixes: true needs an attention mask, and "
                          "flash_attention_2 takes none: set learner.attn_implementation to "
                          "sdpa, or learner.pack_prefixes to auto or false")
        return False
    if setting == "auto":
        return device.type == "cpu"
    return setting is True
