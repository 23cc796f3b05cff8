"""The resumable training loop for one T5 model of the pair.

Every ``ckpt_minutes`` (and at each epoch end) the full state -- model, optimizer, scheduler,
step, epoch, position in the epoch, RNG states, best val BLEU so far -- is written atomically to
``<out>/ckpt-<size>/last.pt``; running the same command again continues from it. After each epoch
(and every ``eval_minutes``) greedy BLEU on a fixed val subset is measured and the best model is
exported with ``save_pretrained`` to ``<out>/<size>-best`` (tokenizer files copied in).
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .data import collate, make_batches, read_parallel, tokenize_pairs
from .evaluate import bleu_of, count_params, load_model
from .model_shapes import t5_config
from .tokenizer import load_tokenizer


@dataclass
class TrainConfig:
    size: str = "large"
    epochs: float = 10.0          # schedule length; cosine decays to min_lr_ratio*lr at the end
    batch_tokens: int = 3000      # n * max(src_len, tgt_len) per batch
    optimizer: str = "adafactor"  # "adafactor" (updates relative to each weight's scale; suits
                                  # T5's init) or "adamw"
    lr: float = 2e-2              # peak; for adafactor a relative step size
    warmup_steps: int = 400
    min_lr_ratio: float = 0.02
    weight_decay: float = 0.01    # AdamW only
    label_smoothing: float = 0.1
    dropout: float | None = None  # None: the shape's default
    clip_norm: float = 1.0
    seed: int = 0
    val_subset: int = 300
    eval_minutes: float = 0.0     # 0: evaluate only at epoch ends
    ckpt_minutes: float = 4.0
    log_every: int = 20
    max_minutes: float = 0.0      # 0: no budget; else stop (and save) after this much training time
    threads: int = 2
    device: str = "auto"
    shape_overrides: dict = field(default_factory=dict)
    freeze_encoder: bool = False  # train only the decoder: the encoder and the shared embedding
                                  # (= tied LM head) stay as initialised, in eval mode (no dropout)
    distill_from: str | None = None  # a teacher model folder: train on KL(teacher || model) at
                                     # every target position instead of the labels alone
    distill_weight: float = 1.0      # loss = w * KL + (1 - w) * label cross-entropy (with a teacher)


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr_ratio * lr`` at ``total_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adafactor (scale_parameter=True: each update is relative to the weight's RMS, which suits
    T5's init -- embeddings std 1, query weights std (d_model*d_kv)^-0.5 -- much better than one
    absolute AdamW step size; measured: lower loss at equal steps) or AdamW."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=cfg.lr, scale_parameter=True, relative_step=False,
                         warmup_init=False, clip_threshold=1.0, weight_decay=0.0)
    if cfg.optimizer == "adamw":
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}],
                                 lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def seq2seq_loss(model, batch: dict[str, torch.Tensor], label_smoothing: float, teacher=None,
                 distill_weight: float = 1.0) -> tuple[torch.Tensor, int]:
    """Label-smoothed token cross-entropy (mean over non-pad target tokens).

    With a ``teacher`` model the loss becomes ``distill_weight * KL(teacher || model)`` (token-level
    knowledge distillation, temperature 1, mean over the same target tokens) plus
    ``(1 - distill_weight)`` times the cross-entropy: the model learns the teacher's whole next-token
    distribution -- its confidence as well as its choice -- which BiLD's policies read: fallback the
    small model's confidence, rollback the large model's probability of the small model's token.
    """
    labels = batch["labels"]
    decoder_input_ids = model._shift_right(labels)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  decoder_input_ids=decoder_input_ids, use_cache=False)
    logits = model(**inputs).logits.float()                       # [B, T, V]
    target = labels != -100                                        # [B, T]
    ntok = int(target.sum())
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1),
                           ignore_index=-100, label_smoothing=label_smoothing)
    if teacher is None:
        return loss, ntok
    with torch.no_grad():
        teacher_logprobs = F.log_softmax(teacher(**inputs).logits.float(), dim=-1)
    kl = F.kl_div(F.log_softmax(logits, dim=-1), teacher_logprobs, log_target=True,
                  reduction="none").sum(-1)                        # [B, T]
    kl = (kl * target).sum() / max(1, ntok)
    return distill_weight * kl + (1 - distill_weight) * loss, ntok


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


# Files that make ``AutoTokenizer.from_pretrained(model_folder)`` work (spiece.model is not needed:
# tokenizer.json holds the whole tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def export_model(model, tokenizer_dir: str | Path, out_dir: str | Path, info: dict | None = None) -> None:
    """``save_pretrained`` (safetensors) + the tokenizer files, replacing ``out_dir`` atomically."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    for f in Path(tokenizer_dir).iterdir():
        if f.name in TOKENIZER_FILES:
            shutil.copy2(f, tmp / f.name)
    if info is not None:
        (tmp / "training_info.json").write_text(json.dumps(info, indent=2))
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def log(msg: str, path: Path | None = None) -> None:
    line = time.strftime("%H:%M:%S ") + msg
    print(line, flush=True)
    if path is not None:
        with open(path, "a") as f:
            f.write(line + "\n")


def set_train_mode(model, cfg: TrainConfig) -> None:
    """``model.train()``, except a frozen encoder, which stays in eval mode (no dropout)."""
    model.train()
    if cfg.freeze_encoder:
        model.get_encoder().eval()


def train(data_dir: str | Path | None, out_dir: str | Path, tokenizer_dir: str | Path, cfg: TrainConfig,
          init_from: str | Path | None = None, train_sources: list[str] | None = None,
          train_targets: list[str] | None = None, run_name: str | None = None,
          val_sources: list[str] | None = None, val_references: list[str] | None = None) -> Path:
    """Trains (or resumes) one model; returns the folder of the best exported model.

    ``data_dir`` holds ``train.{de,en}`` and ``val.{de,en}``. ``init_from`` starts from an existing
    HF model instead of random init; ``train_sources`` / ``train_targets`` replace the training
    text and ``val_sources`` / ``val_references`` the val text (used by alignment). Without any
    val text the model is exported at every evaluation point instead of by best BLEU.
    """
    from transformers import AutoModelForSeq2SeqLM, T5ForConditionalGeneration

    torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    name = run_name or cfg.size
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / f"ckpt-{name}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    best_dir = out_dir / f"{name}-best"
    logfile = ckpt_dir / "train_log.txt"
    ckpt_path = ckpt_dir / "last.pt"

    tok = load_tokenizer(tokenizer_dir)
    if train_sources is None:
        train_sources, train_targets = read_parallel(data_dir, "train")
    if val_sources is None and data_dir is not None:
        val_sources, val_references = read_parallel(data_dir, "val")
    val_src = list(val_sources or [])[:cfg.val_subset]
    val_ref = list(val_references or [])[:cfg.val_subset]
    data = tokenize_pairs(tok, train_sources, train_targets)

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if init_from is not None:
        model = AutoModelForSeq2SeqLM.from_pretrained(str(init_from), dtype=torch.float32)
        if cfg.dropout is not None:
            model.config.dropout_rate = cfg.dropout
            for m in model.modules():
                if isinstance(m, torch.nn.Dropout):
                    m.p = cfg.dropout
    else:
        overrides = dict(cfg.shape_overrides)
        if cfg.dropout is not None:
            overrides["dropout_rate"] = cfg.dropout
        model = T5ForConditionalGeneration(t5_config(cfg.size, len(tok), **overrides))
    model.to(device)
    if cfg.freeze_encoder:
        for p in list(model.get_encoder().parameters()) + list(model.get_input_embeddings().parameters()):
            p.requires_grad_(False)
    opt = make_optimizer(model, cfg)
    teacher = None
    if cfg.distill_from:
        teacher = load_model(cfg.distill_from, device).requires_grad_(False)

    steps_per_epoch = len(make_batches(data, cfg.batch_tokens, cfg.seed, 0))
    total_steps = int(math.ceil(cfg.epochs * steps_per_epoch))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg, total_steps) / cfg.lr)

    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best_bleu": -1.0, "train_seconds": 0.0,
             "history": []}
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        state = ck["state"]
        random.setstate(ck["rng"]["python"])
        torch.set_rng_state(ck["rng"]["torch"])
        if torch.cuda.is_available() and ck["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(ck["rng"]["cuda"])
        log(f"resumed from {ckpt_path}: step {state['step']} epoch {state['epoch']} "
            f"batch {state['batch_in_epoch']} best val BLEU {state['best_bleu']:.2f}", logfile)
    else:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log(f"new run {name}: {count_params(model)/1e6:.2f}M params ({trainable/1e6:.2f}M trained), device {device}, "
            f"{len(data)} pairs, {steps_per_epoch} steps/epoch, {total_steps} total steps, "
            f"config {json.dumps(asdict(cfg))}", logfile)

    def save_ckpt():
        rng = {"python": random.getstate(), "torch": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        _atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "scheduler": sched.state_dict(), "state": state, "rng": rng,
                      "config": asdict(cfg)}, ckpt_path)

    def evaluate_and_export(tag: str):
        model.eval()
        t0 = time.time()
        if val_src:
            bleu, hyps = bleu_of(model, tok, val_src, val_ref, batch_size=100, max_new_tokens=80)
        else:  # nothing to select on: keep the latest model
            bleu, hyps = float(state["step"]), [""]
        set_train_mode(model, cfg)
        improved = bleu > state["best_bleu"]
        state["history"].append({"step": state["step"], "epoch": state["epoch"], "val_bleu": bleu,
                                 "train_minutes": state["train_seconds"] / 60})
        if improved:
            state["best_bleu"] = bleu
            export_model(model, tokenizer_dir, best_dir, info={
                "val_bleu_subset": bleu, "val_subset": len(val_src), "step": state["step"],
                "epoch": state["epoch"], "train_minutes": state["train_seconds"] / 60,
                "config": asdict(cfg), "params": count_params(model)})
        log(f"[eval {tag}] step {state['step']} val BLEU({len(val_src)}) {bleu:.2f} "
            f"best {state['best_bleu']:.2f}{' (exported)' if improved else ''} "
            f"({time.time()-t0:.0f}s) e.g. {hyps[0]!r}", logfile)

    max_seconds = cfg.max_minutes * 60 if cfg.max_minutes else float("inf")
    set_train_mode(model, cfg)
    last_ckpt = last_eval = time.time()
    win_tokens, win_loss, win_n, win_t = 0, 0.0, 0, time.time()
    done = state["step"] >= total_steps
    while not done:
        batches = make_batches(data, cfg.batch_tokens, cfg.seed, state["epoch"])
        for bi in range(state["batch_in_epoch"], len(batches)):
            if state["step"] >= total_steps or state["train_seconds"] >= max_seconds:
                done = True
                break
            t_step = time.time()
            batch = {k: v.to(device) for k, v in collate(data, batches[bi]).items()}
            loss, ntok = seq2seq_loss(model, batch, cfg.label_smoothing, teacher, cfg.distill_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            opt.step()
            sched.step()
            state["step"] += 1
            state["batch_in_epoch"] = bi + 1
            state["train_seconds"] += time.time() - t_step
            win_tokens += ntok + int(batch["attention_mask"].sum())
            win_loss += float(loss.detach()) * ntok
            win_n += ntok
            if state["step"] % cfg.log_every == 0:
                now = time.time()
                log(f"step {state['step']}/{total_steps} epoch {state['epoch']} "
                    f"({bi+1}/{len(batches)}) loss {win_loss/max(1,win_n):.3f} "
                    f"lr {sched.get_last_lr()[0]:.2e} tok/s {win_tokens/(now-win_t):.0f} "
                    f"train {state['train_seconds']/60:.1f} min", logfile)
                win_tokens, win_loss, win_n, win_t = 0, 0.0, 0, now
            if cfg.eval_minutes and time.time() - last_eval > cfg.eval_minutes * 60:
                evaluate_and_export("timed")
                last_eval = time.time()
                save_ckpt()
                last_ckpt = time.time()
            if time.time() - last_ckpt > cfg.ckpt_minutes * 60:
                save_ckpt()
                last_ckpt = time.time()
        else:
            state["epoch"] += 1
            state["batch_in_epoch"] = 0
            evaluate_and_export(f"epoch {state['epoch']}")
            last_eval = time.time()
            save_ckpt()
            last_ckpt = time.time()
            continue
    if not state["history"] or state["history"][-1]["step"] != state["step"]:
        evaluate_and_export("final")
    save_ckpt()
    log(f"finished {name}: step {state['step']}, best val BLEU {state['best_bleu']:.2f}, "
        f"train time {state['train_seconds']/60:.1f} min", logfile)
    return best_dir
