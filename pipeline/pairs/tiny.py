"""Tiny randomly initialised model pairs for tests, benchmarks and an offline try-out.

Each family gets a byte-level tokenizer (any text encodes, no download needed) and a "large"
and a "small" shape. Default initialisation makes tiny models repeat one token or stop at
once; ``init_scale`` widens the initial weights so greedy outputs are long and varied.
Two kinds of small model exist: an independent one of a smaller shape (disagrees with the
large one often) and a noisy copy of the large one (mostly agrees).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    M2M100Config,
    M2M100ForConditionalGeneration,
    MarianConfig,
    MarianMTModel,
    MBartConfig,
    MBartForConditionalGeneration,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

PAD, EOS, UNK = 0, 1, 2
SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>"]
FAMILIES = ("t5", "bart", "mbart", "marian", "nllb", "gpt2", "llama")
ENCODER_DECODER = {"t5", "bart", "mbart", "marian", "nllb"}


def byte_tokenizer(append_eos: bool, vocab_size: int | None = None, *, specials: list[str] = SPECIAL_TOKENS,
                   pad_last: bool = False) -> PreTrainedTokenizerFast:
    """One token per UTF-8 byte after ``specials`` (<pad>=0, </s>=1, <unk>=2 unless given); with
    ``vocab_size``, unused tokens <extra_i> fill the vocabulary up to that size (for models shaped
    like real ones). ``pad_last`` puts <pad> at the last id, as opus-mt's Marian vocabularies do."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate(specials + sorted(alphabet))}
    extras = max(0, (vocab_size or 0) - len(vocab) - pad_last)
    vocab.update({f"<extra_{i}>": len(vocab) + i for i in range(extras)})
    if pad_last:
        vocab["<pad>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    if append_eos:  # encoder inputs end in EOS, as T5/BART/Marian tokenizers do
        tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                                 special_tokens=[("</s>", vocab["</s>"])])
    bos = dict(bos_token="<s>") if "<s>" in vocab else {}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   **bos)


VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def _config(family: str, size: str):
    width, layers = {"large": (64, 3), "small": (32, 1)}[size]
    # Untied output embeddings, so their scale (the models' confidence) can be set on its own.
    common = dict(vocab_size=VOCAB_SIZE, pad_token_id=PAD, eos_token_id=EOS, tie_word_embeddings=False)
    if family == "t5":
        return T5Config(
            d_model=width, d_ff=2 * width, num_layers=2, num_decoder_layers=layers, num_heads=4,
            d_kv=width // 4, decoder_start_token_id=PAD, dropout_rate=0.0, **common,
        )
    if family in ("bart", "mbart", "marian", "nllb"):  # nllb: NLLB's architecture, M2M100
        config_class = {"bart": BartConfig, "mbart": MBartConfig, "marian": MarianConfig, "nllb": M2M100Config}[family]
        return config_class(
            d_model=width, encoder_layers=2, decoder_layers=layers, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=2 * width, decoder_ffn_dim=2 * width,
            max_position_embeddings=512, decoder_start_token_id=_decoder_start(family), bos_token_id=PAD, dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0, **common,
        )
    if family == "gpt2":
        return GPT2Config(
            n_embd=width, n_layer=layers, n_head=4, n_positions=512, bos_token_id=EOS, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, **common,
        )
    if family == "llama":
        return LlamaConfig(
            hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=EOS, **common,
        )
    raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")


def _decoder_start(family: str) -> int:
    """NLLB (M2M100) starts decoding from EOS, as its checkpoints do; the others from <pad>."""
    return EOS if family == "nllb" else PAD


_MODEL_CLASSES = {
    "t5": T5ForConditionalGeneration,
    "bart": BartForConditionalGeneration,
    "mbart": MBartForConditionalGeneration,
    "marian": MarianMTModel,
    "nllb": M2M100ForConditionalGeneration,
    "gpt2": GPT2LMHeadModel,
    "llama": LlamaForCausalLM,
}


# Found by counting distinct tokens in greedy outputs of several prompts: the scale at which each
# family's random model's output varies with its input.
DEFAULT_INIT_SCALE = {"t5": 4.0, "bart": 1.0, "mbart": 1.0, "marian": 1.0, "nllb": 1.0, "gpt2": 1.0, "llama": 8.0}
_EMBEDDING_NAMES = ("embed", "shared", "wte", "wpe", "lm_head")


def _scale_weights(model: PreTrainedModel, init_scale: float, logit_std: float) -> None:
    """Widen the random initialisation of the transformer's matrices (not the embeddings), and
    give the output layer a scale at which the models are sometimes sure and sometimes not."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2 and not any(part in name for part in _EMBEDDING_NAMES):
                param.mul_(init_scale)
        head = model.get_output_embeddings().weight
        head.normal_(0.0, logit_std / head.shape[1] ** 0.5)


def build_model(
    family: str, size: str = "large", *, seed: int = 0, init_scale: float | None = None, logit_std: float = 4.0
) -> PreTrainedModel:
    """A randomly initialised tiny model of the family, deterministic for a seed."""
    torch.manual_seed(seed)
    config = _config(family, size)
    model = _MODEL_CLASSES[family](config)
    _scale_weights(model, DEFAULT_INIT_SCALE[family] if init_scale is None else init_scale, logit_std)
    model.generation_config = GenerationConfig(
        eos_token_id=EOS, pad_token_id=PAD, decoder_start_token_id=_decoder_start(family) if family in ENCODER_DECODER else None
    )
    return model.eval()


def noisy_copy(model: PreTrainedModel, noise: float, *, seed: int = 0) -> PreTrainedModel:
    """The same model with Gaussian noise (relative to each matrix's scale) added: a close drafter."""
    torch.manual_seed(seed)
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for param in copied.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn_like(param) * param.std() * noise)
    return copied.eval()


def build_pair(
    family: str, *, seed: int = 0, small: str = "independent", noise: float = 0.1, init_scale: float | None = None
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast]:
    """(small, large, tokenizer). small="independent" (another shape) or "noisy" (noisy copy)."""
    large = build_model(family, "large", seed=seed, init_scale=init_scale)
    if small == "noisy":
        small_model = noisy_copy(large, noise, seed=seed + 1)
    elif small == "independent":
        small_model = build_model(family, "small", seed=seed + 1, init_scale=init_scale)
    else:
        raise ValueError(f"small must be 'independent' or 'noisy', got {small!r}")
    return small_model, large, byte_tokenizer(append_eos=family in ENCODER_DECODER)


def save_pair(out_dir: str | Path, family: str = "t5", **kwargs) -> tuple[Path, Path]:
    """Build a pair and save it as two ``save_pretrained`` folders (tokenizer in each)."""
    return save_models(out_dir, *build_pair(family, **kwargs))


def save_models(out_dir: str | Path, small: PreTrainedModel, large: PreTrainedModel, tokenizer) -> tuple[Path, Path]:
    """Save a pair as OUT_DIR/small and OUT_DIR/large (``save_pretrained`` folders, the tokenizer in each)."""
    out = Path(out_dir)
    paths = (out / "small", out / "large")
    for model, path in zip((small, large), paths):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return paths
