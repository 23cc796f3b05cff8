"""The benchmark commands and their baselines."""
