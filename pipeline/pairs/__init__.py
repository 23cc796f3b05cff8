"""Model pairs we build rather than download: tiny ones for tests and the demo (tiny.py), random ones of real
shapes for benchmarks (random_shapes.py), and a shipped pair grown to T5-small/T5-large shapes without changing
its function (inflate.py)."""
