"""CTranslate2 beside our engines: plain decoding (method large or small) with the model a job names.

`CT2Model` is one Hugging Face seq2seq checkpoint converted by CTranslate2's own converter and
loaded as a `ctranslate2.Translator`; `CT2Model.generate` decodes greedily from the encoder token
ids our engines get and returns token ids, so a benchmark compares both engines token for token.
Its Decoder (ids in, tokens out) is `pipeline/decoding/ct2_decoder.py`.

CTranslate2 speaks token strings, not ids. The Hugging Face tokenizer maps between the two
(convert_ids_to_tokens / convert_tokens_to_ids); the converter builds CTranslate2's vocabulary
from the same tokenizer, so a token's position there is its id here.

Decoding options that differ from CTranslate2's defaults, each to match transformers' greedy search:
- beam_size=1: greedy (the default is 2);
- min_decoding_length=0: EOS may come first (the default, 1, forbids it at the first step);
- max_input_length=0: no truncation here (inputs come tokenized and cut to max_input_tokens);
- return_end_token=True: the EOS is returned when generated. max_decoding_length counts it,
  as max_new_tokens does, so the two limits are the same number.
A forced first token (mBART's and NLLB's target language: generation config forced_bos_token_id)
goes in as the target prefix and is dropped from the output, as our engines count only what follows.

Known difference: an input of EOS alone (the empty text) gives an empty output in CTranslate2,
where transformers still decodes. CTranslate2's Python API cannot cut a decoder cache back, so
methods that verify drafts (bild, speculative, cascade) do not run on it; its sampling does not
follow a seed, so it decodes greedily only.

Conversions are cached (`converted_checkpoint`): a folder per checkpoint content hash and
CTranslate2 version, written under a temporary name and renamed whole, so actors that convert the
same checkpoint at once never read a half-written folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from pipeline.decoding.config import CACHE_ROOT, ModelSpec

DEFAULT_CACHE = CACHE_ROOT / "ct2"
CT2_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}  # models.dtype -> compute type


def available() -> bool:
    """Whether the `ctranslate2` package is importable."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


class CT2Model:
    """One seq2seq checkpoint converted to CTranslate2 and loaded as a ctranslate2.Translator."""

    def __init__(self, translator, tokenizer: PreTrainedTokenizerBase, model_path: str, compute_type: str = "float32",
                 forced_bos: str | None = None):
        self.translator = translator  # ctranslate2.Translator
        self.tokenizer = tokenizer  # the checkpoint's own tokenizer: ids <-> token strings
        self.model_path = model_path
        self.compute_type = compute_type
        self.forced_bos = forced_bos  # the forced first target token's string, if the model has one

    @property
    def description(self) -> str:
        """What a report says ran: CTranslate2's version and compute type."""
        import ctranslate2

        return f"{ctranslate2.__version__} ({self.compute_type})"

    @classmethod
    def convert(cls, model_path: str | Path, out_dir: str | Path, *, threads: int = 1, compute_type: str = "float32",
                device: str = "cpu", tokenizer: str | None = None) -> CT2Model:
        """Convert the checkpoint at `model_path` into `out_dir` (overwritten) and load it.

        The weights are kept as saved (no quantization at conversion); `compute_type` decides
        the arithmetic at load time ("float32", "int8", ...). `threads` is the number of threads for
        one batch (intra_threads); one batch runs at a time (inter_threads=1). The tokenizer and the
        generation config are saved beside, so `out_dir` loads on its own (`CT2Model.load`).

        Raises ValueError naming `model_path` if it is not an encoder-decoder model, if CTranslate2
        cannot convert or load it, or if its tokenizer's ids do not round-trip through token strings.
        """
        convert_folder(model_path, out_dir, tokenizer)
        return cls.load(out_dir, threads=threads, compute_type=compute_type, device=device, model_path=str(model_path),
                        tokenizer=tokenizer)

    @classmethod
    def load(cls, converted_dir: str | Path, *, threads: int = 1, compute_type: str = "float32", device: str = "cpu",
             device_index: int = 0, tokenizer: str | None = None, model_path: str | None = None) -> CT2Model:
        """A converted folder (ours, or one made with ct2-transformers-converter) with its tokenizer: the
        one saved inside it unless `tokenizer` names another."""
        source = tokenizer or str(converted_dir)
        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as err:
            raise ValueError(f"no tokenizer for the CTranslate2 model at {converted_dir}: set models.tokenizer "
                             f"({err})") from err
        _check_round_trip(hf_tokenizer, source)
        try:
            translator = _translator(converted_dir, device, compute_type, threads, device_index)
        except Exception as err:  # noqa: BLE001 - ctranslate2 raises RuntimeError or ValueError
            raise ValueError(f"CTranslate2 cannot load the model at {converted_dir}: {err}") from err
        forced_id = _forced_bos_id(converted_dir)
        forced = hf_tokenizer.convert_ids_to_tokens(forced_id) if forced_id is not None else None
        return cls(translator, hf_tokenizer, model_path or str(converted_dir), compute_type, forced)

    def with_compute_type(self, compute_type: str, converted_dir: str | Path, threads: int = 1) -> CT2Model:
        """The same converted model loaded again with another compute type (e.g. "int8", CTranslate2's
        usual CPU setting: int8 weights, activations quantized per row at run time)."""
        translator = _translator(converted_dir, self.translator.device, compute_type, threads)
        return CT2Model(translator, self.tokenizer, self.model_path, compute_type, self.forced_bos)

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
        prefix = [self.forced_bos] if self.forced_bos else []
        results = self.translator.translate_batch(
            sources,
            target_prefix=[prefix] * len(sources) if prefix else None,
            beam_size=1,
            max_decoding_length=max_new_tokens + len(prefix),  # counts the EOS too (with return_end_token)
            min_decoding_length=0,
            max_input_length=0,
            return_end_token=True,
            max_batch_size=max_batch_size,
        )
        return [self.tokenizer.convert_tokens_to_ids(result.hypotheses[0][len(prefix):]) for result in results]


def load_checkpoint(name_or_path: str, spec: ModelSpec, threads: int = 1) -> CT2Model:
    """The model a job names, loaded by CTranslate2 as the spec asks (device, int8 or the dtype): a
    converted CTranslate2 folder as it is, else a Hugging Face checkpoint (local folder or hub id)
    converted once into the cache (models.ct2_cache)."""
    device, device_index = _device(spec.device)
    compute_type = compute_type_for(spec, device)
    if (Path(name_or_path) / "model.bin").is_file():
        folder = Path(name_or_path)
    else:
        cache = Path(spec.ct2_cache) if spec.ct2_cache else DEFAULT_CACHE
        folder = converted_checkpoint(name_or_path, cache, spec.tokenizer)
    return CT2Model.load(folder, threads=threads, compute_type=compute_type, device=device, device_index=device_index,
                         tokenizer=spec.tokenizer, model_path=name_or_path)


def compute_type_for(spec: ModelSpec, device: str) -> str:
    """CTranslate2's compute type for models.quantize and models.dtype."""
    if spec.quantize == "int8":
        return "int8_float16" if device == "cuda" else "int8"
    if spec.dtype == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    if spec.dtype not in CT2_DTYPES:
        raise ValueError(f"models.dtype {spec.dtype} does not run on CTranslate2 (one of {', '.join(CT2_DTYPES)})")
    return CT2_DTYPES[spec.dtype]


def _device(device: str) -> tuple[str, int]:
    """("cpu" or "cuda", device index) for models.device: auto takes a GPU where CTranslate2 sees one."""
    import ctranslate2

    if device == "auto":
        return ("cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"), 0
    kind, _, index = device.partition(":")
    return kind, int(index or 0)


def converted_checkpoint(name_or_path: str, cache: Path, tokenizer: str | None = None) -> Path:
    """The CTranslate2 folder of a Hugging Face checkpoint, converted once per content and version.

    A hub id is resolved to its local snapshot first (downloaded where the hub is reachable)."""
    import ctranslate2

    source = Path(name_or_path)
    if not source.is_dir():
        from huggingface_hub import snapshot_download

        source = Path(snapshot_download(name_or_path))
    # The vocabulary is part of what is converted: a checkpoint read with another tokenizer is another folder.
    key = checkpoint_hash(source) + (hashlib.sha256(tokenizer.encode()).hexdigest()[:8] if tokenizer else "")
    folder = cache / f"{key}-ct2-{ctranslate2.__version__}"
    if (folder / "model.bin").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    work = cache / f".{folder.name}.{os.getpid()}.partial"
    shutil.rmtree(work, ignore_errors=True)
    convert_folder(source, work, tokenizer)
    try:
        os.rename(work, folder)
    except OSError:  # another actor renamed its copy first: the same content
        shutil.rmtree(work, ignore_errors=True)
    return folder


def convert_folder(model_path: str | Path, out_dir: str | Path, tokenizer: str | None = None) -> None:
    """CTranslate2's conversion of a Hugging Face checkpoint into `out_dir` (overwritten), weights as
    saved, with its tokenizer (`tokenizer`, else the checkpoint's) and generation config beside."""
    model_path = str(model_path)
    try:
        if not AutoConfig.from_pretrained(model_path).is_encoder_decoder:
            raise ValueError("not an encoder-decoder model (CTranslate2's Translator runs those only)")
        _converter(model_path, tokenizer).convert(str(out_dir), quantization=None, force=True)
    except Exception as err:  # the converter fails in many ways (ValueError, AttributeError, ...)
        raise ValueError(f"CTranslate2 cannot convert the model at {model_path}: {err}") from err
    for beside, source in ((AutoTokenizer, tokenizer or model_path), (GenerationConfig, model_path)):
        try:
            beside.from_pretrained(source).save_pretrained(out_dir)
        except (OSError, ValueError):
            pass  # no generation config: nothing is forced (no tokenizer: the converter failed already)


def checkpoint_hash(folder: Path) -> str:
    """A content hash of a checkpoint folder: every file's relative path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def _forced_bos_id(converted_dir: str | Path) -> int | None:
    try:
        return GenerationConfig.from_pretrained(converted_dir).forced_bos_token_id
    except OSError:
        return None


def _converter(model_path: str, tokenizer: str | None = None):
    """CTranslate2's TransformersConverter, reading BART checkpoints saved by current transformers too,
    and the vocabulary from `tokenizer` where given (models.tokenizer: a checkpoint without its own).

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

        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return super().load_tokenizer(tokenizer_class, tokenizer or model_name_or_path, **kwargs)

    return Converter(model_path)


def _translator(converted_dir: str | Path, device: str, compute_type: str, threads: int, device_index: int = 0):
    """A ctranslate2.Translator over a converted folder: one batch at a time, `threads` threads for it."""
    import ctranslate2

    return ctranslate2.Translator(str(converted_dir), device=device, device_index=device_index,
                                  compute_type=compute_type, inter_threads=1, intra_threads=threads)


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
