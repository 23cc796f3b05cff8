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


def tiny_large(vocab_size: int = 70):
    """A randomly initialised T5 "large" of the pair's kind, tiny enough for a unit test."""
    import torch
    from transformers import T5ForConditionalGeneration

    from pipeline.training.model_shapes import t5_config

    torch.manual_seed(0)
    config = t5_config("large", vocab_size, d_model=32, d_ff=64, num_heads=2, d_kv=16,
                       num_layers=3, num_decoder_layers=3)
    return T5ForConditionalGeneration(config).eval()


def test_shrink_from_large_copies_the_large_models_weights():
    import torch

    from pipeline.training.shrink import shrink_from_large

    large = tiny_large()
    small = shrink_from_large(large)  # the pair's default: every encoder layer, decoder layer 0
    assert (small.config.num_layers, small.config.num_decoder_layers) == (3, 1)
    assert small.config.d_model == large.config.d_model
    large_state, small_state = large.state_dict(), small.state_dict()
    for name, tensor in small_state.items():
        # encoder.* and shared/lm_head keep their names; decoder.block.0 is the large decoder's block 0
        assert torch.equal(tensor, large_state[name]), name
    assert small_state["shared.weight"].data_ptr() != large_state["shared.weight"].data_ptr()  # a copy
    # It is a working model: same encoder output as the large one, a decoder step gives logits.
    ids = torch.tensor([[5, 6, 7, 1]])
    with torch.no_grad():
        assert torch.equal(small.get_encoder()(input_ids=ids).last_hidden_state,
                           large.get_encoder()(input_ids=ids).last_hidden_state)
        logits = small(input_ids=ids, decoder_input_ids=torch.tensor([[0]])).logits
    assert logits.shape == (1, 1, 70)


def test_shrink_from_large_picks_layers_and_keeps_the_relative_bias():
    import torch

    from pipeline.training.shrink import shrink_from_large

    large = tiny_large()
    small = shrink_from_large(large, decoder_layers=[2], encoder_layers=[0, 2])
    assert (small.config.num_layers, small.config.num_decoder_layers) == (2, 1)
    bias = "layer.0.SelfAttention.relative_attention_bias.weight"
    src, dst = large.decoder.block, small.decoder.block
    for name, tensor in dst[0].state_dict().items():
        expected = src[0].state_dict()[bias] if name == bias else src[2].state_dict()[name]
        assert torch.equal(tensor, expected), name
    assert torch.equal(small.encoder.block[1].layer[1].DenseReluDense.wi.weight,
                       large.encoder.block[2].layer[1].DenseReluDense.wi.weight)
    with pytest.raises(ValueError):
        shrink_from_large(large, decoder_layers=[3])


def test_shrunk_small_model_trains_its_decoder_only(tmp_path):
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from pipeline.training.shrink import save_shrunk
    from pipeline.training.train import export_model

    data = corpus(tmp_path / "data")
    build_tokenizer(GERMAN * 20, ENGLISH * 20, tmp_path / "tok", vocab_size=70)
    tokenizer = load_tokenizer(tmp_path / "tok")
    export_model(tiny_large(len(tokenizer)), tmp_path / "tok", tmp_path / "large-best")
    init = save_shrunk(tmp_path / "large-best", tmp_path / "small-init")
    assert (init / "model.safetensors").is_file() and (init / "tokenizer.json").is_file()
    config = TrainConfig(size="small", epochs=1, batch_tokens=400, warmup_steps=2, threads=1, device="cpu",
                         val_subset=4, log_every=5, freeze_encoder=True)
    best = train(data, tmp_path / "out", tmp_path / "tok", config, init_from=init)
    large = AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path / "large-best")).state_dict()
    trained = AutoModelForSeq2SeqLM.from_pretrained(str(best)).state_dict()
    for name, tensor in trained.items():
        if name.startswith(("encoder.", "shared.", "lm_head.")):
            assert torch.equal(tensor, large[name]), f"frozen {name} changed"
    changed = [n for n, t in trained.items() if n.startswith("decoder.block.") and not torch.equal(t, large[n])]
    assert changed, "the decoder was not trained"


def test_export_writes_float16_weights_that_load_back_as_float32(tmp_path):
    import torch
    from safetensors import safe_open

    from pipeline.training.__main__ import export_all
    from pipeline.training.evaluate import load_model
    from pipeline.training.train import export_model

    build_tokenizer(GERMAN * 20, ENGLISH * 20, tmp_path / "tok", vocab_size=70)
    large = tiny_large(len(load_tokenizer(tmp_path / "tok")))
    export_model(large, tmp_path / "tok", tmp_path / "large-best")
    (tmp_path / "tokenizer").mkdir()
    for f in (tmp_path / "tok").iterdir():
        (tmp_path / "tokenizer" / f.name).write_bytes(f.read_bytes())
    exported = export_all(tmp_path) / "large"
    with safe_open(str(exported / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert (exported / "tokenizer.json").is_file()
    reloaded = load_model(exported)
    assert next(reloaded.parameters()).dtype == torch.float32
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, large.state_dict()[name].half().float()), name


def test_shape_option_overrides_the_large_models_shape_only():
    import argparse

    from pipeline.training.__main__ import parse_shape, train_config

    assert parse_shape("num_decoder_layers=12") == ("num_decoder_layers", 12)
    for bad in ("num_decoder_layers", "num_decoder_layers=twelve", "dropout_rate=1", "width=3"):
        with pytest.raises(SystemExit, match="--shape"):
            parse_shape(bad)
    args = argparse.Namespace(seed=0, threads=1, device="cpu", val_subset=10,
                              shape=["num_decoder_layers=12", "d_ff=1024"])
    assert train_config(args, "large").shape_overrides == {"num_decoder_layers": 12, "d_ff": 1024}
    assert train_config(args, "small").shape_overrides == {}  # the small model is cut from the large one


def test_greedy_translate_handles_a_decoder_deeper_than_the_encoder(tmp_path):
    """generate() sizes its own cache by T5's encoder depth; greedy_translate must not (IndexError)."""
    from transformers import T5ForConditionalGeneration

    from pipeline.training.evaluate import greedy_translate
    from pipeline.training.model_shapes import t5_config

    build_tokenizer(GERMAN * 20, ENGLISH * 20, tmp_path / "tok", vocab_size=70)
    tokenizer = load_tokenizer(tmp_path / "tok")
    config = t5_config("small", len(tokenizer), d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1,
                       num_decoder_layers=3)
    model = T5ForConditionalGeneration(config).eval()
    outputs = greedy_translate(model, tokenizer, GERMAN[:3], max_new_tokens=4)
    assert len(outputs) == 3 and all(isinstance(text, str) for text in outputs)


def distillation_batch(tmp_path):
    from pipeline.training.data import collate, tokenize_pairs

    build_tokenizer(GERMAN * 20, ENGLISH * 20, tmp_path / "tok", vocab_size=70)
    tokenizer = load_tokenizer(tmp_path / "tok")
    return collate(tokenize_pairs(tokenizer, GERMAN, ENGLISH), list(range(len(GERMAN)))), len(tokenizer)


def test_distillation_loss_is_the_kl_to_the_teacher(tmp_path):
    import torch

    from pipeline.training.shrink import shrink_from_large
    from pipeline.training.train import seq2seq_loss

    batch, vocab_size = distillation_batch(tmp_path)
    teacher = tiny_large(vocab_size)
    student = shrink_from_large(teacher).eval()
    with torch.no_grad():
        self_kl, ntok = seq2seq_loss(teacher, batch, 0.1, teacher=teacher)
        kl, _ = seq2seq_loss(student, batch, 0.1, teacher=teacher)
        cross_entropy, _ = seq2seq_loss(student, batch, 0.1)
        only_labels, _ = seq2seq_loss(student, batch, 0.1, teacher=teacher, distill_weight=0.0)
        half, _ = seq2seq_loss(student, batch, 0.1, teacher=teacher, distill_weight=0.5)
    assert ntok == sum(len(t) for t in load_tokenizer(tmp_path / "tok")(ENGLISH).input_ids)
    assert abs(float(self_kl)) < 1e-5  # a model is at distance 0 from itself
    assert float(kl) > 0.01            # a one-layer cut of a random model is not
    assert torch.allclose(only_labels, cross_entropy)
    assert torch.allclose(half, 0.5 * kl + 0.5 * cross_entropy)


def test_distillation_run_moves_the_student_towards_the_teacher(tmp_path):
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from pipeline.training.shrink import save_shrunk
    from pipeline.training.train import export_model, seq2seq_loss

    data = corpus(tmp_path / "data")
    batch, vocab_size = distillation_batch(tmp_path)
    export_model(tiny_large(vocab_size), tmp_path / "tok", tmp_path / "large-best")
    init = save_shrunk(tmp_path / "large-best", tmp_path / "small-init")
    config = TrainConfig(size="aligned", epochs=2, batch_tokens=400, warmup_steps=2, threads=1, device="cpu",
                         val_subset=4, log_every=5, freeze_encoder=True, label_smoothing=0.0,
                         distill_from=str(tmp_path / "large-best"))
    best = train(data, tmp_path / "out", tmp_path / "tok", config, init_from=init, run_name="distilled",
                 val_sources=[], val_references=[])  # no val text: the last model is exported
    teacher = AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path / "large-best")).eval()
    before = AutoModelForSeq2SeqLM.from_pretrained(str(init)).eval()
    after = AutoModelForSeq2SeqLM.from_pretrained(str(best)).eval()
    with torch.no_grad():
        kl_before, _ = seq2seq_loss(before, batch, 0.0, teacher=teacher)
        kl_after, _ = seq2seq_loss(after, batch, 0.0, teacher=teacher)
    assert float(kl_after) < 0.8 * float(kl_before)


@pytest.mark.parametrize("loss", ["labels", "distill"])
def test_align_command_fine_tunes_the_small_model_on_the_large_models_outputs(tmp_path, loss):
    import json

    import torch
    from click.testing import CliRunner
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from pipeline.cli import main
    from pipeline.pairs.tiny import save_pair
    from pipeline.training.data import collate, tokenize_pairs
    from pipeline.training.train import seq2seq_loss

    small, large = save_pair(tmp_path / "pair", "t5", small="noisy", seed=0)
    (tmp_path / "train.de").write_text("\n".join(GERMAN * 4) + "\n")
    result = CliRunner().invoke(main, ["align", "--small", str(small), "--large", str(large), "--data",
                                       str(tmp_path / "train.de"), "--out", str(tmp_path / "aligned"),
                                       "--epochs", "3", "--lr", "2e-2", "--device", "cpu", "--loss", loss])
    assert result.exit_code == 0, result.output
    aligned = tmp_path / "aligned" / "small-aligned-best"
    config = json.loads((aligned / "training_info.json").read_text())["config"]
    assert (config["distill_from"] is not None) == (loss == "distill")
    # The targets are the large model's own outputs, and the fine-tune moved the small model towards them.
    targets = [json.loads(line)["text"] for line in (tmp_path / "aligned" / "large_outputs.jsonl").open()][:6]
    tokenizer = AutoTokenizer.from_pretrained(str(large))
    batch = collate(tokenize_pairs(tokenizer, GERMAN, targets), list(range(6)))
    teacher = AutoModelForSeq2SeqLM.from_pretrained(str(large)).eval()
    with torch.no_grad():
        before, _ = seq2seq_loss(AutoModelForSeq2SeqLM.from_pretrained(str(small)).eval(), batch, 0.0, teacher)
        after, _ = seq2seq_loss(AutoModelForSeq2SeqLM.from_pretrained(str(aligned)).eval(), batch, 0.0, teacher)
    assert float(after) < float(before)


def test_each_alignment_loss_has_its_own_run_folder(tmp_path):
    """A distillation run must not resume the label run's checkpoint, and export takes the one asked for."""
    from pipeline.training.__main__ import align_run_dir, export_all
    from pipeline.training.train import export_model

    assert align_run_dir(tmp_path) == tmp_path / "small-aligned-run"  # the shipped pair's layout
    assert align_run_dir(tmp_path, "distill") != align_run_dir(tmp_path, "labels")
    build_tokenizer(GERMAN * 20, ENGLISH * 20, tmp_path / "tokenizer", vocab_size=70)
    export_model(tiny_large(len(load_tokenizer(tmp_path / "tokenizer"))), tmp_path / "tokenizer",
                 align_run_dir(tmp_path, "distill") / "small-aligned-best")
    assert not (export_all(tmp_path, "float32") / "small-aligned").exists()
    assert (export_all(tmp_path, "float32", "distill") / "small-aligned" / "model.safetensors").is_file()
