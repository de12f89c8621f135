"""LoRA adapters over a local Hugging Face model, with PEFT: ``--use-peft`` puts a new adapter on the model (TRL's
``--use_peft``, with TRL's defaults), and ``--model hf:DIR`` takes a PEFT adapter directory (``adapter_config.json``
naming a local base model, ``adapter_model.safetensors``). Either way the base is frozen and only the adapter evolves.
An adapter directory is data: nothing downloads, no pickle loads, no module its config names is imported."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..files import read_mapping

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PICKLED_WEIGHTS = "adapter_model.bin"
LORA_R, LORA_ALPHA = 16, 32  # TRL's ModelConfig defaults (its lora_dropout, 0.05, does nothing here: see check_lora)
MAX_CONFIG = 1 << 20  # bytes of an adapter_config.json (PEFT's are about 1 KB)
LORA_OPTIONS = ("lora_r", "lora_alpha", "lora_target_modules")


@dataclass(frozen=True)
class Lora:
    """A new adapter's settings (``--use-peft``): rank, alpha (the update is scaled by alpha / r) and the modules it
    wraps (comma-separated names, ``all-linear``, or None: PEFT's for the architecture, as TRL leaves it)."""

    r: int = LORA_R
    alpha: int = LORA_ALPHA
    target_modules: str | None = None

    def config(self):
        """The PEFT ``LoraConfig``: no dropout (see :func:`check_lora`), the causal-LM task type."""
        import peft

        return peft.LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                               target_modules=targets(self.target_modules))


def targets(text: str | None) -> list[str] | str | None:
    """``--lora-target-modules``: "q_proj,v_proj" as a list, "all-linear" as it is, None as it is."""
    if text is None or text == "all-linear":
        return text
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise ValueError(f"lora_target_modules must be module names, comma-separated (q_proj,v_proj), or all-linear; "
                         f"got {text!r}")
    return names


def check_lora(options) -> None:
    """The LoRA options of a task's ``options`` (a ValueError names the option): rank, alpha and target modules apply
    with ``use_peft``; dropout must stay 0, for ES scores every member in eval mode, where dropout does nothing (in
    train mode it would make each member's reward noisy)."""
    if options.lora_dropout:
        raise ValueError(f"option 'lora_dropout' (= {options.lora_dropout}) must be 0: ES scores every member in eval "
                         f"mode, where dropout does nothing (and in train mode it would make each member's reward "
                         f"noisy); drop --lora-dropout")
    given = [name for name in LORA_OPTIONS if getattr(options, name) is not None]
    if given and not options.use_peft:
        raise ValueError(f"option {given[0]!r} (= {getattr(options, given[0])!r}) applies with --use-peft (a new "
                         f"LoRA adapter over the frozen model); add --use-peft or drop it")
    targets(options.lora_target_modules)


def settled(options):
    """``options`` with the LoRA defaults of a ``use_peft`` run filled in (TRL's rank 16 and alpha 32), checked: what
    a run records, so that a resume or an evaluation builds the same adapter."""
    check_lora(options)
    if not options.use_peft:
        return options
    return dataclasses.replace(options, lora_r=options.lora_r or LORA_R, lora_alpha=options.lora_alpha or LORA_ALPHA)


def lora_of(options) -> Lora | None:
    """The new adapter a task's ``options`` ask for (None: no ``use_peft``)."""
    options = settled(options)
    return Lora(options.lora_r, options.lora_alpha, options.lora_target_modules) if options.use_peft else None


@dataclass(frozen=True)
class Adapter:
    """A PEFT LoRA adapter directory: where it is, the local base model directory its config names, its config."""

    directory: Path
    base: Path
    config: dict


def read_adapter(directory: Path) -> Adapter | None:
    """The adapter in ``directory`` (None: it has no adapter_config.json), checked: a LoRA adapter of a local base
    model whose weights are safetensors, and a config that names no code."""
    file = directory / ADAPTER_CONFIG
    if not file.exists():
        return None
    config = read_mapping(file, "what PEFT's save_pretrained writes", MAX_CONFIG)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{file}: peft_type {config.get('peft_type')!r}; nesgpu trains LoRA adapters (peft_type "
                         f"LORA)")
    if config.get("megatron_config") is not None:  # PEFT imports the module megatron_core names
        raise ValueError(f"{file} has a megatron_config, which has PEFT import the module megatron_core names; nesgpu "
                         f"never runs code an adapter directory names: remove megatron_config")
    weights = directory / ADAPTER_WEIGHTS
    if not weights.is_file():
        if (directory / PICKLED_WEIGHTS).exists():
            raise ValueError(f"{directory / PICKLED_WEIGHTS} is a pickle, which nesgpu never loads (unpickling can run "
                             f"code); save the adapter as {ADAPTER_WEIGHTS} (PEFT's save_pretrained does by default)")
        raise ValueError(f"{directory} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}; expected what PEFT's "
                         f"save_pretrained writes")
    return Adapter(directory, _base(file, config.get("base_model_name_or_path")), config)


def _base(file: Path, name) -> Path:
    """The local base model directory an adapter's config names (a path, absolute or from the working directory)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{file}: base_model_name_or_path is {name!r}; set it to the base model's local directory")
    base = Path(name).expanduser()
    if (base / ADAPTER_CONFIG).exists():
        raise ValueError(f"{file}: base_model_name_or_path {name!r} is an adapter itself; name the base model's "
                         f"directory")
    if not (base / "config.json").is_file():
        raise ValueError(f"{file}: base_model_name_or_path {name!r} is not a local model directory (no config.json "
                         f"there) and nesgpu downloads nothing; download the base model and set "
                         f"base_model_name_or_path in {file} to its directory")
    return base


def tokenizer_directory(directory: Path) -> Path:
    """Where a model's tokenizer is: an adapter directory's own, else (none saved with it) its base model's."""
    adapter = read_adapter(directory)
    if adapter is None or (directory / "tokenizer_config.json").is_file():
        return directory
    return adapter.base


def base_directory(directory: Path) -> Path:
    """The model directory behind ``directory``: an adapter's base, else ``directory`` itself."""
    adapter = read_adapter(directory)
    return directory if adapter is None else adapter.base


def adapter_config(adapter: Adapter):
    """The adapter's ``LoraConfig`` to load its weights into: trainable, initialised plainly (the weights replace it;
    PiSSA-like inits would rewrite the base), the fields this PEFT does not know left out."""
    import peft

    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    values = {k: v for k, v in adapter.config.items() if k in known and k not in ("peft_type", "auto_mapping")}
    values.update(inference_mode=False, init_lora_weights=True, base_model_name_or_path=str(adapter.base))
    try:
        return peft.LoraConfig(**values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{adapter.directory / ADAPTER_CONFIG}: PEFT refuses it ({_line(e)})") from e


def with_lora(model: nn.Module, config, base: Path, source: Path) -> nn.Module:
    """``model`` with a LoRA adapter of ``config`` (PEFT freezes the base), its config naming the local ``base``."""
    lora = _peft_model(model, config, source)
    lora.peft_config["default"].base_model_name_or_path = str(base.resolve())
    return lora


def _peft_model(model: nn.Module, config, source: Path) -> nn.Module:
    import peft

    linear = sorted({name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
    try:
        return peft.get_peft_model(model, config)
    except ValueError as e:  # target modules the model lacks, or none known for its architecture
        raise ValueError(f"LoRA over {source}: {_line(e)} (its Linear layers: {', '.join(linear) or 'none'}; "
                         f"--lora-target-modules names them, comma-separated, or all-linear)") from e


def with_adapter(model: nn.Module, adapter: Adapter) -> nn.Module:
    """``model`` (the adapter's base) with the adapter's trained weights; a file whose tensors do not fill the
    adapter exactly is refused, not left at PEFT's initialisation."""
    import peft
    from safetensors.torch import load_file

    lora = with_lora(model, adapter_config(adapter), adapter.base, adapter.directory)
    weights = adapter.directory / ADAPTER_WEIGHTS
    try:
        result = peft.set_peft_model_state_dict(lora, load_file(str(weights)))
    except Exception as e:  # a damaged file, a tensor of another shape: the loader's words, in one line
        raise ValueError(f"{weights} cannot be loaded into the adapter {ADAPTER_CONFIG} describes "
                         f"({type(e).__name__}: {_line(e)})") from e
    own = {name for name, p in lora.named_parameters() if p.requires_grad}
    missing = sorted(own & set(result.missing_keys))
    wrong = sorted(result.unexpected_keys)
    if missing or wrong:
        names = missing or wrong
        raise ValueError(f"{weights} {'has no weights for' if missing else 'has weights the adapter has no place for:'}"
                         f" {names[:3]}{' ...' if len(names) > 3 else ''} ({len(names)} tensors); its "
                         f"{ADAPTER_CONFIG} does not describe these weights")
    return lora


def evolving_shapes(model: nn.Module, config, source: Path) -> list[tuple[int, ...]]:
    """The shapes of the parameters that evolve once a LoRA adapter of ``config`` is on ``model`` (a model on the
    meta device: no memory)."""
    lora = _peft_model(model, copy.deepcopy(config), source)
    return [tuple(p.shape) for p in lora.parameters() if p.requires_grad]


def is_peft(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT model (its ``save_pretrained`` writes the adapter only)."""
    try:
        import peft
    except ImportError:
        return False
    return isinstance(model, peft.PeftModel)


def _line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "Adapter", "LORA_ALPHA", "LORA_R", "Lora", "adapter_config",
           "base_directory", "check_lora", "evolving_shapes", "is_peft", "lora_of", "read_adapter", "settled",
           "tokenizer_directory", "with_adapter", "with_lora"]
