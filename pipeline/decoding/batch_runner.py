"""One model's decoder for a batch of rows that each keep their own length (batched decoding).

Every row (a record being decoded) owns a *slot* in a pool of key/value tensors, in the style of
gpt-fast's static KV cache: slot s holds its row's first ``cached[s]`` positions, left-aligned.
A forward pass over any subset of rows gathers their caches into one right-aligned (left-padded)
Hugging Face cache, feeds each row's uncached tail (right-padded), and writes the new keys and
values back into the slots. So

- a rollback is only a smaller ``cached`` count (nothing is copied),
- a finished row frees its slot and a new record takes it (continuous batching),
- only the rows that need the model take part in its forward pass.

Right alignment keeps each row's tokens contiguous and directly before its new tokens, so T5's
relative position bias sees true distances; models with absolute positions get each row's own
positions (``position_ids`` for decoder-only models, a hook on the decoder's position embedding
for BART-like encoder-decoders).
"""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput


class UnsupportedModelError(ValueError):
    """The model cannot be decoded in a batch with per-row lengths (use batch_size 1)."""


class _SlotPool:
    """Per-slot tensors of every layer: ``layers[i]`` is a list of [slots, heads, capacity, dim].

    The capacity (positions per slot) grows on demand, so memory follows the longest row seen.
    """

    def __init__(self, slots: int):
        self.slots = slots
        self.layers: list[list[torch.Tensor]] = []  # per layer: [keys, values]

    @property
    def capacity(self) -> int:
        return self.layers[0][0].shape[2] if self.layers else 0

    def reserve(self, like: list[tuple[torch.Tensor, torch.Tensor]], positions: int) -> None:
        """Make room for ``positions`` per slot, shaped like ``like`` (one (keys, values) per layer)."""
        if self.layers and positions <= self.capacity:
            return
        capacity = max(positions, 2 * self.capacity, 16)
        grown = []
        for i, pair in enumerate(like):
            tensors = []
            for j, t in enumerate(pair):
                new = t.new_zeros((self.slots, t.shape[1], capacity, t.shape[3]))
                if self.layers:
                    new[:, :, : self.capacity] = self.layers[i][j]
                tensors.append(new)
            grown.append(tensors)
        self.layers = grown

    def write(self, slots: torch.Tensor, positions: torch.Tensor, layers) -> None:
        """Store [R, H, W, D] keys/values of each layer at per-row ``positions`` [R, W]."""
        self.reserve(layers, int(positions.max()) + 1)
        for pool, new in zip(self.layers, layers):
            for pooled, tensor in zip(pool, new):
                pooled[slots[:, None], :, positions] = tensor.transpose(1, 2)  # [R, W, H, D]

    def read(self, slots: torch.Tensor, index: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values) [R, H, P, D] at per-row positions ``index`` [R, P]."""
        return [tuple(t[slots[:, None], :, index].transpose(1, 2) for t in pool) for pool in self.layers]


class CallCost:
    """A running least-squares fit of one model's forward time: seconds = a + b * positions.

    ``a / b`` is what one more call costs, in positions: the scheduler weighs it against the
    padding that splitting a pass would save. On a GPU ``b`` is tiny and calls are rarely split;
    on a CPU, where time grows with every position, padding matters.
    """

    def __init__(self, min_calls: int = 16):
        self.min_calls = min_calls
        self.n = 0
        self.sums = [0.0] * 4  # over calls, x = positions and y = seconds: sum x, y, xx, xy

    def add(self, positions: int, seconds: float) -> None:
        self.n += 1
        x, y = float(positions), seconds
        for i, value in enumerate((x, y, x * x, x * y)):
            self.sums[i] += value

    def overhead_in_positions(self) -> float | None:
        """a / b, or None until enough calls of different sizes were timed (or the fit is absurd)."""
        if self.n < self.min_calls:
            return None
        sx, sy, sxx, sxy = self.sums
        spread = self.n * sxx - sx * sx
        if spread <= 0:
            return None
        slope = (self.n * sxy - sx * sy) / spread
        intercept = (sy - slope * sx) / self.n
        if slope <= 0 or intercept <= 0:
            return None
        return intercept / slope


class BatchedDecoder:
    """A model's decoder over a pool of row slots; the batched counterpart of ``CachedDecoder``.

    The caller keeps the token buffer ``sequence`` [slots, T]; the decoder remembers, per slot,
    how many positions are cached and the logits of the last position it read.
    """

    def __init__(self, model: PreTrainedModel, slots: int):
        config = model.config
        if getattr(config, "sliding_window", None) or "sliding_attention" in (getattr(config, "layer_types", None) or []):
            raise UnsupportedModelError(
                f"{config.model_type}: sliding-window attention is not supported in batched decoding; use batch_size 1"
            )
        self.model = model
        self.slots = slots
        self.is_encoder_decoder = bool(config.is_encoder_decoder)
        self.device = model.device
        self.cached = torch.zeros(slots, dtype=torch.long)
        self.self_pool = _SlotPool(slots)
        self.cross_pool = _SlotPool(slots)
        self.encoder_states: torch.Tensor | None = None  # [slots, S, d]
        self.encoder_lengths = torch.zeros(slots, dtype=torch.long)
        self.last_logits: torch.Tensor | None = None  # [slots, V]: logits of position cached - 1
        self.last_valid = torch.zeros(slots, dtype=torch.bool)
        self.cross_ready = torch.zeros(slots, dtype=torch.bool)  # cross-attention keys/values stored
        # The cross-attention inputs of the last row set: reused while the same rows run again.
        self._cross_memo: tuple[tuple[int, ...], tuple] | None = None
        self._position_embedding = self._absolute_position_embedding()
        self.calls = 0
        self.tokens_fed = 0
        self.positions_computed = 0
        self.forward_seconds = 0.0
        self.call_cost = CallCost()

    # --- rows joining and leaving ---------------------------------------------------------------

    @torch.inference_mode()
    def admit(
        self, slots: list[int], input_ids: list[torch.Tensor] | None = None, encoded: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Give ``slots`` to new rows. Encoder-decoder models run the encoder on ``input_ids``
        (one [S] tensor per slot) here, once, batched over the newcomers, and return its states
        [J, S, d]; ``encoded`` passes states of an identical encoder instead (a shared encoder)."""
        index = torch.tensor(slots, dtype=torch.long)
        self.cached[index] = 0
        self.last_valid[index] = False
        if not self.is_encoder_decoder:
            return None
        lengths = torch.tensor([len(ids) for ids in input_ids])
        if encoded is None:
            padded = torch.zeros((len(slots), int(lengths.max())), dtype=torch.long)
            for row, ids in enumerate(input_ids):
                padded[row, : len(ids)] = ids
            mask = (torch.arange(padded.shape[1])[None, :] < lengths[:, None]).long()
            encoded = self.model.get_encoder()(input_ids=padded.to(self.device), attention_mask=mask.to(self.device))
            encoded = encoded.last_hidden_state  # [J, S, d]
        states = encoded
        self._reserve_encoder(states, states.shape[1])
        self.encoder_states[index.to(self.device), : states.shape[1]] = states
        self.encoder_lengths[index] = lengths
        self.cross_ready[index] = False
        self._cross_memo = None
        return states

    def _reserve_encoder(self, like: torch.Tensor, length: int) -> None:
        have = 0 if self.encoder_states is None else self.encoder_states.shape[1]
        if length <= have:
            return
        grown = like.new_zeros((self.slots, max(length, 2 * have), like.shape[2]))
        if self.encoder_states is not None:
            grown[:, :have] = self.encoder_states
        self.encoder_states = grown

    # --- the forward pass -----------------------------------------------------------------------

    @torch.inference_mode()
    def predict(
        self, slots: torch.Tensor, sequence: torch.Tensor, upto: torch.Tensor, wanted: torch.Tensor
    ) -> torch.Tensor:
        """Logits that predict the last ``wanted[r]`` tokens of each row's ``sequence[slot, :upto]``.

        slots, upto, wanted: [R] -> logits [R, max(wanted), V]; row r's predictions fill
        [r, :wanted[r]] (for positions upto-wanted .. upto-1, each predicting the next token).
        Only rows with uncached tokens are fed, all in one padded forward pass.
        """
        cached = self.cached[slots]
        tail = upto - cached  # [R] tokens each row still has to feed
        first = upto - wanted  # [R] first position whose prediction is wanted
        if bool((first < cached - 1).any()) or bool(((first == cached - 1) & ~self.last_valid[slots]).any()):
            raise RuntimeError("a wanted prediction lies before the cached prefix and was not kept")
        fed = (tail > 0).nonzero().squeeze(1)
        block_logits = None
        if len(fed):
            block_logits = self._forward(slots[fed], sequence, cached[fed], tail[fed])  # [F, W, V]
        # Per row: its kept last logits (position cached-1), then the fed block (cached ..).
        stored = self.last_logits[slots] if self.last_logits is not None else None
        width = int(wanted.max())
        rows = []
        fed_row = {int(r): i for i, r in enumerate(fed.tolist())}
        for r in range(len(slots)):
            start = int(first[r]) - (int(cached[r]) - 1)  # 0 means "the kept logits"
            parts = []
            if start == 0:
                parts.append(stored[r : r + 1])
            if r in fed_row:
                i = fed_row[r]
                parts.append(block_logits[i, max(start - 1, 0) : int(tail[r])])
            got = torch.cat(parts) if len(parts) > 1 else parts[0]
            if got.shape[0] < width:
                got = torch.cat([got, got.new_zeros((width - got.shape[0], got.shape[1]))])
            rows.append(got)
        result = torch.stack(rows)
        if len(fed):  # remember each fed row's last logits and how far it is cached
            fed_slots = slots[fed]
            last = block_logits[torch.arange(len(fed)), tail[fed] - 1]
            if self.last_logits is None:
                self.last_logits = last.new_zeros((self.slots, last.shape[-1]))
            self.last_logits[fed_slots] = last
            self.last_valid[fed_slots] = True
            self.cached[fed_slots] = upto[fed]
        return result

    def _forward(self, slots: torch.Tensor, sequence: torch.Tensor, cached: torch.Tensor, tail: torch.Tensor):
        """One padded forward over ``slots``: feeds sequence[slot, cached:cached+tail] for each."""
        width = int(tail.max())
        past = int(cached.max())
        steps = torch.arange(width)
        positions = cached[:, None] + steps[None, :]  # [F, W] each row's own positions
        tokens = sequence[slots[:, None], positions.clamp(max=sequence.shape[1] - 1)]
        tokens = torch.where(steps[None, :] < tail[:, None], tokens, torch.zeros_like(tokens))
        # Past keys right-aligned: row r's cached positions land in the last cached[r] columns.
        columns = torch.arange(past)
        past_mask = columns[None, :] >= (past - cached)[:, None]  # [F, P]
        index = (columns[None, :] - (past - cached)[:, None]).clamp(min=0)
        attention_mask = torch.cat([past_mask, torch.ones((len(slots), width), dtype=torch.bool)], dim=1).long()
        device_slots = slots.to(self.device)
        self_cache = DynamicCache(self.self_pool.read(device_slots, index.to(self.device)) if past else None)

        kwargs = dict(use_cache=True)
        if self.is_encoder_decoder:
            cross_cache, encoder = self._cross(slots)
            kwargs.update(
                encoder_outputs=BaseModelOutput(last_hidden_state=encoder["states"]),
                attention_mask=encoder["mask"],
                decoder_input_ids=tokens.to(self.device),
                decoder_attention_mask=attention_mask.to(self.device),
                cache=EncoderDecoderCache(self_cache, cross_cache),
            )
        else:
            kwargs.update(
                input_ids=tokens.to(self.device),
                attention_mask=attention_mask.to(self.device),
                position_ids=positions.to(self.device),
                cache=self_cache,
            )
        started = time.perf_counter()
        with self._own_positions(positions.to(self.device)):
            out = self.model(**kwargs)
        elapsed = time.perf_counter() - started
        self.forward_seconds += elapsed
        self.calls += 1
        self.tokens_fed += int(tail.sum())
        self.positions_computed += len(slots) * width  # padding included
        self.call_cost.add(len(slots) * width, elapsed)

        cache = kwargs["cache"]  # filled in place by the model
        self_layers = cache.self_attention_cache if self.is_encoder_decoder else cache
        new = [(layer.keys[:, :, past:], layer.values[:, :, past:]) for layer in self_layers.layers]
        self.self_pool.write(device_slots, positions.to(self.device), new)
        if self.is_encoder_decoder:
            self._keep_cross(slots, cache.cross_attention_cache)
        return out.logits  # [F, W, V]

    def _cross(self, slots: torch.Tensor):
        """The cross-attention cache and encoder states of ``slots`` (computed by the model for
        rows that have none yet: then every row of this call recomputes them once)."""
        key = tuple(slots.tolist())
        if self._cross_memo is not None and self._cross_memo[0] == key:
            layers, encoder = self._cross_memo[1]
            return DynamicCache(layers), encoder
        lengths = self.encoder_lengths[slots]
        width = int(lengths.max())
        device_slots = slots.to(self.device)
        states = self.encoder_states[device_slots, :width]
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long().to(self.device)
        encoder = {"states": states, "mask": mask}
        if not bool(self.cross_ready[slots].all()):
            return DynamicCache(), encoder  # empty: the model fills it from `states`
        layers = [(k.contiguous(), v.contiguous()) for k, v in
                  self.cross_pool.read(device_slots, torch.arange(width).expand(len(slots), -1).to(self.device))]
        self._cross_memo = (key, (layers, encoder))
        return DynamicCache(layers), encoder

    def _keep_cross(self, slots: torch.Tensor, cross_cache: DynamicCache) -> None:
        if bool(self.cross_ready[slots].all()):
            return
        layers = [(layer.keys, layer.values) for layer in cross_cache.layers]
        width = layers[0][0].shape[2]
        positions = torch.arange(width)[None, :].expand(len(slots), -1).to(self.device)
        self.cross_pool.write(slots.to(self.device), positions, layers)
        self.cross_ready[slots] = True

    # --- rollback -------------------------------------------------------------------------------

    def rewind(self, slots: torch.Tensor, keep: torch.Tensor) -> None:
        """Keep only the first ``keep[r]`` cached positions of each slot (no-op where fewer)."""
        cached = self.cached[slots]
        shorter = keep < cached
        self.last_valid[slots[shorter]] = False
        self.cached[slots] = torch.minimum(cached, keep)

    # --- absolute positions for BART-like decoders ----------------------------------------------

    def _absolute_position_embedding(self):
        """BART/Marian decoders number positions from the (padded) cache length and need each
        row's own positions instead; T5 (relative bias) and decoder-only models need nothing."""
        if not self.is_encoder_decoder:
            return None
        return getattr(self.model.get_decoder(), "embed_positions", None)

    @contextlib.contextmanager
    def _own_positions(self, positions: torch.Tensor):
        """While the model runs, its decoder position embedding reads ``positions`` [R, W]."""
        if self._position_embedding is None:
            yield
            return

        def use_row_positions(module, args, kwargs):
            if "position_ids" not in kwargs:
                raise UnsupportedModelError(
                    f"{self.model.config.model_type}: its decoder's position embedding takes no position_ids; "
                    "use batch_size 1"
                )
            return args, {**kwargs, "position_ids": positions}

        def drop_added_dim(module, args, output):
            # BART treats position_ids as one shared row and unsqueezes them: [1, R, W, d] -> [R, W, d]
            return output.squeeze(0) if output.dim() == positions.dim() + 2 else output

        embedding = self._position_embedding
        handles = [embedding.register_forward_pre_hook(use_row_positions, with_kwargs=True),
                   embedding.register_forward_hook(drop_added_dim)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
