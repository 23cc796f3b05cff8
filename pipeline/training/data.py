"""Parallel text reading and length-bucketed token batching.

Batches are deterministic functions of (seed, epoch), so a resumed run regenerates the epoch's
batch order and skips the batches it has already trained on.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch


def read_lines(path: str | Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def read_parallel(data_dir: str | Path, split: str, src: str = "de", tgt: str = "en") -> tuple[list[str], list[str]]:
    """Reads ``{split}.{src}`` and ``{split}.{tgt}``; line i of one is parallel to line i of the other."""
    s = read_lines(Path(data_dir) / f"{split}.{src}")
    t = read_lines(Path(data_dir) / f"{split}.{tgt}")
    if len(s) != len(t):
        raise ValueError(f"{split}: {len(s)} source lines but {len(t)} target lines")
    return s, t


@dataclass
class TokenizedPairs:
    src: list[list[int]]
    tgt: list[list[int]]

    def __len__(self) -> int:
        return len(self.src)


def tokenize_pairs(tokenizer, sources: list[str], targets: list[str], max_len: int = 128) -> TokenizedPairs:
    """Token ids (EOS appended by the T5 tokenizer), truncated to ``max_len`` keeping EOS."""
    def enc(texts):
        ids = tokenizer(texts, add_special_tokens=True).input_ids
        return [x if len(x) <= max_len else x[:max_len - 1] + [x[-1]] for x in ids]
    return TokenizedPairs(enc(sources), enc(targets))


def make_batches(data: TokenizedPairs, batch_tokens: int, seed: int, epoch: int,
                 shuffle: bool = True) -> list[list[int]]:
    """Groups example indices into batches of similar length.

    A batch holds as many examples as fit ``n * max(longest source, longest target) <=
    batch_tokens`` (padded tokens on the larger side). Examples are sorted by length with a
    little seeded noise (so batches differ between epochs), then the batch order is shuffled.
    """
    rng = random.Random(seed * 100_003 + epoch)
    lengths = [max(len(s), len(t)) for s, t in zip(data.src, data.tgt)]
    order = list(range(len(data)))
    if shuffle:
        rng.shuffle(order)
        order.sort(key=lambda i: lengths[i] + rng.random() * 2.0)
    else:
        order.sort(key=lambda i: lengths[i])
    batches, cur, cur_max = [], [], 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(data: TokenizedPairs, idx: list[int], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and labels (pad positions in labels are -100)."""
    src = [data.src[i] for i in idx]
    tgt = [data.tgt[i] for i in idx]
    S, T = max(map(len, src)), max(map(len, tgt))
    input_ids = torch.full((len(idx), S), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), T), -100, dtype=torch.long)
    for r, (s, t) in enumerate(zip(src, tgt)):
        input_ids[r, :len(s)] = torch.tensor(s)
        labels[r, :len(t)] = torch.tensor(t)
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad_id).long(), "labels": labels}
