"""Random-weight model pairs at the shapes of real checkpoints, to time engines without downloads.

A decode step's cost depends on a model's shapes (layers, widths, vocabulary), not on its weights,
so these stand in for real checkpoints in speed checks (``scripts/gpu_check.py``, ``bild-pipeline
tiny-pair --shape``). What they write means nothing; which tokens they agree on is still exact.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GenerationConfig,
    M2M100Config,
    M2M100ForConditionalGeneration,
    MarianConfig,
    MarianMTModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

from pipeline.pairs.tiny import SPECIAL_TOKENS, byte_tokenizer, save_models


def _t5(d_model: int, layers: int, heads: int) -> dict:
    return dict(d_model=d_model, d_ff=4 * d_model, num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                d_kv=64, feed_forward_proj="relu")


def _bart(d_model: int, encoder: int, decoder: int, heads: int) -> dict:
    return dict(d_model=d_model, encoder_layers=encoder, decoder_layers=decoder, encoder_attention_heads=heads,
                decoder_attention_heads=heads, encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model)


# name -> (model class, config class, vocabulary, small shape, large shape); the small model of an
# opus-mt-shaped pair keeps the large one's shape with one decoder layer (a shrunk drafter).
# Special tokens sit where the real checkpoints' tokenizers put them (SPECIAL_IDS), because
# converters and position schemes depend on it: CTranslate2 drops opus-mt's last id (<pad>), and
# M2M100 counts positions from its pad id.
SHAPES = {
    "t5": (T5ForConditionalGeneration, T5Config, 32128, _t5(512, 6, 8), _t5(1024, 24, 16)),  # T5-small / T5-large
    "opus-mt": (MarianMTModel, MarianConfig, 58101, _bart(512, 6, 1, 8), _bart(512, 6, 6, 8)),  # Helsinki-NLP opus-mt
    "bart-opus-mt": (BartForConditionalGeneration, BartConfig, 58101, _bart(512, 6, 1, 8), _bart(512, 6, 6, 8)),
    "nllb": (M2M100ForConditionalGeneration, M2M100Config, 256206,  # NLLB-200 distilled 600M / 3.3B
             _bart(1024, 12, 12, 16), _bart(2048, 24, 24, 16)),
}


FAIRSEQ_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # BART, NLLB (fairseq dictionaries)
# name -> (special tokens from id 0, whether <pad> is the last id instead)
SPECIAL_IDS = {"t5": (SPECIAL_TOKENS, False), "opus-mt": (["</s>", "<unk>"], True),
               "bart-opus-mt": (FAIRSEQ_SPECIALS, False), "nllb": (FAIRSEQ_SPECIALS, False)}


def shaped_model(name: str, size: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> PreTrainedModel:
    """A random model of ``SHAPES[name]``'s ``size`` ("small" or "large"), built on ``device``."""
    model_class, config_class, vocabulary, small, large = SHAPES[name]
    tokenizer = shaped_tokenizer(name)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    start = eos if config_class is M2M100Config else pad  # NLLB starts decoding from EOS
    shape = dict(small if size == "small" else large)
    extra = dict(dropout_rate=0.0) if config_class is T5Config else dict(
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=1024,
        scale_embedding=config_class is not BartConfig)
    config = config_class(vocab_size=vocabulary, pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=start,
                          **shape, **extra)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, decoder_start_token_id=start)
    return model.to(dtype).eval()


def shaped_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A byte tokenizer whose vocabulary is filled up to the pair's size (the extra tokens decode as <extra_i>)."""
    specials, pad_last = SPECIAL_IDS[name]
    return byte_tokenizer(append_eos=True, vocab_size=SHAPES[name][2], specials=specials, pad_last=pad_last)


def shaped_pair(name: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
    """(small, large, tokenizer) of ``SHAPES[name]``."""
    small = shaped_model(name, "small", device=device, dtype=dtype, seed=seed + 1)
    large = shaped_model(name, "large", device=device, dtype=dtype, seed=seed)
    return small, large, shaped_tokenizer(name)


def save_shaped_pair(out_dir: str | Path, name: str, seed: int = 0) -> tuple[Path, Path]:
    """Build a pair of ``SHAPES[name]`` and save it as two ``save_pretrained`` folders (tokenizer in each)."""
    return save_models(out_dir, *shaped_pair(name, seed=seed))
