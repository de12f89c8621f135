"""Perturbed nn.LSTM, nn.GRU and nn.RNN: a population-batched recurrence.

cuDNN's fused recurrent kernel takes one set of weights, so the population forward runs the recurrence
itself: each layer's input projection for all time steps at once (one perturbed product), then one
perturbed hidden-to-hidden product per step. Gates follow torch's definitions (LSTM: i, f, g, o; GRU: r,
z, n with the reset gate applied to the hidden product including its bias). Every weight matrix takes
the module's kind; biases are per-member vectors. ``proj_size`` and packed sequences are not supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Geometry, make_kind
from .base import PerturbedModule
from .layout import compute_dtype


class _PerturbedRNN(PerturbedModule):
    gates: int
    parent: type[nn.RNNBase]

    def __init__(self, *args, kind="gaussian", directions=None, **kwargs):
        options = {k: kwargs.pop(k) for k in list(kwargs) if k not in _RNN_ARGS}  # the kind's options
        self.parent.__init__(self, *args, **kwargs)
        self._init_rnn(kind, directions, options)

    def _init_rnn(self, kind, directions, options) -> None:
        if getattr(self, "proj_size", 0):
            raise ValueError(f"{type(self).__name__}: proj_size={self.proj_size} is not supported; expected 0")
        matrices = {}
        for name in self._flat_weights_names:
            if name.startswith("weight_"):
                shape = getattr(self, name).shape
                matrices[name] = Geometry(shape[0], shape[1])
        self.init_perturbation(make_kind(kind, **options), directions, matrices, "linear")

    def population_forward(self, input, hx=None):
        if isinstance(input, nn.utils.rnn.PackedSequence) or input.dim() != 3:
            raise ValueError(f"{type(self).__name__}: a population call needs a padded batch of 3 dimensions "
                             f"(no PackedSequence); got {type(input).__name__} "
                             f"{tuple(input.shape) if isinstance(input, torch.Tensor) else ''}")
        x = input if self.batch_first else input.transpose(0, 1)  # (N, T, in)
        n, steps = x.shape[:2]
        pop = self.population_of(n, compute_dtype(x), x.device)
        sides = 2 if self.bidirectional else 1
        lstm = isinstance(self, nn.LSTM)
        if hx is None:
            zeros = x.new_zeros(self.num_layers * sides, n, self.hidden_size)
            hx = (zeros, zeros) if lstm else zeros
        h0, c0 = hx if lstm else (hx, None)
        expected = (self.num_layers * sides, n, self.hidden_size)
        if x.shape[2] != self.input_size or any(t is not None and tuple(t.shape) != expected for t in (h0, c0)):
            raise ValueError(f"{type(self).__name__}: expected input (rows, T, {self.input_size}) batch-first and "
                             f"hidden states of shape {expected}; got input {tuple(x.shape)} (batch-first), hidden "
                             f"{[tuple(t.shape) for t in (h0, c0) if t is not None]}")
        last_h, last_c = [], []
        for layer in range(self.num_layers):
            outputs = []
            for side in range(sides):
                suffix = f"l{layer}" + ("_reverse" if side else "")
                inputs = self.perturbed_linear(x, pop, f"weight_ih_{suffix}", f"bias_ih_{suffix}" if self.bias else None)  # every time step at once: (N, T, G * H)
                h = h0[layer * sides + side]
                c = c0[layer * sides + side] if lstm else None
                out = [None] * steps
                for t in (reversed(range(steps)) if side else range(steps)):
                    hidden = self.perturbed_linear(h, pop, f"weight_hh_{suffix}", f"bias_hh_{suffix}" if self.bias else None)
                    if self.gates == 1:
                        h = self._activation(inputs[:, t] + hidden)
                    elif lstm:
                        i, f, g, o = (inputs[:, t] + hidden).chunk(4, dim=-1)
                        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                        h = torch.sigmoid(o) * torch.tanh(c)
                    else:
                        xr, xz, xn = inputs[:, t].chunk(3, dim=-1)
                        hr, hz, hn = hidden.chunk(3, dim=-1)
                        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                        h = (1 - z) * torch.tanh(xn + r * hn) + z * h
                    out[t] = h
                outputs.append(torch.stack(out, 1))
                last_h.append(h)
                last_c.append(c)
            x = outputs[0] if sides == 1 else torch.cat(outputs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        output = x if self.batch_first else x.transpose(0, 1)
        h_n = torch.stack(last_h)
        return (output, (h_n, torch.stack(last_c))) if lstm else (output, h_n)


class PerturbedLSTM(_PerturbedRNN, nn.LSTM):
    """nn.LSTM with a population-batched recurrence (see the module docstring).

    Args:
        as for :class:`torch.nn.LSTM` (without ``proj_size``), plus ``kind``, its ``**options`` and
        ``directions`` (keyword-only).

    Shape:
        population input (R * D, T, in) with ``batch_first``, else (T, R * D, in); row n uses direction n % D.
    """

    gates = 4

    parent = nn.LSTM


class PerturbedGRU(_PerturbedRNN, nn.GRU):
    """nn.GRU with a population-batched recurrence (see :class:`PerturbedLSTM`)."""

    gates = 3

    parent = nn.GRU


class PerturbedRNN(_PerturbedRNN, nn.RNN):
    """nn.RNN (tanh or relu) with a population-batched recurrence (see :class:`PerturbedLSTM`)."""

    gates = 1

    parent = nn.RNN

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) if self.nonlinearity == "tanh" else torch.relu(x)


_RNN_ARGS = {"input_size", "hidden_size", "num_layers", "nonlinearity", "bias", "batch_first", "dropout",
             "bidirectional", "proj_size", "device", "dtype"}
