"""Activation checkpointing for backprop runs: each block's activations are recomputed in the backward pass
instead of stored (``torch.utils.checkpoint``, non-reentrant), trading compute for memory."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from ...layers.swap import swap_class

# blocks that are checkpointed (and sharded) whole
TRANSFORMER_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


class _CheckpointedBlock:
    """Mixin: the forward of a block runs under ``checkpoint`` while gradients are recorded."""

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation: nothing is stored anyway
            return super().forward(*args, **kwargs)
        return checkpoint(super().forward, *args, use_reentrant=False, **kwargs)


class _CheckpointedSequential:
    """Mixin: a Sequential runs as ``segments`` checkpointed segments while gradients are recorded."""

    segments: int  # set on each swapped class

    def forward(self, x):
        if not torch.is_grad_enabled():
            return super().forward(x)
        return checkpoint_sequential(self, self.segments, x, use_reentrant=False)


def checkpoint_blocks(model: nn.Module) -> int:
    """Turn on activation checkpointing in ``model`` (in place); returns the number of blocks.

    Blocks: every transformer encoder/decoder layer, and every ``nn.Sequential`` with two or more layers
    that have parameters, cut into one segment per such layer (e.g. Linear + Tanh). The weights, the
    state_dict and the results are unchanged; only what the backward pass stores is. A model with no such
    block is an error (checkpointing would silently do nothing).
    """
    blocks = 0
    for module in list(model.modules()):
        if isinstance(module, (_CheckpointedBlock, _CheckpointedSequential)):
            continue
        if isinstance(module, TRANSFORMER_LAYERS):
            swap_class(module, _CheckpointedBlock, "Checkpointed")
            blocks += 1
        elif isinstance(module, nn.Sequential):
            weighted = sum(1 for child in module if any(True for _ in child.parameters()))
            if weighted >= 2 and not inside_transformer_layer(model, module):
                swap_class(module, _CheckpointedSequential, "Checkpointed", segments=weighted)
                blocks += weighted
    if not blocks:
        raise ValueError(f"activation checkpointing found no block in {type(model).__name__} (a transformer "
                         f"layer, or an nn.Sequential of two or more layers with parameters)")
    return blocks


def inside_transformer_layer(model: nn.Module, target: nn.Module) -> bool:
    """Whether ``target`` lies inside one of ``model``'s transformer layers (a unit of its own already)."""
    return any(target is not layer and any(m is target for m in layer.modules())
               for layer in model.modules() if isinstance(layer, TRANSFORMER_LAYERS))
