"""Benchmarks, run from the command line as ``nesgpu bench <name>``.

- :mod:`nesgpu.bench.layers`: forward-pass time and noise memory of every perturbed layer.
"""
