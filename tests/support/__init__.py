"""What several test layers share: the repository's paths, tiny model pairs, a scripted model,
a cache-free reference BiLD and enumerable distributions. Tests import from here, never from
one another."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: models/, data/, jobs/, pipeline/
