"""The population on vLLM: every member of a low-rank population, as a LoRA adapter on one vLLM engine, generates
what the same member generates through transformers' ``generate()`` (greedy, float32), its per-token
log-probabilities within a stated tolerance, and the engine's weights follow the trainer's in place. These run in
the vLLM environment (``make test`` builds it: vLLM pins its own torch and transformers)."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from conftest import CHARS, char_tokenizer
from safetensors.torch import load_file

import nesgpu
from nesgpu.engines.adapters import adapter_config, check_members, member_adapters

if os.environ.get("NESGPU_VLLM_TESTS") == "1":  # the vLLM environment (make test): no vLLM is an error, not a skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")
tf = pytest.importorskip("transformers")
from nesgpu.engines.vllm_engine import VLLMEngine  # noqa: E402

DIRECTIONS, RANK, SIGMA, NEW = 4, 4, 0.3, 8
# vLLM's CPU attention takes head_dim 64 and up; two decoder layers, untied head (the head is evolved too)
CONFIG = dict(vocab_size=len(CHARS) + 3, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0,
              bos_token_id=1, eos_token_id=1, tie_word_embeddings=False)
PROMPTS = ["12+7=", "3*4=", "99-1=", "5+5="]
# the largest difference of a token's log-probability between vLLM's decode and transformers' teacher-forced forward
# that we accept (float32; the median must be a hundredth of it): measured over every member's 256 tokens, at most
# 1.2e-4 and a median of 1e-6 (vLLM's CPU kernels and KV cache against one forward of the whole sequence)
LOGPROB_TOLERANCE = 5e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**CONFIG, initializer_range=0.2)).eval()
    where = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(where)
    char_tokenizer().save_pretrained(where)
    return where


@pytest.fixture(scope="module")
def engine(model_dir):
    return VLLMEngine(str(model_dir), members=2 * DIRECTIONS + 1, rank=RANK, max_model_len=64)


def population(model_dir, step=0):
    model = tf.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    pm = nesgpu.PerturbedModel(nesgpu.convert(model, "lowrank", evolve="matrices", rank=RANK), DIRECTIONS,
                               sigma=SIGMA, antithetic=True, seed=3)
    pm.set_noise(step=step)
    return pm


def hf_rows(pm, tokenizer):
    """Every member's greedy tokens for every prompt, through transformers, rows laid out (sign, prompt,
    direction), and the row's ids."""
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    with pm.perturbing():
        out = pm.model.generate(input_ids=pm.member_rows(enc.input_ids), attention_mask=pm.member_rows(
            enc.attention_mask), do_sample=False, max_new_tokens=NEW, pad_token_id=0, temperature=None, top_p=None,
            top_k=None)
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    rows = [ids[(n // DIRECTIONS) % len(PROMPTS)] for n in range(out.shape[0])]
    members = [(n // (DIRECTIONS * len(PROMPTS))) * DIRECTIONS + n % DIRECTIONS for n in range(out.shape[0])]
    return out[:, enc.input_ids.shape[1]:], rows, members


def same_tokens(hf: torch.Tensor, engine_tokens: list[int]) -> bool:
    """transformers pads a row after its EOS; vLLM stops there."""
    width = len(engine_tokens)
    return hf[:width].tolist() == engine_tokens and bool((hf[width:] == 0).all())


def test_every_member_generates_on_vllm_what_it_generates_in_transformers(model_dir, engine):
    pm = population(model_dir)
    names = check_members(pm)
    assert len(names) == 2 * 7 + 1  # the decoder's projections and the head
    engine.set_members(member_adapters(pm, names), adapter_config(names, RANK))
    expected, rows, members = hf_rows(pm, char_tokenizer())
    got = engine.generate(rows, members, NEW)
    mismatched = [n for n in range(len(rows)) if not same_tokens(expected[n], got[n])]
    assert not mismatched, f"rows {mismatched} of {len(rows)} differ"
    assert len({tuple(t) for t in got}) > len(PROMPTS)  # the members differ from one another


def test_a_members_log_probabilities_agree_within_the_stated_tolerance(model_dir, engine):
    pm = population(model_dir, step=1)
    names = check_members(pm)
    engine.set_members(member_adapters(pm, names), adapter_config(names, RANK))
    tokenizer = char_tokenizer()
    _, rows, members = hf_rows(pm, tokenizer)
    tokens, logprobs = engine.generate(rows, members, NEW, logprobs=True)
    gaps = []
    for n in range(len(rows)):  # one teacher-forced population forward each
        ids = torch.tensor([rows[n] + tokens[n]])
        with pm.perturbing():
            logits = pm.model(pm.member_rows(ids)).logits
        member_logits = logits[members[n]]  # the rows of one prompt: (sign, direction), a member each
        expected = member_logits[len(rows[n]) - 1:-1].log_softmax(-1).gather(1, torch.tensor(tokens[n])[:, None])
        gaps += [abs(a - b) for a, b in zip(expected[:, 0].tolist(), logprobs[n])]
    gaps = torch.tensor(gaps)
    print(f"log-probability differences over {len(gaps)} tokens: max {gaps.max():.1e}, median {gaps.median():.1e}")
    assert gaps.max() < LOGPROB_TOLERANCE and gaps.median() < LOGPROB_TOLERANCE / 100


def test_the_engines_weights_follow_the_trainers_in_place(model_dir, engine):
    pm = population(model_dir, step=2)
    names = check_members(pm)
    with torch.no_grad():  # a step of the trainer: every projection and the head change
        for name in names:
            weight = pm.model.get_submodule(name).weight
            weight.add_(0.05 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(len(name))))
    engine.load_weights((f"{name}.weight", pm.model.get_submodule(name).weight) for name in names)
    engine.set_members(member_adapters(pm, names), adapter_config(names, RANK))
    expected, rows, members = hf_rows(pm, char_tokenizer())
    got = engine.generate(rows, members, NEW)
    assert all(same_tokens(expected[n], got[n]) for n in range(len(rows)))


def test_the_model_shares_the_engines_weights_one_copy_in_the_process(model_dir, engine):
    pm = population(model_dir, step=3)
    before = {name: param.clone() for name, param in pm.model.named_parameters()}
    assert engine.share(pm.model) == []  # every weight: the process holds each once
    for name, param in pm.model.named_parameters():
        assert torch.equal(param, before[name]), name  # the model's values, now in the engine
        assert engine.region(name, param).data_ptr() == param.data_ptr(), name
    names = check_members(pm)
    with torch.no_grad():  # an update to the model is the engine's, no weights written
        for name in names:
            pm.model.get_submodule(name).weight.mul_(1.1)
    engine.set_members(member_adapters(pm, names), adapter_config(names, RANK))
    expected, rows, members = hf_rows(pm, char_tokenizer())
    got = engine.generate(rows, members, NEW)
    assert all(same_tokens(expected[n], got[n]) for n in range(len(rows)))


def test_a_tied_model_with_biases_shares_its_weights_and_generates_as_transformers(tmp_path):
    torch.manual_seed(1)
    config = tf.Qwen2Config(**{**CONFIG, "tie_word_embeddings": True}, initializer_range=0.2)
    tf.Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    model = tf.Qwen2ForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():  # weights other than the directory's (a resumed run's): the engine takes the model's
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    one = VLLMEngine(str(tmp_path), members=0, rank=1, max_model_len=64, weights=model)  # loaded from the model
    assert one.apart == []
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert one.region("model.layers.0.self_attn.v_proj.bias", model.model.layers[0].self_attn.v_proj.bias) is not None
    tokenizer = char_tokenizer()
    for _ in range(2):
        enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
        out = model.generate(**enc, do_sample=False, max_new_tokens=NEW, pad_token_id=0)[:, enc.input_ids.shape[1]:]
        got = one.generate([tokenizer(p).input_ids for p in PROMPTS], None, NEW)
        assert all(same_tokens(out[n], got[n]) for n in range(len(PROMPTS)))
        with torch.no_grad():  # a change of the biases and the tied embedding, in the model
            model.model.layers[1].self_attn.q_proj.bias.add_(0.5)
            model.model.embed_tokens.weight.mul_(1.5)


def test_weights_vllm_rearranges_stay_the_models_own_and_members_are_refused_there(tmp_path):
    torch.manual_seed(2)
    config = tf.GPT2Config(vocab_size=len(CHARS) + 3, n_embd=128, n_layer=2, n_head=2, n_positions=64,
                           bos_token_id=1, eos_token_id=1, pad_token_id=0)
    tf.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    model = tf.GPT2LMHeadModel.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    before = {name: param.clone() for name, param in model.named_parameters()}
    one = VLLMEngine(str(tmp_path), members=0, rank=1, max_model_len=64, weights=model)
    # GPT-2's Conv1D weights are (in, out): vLLM transposes them, the square c_proj keeping its shape
    assert "transformer.h.0.attn.c_proj.weight" in one.apart and "transformer.wte.weight" not in one.apart
    assert all(torch.equal(param, before[name]) for name, param in model.named_parameters())
    with pytest.raises(ValueError, match="holds 'transformer.h.0.attn.c_proj.weight' rearranged"):
        one.parameter("transformer.h.0.attn.c_proj.weight")
    tokenizer = char_tokenizer()
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**enc, do_sample=False, max_new_tokens=NEW, pad_token_id=0)[:, enc.input_ids.shape[1]:]
    got = one.generate([tokenizer(p).input_ids for p in PROMPTS], None, NEW)
    assert all(same_tokens(out[n], got[n]) for n in range(len(PROMPTS)))


def test_an_engine_weight_the_model_has_no_value_for_is_refused_by_name(model_dir):
    model = tf.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.model.norm = torch.nn.Identity()  # vLLM's model.norm.weight would stay as allocated
    with pytest.raises(ValueError, match=r"no value for \(1: model.norm.weight\)"):
        VLLMEngine(str(model_dir), members=0, rank=1, max_model_len=64, weights=model)


def nesgpu_train(*args, cwd):
    return subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--evolve", "matrices",
                           "--population", "16", "--sigma", "0.3", "--lr", "0.05", "--log", "none", *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


def test_a_run_on_vllm_is_the_run_on_transformers_and_resumes_bit_for_bit(model_dir, tmp_path):
    runs = {}
    for name, args in [("hf", ["--steps", "6"]), ("vllm", ["--engine", "vllm", "--steps", "6"]),
                       ("cut", ["--engine", "vllm", "--steps", "3", "--checkpoint-every", "3"])]:
        done = nesgpu_train("--model", f"hf:{model_dir}", *args, "--out", str(tmp_path / name), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        runs[name] = tmp_path / name
    resumed = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--resume", str(runs["cut"]), "--steps", "6"],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr
    weights = {name: load_file(run / "model.safetensors") for name, run in runs.items()}
    for name in ("vllm", "cut"):  # every member's completions the same: the same fitness, the same updates
        assert all(torch.equal(weights["hf"][k], weights[name][k]) for k in weights["hf"]), name
    assert json.loads((runs["vllm"] / "config.json").read_text())["engine"] == "vllm"
    curve = [(runs[name] / "metrics.csv").read_text().splitlines() for name in ("hf", "vllm")]
    columns = curve[0][0].split(",")
    kept = [i for i, c in enumerate(columns) if "second" not in c and "time" not in c]
    assert [[row.split(",")[i] for i in kept] for row in curve[0]] == [[row.split(",")[i] for i in kept]
                                                                        for row in curve[1]]


@pytest.mark.parametrize("evolve, layer", [("all", "lowrank"), ("matrices", "gaussian")])
def test_members_no_adapter_carries_are_written_into_the_engine_one_at_a_time(model_dir, tmp_path, evolve, layer):
    weights = []
    for engine in ("hf", "vllm"):
        done = nesgpu_train("--model", f"hf:{model_dir}", "--engine", engine, "--evolve", evolve, "--layer", layer,
                            "--steps", "3", "--out", str(tmp_path / engine), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        weights.append(load_file(tmp_path / engine / "model.safetensors"))
    assert "the members generate one at a time instead" in done.stderr
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # embeddings and norms evolve too


def test_the_evaluations_generate_on_the_engine_as_transformers_would(model_dir, tmp_path, monkeypatch):
    from nesgpu.tasks.generation import GenerationTask
    from nesgpu.train import TrainConfig, train

    through_transformers = []
    original = GenerationTask.generate_tokens

    def counted(self, model, ids, *args, **kwargs):
        through_transformers.append(ids.shape[0])
        return original(self, model, ids, *args, **kwargs)
    monkeypatch.setattr(GenerationTask, "generate_tokens", counted)
    runs, rows = {}, {}
    for engine in ("hf", "vllm"):
        through_transformers.clear()
        cfg = TrainConfig.from_dict(dict(task="arithmetic", model=f"hf:{model_dir}", engine=engine, evolve="matrices",
                                         population=8, sigma=0.3, lr=0.05, steps=2, eval_every=1, eval_generations=2,
                                         log=None, out=str(tmp_path / engine)))
        train(cfg)
        runs[engine] = (tmp_path / engine / "metrics.csv").read_text().splitlines()
        rows[engine] = list(through_transformers)
    # on vLLM the first of three evaluations only (before the first step no engine is made), greedy and sampled
    assert rows["vllm"] and rows["vllm"] == rows["hf"][:len(rows["vllm"])]
    assert sum(rows["hf"]) > 3 * sum(rows["vllm"])  # on hf: three evaluations, and the population
    columns = runs["hf"][0].split(",")
    greedy = [i for i, c in enumerate(columns) if c in ("accuracy", "eval_reward", "eval_completions/mean_length")]
    assert greedy and [[r.split(",")[i] for i in greedy] for r in runs["hf"]] == [
        [r.split(",")[i] for i in greedy] for r in runs["vllm"]]


def test_held_out_prompts_longer_than_the_training_prompts_generate_on_the_engine(model_dir, tmp_path):
    (tmp_path / "rw.py").write_text("def ones(completions, **kw):\n    return [float(c.count('1')) for c in completions]\n")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    (tmp_path / "eval.jsonl").write_text(json.dumps({"prompt": "12+7=19, 3*4=12, 99-1=98, 5+5="}) + "\n")
    done = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model", f"hf:{model_dir}",
                           "--prompts", "train.jsonl", "--eval-prompts", "eval.jsonl", "--reward", "rw:ones",
                           "--max-new-tokens", "8", "--engine", "vllm", "--evolve", "matrices", "--population", "8",
                           "--batch-size", "4", "--sigma", "0.3", "--lr", "0.05", "--steps", "2", "--eval-every", "1",
                           "--log", "none", "--out", "run"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len((tmp_path / "run" / "metrics.csv").read_text().splitlines()) == 4  # the header, steps 0-2


def test_torchrun_ranks_each_with_an_engine_end_as_one_process(model_dir, tmp_path):
    args = ["--model", f"hf:{model_dir}", "--engine", "vllm", "--steps", "3", "--device", "cpu"]
    one = nesgpu_train(*args, "--out", str(tmp_path / "one"), cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
                          "-m", "nesgpu", "train", "--task", "arithmetic", "--evolve", "matrices", "--population", "16",
                          "--sigma", "0.3", "--lr", "0.05", *args, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert two.returncode == 0 and "Traceback" not in two.stderr, two.stderr[-3000:]
    assert '"processes": 2' in two.stdout
    a, b = (load_file(tmp_path / run / "model.safetensors") for run in ("one", "two"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # each rank's members generated on its own engine


def test_a_repetition_penalty_vllm_would_apply_otherwise_is_refused_in_one_line(model_dir, tmp_path):
    penalised = tmp_path / "penalised"
    shutil.copytree(model_dir, penalised)
    config = json.loads((penalised / "generation_config.json").read_text())
    (penalised / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 1.5}))
    done = nesgpu_train("--model", f"hf:{penalised}", "--engine", "vllm", "--steps", "1", "--out",
                        str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "generation_config sets repetition_penalty=1.5" in done.stderr.splitlines()[-1]


def test_a_run_vllm_cannot_serve_is_one_line(model_dir, tmp_path):
    done = nesgpu_train("--model", f"hf:{model_dir}", "--engine", "vllm", "--fitness", "likelihood", "--generations", "2",
                        "--temperature", "1", "--steps", "1", "--out", str(tmp_path / "run2"), cwd=tmp_path)
    assert done.returncode != 0 and "--fitness likelihood generates none" in done.stderr.splitlines()[-1]
