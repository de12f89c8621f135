"""The data of :mod:`nesgpu.bench.hf_zoo`: the small sizes and the per-family overrides of its configs."""

from __future__ import annotations

from typing import Any

VOCAB = 128
SPECIAL_RESERVED = 16  # ids VOCAB - 16 .. VOCAB - 1 hold the special tokens that are not pad / bos / eos
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MAX_LAYERS = 4  # per-layer patterns with more distinct kinds keep their first MAX_LAYERS kinds
MAX_PARAMETERS = 2_000_000

# key -> small value, applied where the config has the key (directly, or through its attribute_map) and the
# key is not None there. Per-layer lists of such a key become the small value repeated.
SIZES: dict[str, Any] = {
    # vocabulary and positions
    "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB, "decoder_vocab_size": VOCAB,
    "unpadded_vocab_size": VOCAB, "shape_vocab_size": 32, "pronunciation_vocab_size": 32,
    "shape_embed_dim": 16, "pronunciation_embed_dim": 16, "rel_extent": 16,
    "max_position_embeddings": 128, "n_positions": 128, "n_ctx": 128, "max_seq_len": 128,
    "max_target_positions": 128, "context_length": 128, "model_max_length": 128,
    "original_max_position_embeddings": 128,
    # widths
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "embedding_size": 64, "word_embed_proj_dim": 64,
    "input_embedding_size": 64, "output_embedding_size": 64, "backbone_hidden_size": 64, "lru_width": 64,
    "adapter_in_dim": 64, "adapter_input_size": 64, "adapter_out_dim": 64, "hidden_size_global": 64,
    "encoder_hash_byte_group_vocab": VOCAB, "hidden_size_per_layer_input": 16, "router_hidden_size": 32,
    "intermediate_size": 128, "ffn_dim": 128, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "n_inner": 128,
    "d_ff": 128, "dim_ff": 128, "dff": 128, "ffn_hidden_size": 128, "feed_forward_size": 128, "d_inner": 128,
    "intermediate_size_mlp": 128, "dense_intermediate_size": 128, "mlp_dim": 128,
    # audio and vision towers of composite models
    "output_channels": 32, "ext_pw_out_channel": 64, "depthwise_separable_out_channel": 64,
    "nemo_conv_channels": 32,
    # depth (and the counts of special layers inside it)
    "num_hidden_layers": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2, "encoder_layers": 2,
    "num_decoder_layers": 2, "num_encoder_layers": 2, "num_blocks": 2, "first_k_dense_replace": 1,
    "num_dense_layers": 1, "decoder_sparse_step": 1, "num_kv_shared_layers": 0, "num_nextn_predict_layers": 0,
    "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
    # attention
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4, "num_decoder_attention_heads": 4, "num_encoder_attention_heads": 4,
    "attention_heads": 4, "swa_num_attention_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2, "multi_query_group_num": 2,
    "num_query_groups": 2, "swa_num_key_value_heads": 2,
    "head_dim": 16, "d_head": 16, "dim_head": 16, "attention_head_size": 16, "kv_channels": 16,
    "attention_head_dim": 16, "swa_head_dim": 16, "rotary_dim": 8,
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "index_head_dim": 16, "index_n_heads": 2, "index_topk": 4,
    "sliding_window": 4, "sliding_window_size": 4, "attention_window_size": 4, "attention_chunk_size": 4,
    "local_attention_window_len": 4, "local_attention": 8,
    # mixtures of experts
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "moe_k": 2, "num_experts_per_token": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1,
    "zero_expert_num": 2, "n_group": 1, "topk_group": 1, "num_expert_group": 1,
    "moe_intermediate_size": 32, "expert_ffn_hidden_size": 32, "shared_expert_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64, "shared_intermediate_size": 64,
    "shared_experts_intermediate_size": 64,
    # state-space and linear-attention mixers
    "state_size": 8, "mamba_d_state": 8, "ssm_state_size": 8, "mamba_d_conv": 4, "conv_kernel": 4,
    "time_step_rank": 8, "mamba_dt_rank": 8, "mamba_n_heads": 8, "mamba_num_heads": 8, "mamba_d_head": 16,
    "mamba_head_dim": 16, "mamba_headdim": 16, "mamba_n_groups": 1, "mamba_ngroups": 1, "n_groups": 1,
    "mamba_chunk_size": 8, "mamba_d_ssm": 128,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_head_dim": 16, "linear_num_heads": 4, "linear_conv_kernel_dim": 4,
    # low-rank side paths
    "hc_lowrank": 8, "laurel_rank": 8, "gated_norm_rank": 8, "adapter_rank": 8, "loop_gate_rank": 8,
    "o_lora_rank": 16,
}

# flags set where the config has them: every model runs as a causal decoder
FLAGS: dict[str, Any] = {"is_decoder": True}

# probabilities that are dropped to 0: keys with one of these parts, when their value is a float
DROPOUT_PARTS = ("dropout", "pdrop", "layerdrop", "drop_prob", "_prob", "jitter_noise")
# keys set even where the config leaves them None: None there means "derive it", which the small value matches
FILL_WHEN_NONE = ("head_dim", "num_key_value_heads", "num_kv_heads", "num_experts_per_tok")
# (key, source): where the full-size config has key == source, the small one keeps them equal (latent attention
# configs whose head_dim is the rotary part)
TIED_SIZES = (("head_dim", "qk_rope_head_dim"),)
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "num_query_groups")
LAYER_COUNT_KEYS = ("num_hidden_layers", "num_layers", "n_layers", "n_layer", "decoder_layers")

# model types whose input_ids hold one row per codebook: (batch * config.num_codebooks, length)
CODEBOOK_ROWS = ("musicgen_decoder", "musicgen_melody_decoder")

# per-family fixes the table cannot express: type -> kwargs (a dict value for a sub-config key is merged
# into that sub-config's kwargs)
OVERRIDES: dict[str, dict[str, Any]] = {
    "mamba2": {"num_heads": 8, "head_dim": 16, "chunk_size": 8},
    # hybrids whose default small pattern has no attention layer, which their cache code needs
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # defaults that cannot build a model at all
    "blt": {"use_cache": False},  # its cache reads num_hidden_layers from the composite config
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                                   "mrope_section": [4, 2, 2]}}},
    "dbrx": {"attn_config": {"rope_theta": 1e4, "clip_qkv": 8.0}},  # modeling reads both unconditionally
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_output_layers": 1,
             "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
    "lfm2": {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]},  # its default is all attention
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 2},
    "musicgen": {"decoder": {"decoder_start_token_id": BOS_ID}},  # generate reads it from the decoder alone
    "musicgen_melody": {"decoder": {"decoder_start_token_id": BOS_ID}},
    # axial positions multiply to max_position_embeddings and their widths add to hidden_size; its LSH layers
    # cannot generate from a cache once the sequence is longer than a chunk, so the chunks stay 64 long
    "reformer": {"axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 48]},
    "xlstm": {"num_heads": 4, "qk_dim_factor": 1.0},  # its cache rounds qk_dim up to 64, its layers do not
    "xmod": {"default_language": "en_XX"},
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},  # 2 shared
    "gemma4_text": {"global_head_dim": 32},
    "gemma4_unified_text": {"global_head_dim": 32},
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}},
    # constructor-only kwargs (not fields) that size the layers their __post_init__ makes heterogeneous
    "dots3_note_text": {"sliding_window": 4, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 4,
                        "swa_q_lora_rank": 32, "swa_kv_lora_rank": 16, "swa_head_dim": 16, "swa_qk_nope_head_dim": 8,
                        "swa_v_head_dim": 16},
    # validators the table does not satisfy
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "zaya": {"num_experts_per_tok": 1},
}
