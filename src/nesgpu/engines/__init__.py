"""Inference engines that generate for a language model's population: each member of a low-rank population is a
LoRA adapter (:mod:`nesgpu.engines.adapters`), which vLLM batches (:mod:`nesgpu.engines.vllm_engine`, the
``vllm`` extra)."""

from .adapters import TARGETS, adapter_config, check_members, lora_refusal, member_adapters

__all__ = ["TARGETS", "adapter_config", "check_members", "lora_refusal", "member_adapters"]
