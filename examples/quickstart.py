"""Quick start: train an MLP on sklearn's digits with ES, the whole population in one forward pass.

Follows the recipe: convert the layers, wrap the model, then per step set_noise / population forward /
update / optimizer.step, written out by hand (``nesgpu train`` and ``nesgpu.strategies`` do this for you).
Run: python examples/quickstart.py
"""

import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import nesgpu
from nesgpu.strategies import centered_ranks  # fitness shaping: ranks scaled to [-0.5, 0.5]

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# data: 8x8 digits, 10 classes; the last 360 images are the test set
digits = load_digits()
x_all = torch.tensor(digits.data, dtype=torch.float32, device=device) / 16.0
y_all = torch.tensor(digits.target, device=device)
x_train, y_train, x_test, y_test = x_all[:-360], y_all[:-360], x_all[-360:], y_all[-360:]

# 1. replace nn.Linear by a perturbed kind; 2. wrap the model
directions, batch = 256, 64
model = nesgpu.convert(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)), "lowrank").to(device)
pm = nesgpu.PerturbedModel(model, directions, sigma=0.05, antithetic=True, seed=0)
optimizer = torch.optim.Adam(model.parameters(), lr=0.03)


gen = torch.Generator(device=device).manual_seed(0)
start = time.perf_counter()
for step in range(1, 401):
    # 3.1 new noise
    pm.set_noise()
    # 3.2 population loss: every direction sees the same minibatch, with both signs.
    # Layout (sign, sample, direction, features): repeats R = 2 * batch, the sign outermost.
    idx = torch.randint(0, len(x_train), (batch,), device=device, generator=gen)
    rows = x_train[idx].view(1, batch, 1, 64).expand(2, batch, directions, 64).reshape(-1, 64)
    logits = pm(rows).view(2, batch, directions, 10)
    target = y_train[idx].view(1, batch, 1).expand(2, batch, directions)
    losses = F.cross_entropy(logits.permute(0, 3, 1, 2), target, reduction="none").mean(1)  # (2, D)
    # 3.3 shaped losses -> .grad -> optimizer step
    optimizer.zero_grad()
    pm.update(centered_ranks(losses))  # on losses: lower is better, so update + step descends
    optimizer.step()
    if step % 100 == 0:
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        print(f"step {step:4d}  train loss {losses.mean().item():.3f}  test accuracy {accuracy:.3f}  "
              f"{time.perf_counter() - start:.1f}s")

# 4. drop the noise before saving
pm.free_memory()
