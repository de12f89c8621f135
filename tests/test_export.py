"""export(): plain torch (and transformers) modules with the trained weights, computing what the converted
model's plain calls compute."""

import pytest
import torch
from torch import nn

import nesgpu


class Zoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.conv = nn.Embedding(10, 6), nn.Conv1d(6, 6, 3, padding=1)
        self.lstm = nn.LSTM(6, 6, batch_first=True)
        self.block = nn.TransformerEncoderLayer(6, 2, 12, batch_first=True, dropout=0.0)
        self.norm, self.head = nn.LayerNorm(6), nn.Linear(6, 10)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        x = self.embed(ids)
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        x = self.block(self.lstm(x)[0])
        return self.head(self.norm(x))


def trained(model, kind="lowrank", **options):
    torch.manual_seed(0)
    net = nesgpu.convert(model, kind, **options)
    pm = nesgpu.PerturbedModel(net, 4, sigma=0.1, antithetic=True)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    pm.set_noise()
    pm.update(torch.randn(2, 4))
    optimizer.step()
    return net


def nesgpu_classes(model):
    return [type(m).__name__ for m in model.modules()
            if any(c.__module__.startswith("nesgpu.") for c in type(m).__mro__)]


def test_export_gives_plain_modules_that_compute_the_same():
    net = trained(Zoo()).eval()
    plain = nesgpu.export(net)
    assert nesgpu_classes(plain) == [] and nesgpu_classes(net)  # the original stays converted
    assert type(plain.head) is nn.Linear and type(plain.lstm) is nn.LSTM
    assert type(plain.block) is nn.TransformerEncoderLayer
    assert plain.head.weight is plain.embed.weight  # the tie is kept
    ids = torch.randint(0, 10, (3, 5))
    torch.testing.assert_close(plain(ids), net(ids), rtol=0, atol=0)
    assert plain.state_dict().keys() == net.state_dict().keys()


def test_a_low_bit_layer_exports_as_the_float_layer_with_its_quantised_weights():
    net = trained(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), bits=1).eval()
    plain = nesgpu.export(net)
    assert [type(m) for m in plain] == [nn.Linear, nn.ReLU, nn.Linear]
    x = torch.randn(5, 4)
    torch.testing.assert_close(plain(x), net(x))


def test_a_bare_converted_module_and_bad_input():
    net = trained(nn.Linear(3, 2))
    plain = nesgpu.export(net)
    assert type(plain) is nn.Linear and torch.equal(plain.weight, net.weight)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        nesgpu.export("model")


def test_a_hugging_face_model_exports_to_its_own_classes():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    net = trained(tf.GPT2LMHeadModel(config).eval())
    plain = nesgpu.export(net)
    assert nesgpu_classes(plain) == []
    assert type(plain.transformer.h[0].attn.c_attn).__name__ == "Conv1D"
    ids = torch.randint(0, 32, (2, 6))
    torch.testing.assert_close(plain(ids).logits, net(ids).logits, rtol=0, atol=0)


def test_a_bf16_model_exports_without_the_perturbed_models_hooks():
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 2)), "lowrank").to(torch.bfloat16)
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    assert net._forward_pre_hooks and pm.master_state()
    plain = nesgpu.export(net)
    assert not plain._forward_pre_hooks and plain[0].weight.dtype == torch.bfloat16


@pytest.mark.parametrize("task, hidden, inputs", [("pendulum", (8,), lambda: torch.randn(5, 3)),
                                                   ("cartpole", (), lambda: torch.randn(5, 4)),
                                                   ("reverse", (16, 1), lambda: torch.randint(0, 10, (2, 12)))])
def test_the_tasks_own_models_export_as_their_own_classes(task, hidden, inputs):
    from nesgpu.tasks import make_task

    model = nesgpu.convert(make_task(task).make_model(hidden), "lowrank")
    plain = nesgpu.export(model)
    assert type(plain) is type(model) and not any(isinstance(m, nesgpu.PerturbedModule) for m in plain.modules())
    x = inputs()
    with torch.no_grad():
        assert torch.equal(plain(x), model(x))


def test_export_is_the_function_after_the_trainer_is_imported():
    import subprocess
    import sys

    # read before any other public name: the first one loads them all, which hid the bug
    code = ("import nesgpu, torch\nfrom nesgpu.train import train\nexport = nesgpu.export\n"
            "net = nesgpu.convert(torch.nn.Linear(3, 2), 'lowrank')\n"
            "print(type(export(net)).__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "Linear"
