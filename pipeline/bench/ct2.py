"""CTranslate2 as a baseline for our benchmarks: the engine corpus-translation users run instead of ours.

`CT2Model.convert` converts a Hugging Face seq2seq checkpoint with CTranslate2's own converter
into a folder and loads it as a `ctranslate2.Translator`; `CT2Model.generate` decodes greedily
from the same encoder token ids our engine gets and returns token ids, so a benchmark can time
both engines side by side and compare their output tokens one for one.

CTranslate2 speaks token strings, not ids. The Hugging Face tokenizer maps between the two
(convert_ids_to_tokens / convert_tokens_to_ids); the converter builds CTranslate2's vocabulary
from the same tokenizer, so a token's position there is its id here.

Decoding options that differ from CTranslate2's defaults, each to match transformers' greedy search:
- beam_size=1: greedy (the default is 2);
- min_decoding_length=0: EOS may come first (the default, 1, forbids it at the first step);
- max_input_length=0: no truncation of long inputs (the default cuts them at 1024 tokens);
- return_end_token=True: the EOS is returned when generated. max_decoding_length counts it,
  as max_new_tokens does, so the two limits are the same number.

Known difference: an input of EOS alone (the empty text) gives an empty output in CTranslate2,
where transformers still decodes.

ctranslate2 is optional (pip install -e .[bench]); it is imported inside the functions that need
it, so this module imports without it.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase


def available() -> bool:
    """Whether the optional `ctranslate2` package is importable (pip install -e .[bench])."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


class CT2Model:
    """One Hugging Face seq2seq checkpoint converted to CTranslate2 and loaded as a ctranslate2.Translator."""

    def __init__(self, translator, tokenizer: PreTrainedTokenizerBase, model_path: str, compute_type: str = "float32"):
        self.translator = translator  # ctranslate2.Translator
        self.tokenizer = tokenizer  # the checkpoint's own tokenizer: ids <-> token strings
        self.model_path = model_path
        self.compute_type = compute_type

    @property
    def description(self) -> str:
        """What a report says ran: CTranslate2's version and compute type."""
        import ctranslate2

        return f"{ctranslate2.__version__} ({self.compute_type})"

    @classmethod
    def convert(
        cls,
        model_path: str | Path,
        out_dir: str | Path,
        *,
        threads: int = 1,
        compute_type: str = "float32",
        device: str = "cpu",
    ) -> CT2Model:
        """Convert the checkpoint at `model_path` into `out_dir` (overwritten) and load it.

        The weights are kept as saved (no quantization at conversion); `compute_type` decides
        the arithmetic at load time ("float32", "int8", ...). Give it explicitly: the default,
        "default", keeps the saved type where the device supports it and warns where it does not
        (float16 on CPU). `threads` is the number of threads for one batch (intra_threads); one
        batch runs at a time (inter_threads=1).

        Raises ValueError naming `model_path` if it is not an encoder-decoder model, if
        CTranslate2 cannot convert or load it, or if its tokenizer's ids do not round-trip
        through token strings.
        """
        model_path = str(model_path)
        try:
            if not AutoConfig.from_pretrained(model_path).is_encoder_decoder:
                raise ValueError("not an encoder-decoder model (CT2Model runs ctranslate2.Translator only)")
            _converter(model_path).convert(str(out_dir), quantization=None, force=True)
            translator = _translator(out_dir, device, compute_type, threads)
        except Exception as err:  # the converter fails in many ways (ValueError, AttributeError, ...)
            raise ValueError(f"CTranslate2 cannot convert the model at {model_path}: {err}") from err
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        _check_round_trip(tokenizer, model_path)
        return cls(translator, tokenizer, model_path, compute_type)

    def with_compute_type(self, compute_type: str, converted_dir: str | Path, threads: int = 1) -> CT2Model:
        """The same converted model loaded again with another compute type (e.g. "int8", CTranslate2's
        usual CPU setting: int8 weights, activations quantized per row at run time)."""
        translator = _translator(converted_dir, self.translator.device, compute_type, threads)
        return CT2Model(translator, self.tokenizer, self.model_path, compute_type)

    def generate(self, batch: list[list[int]], max_new_tokens: int, max_batch_size: int = 0) -> list[list[int]]:
        """Greedy outputs (beam_size=1) for a batch of encoder input ids.

        batch: B lists of input ids, each tokenized by the checkpoint's Hugging Face tokenizer
        (EOS included, as our tokenizer appends it); lengths may differ. With max_batch_size > 0
        CTranslate2 decodes them in batches of at most that many (its own rebatching, by length).
        Returns B lists of generated ids, in input order: EOS included when the model generated
        it, no decoder start token, each at most `max_new_tokens` long.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        sources = [self.tokenizer.convert_ids_to_tokens(list(ids)) for ids in batch]
        results = self.translator.translate_batch(
            sources,
            beam_size=1,
            max_decoding_length=max_new_tokens,  # counts the EOS too (with return_end_token)
            min_decoding_length=0,
            max_input_length=0,
            return_end_token=True,
            max_batch_size=max_batch_size,
        )
        return [self.tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


def _converter(model_path: str):
    """CTranslate2's TransformersConverter, reading BART checkpoints saved by current transformers too.

    Its BART loader reads `config.normalize_before`, a key that only checkpoints saved by old
    transformers versions carry (facebook/bart-*: false); BartConfig no longer defines it, so a BART
    fine-tuned and saved today fails to convert. BART is post-norm, so a missing key means False.
    """
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            if model.config.model_type == "bart" and not hasattr(model.config, "normalize_before"):
                model.config.normalize_before = False
            return model

    return Converter(model_path)


def _translator(converted_dir: str | Path, device: str, compute_type: str, threads: int):
    """A ctranslate2.Translator over a converted folder: one batch at a time, `threads` threads for it."""
    import ctranslate2

    return ctranslate2.Translator(str(converted_dir), device=device, compute_type=compute_type, inter_threads=1,
                                  intra_threads=threads)


def _check_round_trip(tokenizer: PreTrainedTokenizerBase, model_path: str) -> None:
    """Every id the tokenizer knows must come back from its token string (no two ids share one)."""
    ids = list(range(len(tokenizer)))
    back = tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(ids))
    if back != ids:
        bad = next(i for i, j in zip(ids, back) if i != j)
        raise ValueError(
            f"the tokenizer of {model_path} does not map ids to distinct token strings "
            f"(id {bad} comes back as {back[bad]}), so CTranslate2's outputs cannot be mapped back to ids"
        )


def convert_pair(pair, work_dir: str | Path, *, threads: int = 1, compute_type: str = "float32") -> dict[str, CT2Model]:
    """{"small": ..., "large": ..., "small_int8": ..., "large_int8": ...}: both models of a ModelPair as
    CTranslate2 would run them, in `compute_type` and in int8.

    Each model is saved (with the pair's tokenizer) under `work_dir` and converted from there, so a
    pair built in memory converts as well as one loaded from a folder.
    """
    converted = {}
    for role in ("small", "large"):
        saved = Path(work_dir) / role
        getattr(pair, role).save_pretrained(saved)
        pair.tokenizer.save_pretrained(saved)
        converted[role] = CT2Model.convert(saved, Path(work_dir) / f"{role}-ct2", threads=threads,
                                           compute_type=compute_type)
        converted[f"{role}_int8"] = converted[role].with_compute_type("int8", Path(work_dir) / f"{role}-ct2", threads)
    return converted
