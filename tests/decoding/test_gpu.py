"""Device tests: the engines in half precision on the device that ``BILD_TEST_DEVICE`` names.

``scripts/gpu_check.py`` runs them (``pytest -m gpu``) on a GPU, and on the CPU in CI through
tests/infra/test_gpu_check.py; a plain ``make test`` skips them. In bfloat16 and float16 the native and
the Hugging Face engine round differently, so their tokens may part where two candidates nearly
tie: on trained models (the demo pair) and on the BART family's tiny models at least 90% of the
records must come out identical, and the count is printed.
"""

from __future__ import annotations

import os

import pytest
import torch

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.pairs.tiny import build_pair
from support.pairs import TEXTS
from support import REPO

DEVICE = os.environ.get("BILD_TEST_DEVICE")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not DEVICE, reason="set BILD_TEST_DEVICE (scripts/gpu_check.py does)")]
MODELS = REPO / "models" / "demo-de-en"


def demo_texts(count: int) -> list[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(REPO / "data" / "multi30k_sample" / "test_2016_flickr.parquet")
    return table.column("de").to_pylist()[:count]


def identical_share(pairs: dict, texts: list[str], method: str, max_new: int) -> float:
    config = DecodingConfig(method=method, max_new_tokens=max_new, fallback_threshold=0.4, rollback_threshold=1.0,
                            adaptive_draft=False)  # the same rounds on both engines, whatever their speed
    outputs = {kind: [r.token_ids for r in Generator(pair, config).generate(texts)] for kind, pair in pairs.items()}
    same = sum(a == b for a, b in zip(outputs["native"], outputs["hf"]))
    print(f"{method}: {same}/{len(texts)} records identical on native and hf")
    return same / len(texts)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_demo_pair_decodes_alike_on_both_engines_in_half_precision(dtype):
    pairs = {engine: ModelPair.from_pretrained(str(MODELS / "small-aligned"), str(MODELS / "large"), device=DEVICE,
                                               dtype=dtype, engine=engine) for engine in ("native", "hf")}
    assert pairs["native"].engine_kind == "native" and pairs["native"].large.dtype == getattr(torch, dtype)
    texts = demo_texts(20 if DEVICE != "cpu" else 8)  # the CPU run (CI, through test_gpu_check.py) stays short
    for method in ("large", "bild"):
        assert identical_share(pairs, texts, method, 64) >= 0.9


@pytest.mark.parametrize("family", ["bart", "marian", "nllb"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_bart_family_decodes_alike_on_both_engines_in_half_precision(family, dtype):
    small, large, tokenizer = build_pair(family, small="noisy")
    device, torch_dtype = torch.device(DEVICE), getattr(torch, dtype)
    small, large = small.to(device, torch_dtype), large.to(device, torch_dtype)
    pairs = {engine: ModelPair(small, large, tokenizer, device, engine_request=engine) for engine in ("native", "hf")}
    for method in ("large", "bild"):
        assert identical_share(pairs, TEXTS, method, 24) >= 0.9


def test_sampling_is_seeded_on_the_device():
    pair = ModelPair.from_pretrained(str(MODELS / "small-aligned"), str(MODELS / "large"), device=DEVICE)
    config = DecodingConfig(method="bild", do_sample=True, temperature=1.2, max_new_tokens=24, adaptive_draft=False)
    first = [r.token_ids for r in Generator(pair, config).generate(TEXTS, seeds=[3] * len(TEXTS))]
    again = [r.token_ids for r in Generator(pair, config).generate(TEXTS, seeds=[3] * len(TEXTS))]
    assert first == again and all(first)
