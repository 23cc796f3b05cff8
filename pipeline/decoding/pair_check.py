"""Whether two checkpoints can form a small/large pair, read from their configs and tokenizers alone (no
weights, no model classes): what a job's driver checks before Ray starts (jobs/preflight.py), without paying for
transformers' model loading, which only the actors need."""

from __future__ import annotations

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase


class IncompatiblePairError(ValueError):
    """The small and large model cannot be used together (raised before any decoding)."""


def check_configs(small_config, large_config) -> None:
    if bool(small_config.is_encoder_decoder) != bool(large_config.is_encoder_decoder):
        kinds = {True: "encoder-decoder", False: "decoder-only"}
        raise IncompatiblePairError(
            f"the small model is {kinds[bool(small_config.is_encoder_decoder)]} but the large model is "
            f"{kinds[bool(large_config.is_encoder_decoder)]}; both must be of the same kind"
        )
    small_vocab = getattr(small_config, "vocab_size", None)
    large_vocab = getattr(large_config, "vocab_size", None)
    if small_vocab != large_vocab:
        raise IncompatiblePairError(
            f"the small and large model have different vocabularies (vocab_size {small_vocab} vs "
            f"{large_vocab}); BiLD needs a pair that shares one tokenizer"
        )


def check_pair(small: str, large: str, tokenizer: str | None = None,
               trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Raise IncompatiblePairError unless two checkpoints can form a pair, from their configs and
    tokenizers alone (no weights are read); returns the pair's shared tokenizer."""
    small_config = AutoConfig.from_pretrained(small, trust_remote_code=trust_remote_code)
    large_config = AutoConfig.from_pretrained(large, trust_remote_code=trust_remote_code)
    check_configs(small_config, large_config)
    shared_tokenizer = AutoTokenizer.from_pretrained(tokenizer or large, trust_remote_code=trust_remote_code)
    if tokenizer is None:
        check_tokenizers_match(small, shared_tokenizer, trust_remote_code)
    return shared_tokenizer


def check_tokenizers_match(small: str, large_tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool) -> None:
    """If the small model ships its own tokenizer, it must map text to the same ids."""
    try:
        small_tokenizer = AutoTokenizer.from_pretrained(small, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return  # no tokenizer beside the small model: it uses the shared one
    if small_tokenizer.get_vocab() != large_tokenizer.get_vocab():
        raise IncompatiblePairError(
            "the small and large model come with different tokenizers (their vocabularies differ); "
            "BiLD needs a pair that shares one tokenizer"
        )
