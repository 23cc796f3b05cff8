"""A joint German+English SentencePiece tokenizer, saved as a Hugging Face T5 tokenizer.

T5 conventions: pad id 0 ``<pad>``, eos id 1 ``</s>``, unk id 2 ``<unk>``, no BOS, no extra_ids.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import sentencepiece as spm


def train_sentencepiece(texts: list[str], model_prefix: str | Path, vocab_size: int = 8000,
                        seed: int = 0) -> Path:
    """Trains a unigram SentencePiece model on ``texts``; returns the ``.model`` path."""
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        for t in texts:
            f.write(t.replace("\n", " ") + "\n")
        corpus = f.name
    try:
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=str(model_prefix), vocab_size=vocab_size,
            model_type="unigram", character_coverage=1.0,
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
            pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
            input_sentence_size=0, shuffle_input_sentence=False,
            num_threads=os.cpu_count() or 1, seed_sentencepiece_size=1000000,
            minloglevel=2,
        )
    finally:
        os.unlink(corpus)
    return model_prefix.with_suffix(".model")


def to_hf_tokenizer(spm_model: str | Path, out_dir: str | Path):
    """Wraps a SentencePiece model as a T5 tokenizer and saves it with ``save_pretrained``."""
    from transformers import T5Tokenizer

    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(spm_model).read_bytes())
    vocab = [(piece.piece, piece.score) for piece in proto.pieces]
    tok = T5Tokenizer(vocab=vocab, extra_ids=0,
                      _spm_precompiled_charsmap=proto.normalizer_spec.precompiled_charsmap)
    tok.save_pretrained(str(out_dir))
    # Keep the raw SentencePiece model next to it (small, handy for inspection).
    Path(out_dir, "spiece.model").write_bytes(Path(spm_model).read_bytes())
    return tok


def build_tokenizer(train_src: list[str], train_tgt: list[str], out_dir: str | Path,
                    vocab_size: int = 8000, seed: int = 0):
    """Trains the joint tokenizer and saves it to ``out_dir``; returns the HF tokenizer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = train_sentencepiece(list(train_src) + list(train_tgt), Path(tmp) / "sp", vocab_size, seed)
        tok = to_hf_tokenizer(model, out_dir)
    check_tokenizer(tok)
    return tok


def check_tokenizer(tok) -> None:
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and tok.unk_token_id == 2, (
        tok.pad_token_id, tok.eos_token_id, tok.unk_token_id)
    ids = tok("Ein Mann fährt Fahrrad.").input_ids
    assert ids[-1] == 1, ids


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))
