"""The demo-pair training code on a few hundred Multi30k-like lines: tokenizer, a short run, resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.training.tokenizer import build_tokenizer, load_tokenizer
from pipeline.training.train import TrainConfig, train

pytestmark = pytest.mark.slow

GERMAN = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.",
          "Kinder bauen eine Sandburg.", "Ein Mann fährt Fahrrad.", "Musiker spielen auf der Bühne."]
ENGLISH = ["A dog runs across the meadow.", "Two men play soccer.", "A woman reads a book.",
           "Children build a sandcastle.", "A man rides a bike.", "Musicians play on stage."]


def corpus(folder: Path, copies: int = 40) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", copies), ("val", 2)):
        (folder / f"{split}.de").write_text("\n".join(GERMAN * n) + "\n")
        (folder / f"{split}.en").write_text("\n".join(ENGLISH * n) + "\n")
    return folder


def test_tokenizer_is_shared_t5_style(tmp_path):
    build_tokenizer(GERMAN * 20, ENGLISH * 20, tmp_path / "tok", vocab_size=70)
    tokenizer = load_tokenizer(tmp_path / "tok")
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    ids = tokenizer("Ein Hund läuft.")["input_ids"]
    assert ids[-1] == 1 and tokenizer.decode(ids, skip_special_tokens=True) == "Ein Hund läuft."


def test_short_training_run_exports_and_resumes(tmp_path):
    data = corpus(tmp_path / "data")
    build_tokenizer(GERMAN * 20, ENGLISH * 20, tmp_path / "tok", vocab_size=70)
    config = TrainConfig(size="small", epochs=1, batch_tokens=400, warmup_steps=2, threads=1, device="cpu",
                         val_subset=4, log_every=5)
    best = train(data, tmp_path / "out", tmp_path / "tok", config)
    assert (best / "model.safetensors").is_file() and (best / "config.json").is_file()
    checkpoint = tmp_path / "out" / "ckpt-small" / "last.pt"
    assert checkpoint.is_file()
    # A second call with a longer schedule continues from the checkpoint instead of starting over.
    longer = TrainConfig(**{**config.__dict__, "epochs": 2})
    train(data, tmp_path / "out", tmp_path / "tok", longer)
    log = (tmp_path / "out" / "ckpt-small" / "train_log.txt").read_text()
    assert "resumed" in log
