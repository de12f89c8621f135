"""A run whose prompts hold characters the tokenizer reads as its unknown token warns, naming them (issue 55:
the demo's arithmetic model on countdown read every space, '>' and ':' as [UNK] and learned nothing, silently);
prompts it reads in full, and tokenizers without an unknown token (byte-level), give no warning."""

import warnings

import pytest

transformers = pytest.importorskip("transformers")
from nesgpu.tasks import make_task  # noqa: E402
from nesgpu.tasks.generation_checks import unreadable  # noqa: E402


def arithmetic_only_tokenizer():
    import tokenizers

    vocab = {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, **{c: i + 3 for i, c in enumerate("0123456789+-*=\n")}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]",
                                                unk_token="[UNK]")


def test_prompts_read_as_unknown_tokens_are_named():
    tokenizer = arithmetic_only_tokenizer()
    assert unreadable(tokenizer, ["12+3=", "4*5="]) is None
    message = unreadable(tokenizer, ["12+3=", "3 7 12>33:"], "training prompts")
    assert message.startswith("1 of 2 training prompts hold characters the tokenizer does not know, e.g. "
                              "'3 7 12>33:' (' ', ':', '>'): the model reads them all as one token, '[UNK]'")
    tokenizer.unk_token = None  # a byte-level tokenizer has none: every text reads
    assert unreadable(tokenizer, ["3 7 12>33:"]) is None


def test_a_tokenizer_that_cannot_encode_a_prompt_names_it():
    import tokenizers

    vocab = {"[PAD]": 0, "[EOS]": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}  # no unknown token
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]")
    assert unreadable(tokenizer, ["12+3="]) is None
    with pytest.raises(ValueError, match=r"the tokenizer cannot encode the training prompt '1 2=' \(Exception: "
                                         r"WordLevel error: Missing \[UNK\] token"):
        unreadable(tokenizer, ["12+3=", "1 2="], "training prompts")


def test_a_countdown_run_on_an_arithmetic_model_warns_at_the_start(tmp_path):
    config = transformers.LlamaConfig(vocab_size=18, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=1)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    arithmetic_only_tokenizer().save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"4000 of 4000 training prompts hold characters .* \(' ', ':', '>'\)"):
        make_task("countdown", model=f"hf:{tmp_path}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_task("arithmetic", model=f"hf:{tmp_path}")
