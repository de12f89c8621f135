"""The built-in reward tasks for language models, ``arithmetic`` and ``countdown``: problems generated offline
(:mod:`nesgpu.tasks.verifiers`), the model and tokenizer from a local Hugging Face directory
(``--model hf:DIR``; the hub is never contacted), the fine-tuned model saved back with ``save_pretrained``."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..files import read_json
from ..options import check_options, option
from .adapters import (ADAPTER_CONFIG, LORA_ALPHA, LORA_R, Lora, adapter_config, base_directory, evolving_shapes,
                       is_peft, lora_of, read_adapter, settled, tokenizer_directory, with_adapter, with_lora)
from .divergence import read_texts
from .engine_generation import ENGINES, check_engine
from .generation import FITNESSES, GenerationTask
from .generation_checks import MAX_EVAL_GENERATIONS, unreadable
from .generation_config import generation_config_error
from .spec import MAX_COUNT, TaskContext, TaskSpec
from .verifiers import arithmetic_problems, arithmetic_reward, countdown_problems, countdown_reward, rewards_of

HF = "hf:"
TRAIN_PROBLEMS, HELD_OUT = 4000, 200  # the train split and the held-out split, each from its own seed


def hf_directory(model: str | None) -> Path:
    """The directory of ``hf:DIR``: a local ``from_pretrained`` directory (its config.json is checked), or a PEFT
    adapter directory (its adapter_config.json, and the local base model directory it names)."""
    if not model or not model.startswith(HF) or len(model) == len(HF):
        raise ValueError(f"the language-model tasks need --model hf:DIR, a local Hugging Face model directory; got "
                         f"{model!r}")
    try:
        directory = Path(model[len(HF):]).expanduser()
    except RuntimeError as e:  # ~nobody: no such user
        raise ValueError(f"--model {model}: {e}") from e
    if read_adapter(directory) is not None:  # checked; its base model directory is checked as any other
        refuse_remote_code(directory)
        hf_directory(HF + str(base_directory(directory)))
        return directory
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} is not a Hugging Face model directory (no config.json); expected what "
                         f"save_pretrained writes")
    try:
        read_json(directory / "config.json")
    except (OSError, ValueError) as e:
        raise ValueError(f"{directory / 'config.json'} cannot be read as JSON ({e}); expected what save_pretrained "
                         f"writes") from e
    refuse_remote_code(directory)
    return directory


CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
"""The files of a model directory whose ``auto_map`` would have transformers import the directory's Python."""


def refuse_remote_code(directory: Path) -> None:
    """A model directory is data: refuse one whose configs name Python files of its own (``auto_map``), which
    transformers would import (asking on a terminal first) if trusted; nesgpu never runs them."""
    for name in CODE_CONFIGS:
        if not os.path.lexists(directory / name):
            continue
        try:  # as data: a FIFO or a device is refused, not read (transformers would block on it or never end)
            config = read_json(directory / name)
        except OSError:  # unreadable: not code (the model's loading names it)
            continue
        except ValueError as e:
            raise ValueError(f"{e}; expected what save_pretrained writes") from e
        if isinstance(config, dict) and "auto_map" in config:  # any value, empty or nested: transformers reads it
            auto_map = config["auto_map"]
            raise ValueError(f"{directory / name} has an auto_map that names code in the model directory "
                             f"({', '.join(_code_files(auto_map)) or repr(auto_map)[:80]}); nesgpu never runs a model "
                             f"directory's code: use a model transformers implements itself (or remove auto_map "
                             f"where its model_type is one transformers has)")


def _code_files(auto_map) -> list[str]:
    """The Python files an ``auto_map`` names: {"AutoModelForCausalLM": "modeling_x.XForCausalLM", ...}, a
    tokenizer's as a [slow, fast] pair, a hub reference as "repo--module.Class"."""
    names, values = [], [auto_map]
    while values:  # every string in it, however nested
        value = values.pop()
        if isinstance(value, (dict, list)):
            values.extend(value.values() if isinstance(value, dict) else value)
        elif isinstance(value, str) and "." in value:
            names.append(value)
    return sorted({f"{v.split('--')[-1].rpartition('.')[0]}.py" for v in names})


SHARD = "256MB"
"""The shards of a saved model: ``save_pretrained`` builds each shard's file in memory before writing it, so a larger
shard is a larger copy of the model at the end of a run (a tensor larger than this is a shard of its own)."""


def load_causal_lm(directory: Path, **options) -> nn.Module:
    """The causal LM of a local directory, in eval mode, with the parameters its architecture keeps fixed
    frozen again (``from_pretrained`` makes every parameter trainable: RoFormer's sinusoidal table). A PEFT adapter
    directory: its base model with the adapter on it, the base frozen."""
    import torch

    adapter = read_adapter(directory)
    if adapter is not None:
        refuse_remote_code(directory)
        return with_adapter(load_causal_lm(adapter.base, **options), adapter)
    refuse_remote_code(directory)
    try:
        model, info = _causal_lm_class(directory).from_pretrained(directory, local_files_only=True,
                                                                   trust_remote_code=False,
                                                                   output_loading_info=True, **options)
    except Exception as e:  # a truncated or garbage weights file, a pickle that is no tensor: its loader's words
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(generation_config_error(directory) or f"{directory} holds no causal language model "
                         f"transformers can load ({type(e).__name__}: {first})") from e
    for what, names in (("has no weights for", info.get("missing_keys")),
                        ("has weights the config has no place for:", info.get("unexpected_keys")),
                        ("has weights of another shape for", info.get("mismatched_keys"))):
        if names:  # transformers would initialise them at random (or drop them) with a log line only
            names = sorted(str(n if isinstance(n, str) else n[0]) for n in names)
            raise ValueError(f"{directory}: the checkpoint {what} {names[:3]}{' ...' if len(names) > 3 else ''} "
                             f"({len(names)} tensors); its config.json does not describe these weights")
    model.eval()
    with torch.device("meta"):  # the architecture's own model, without memory or initialisation
        fresh = type(model)(model.config)
    fixed = {n for n, p in fresh.named_parameters() if not p.requires_grad}
    for name, p in model.named_parameters():
        if name in fixed:
            p.requires_grad_(False)
    return model


def _causal_lm_class(directory: Path):
    """``AutoModelForCausalLM`` where its table maps the directory's config type; else (Emu3's and Mllama's text
    models) the transformers class config.json names in ``architectures``."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return transformers.AutoModelForCausalLM
    named = [getattr(transformers, a, None) for a in getattr(config, "architectures", None) or []]
    cls = next((c for c in named if isinstance(c, type) and issubclass(c, transformers.PreTrainedModel)
                and c.__name__.endswith("ForCausalLM")), None)
    if cls is None:
        raise ValueError(f"its config type {type(config).__name__} is not one AutoModelForCausalLM maps, and "
                         f"config.json names no transformers ...ForCausalLM class in 'architectures'")
    return cls


def _context(directory: Path) -> int | None:
    """The model's context in tokens, from its config (no weights loaded); None where it has none."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(base_directory(directory), local_files_only=True,
                                                         trust_remote_code=False)
    except (OSError, ValueError, KeyError):  # named when the model itself loads
        return None
    context = getattr(config, "max_position_embeddings", None)
    return context if isinstance(context, int) else None


def load_tokenizer(directory: Path):
    """The directory's tokenizer, with a pad token (its eos token when it has none); an adapter saved without a
    tokenizer: its base model's."""
    from transformers import AutoTokenizer

    directory = tokenizer_directory(directory)
    refuse_remote_code(directory)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"{directory} has no tokenizer that transformers can load ({e})") from e
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_vocabulary(tokenizer, lm: nn.Module, directory: Path) -> None:
    """Refuse a tokenizer with more tokens than the model's embedding has rows: its ids past the table would
    fail deep inside the embedding."""
    rows = lm.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(f"the tokenizer in {directory} has {len(tokenizer)} tokens, but the model's embedding has "
                         f"{rows} rows; use the tokenizer the model was trained with")


class PretrainedGenerationTask(GenerationTask):
    """A :class:`GenerationTask` whose model is a local Hugging Face directory: :meth:`make_model` loads it
    and :meth:`save` writes the trained one beside the run's weights, loadable by ``from_pretrained``. With
    ``lora`` (``--use-peft``) or an adapter directory, the model is a PEFT model whose adapter alone evolves, and
    :meth:`save` writes the adapter (``adapter_config.json`` naming the base directory)."""

    def __init__(self, directory: Path, dtype: str | None = None, tokenizer=None, lora: Lora | None = None,
                 engine: str = "hf", **options):
        self.directory, self.dtype, self.lora = directory, dtype, lora
        self.base = base_directory(directory)
        if lora is not None and self.base != directory:
            raise ValueError(f"--use-peft puts a new LoRA adapter on a model; {directory} is a PEFT adapter already "
                             f"({ADAPTER_CONFIG}), whose own adapter a run trains: drop --use-peft")
        super().__init__(tokenizer=load_tokenizer(directory) if tokenizer is None else tokenizer, **options)
        self.engine, self.engine_model = check_engine(engine, self.fitness_kind, self.compile), directory
        if engine == "vllm" and (lora is not None or self.base != directory):
            raise ValueError("--engine vllm serves each member as a LoRA adapter of the model; a run that evolves a "
                             "LoRA adapter (--use-peft, or a PEFT directory) has no such members: use --engine hf")
        self.check_context(_context(directory))  # from config.json: before the weights load (a minute, for 1B)
        unknown = unreadable(self.tokenizer, self.prompts, "training prompts")
        if unknown:
            warnings.warn(unknown, stacklevel=2)

    def make_model(self, hidden, model: str) -> nn.Module:
        lm = load_causal_lm(self.directory, dtype=self.dtype or "auto")
        if self.lora is not None:
            lm = with_lora(lm, self.lora.config(), self.base, self.directory)
        check_vocabulary(self.tokenizer, lm, self.directory)
        return lm

    def save(self, model: nn.Module, directory: Path) -> None:
        """``model`` and the tokenizer in ``directory`` (save_pretrained), for ``from_pretrained``; a PEFT model's
        adapter, for ``PeftModel.from_pretrained`` over its base (and ``--model hf:DIR``)."""
        if is_peft(model):
            model.save_pretrained(directory)
        else:
            model.save_pretrained(directory, max_shard_size=SHARD)  # safetensors holds a shard's bytes in memory
        self.tokenizer.save_pretrained(directory)

    def adapter_shapes(self) -> list[tuple[int, ...]] | None:
        """The shapes of the parameters that evolve where an adapter is on the model (None: a full fine-tune), from
        the configs alone: the model is built on the meta device."""
        adapter = read_adapter(self.directory)
        if adapter is None and self.lora is None:
            return None
        import torch
        import transformers

        config = transformers.AutoConfig.from_pretrained(self.base, local_files_only=True, trust_remote_code=False)
        cls = _causal_lm_class(self.base)
        with torch.device("meta"):
            model = cls.from_config(config) if cls is transformers.AutoModelForCausalLM else cls(config)
        return evolving_shapes(model, self.lora.config() if adapter is None else adapter_config(adapter),
                               self.directory)


def splits(problems) -> tuple[list[str], list[str]]:
    """(train prompts, held-out prompts) of a problem generator: ``TRAIN_PROBLEMS`` drawn with seed 0, and
    ``HELD_OUT`` drawn with seed 1 that are not among them."""
    train = [p for p, _ in problems(TRAIN_PROBLEMS, seed=0)]
    seen = set(train)
    return train, [p for p, _ in problems(4 * HELD_OUT, seed=1) if p not in seen][:HELD_OUT]


def measures(options: PromptOptions) -> dict:
    """The task's options of what it measures beside its reward (kl, pass@k, drift) and the KL penalty (beta), the
    drift texts read now: a mistake in the file is named before the model loads."""
    texts = None if options.drift_text is None else read_texts(options.drift_text)
    return dict(kl=options.kl, eval_generations=options.eval_generations, drift_texts=texts, beta=options.beta)


def _maker(problems, verifier, max_new_tokens: int):
    def make(name: str, where: TaskContext, options: PromptOptions) -> PretrainedGenerationTask:
        train, held_out = splits(problems)
        return PretrainedGenerationTask(hf_directory(where.model), where.dtype, lora=lora_of(options),
                                        engine=options.engine, prompts=train,
                                        eval_prompts=held_out, reward=rewards_of(verifier),
                                        max_new_tokens=max_new_tokens, prompts_per_step=options.batch_size,
                                        temperature=options.temperature, generations=options.generations,
                                        fitness=options.fitness, seed=where.seed, name=name,
                                        compile=where.compile, **measures(options))
    return make


@dataclass(frozen=True)
class PromptOptions:
    """The options of a reward task over a pretrained language model (``--task generation`` has these too)."""

    batch_size: int = option(8, "prompts per step", at_least=1, at_most=MAX_COUNT, defines=True)
    temperature: float = option(0.0, "0: greedy completions; above: sampled at this temperature", at_least=0)
    generations: int = option(1, "completions per prompt, their mean reward the fitness (above 1 needs "
                                 "--temperature)", at_least=1, at_most=MAX_COUNT)
    fitness: str = option("reward", "reward: each member's reward on its completions; likelihood: its expected "
                                    "reward on sampled ones (no population generate)", choices=FITNESSES)
    kl: bool = option(False, "log kl and eval_kl: TRL's per-token KL from the start (a copy of the start)")
    beta: float = option(0.0, "TRL's KL penalty: fitness = reward - beta x each member's KL from the start (0: off)",
                         at_least=0, defines=True)
    eval_generations: int = option(0, f"K > 0: sample K completions per held-out prompt: eval_pass@K (K at most "
                                      f"{MAX_EVAL_GENERATIONS})", at_least=0, at_most=MAX_EVAL_GENERATIONS)
    drift_text: str | None = option(None, "a file of texts (lines, or JSON lines with 'text'): each evaluation "
                                          "logs their NLL per token, drift_nll, and its change")
    # LoRA (TRL's ModelConfig names and defaults; see nesgpu.tasks.adapters): recorded, so resume and eval rebuild it
    use_peft: bool = option(False, "evolve a LoRA adapter; base frozen (default off)", defines=True)
    lora_r: int | None = option(None, f"with --use-peft: its rank (default {LORA_R}, TRL's)", at_least=1,
                                at_most=MAX_COUNT, defines=True)
    lora_alpha: int | None = option(None, f"its update scales by alpha / r (default {LORA_ALPHA}, TRL's)", at_least=1,
                                    at_most=MAX_COUNT, defines=True)
    lora_target_modules: str | None = option(None, "q_proj,v_proj or all-linear (default: PEFT's table)",
                                             defines=True)
    lora_dropout: float = option(0.0, "must be 0: ES scores in eval mode (default: 0.0)", at_least=0)
    engine: str = option("hf", "where the population generates: hf (transformers' generate) or vllm (one vLLM "
                               "engine; with --layer lowrank --evolve matrices every member a LoRA adapter, else "
                               "one member at a time)", choices=ENGINES)

    def __post_init__(self):
        check_options(self, "reward task")

    def for_run(self, strategy, hidden) -> PromptOptions:
        """The options a run records: with ``use_peft``, the LoRA defaults filled in (see adapters.settled)."""
        return settled(self)


# fine-tuning a pretrained small model (OpenAI-ES on low-rank noise, plain SGD written into the weights: the memory
# of inference, issue 54); sigma from the model's own response (nesgpu.probe) and lr from sigma
# (InPlaceSGD.lr_for_sigma), decaying as 1 / sqrt(step) after 100 steps: no fixed sigma holds across models, and a
# constant lr that suits 100 steps unlearns over 2,000 (BENCHMARKS.md, issue 43); batch_size = prompts per step
DEFAULTS = dict(population=32, sigma="auto", lr="auto", lr_schedule="rsqrt", steps=1000, hidden=(), batch_size=8,
                update="sgd")
TASKS = {
    "arithmetic": TaskSpec(_maker(arithmetic_problems, arithmetic_reward, 6), DEFAULTS, models=("hf:DIR",),
                           model_prefix=HF, options=PromptOptions),
    "countdown": TaskSpec(_maker(countdown_problems, countdown_reward, 16), DEFAULTS, models=("hf:DIR",),
                          model_prefix=HF, options=PromptOptions),
}

__all__ = ["DEFAULTS", "HF", "PretrainedGenerationTask", "TASKS", "check_vocabulary", "hf_directory", "load_causal_lm",
           "load_tokenizer", "measures", "splits"]
