"""The memory an ES run of a Hugging Face model directory will hold, read from the directory's headers before the
weights are loaded: printed at the start of the run, and a run that cannot fit is refused in one line.

What each part counts (bytes):

- weights: every tensor of the directory's safetensors files, in the run's dtype (tied weights are stored once), and
  a LoRA adapter's (float32 unless ``--dtype`` says, as PEFT keeps them); with an adapter, only its parameters evolve,
  and the parts below count them alone (the base is frozen);
- masters, gradient, optimizer state: ``--update strategy``: a float32 master of each half-precision weight, a
  float32 ``.grad``, and the strategy's optimizer state (Adam: 8 bytes a parameter), measured on one parameter;
  ``--update sgd`` writes the update into the weights and holds none of them, ``--update adam`` two moments in the
  weights' dtype;
- starting weights: a copy of the weights, kept for ``--anchor``, ``kl``, ``--beta`` or a drift text;
- noise: the directions a block evaluates (``sgd``: the update draws every direction's at once), float32: low-rank
  factors of a matrix exactly, one value an entry for the other kinds (exact for IID Gaussian, an upper bound else);
- KV cache: the task's own count per direction (its cache, one layer's activations, the logits), times the block;
- workspace: the in-place update's slices (a few float32 tensors of ``SLICE`` entries) or the largest float32
  estimate of a weight that is not sliced; and, on the CPU, about 0.5 GiB of the interpreter, torch and transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ...layers.estimate import SLICE
from ...memory import free_memory, gib
from ...noise import BLOCK
from ..storage.tensor_file import DTYPES

RUNTIME_CPU = 1 << 29
"""The process itself on the CPU (the interpreter, torch, transformers, the tokenizer): about 0.5 GiB, measured as
plain inference's peak less its weights (BENCHMARKS.md, issue 54)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of each part of a run (see the module's docstring); ``chunk`` is the directions of a block, and
    ``evolving`` the parameters that evolve where a LoRA adapter is on the model (None: all of them)."""

    parameters: int
    weights: int
    masters: int
    grad: int
    optimizer: int
    start: int
    noise: int
    cache: int
    workspace: int
    runtime: int
    chunk: int
    evolving: int | None = None

    @property
    def total(self) -> int:
        return (self.weights + self.masters + self.grad + self.optimizer + self.start + self.noise + self.cache
                + self.workspace + self.runtime)

    def describe(self) -> str:
        """One line: the total, then each part that is not zero (:meth:`breakdown`)."""
        count = _count_text(self.parameters)
        if self.evolving is not None:
            count += f" parameters, {_count_text(self.evolving)} of them evolving in a LoRA adapter"
        else:
            count += " parameters"
        return f"memory plan: {_bytes(self.total)} for {count} ({self.breakdown()})"

    def breakdown(self) -> str:
        """Each part that is not zero, with its bytes."""
        parts = [("weights", self.weights), ("float32 masters", self.masters), (".grad", self.grad),
                 ("optimizer state", self.optimizer), ("starting weights", self.start),
                 (f"noise of {self.chunk} directions", self.noise),
                 (f"KV cache of {self.chunk} directions", self.cache), ("workspace", self.workspace),
                 ("runtime", self.runtime)]
        return ", ".join(f"{name} {_bytes(value)}" for name, value in parts if value)


def _count_text(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _bytes(n: int) -> str:
    """``n`` bytes in GiB, or in MiB below one GiB."""
    return gib(n) if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def tensor_shapes(directory: Path) -> list[tuple[tuple[int, ...], torch.dtype | None]]:
    """(shape, dtype) of every tensor of the directory's safetensors weights, read from the headers only (none where
    a header cannot be read)."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"] if (directory / "model.safetensors").is_file() else []
    shapes = []
    try:
        for name in files:
            with safe_open(str(directory / name), "pt") as f:
                for key in f.keys():
                    part = f.get_slice(key)
                    shapes.append((tuple(part.get_shape()), DTYPES.get(part.get_dtype())))
    except Exception:  # a damaged file: no plan, and the loader names what is wrong with it
        return []
    return shapes


def plan_run(cfg, directory: Path, task, device: torch.device,
             adapter: list[tuple[int, ...]] | None = None) -> MemoryPlan | None:
    """The plan of an ES run of the model in ``directory`` (None: no safetensors headers to read); ``adapter``: the
    shapes of a LoRA adapter's parameters on it, which alone evolve. With chunk "auto", the largest block that fits
    in the device's free memory (at least 1)."""
    floats = [(shape, dtype) for shape, dtype in tensor_shapes(directory) if dtype is not None
              and dtype.is_floating_point]
    if not floats:
        return None
    if cfg.dtype is not None:
        floats = [(shape, getattr(torch, cfg.dtype)) for shape, _ in floats]
    lora = [(shape, getattr(torch, cfg.dtype or "float32")) for shape in adapter or []]
    evolving = floats if adapter is None else lora
    numel = sum(_count(shape) for shape, _ in evolving)
    half = sum(_count(shape) for shape, dtype in evolving if dtype in (torch.float16, torch.bfloat16))
    weights = sum(_count(shape) * dtype.itemsize for shape, dtype in floats + lora)
    evolved = sum(_count(shape) * dtype.itemsize for shape, dtype in evolving)  # their bytes
    in_place, directions = cfg.update != "strategy", cfg.directions
    per_direction = sum(_noise(cfg, shape) for shape, _ in evolving)
    per_block = _task_bytes(task, directory, floats[0][1].itemsize, cfg.antithetic)
    fixed = dict(weights=weights, masters=0 if in_place else 4 * half,
                 grad=0 if in_place else 4 * numel,
                 optimizer=(2 * evolved if cfg.update == "adam" else 0) if in_place
                 else optimizer_bytes(cfg, numel) * numel,
                 start=evolved if _keeps_start(cfg, task) else 0,
                 workspace=_workspace(cfg, evolving, in_place), runtime=RUNTIME_CPU if device.type == "cpu" else 0)
    update_noise = per_direction * directions if in_place else 0  # the in-place update draws every direction
    chunk = directions if cfg.chunk_size in (None, "auto") else cfg.chunk_size
    free = free_memory(device) if cfg.chunk_size == "auto" else None
    if free is not None:
        drawn = 0 if in_place else per_direction * BLOCK  # a block is drawn whole (BLOCK directions), then sliced
        room = free - sum(fixed.values()) - update_noise - drawn
        chunk = max(1, min(directions, room // max(1, per_direction + per_block)))
    noise = max(update_noise, per_direction * min(directions, chunk + (0 if in_place else BLOCK)))
    total = sum(_count(shape) for shape, _ in floats + lora)
    return MemoryPlan(parameters=total, **fixed, noise=noise, cache=per_block * chunk, chunk=chunk,
                      evolving=None if adapter is None else numel)


def check_fits(plan: MemoryPlan, device: torch.device, where: str) -> None:
    """A ValueError, in one line, where the plan needs more than ``device`` has free, with what would help most."""
    free = free_memory(device)
    if free is None or plan.total <= free:
        return
    raise ValueError(f"{where} needs {gib(plan.total)} ({plan.breakdown()}) but {device} has {gib(free)} free; "
                     f"{_advice(plan, free)}")


def _advice(plan: MemoryPlan, free: int) -> str:
    """What would free the most of ``plan`` for a device with ``free`` bytes."""
    if plan.masters or plan.grad or plan.optimizer:
        return "--update sgd holds no masters, .grad or optimizer state"
    if plan.start:
        return "kl, --beta, --anchor and drift texts keep a copy of the starting weights: drop them"
    if plan.weights + plan.workspace + plan.runtime > free:
        return ("the weights alone do not fit: a device with more memory (a LoRA adapter, --use-peft, evolves less "
                "but holds the same base)")
    return "a smaller --population or --chunk-size (auto fits the block to the memory)"


def optimizer_bytes(cfg, parameters: int) -> int:
    """Bytes of the strategy's optimizer state per parameter (of ``parameters`` perturbed), measured by one step on
    a float32 parameter."""
    from ...options import arguments
    from ...strategies import STRATEGIES

    cls = STRATEGIES[cfg.strategy]
    of_population = {name: parameters for name in cls.population_options}  # num_perturbed: the one read today
    p = torch.nn.Parameter(torch.zeros(4))
    optimizer = cls(cfg.directions, cfg.antithetic, **of_population, **arguments(cfg.strategy_options)
                    ).make_optimizer([p], 1e-3)
    p.grad = torch.ones(4)
    optimizer.step()
    state = optimizer.state.get(p, {})
    return sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor)
               and v.shape == p.shape) // p.numel()


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def _noise(cfg, shape: tuple[int, ...]) -> int:
    """Float32 noise bytes of one direction of a tensor: low-rank factors for a matrix; else one value an entry (IID
    Gaussian's; the other structured kinds hold less: an upper bound)."""
    if len(shape) == 2 and cfg.layer == "lowrank":
        return 4 * int(cfg.layer_options.get("rank", 1)) * (shape[0] + shape[1])
    return 4 * _count(shape)


def _task_bytes(task, directory: Path, size: int, antithetic: bool) -> int:
    """The task's bytes per direction beyond the noise (its KV cache), from the directory's config."""
    if not hasattr(task, "activation_bytes_of"):
        return 0
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    return int(task.activation_bytes_of(getattr(config, "text_config", None) or config, size, antithetic))


def _keeps_start(cfg, task) -> bool:
    from ...tasks.protocol import ComparesToStart

    return bool(cfg.anchor) or (isinstance(task, ComparesToStart) and task.wants_start)


def _workspace(cfg, floats, in_place: bool) -> int:
    """The update's temporaries: in place, a few float32 slices; else the float32 estimate of the largest weight."""
    largest = max((_count(shape) for shape, _ in floats), default=0)
    if in_place:
        return 6 * 4 * min(SLICE, largest) + (4 * largest if cfg.layer != "lowrank" else 0)
    return 4 * largest


__all__ = ["MemoryPlan", "check_fits", "optimizer_bytes", "plan_run", "tensor_shapes"]
