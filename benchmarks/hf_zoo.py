"""A zoo of tiny random-init Hugging Face causal language models: one for every model type that
``transformers.AutoModelForCausalLM`` knows, each with a few hundred thousand parameters.

- :func:`causal_lm_types` lists the types.
- :func:`small_config` builds a type's own config class with its sizes shrunk: a table of
  key -> small value applied where the config has the key, per-layer lists cut down to the new layer
  count, nested sub-configs shrunk the same way, and a few per-family overrides.
- :func:`build_small` builds the model (float32, eval mode, every parameter moved off its init) or says
  in one line why it cannot be built small.
- :func:`example_inputs` makes a left-padded batch of token ids for it.

transformers is imported lazily: this module imports without it.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
from typing import Any

import torch
from torch import nn

from hf_zoo_sizes import (
    BOS_ID,
    CODEBOOK_ROWS,
    DROPOUT_PARTS,
    EOS_ID,
    FILL_WHEN_NONE,
    FLAGS,
    KV_HEAD_KEYS,
    LAYER_COUNT_KEYS,
    MAX_LAYERS,
    MAX_PARAMETERS,
    OVERRIDES,
    PAD_ID,
    SIZES,
    SPECIAL_RESERVED,
    TIED_SIZES,
    VOCAB,
)


def causal_lm_types() -> list[str]:
    """The model types ``transformers.AutoModelForCausalLM`` can build, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _field_names(cls) -> set[str]:
    """The constructor keys of a config class: its dataclass fields, or its attributes when it is no dataclass."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(vars(cls()).keys())


def _get(config, key: str, default: Any = None) -> Any:
    """``config.key``, read past the per-layer guard of heterogeneous configs; ``default`` when it is missing."""
    getter = getattr(config, "_getattr_without_heterogeneous_validation", None)
    return getter(key, default) if getter is not None else getattr(config, key, default)


def _is_dropout(key: str, value: Any) -> bool:
    """Whether ``key`` names a probability that should be 0 in the small model."""
    return isinstance(value, float) and any(part in key for part in DROPOUT_PARTS)


def _token_ids(fields: set[str], config) -> dict[str, Any]:
    """pad / bos / eos at 0 / 1 / 2; every other ``*_token_id`` / ``*_token_index`` in the reserved top ids."""
    out: dict[str, Any] = {}
    fixed = {"pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
             "decoder_start_token_id": EOS_ID, "forced_eos_token_id": EOS_ID, "forced_bos_token_id": BOS_ID}
    reserved = iter(range(VOCAB - 1, VOCAB - 1 - SPECIAL_RESERVED, -1))
    for key in sorted(fields):
        if key in fixed:
            out[key] = fixed[key] if _get(config, key) is not None or key == "pad_token_id" else None
        elif key.endswith(("_token_id", "_token_index")) and isinstance(_get(config, key), int):
            out[key] = next(reserved)
    return out


def _layer_count(config) -> int | None:
    """The number of layers of a full-size config, from the first layer-count key it has."""
    for key in LAYER_COUNT_KEYS:
        value = _get(config, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _is_index_list(value: list, n: int) -> bool:
    """Whether ``value`` lists layer indices (strictly increasing ints below ``n``) rather than one entry per layer."""
    return (all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and all(0 <= v < n for v in value) and all(a < b for a, b in itertools.pairwise(value)))


def _per_layer_lists(fields: set[str], config, n: int) -> tuple[dict[str, list], dict[str, list]]:
    """The config's list-valued fields that describe layers: (one entry per layer, layer-index lists)."""
    per_layer, indices = {}, {}
    for key in sorted(fields):
        value = _get(config, key)
        if not isinstance(value, (list, tuple)) or not value:
            continue
        if _is_index_list(list(value), n) and (len(value) != n or key.endswith(("layers", "idxs", "ids"))):
            indices[key] = list(value)
        elif len(value) == n:
            per_layer[key] = list(value)
    return per_layer, indices


def _kept_layers(per_layer: dict[str, list], indices: dict[str, list], n: int) -> list[int]:
    """Which full-size layers to keep: the first of each distinct joint layer kind (2 to MAX_LAYERS of them)."""
    def kind(i):
        return tuple(str(v[i]) for v in per_layer.values()) + tuple(i in v for v in indices.values())
    kept, seen = [], set()
    for i in range(n):
        if kind(i) not in seen and len(kept) < MAX_LAYERS:
            seen.add(kind(i))
            kept.append(i)
    for i in range(n):
        if len(kept) >= 2:
            break
        if i not in kept:
            kept.append(i)
    return sorted(kept)


def _layer_kwargs(fields: set[str], config) -> dict[str, Any]:
    """The layer count and the per-layer lists of a config cut down to the layers :func:`_kept_layers` keeps."""
    n = _layer_count(config)
    if n is None:
        return {}
    per_layer, indices = _per_layer_lists(fields, config, n)
    kept = _kept_layers(per_layer, indices, n)
    out: dict[str, Any] = {key: len(kept) for key in LAYER_COUNT_KEYS if key in fields
                           and isinstance(_get(config, key), int)}
    for key, value in per_layer.items():
        small = SIZES.get(key)
        out[key] = [small if small is not None else value[i] for i in kept]
    for key, value in indices.items():
        out[key] = [new for new, old in enumerate(kept) if old in value]
    return out


def _kv_heads(config, key: str) -> int:
    """The small count for KV-head key ``key`` that keeps the config's attention style: one KV head (MQA) stays
    one, as many as the query heads (MHA, and every latent-attention config) stays as many, fewer (GQA) is 2."""
    heads, kv = _get(config, "num_attention_heads"), _get(config, key)
    if kv == 1:
        return 1
    if isinstance(heads, int) and isinstance(kv, int) and kv < heads:
        return SIZES[key]
    return SIZES["num_attention_heads"]


def _size_kwargs(config, fields: set[str]) -> dict[str, Any]:
    """The :data:`SIZES` values for the keys the config has (directly or through its attribute_map) and does not
    leave None (None often switches a feature off), except the :data:`FILL_WHEN_NONE` keys."""
    aliases = {alias: target for alias, target in getattr(type(config), "attribute_map", {}).items()
               if target in fields}
    derived = _derived_fields(config)
    out: dict[str, Any] = {}
    for key, small in SIZES.items():
        target = key if key in fields else aliases.get(key)
        value = _get(config, target) if target else None
        if target is None or target in derived or isinstance(value, (bool, list, tuple, dict)):
            continue
        if value is not None or target in FILL_WHEN_NONE:
            out[target] = _kv_heads(config, target) if key in KV_HEAD_KEYS else small
    for key, source in TIED_SIZES:
        if key in out and source in out and _get(config, key) == _get(config, source):
            out[key] = out[source]
    return out


def _derived_fields(config) -> set[str]:
    """The fields that default to None and that the config's ``__post_init__`` filled in from other fields (such as
    ``head_dim = hidden_size // num_attention_heads``): left out, they are derived again from the small sizes."""
    if not dataclasses.is_dataclass(config):
        return set()
    return {f.name for f in dataclasses.fields(config) if f.default is None and f.default_factory is dataclasses.MISSING
            and _get(config, f.name) is not None}


def _small_kwargs(config, model_type: str | None = None) -> dict[str, Any]:
    """The constructor kwargs that shrink ``config`` (sub-configs included, as dicts) to a tiny model."""
    cls = type(config)
    fields = _field_names(cls)
    out = _size_kwargs(config, fields)
    for key in fields:
        if _is_dropout(key, _get(config, key)):
            out[key] = 0.0
    out.update({key: value for key, value in FLAGS.items() if key in fields})
    out.update(_token_ids(fields, config))
    out.update(_layer_kwargs(fields, config))
    for key in getattr(cls, "sub_configs", {}) or {}:
        sub = _get(config, key)
        if sub is not None and hasattr(sub, "to_dict"):
            own = (_field_names(type(sub)) | {"model_type"}) - _derived_fields(sub)
            out[key] = {**{k: v for k, v in sub.to_dict().items() if k in own}, **_small_kwargs(sub)}
    for key, value in OVERRIDES.get(model_type or getattr(config, "model_type", ""), {}).items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) and key in out else value
    return out


def _config_class(model_type: str):
    """The config class transformers registers for ``model_type``."""
    from transformers import CONFIG_MAPPING
    if model_type not in CONFIG_MAPPING:
        raise KeyError(f"expected a model type that transformers knows; got {model_type!r}")
    return CONFIG_MAPPING[model_type]


def small_config(model_type: str):
    """``model_type``'s own config class with every size shrunk: a model of a few hundred thousand parameters.

    Built from kwargs (the config validates them together in its ``__init__``); when that fails, the
    defaults are built and the small values set on them afterwards.
    """
    cls = _config_class(model_type)
    try:
        default = cls()
    except Exception:  # a few types' defaults are invalid without their per-family fix
        default = cls(**OVERRIDES.get(model_type, {}))
    kwargs = _small_kwargs(default, model_type)
    try:
        return cls(**kwargs)
    except Exception as first_error:  # some configs only accept the values one at a time
        config = copy.deepcopy(default)
        for key, value in kwargs.items():
            sub = _get(config, key)
            if isinstance(value, dict) and sub is not None and hasattr(sub, "to_dict"):
                value = type(sub)(**value)
            try:
                setattr(config, key, value)
            except Exception:
                raise first_error from None
        return config


def _reason(error: BaseException) -> str:
    """One line that says why a model could not be built: an optional package it needs, or the exception."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines[0] if lines else "")
    if isinstance(error, ImportError):
        named = re.search(r"requires the (\S+) library", text)
        package = getattr(error, "name", None) or (named.group(1) if named else text)
        return f"needs an optional package: {package}"
    return f"{type(error).__name__}: {text[:200]}"


def _perturb(model: nn.Module) -> None:
    """Moves every parameter by ``0.1 * randn_like``, so that norms at one and biases at zero matter."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))


def _causal_lm_config(config):
    """The config the causal-LM class of ``config`` declares: ``config`` itself, or the sub-config of that class
    that a composite config holds (musicgen's causal LM is its decoder alone)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    wanted = getattr(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    for key in getattr(type(config), "sub_configs", {}) or {}:
        if isinstance(_get(config, key), wanted):
            return _get(config, key)
    return config


def build_small(model_type: str, seed: int = 0) -> tuple[nn.Module | None, str]:
    """A tiny random ``AutoModelForCausalLM`` of ``model_type`` in float32 and eval mode, with every parameter
    perturbed. Returns (model, "") or (None, a one-line reason it cannot be built small)."""
    try:
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
        full = small_config(model_type)
        config = _causal_lm_config(full)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if config is full:
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            else:
                model = MODEL_FOR_CAUSAL_LM_MAPPING[type(full)]._from_config(config, dtype=torch.float32)
            _perturb(model)
    except Exception as error:
        return None, _reason(error)
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMETERS:
        return None, f"too large: {n} parameters"
    return model.eval(), ""


def _vocab_size(model: nn.Module) -> int:
    """The vocabulary size of a model's (text) config."""
    config = model.config
    for candidate in (config, getattr(config, "text_config", None), getattr(config, "decoder", None)):
        size = getattr(candidate, "vocab_size", None)
        if isinstance(size, int):
            return size
    embeddings = model.get_input_embeddings()
    if embeddings is None:
        raise ValueError(f"expected a config with vocab_size or a model with input embeddings; got {type(model)}")
    return embeddings.num_embeddings


def example_inputs(model: nn.Module, rows: int, length: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch for ``model``: ``input_ids`` (rows, length) in [3, vocab minus the reserved special ids) and an
    ``attention_mask`` (rows, length) of ones with left padding (row 0 has 2 pad positions, row 1 one, the others
    none; pad positions hold ``PAD_ID``). A :data:`CODEBOOK_ROWS` model (musicgen's decoder) takes the ids of
    every codebook as rows: its ``input_ids`` are (rows * num_codebooks, length), row r's codebooks at r*K .. r*K+K-1,
    and its masked positions keep ordinary ids.
    """
    if rows < 1 or length < 3:
        raise ValueError(f"expected rows >= 1 and length >= 3; got rows={rows}, length={length}")
    vocab = _vocab_size(model)
    high = vocab - SPECIAL_RESERVED if vocab > SPECIAL_RESERVED + 3 else vocab
    codebooks = model.config.num_codebooks if model.config.model_type in CODEBOOK_ROWS else 1
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, high, (rows, codebooks, length), generator=gen)
    attention_mask = torch.ones(rows, length, dtype=torch.long)
    for row, pad in ((0, 2), (1, 1))[:rows]:
        attention_mask[row, :pad] = 0
        if codebooks == 1:  # musicgen's generate drops every pad id from its output, so it keeps ids there
            input_ids[row, :, :pad] = PAD_ID
    return {"input_ids": input_ids.reshape(rows * codebooks, length), "attention_mask": attention_mask}
