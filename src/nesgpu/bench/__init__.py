"""Benchmarks, run from the command line as ``nesgpu bench <name>``.

- :mod:`nesgpu.bench.layers`: forward-pass time and noise memory of every perturbed layer.
- :mod:`nesgpu.bench.modules`: the same for transformer blocks, embeddings, norms, LSTM and the fallback.
"""
