"""``--anchor``: after every optimizer step, the evolving weights are pulled a share of the way back to the starting
model's, ``w -= anchor * (w - w_start)``, which bounds how far an ES run drifts from the model it started from
(the "anchored weight decay" of the comparisons of ES with GRPO). The starting weights are kept once, on the
weights' device, and in the checkpoint, so that a resumed run pulls toward the same ones; the pull is applied
once per step, after every block's update, so a chunked run pulls as an unchunked one.
"""

from __future__ import annotations

import torch


class Anchor:
    """The starting weights of ``parameters`` and the pull toward them (``strength`` 0: none, nothing kept)."""

    def __init__(self, strength: float, parameters: list[torch.Tensor]):
        self.strength = float(strength)
        self.start = [p.detach().clone() for p in parameters] if self.strength else None

    @torch.no_grad()
    def pull(self, parameters: list[torch.Tensor]) -> None:
        """``w -= strength * (w - w_start)`` for every parameter, in place (no host read)."""
        if self.start is None:
            return
        for p, start in zip(parameters, self.start):
            p.sub_(p - start, alpha=self.strength)

    def state(self) -> dict:
        """What a checkpoint keeps: the starting weights (none without an anchor)."""
        return {} if self.start is None else {"anchor": list(self.start)}

    def load(self, state: dict, parameters: list[torch.Tensor]) -> None:
        """The starting weights a checkpoint kept; a ValueError where an anchored run resumes one that has none."""
        if self.start is None:
            return
        saved = state.get("anchor")
        if not isinstance(saved, list) or len(saved) != len(parameters):
            raise ValueError("--anchor pulls toward the starting weights, which this checkpoint does not hold (the run "
                             "started without --anchor); drop --anchor, or start a new run with it")
        self.start = [s.to(device=p.device, dtype=p.dtype) for s, p in zip(saved, parameters)]


__all__ = ["Anchor"]
