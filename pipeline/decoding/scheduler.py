"""The one decoding driver: BiLD, speculative and plain decoding over a batch of rows (docs/design.md §1).

A batch holds up to ``batch_size`` active rows (batch size 1 is the same code with one row).
Each round either

- *drafts*: every drafting row drafts until it falls back (max pS < alpha_FB), writes EOS or fills
  its window, then waits (drafting.py: greedy rows a whole window in one call, sampled ones one token
  per round). A row's window is chosen when its round opens: ``max_draft_tokens``, or with
  ``adaptive_draft`` the measured best (draft_length.py), where 0 makes the round a plain large step; or
- *verifies*: the large model reads the pending drafts of every waiting row in one forward pass
  (or a few, see ``_verify_groups``); each row's policy verdict (policies.py) keeps a prefix of
  its drafts and appends the large model's token, and both models' caches of that row are cut
  back to what it kept — a shorter length in each engine, nothing recomputed.

The large model is called when at least ``verify_share`` of the active rows wait (always when
none is left drafting). A row drafts and is verified exactly as it would be alone, so its
tokens and statistics do not depend on the rows that share its batch (docs/design.md §1, §2).
Finished rows leave at once and queued records take their slots (continuous batching). Plain
``large``/``small`` decoding batches the same way: every active row advances one token per pass.
The models are reached only through engines (engine.py).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch.nn.utils.rnn import pad_sequence

from pipeline.decoding.config import DRAFTING_METHODS, BatchPolicy, BatchRequest, DecodingConfig
from pipeline.decoding.draft_length import DraftLength
from pipeline.decoding.drafting import Drafter
from pipeline.decoding.engine import Engine, Feed, padding_groups
from pipeline.decoding.policies import judge, model_probs
from pipeline.decoding.sampling import RowSampler, choose, greedy
from pipeline.decoding.stats import DecodeOutput, DecodeStats


@dataclass
class _Row:
    """A record's state while it is in the batch."""

    request: int  # index into the requests
    slot: int
    start: int  # prefix length: generated tokens begin here
    length: int  # kept tokens (prefix included); drafts follow at [length, length + drafts)
    joined: float
    sampler: RowSampler | None
    stats: DecodeStats = field(default_factory=DecodeStats)
    window: int | None = None  # the most drafts of this round (None: not chosen yet)
    window_calls: int = 0  # small-model calls of this round
    drafts: int = 0
    draft_probs: list[torch.Tensor] = field(default_factory=list)  # q per draft, when sampling
    draft_logits: list[torch.Tensor] = field(default_factory=list)  # the small model's logits per draft (cascade)
    waiting: bool = False
    ended_on_eos: bool = False
    drafter_admitted: bool = False  # the small engine holds this row (it joins on its first draft)
    encoded: torch.Tensor | None = None  # its encoder states [S, d] until then, where the small model shares them
    budget: int = 0  # the most tokens this record may generate (DecodingConfig.budget of its input)

    def produced(self) -> int:
        return self.length - self.start


class Scheduler:
    """Decodes many requests with a small and a large engine, ``policy.batch_size`` rows at a time.

    ``prefix_for(input_ids) -> [P]`` gives a request's decoder prefix (the start token for
    encoder-decoder models, the prompt for decoder-only ones). An engine a method does not use
    may be None. ``draft_length`` chooses each round's window (default: a DraftLength when
    ``config.adaptive_draft``, else the configured window always).
    """

    def __init__(
        self,
        small: Engine | None,
        large: Engine | None,
        config: DecodingConfig,
        policy: BatchPolicy,
        eos_ids: frozenset[int],
        prefix_for: Callable[[torch.Tensor], torch.Tensor],
        device: torch.device | str = "cpu",
        shares_encoder: bool = False,
        draft_length: DraftLength | None = None,
    ):
        for engine in (small, large):
            if engine is not None and engine.slots < policy.batch_size:
                raise ValueError(f"an engine with {engine.slots} slots cannot hold a batch of {policy.batch_size}")
        self.small, self.large = small, large
        self.config = config
        self.policy = policy
        self.eos_ids = eos_ids
        self.prefix_for = prefix_for
        self.device = torch.device(device)
        # The small model's encoder is the large one's (which only matters where both run).
        self.shares_encoder = shares_encoder and None not in (small, large)
        if draft_length is None and config.measures_windows:
            draft_length = DraftLength(config.max_draft_tokens, policy.batch_size)
        self.draft_length = draft_length
        self.drafter = Drafter(small, config, eos_ids, lambda rows: self._feed(small, rows, [1] * len(rows)),
                               self._choose) if config.method in DRAFTING_METHODS else None

    # --- the outer loop -------------------------------------------------------------------------

    def run(self, requests: Sequence[BatchRequest]) -> list[DecodeOutput]:
        if not requests:
            return []
        # Shortest inputs first: newcomers admitted together are padded to the longest of them (as
        # CTranslate2 sorts a batch by length). Each row's tokens never depend on its neighbours.
        queue = deque(sorted(range(len(requests)), key=lambda index: len(requests[index].input_ids)))
        buffer_length = max(len(self.prefix_for(r.input_ids)) + r.budget(self.config)
                            for r in requests) + 1
        self.sequence = torch.zeros((self.policy.batch_size, buffer_length), dtype=torch.long)
        self.requests = requests
        free = list(range(self.policy.batch_size))[::-1]
        active: list[_Row] = []
        outputs: list[DecodeOutput | None] = [None] * len(requests)
        plain = partial(self._plain_step, self.large if self.config.method == "large" else self.small)
        step = self._step_drafts if self.config.method in DRAFTING_METHODS else plain  # large/small: one token a pass
        while queue or active:
            joining = []
            # Newcomers join in groups (one encoder pass for all), unless the queue is nearly empty.
            if not active or len(free) >= min(self.policy.refill_share * self.policy.batch_size, len(queue)):
                while queue and free:
                    joining.append(self._new_row(queue.popleft(), free.pop(), requests))
            if joining:
                if self.draft_length is not None:  # its epochs compare rounds: admissions are both arms' alike
                    self.draft_length.pause()
                self._admit(joining, requests)
                active.extend(joining)
                active.sort(key=lambda row: row.slot)  # rows in slot order: engines read consecutive slots in place
            for row in step(active):  # rows that finished this round
                row.stats.output_tokens = row.produced()
                outputs[row.request] = DecodeOutput(tokens=self.sequence[row.slot, row.start : row.length].tolist(),
                                                    stats=row.stats, seconds=time.perf_counter() - row.joined)
                active.remove(row)
                free.append(row.slot)
                for engine in (self.small, self.large):
                    if engine is not None:
                        engine.release(row.slot)
        if self.draft_length is not None:
            self.draft_length.pause()
        return outputs

    def _new_row(self, index: int, slot: int, requests: Sequence[BatchRequest]) -> _Row:
        prefix = self.prefix_for(requests[index].input_ids)
        self.sequence[slot].zero_()
        self.sequence[slot, : len(prefix)] = prefix
        sampler = RowSampler.seeded([requests[index].seed], device=self.device) if self.config.do_sample else None
        return _Row(request=index, slot=slot, start=len(prefix), length=len(prefix),
                    joined=time.perf_counter(), sampler=sampler,
                    budget=requests[index].budget(self.config))

    def _admit(self, rows: list[_Row], requests: Sequence[BatchRequest]) -> None:
        """Newcomers take their slots; encoder-decoder engines run the encoder once for all of them
        (once for both models when they share it). A drafting method's small model takes a row when it
        first drafts (``_admit_drafters``): rows that only ever take plain steps (a window of 0) never
        pay its encoder or cross-attention projections."""
        slots = [row.slot for row in rows]
        inputs = [requests[row.request].input_ids for row in rows]
        if self.large is None:  # plain small decoding
            return self._admit_drafters(rows)
        encoded = self.large.admit(slots, inputs)
        if self.small is not None and self.shares_encoder:
            for row, states, ids in zip(rows, encoded, inputs):
                row.encoded = states[: len(ids)]

    def _admit_drafters(self, rows: list[_Row]) -> None:
        """The small engine takes the rows it does not hold yet, before their first draft; its next
        feed brings each up to the row's kept tokens."""
        joining = [row for row in rows if not row.drafter_admitted]
        if not joining:
            return
        encoded = pad_sequence([row.encoded for row in joining], batch_first=True) if self.shares_encoder else None
        inputs = [self.requests[row.request].input_ids for row in joining]
        self.small.admit([row.slot for row in joining], inputs, encoded)
        for row in joining:
            row.drafter_admitted, row.encoded = True, None

    def _feed(self, engine: Engine, rows: list[_Row], reads: list[int]) -> Feed:
        """Each row's tokens that ``engine`` has not cached yet: from its cached length up to the
        row's last kept token or draft."""
        slots = [row.slot for row in rows]
        positions = [engine.lengths[slot] for slot in slots]
        counts = [row.length + row.drafts - position for row, position in zip(rows, positions)]
        return Feed(slots, self._tokens(slots, positions, max(counts)), positions, counts, reads)

    def _tokens(self, slots: list[int], starts: list[int], width: int) -> torch.Tensor:
        """Each slot's ``width`` buffered tokens from its start (a view for one row). [R, width]"""
        if len(slots) == 1:
            return self.sequence[slots[0] : slots[0] + 1, starts[0] : starts[0] + width]
        columns = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
        return self.sequence[torch.tensor(slots)[:, None], columns.clamp(max=self.sequence.shape[1] - 1)]

    # --- plain decoding with one model ----------------------------------------------------------

    def _plain_step(self, engine: Engine, rows: list[_Row]) -> list[_Row]:
        """One token for each row from one forward pass of ``engine``: its argmax, or a sample from the row's
        own stream. Plain ``large``/``small`` decoding, and a drafting method's rounds where every row's window
        is 0. Returns the rows that finished."""
        logits = engine.forward(self._feed(engine, rows, [1] * len(rows)))[:, 0]  # [R, V]
        tokens = self._choose(self._probs(logits), rows) if self.config.do_sample else greedy(logits)
        by_large = engine is self.large
        finished = []
        for row, token in zip(rows, tokens.tolist()):
            self.sequence[row.slot, row.length] = token
            row.length += 1
            row.stats.count_plain_step(by_large)
            row.window, row.waiting = None, False
            if token in self.eos_ids or row.produced() >= row.budget:
                finished.append(row)
        return finished

    # --- BiLD and speculative decoding ----------------------------------------------------------

    def _step_drafts(self, active: list[_Row]) -> list[_Row]:
        if any(row.window is None for row in active):  # rows opening a round: the configured or the measured best
            most = self.config.max_draft_tokens if self.draft_length is None else self.draft_length.choose(len(active))
            self.drafter.open_windows(active, most)
        if all(row.window == 0 for row in active):  # plain large steps only: the Python of `large`'s own step
            started = time.perf_counter()
            finished = self._plain_step(self.large, active)
            if self.draft_length is not None:  # as _verify_group reports a round of windows 0
                self.draft_length.verified(len(active), time.perf_counter() - started, calls=0, drafts=0, kept=0,
                                           rejections=0, made=len(active))
            return finished
        waiting = [row for row in active if row.waiting]
        drafting = [row for row in active if not row.waiting]
        if waiting and (not drafting or len(waiting) >= self.policy.verify_share * len(active)):
            return [row for group in self._verify_groups(waiting) for row in self._verify_group(group)]
        started = time.perf_counter()
        enough = max(1, math.ceil(self.policy.verify_share * len(active)) - len(waiting))
        self._admit_drafters(drafting)
        steps = self.drafter.draft(drafting, self.sequence, enough)
        if self.draft_length is not None:
            self.draft_length.drafted(len(drafting), time.perf_counter() - started, steps)
        return []

    def _verify_groups(self, rows: list[_Row]) -> list[list[_Row]]:
        """The waiting rows in the groups verified together: one large-model pass, or several where rows with
        short and long pending tails are better padded apart (engine.padding_groups, by the measured call cost)."""
        if len(rows) < 2:
            return [rows]
        overhead = self.large.call_cost.overhead_in_positions()
        if overhead is None:
            return [rows]
        lengths = self.large.lengths
        tails = [row.length + row.drafts - lengths[row.slot] for row in rows]  # tokens to feed
        return [[rows[i] for i in group] for group in padding_groups(tails, overhead)]

    def _verify_group(self, rows: list[_Row]) -> list[_Row]:
        """One large-model pass over the pending drafts of these rows (docs/design.md §1, step 2)."""
        config = self.config
        started = time.perf_counter()
        counts, kept_before = [row.drafts for row in rows], sum(row.length for row in rows)
        feed = self._feed(self.large, rows, [count + 1 for count in counts])
        logits = self.large.forward(feed)  # [R, K+1, V]
        width = max(counts)
        if width == 0 and not config.do_sample:  # no drafts (a fallback at once, or a window of 0): the large
            # model's greedy token, as a plain large step takes it (the argmax of p is the argmax of its logits)
            accepted, rejected, deferred = [0] * len(rows), [False] * len(rows), None
            next_token = greedy(logits[:, 0]).tolist()
        else:
            accepted, rejected, next_token, deferred = self._verdict(rows, counts, width, logits)
        finished = []
        calls = [row.window_calls for row in rows]
        for i, row in enumerate(rows):
            stats = row.stats
            stats.large_calls += 1
            stats.draft_tokens += row.drafts
            stats.small_tokens += accepted[i]
            stats.rollbacks += int(rejected[i])
            if deferred is not None:
                stats.deferrals += int(deferred[i])
            row.length += accepted[i]  # kept drafts are already in the buffer
            # Both models may have read drafts past the kept prefix: drop those cache entries.
            self.small.rewind(row.slot, row.length)
            self.large.rewind(row.slot, row.length)
            done = accepted[i] == row.drafts and row.ended_on_eos  # a kept EOS ends the sequence
            if not done and row.produced() < row.budget:
                self.sequence[row.slot, row.length] = next_token[i]
                row.length += 1
                stats.large_tokens += 1
                done = next_token[i] in self.eos_ids
            done = done or row.produced() >= row.budget
            row.drafts, row.draft_probs, row.draft_logits, row.waiting, row.ended_on_eos = 0, [], [], False, False
            row.window, row.window_calls = None, 0
            if done:
                finished.append(row)
        if self.draft_length is not None:
            self.draft_length.verified(len(rows) * feed.width, time.perf_counter() - started,
                                       calls=sum(calls), drafts=sum(counts), kept=sum(accepted),
                                       rejections=sum(int(flag) for flag in rejected),
                                       made=sum(row.length for row in rows) - kept_before)
        return finished

    def _verdict(self, rows: list[_Row], counts: list[int], width: int, logits: torch.Tensor) -> tuple[list, ...]:
        """The method's policy (policies.judge) on these rows' drafts, as lists: (accepted, rejected, next token,
        deferred or None)."""
        drafts = self._tokens([row.slot for row in rows], [row.length for row in rows], width)  # [R, K]
        if len(rows) > 1:  # zeros past each row's own drafts
            drafts = torch.where(torch.arange(width)[None, :] < torch.tensor(counts)[:, None], drafts, 0)
        sampler = RowSampler([row.sampler.generators[0] for row in rows]) if self.config.do_sample else None
        verdict = judge(self.config, drafts, torch.tensor(counts), logits, [row.draft_probs for row in rows],
                        [row.draft_logits for row in rows], sampler)
        deferred = verdict.deferred.tolist() if verdict.deferred is not None else None
        return verdict.accepted.tolist(), verdict.rejected.tolist(), verdict.next_token.tolist(), deferred

    # --- distributions and choices --------------------------------------------------------------

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        return model_probs(self.config, logits)

    def _choose(self, probs: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """Each row's own choice: argmax, or a sample from the row's own random stream. [R, V] -> [R]"""
        if not self.config.do_sample:
            return greedy(probs)
        return choose(probs, True, RowSampler([row.sampler.generators[0] for row in rows]))


def scheduler_for(pair, config: DecodingConfig, policy: BatchPolicy, chooser: DraftLength | None = None) -> Scheduler:
    """A Scheduler over ``pair`` (a ModelPair) with the engines ``config.method`` uses; ``chooser``: the window
    chooser it reports to and asks (with ``config.adaptive_draft``; None: one of its own, for this run only),
    which its owner (pair_decoder.PairDecoder, a benchmark) keeps across runs."""
    return Scheduler(
        pair.engine("small", policy.batch_size) if config.method != "large" else None,
        pair.engine("large", policy.batch_size) if config.method != "small" else None,
        config, policy, pair.eos_token_ids, pair.decoder_prefix,
        device=pair.device, shares_encoder=pair.shares_encoder,
        draft_length=chooser if config.measures_windows else None,
    )


def decode_batch(pair, config: DecodingConfig, policy: BatchPolicy, requests: Sequence[BatchRequest],
                 chooser: DraftLength | None = None) -> list[DecodeOutput]:
    """Decode ``requests`` with ``pair`` (a ModelPair), ``policy.batch_size`` rows at a time."""
    return scheduler_for(pair, config, policy, chooser).run(requests)
