"""Initial weights: torch's defaults, He (Kaiming) or Xavier (Glorot), for ES and backprop runs alike."""

from __future__ import annotations

from torch import nn

INITS = ("default", "he", "xavier")
_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def init_weights(model: nn.Module, scheme: str = "default") -> nn.Module:
    """Re-initialise every Linear and Conv weight of ``model`` (in place) and zero their biases.

    Args:
        model: the plain model, before it is converted to perturbed layers.
        scheme: "default" (leave torch's initialisation), "he" (Kaiming normal, fan-in, ReLU gain) or
            "xavier" (Glorot uniform, gain 1). Other parameters (embeddings, norms) keep their own.

    Returns:
        ``model``. Draws from torch's global generator: seed it first for a reproducible model.
    """
    if scheme not in INITS:
        raise ValueError(f"init must be one of {list(INITS)}; got {scheme!r}")
    if scheme == "default":
        return model
    touched = 0
    for module in model.modules():
        if isinstance(module, _WEIGHTED):
            if scheme == "he":
                nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
            else:
                nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            touched += 1
    if not touched:
        raise ValueError(f"init {scheme!r} found no Linear or Conv layer in {type(model).__name__}")
    return model
