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

    def rows(self, slots: torch.Tensor, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values) [R, H, width, D]: the first ``width`` positions of ``slots``
        (a plain row selection, several times cheaper than ``read``'s per-row positions)."""
        return [tuple(t.index_select(0, slots)[:, :, :width].contiguous() for t in pool) for pool in self.layers]

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
        fed_tail = tail[fed]
        if len(fed):
            packed = self._forward(slots[fed], sequence, cached[fed], fed_tail)  # [sum(tail), V]
        if len(fed) == len(slots) and bool(((tail == 1) & (wanted == 1)).all()):
            # The common drafting step: every row fed one token and wants its prediction.
            self._remember(slots, upto, packed, tail)
            return packed[:, None, :]  # [R, 1, V]
        # One table to gather from: each row's kept logits (position cached-1), the fed rows'
        # new logits one after another (position cached + j), and a zero row for padding.
        if self.last_logits is None:  # nothing kept yet: every wanted prediction is fed
            stored = packed.new_zeros((len(slots), packed.shape[-1]))
        else:
            stored = self.last_logits[slots]  # [R, V]
        offsets = torch.zeros(len(slots), dtype=torch.long)
        offsets[fed] = torch.cumsum(fed_tail, 0) - fed_tail
        parts = [stored, packed] if len(fed) else [stored]
        table = torch.cat(parts + [stored.new_zeros((1, stored.shape[-1]))])
        width = int(wanted.max())
        k = torch.arange(width)[None, :]
        relative = first[:, None] + k - cached[:, None]  # [R, W] -1: the kept logits, j >= 0: fed j
        source = torch.where(relative < 0, torch.arange(len(slots))[:, None], len(slots) + offsets[:, None] + relative)
        source = torch.where(k < wanted[:, None], source, table.shape[0] - 1)
        result = table[source.to(table.device)]  # [R, W, V]
        if len(fed):
            self._remember(slots[fed], upto[fed], packed, fed_tail)
        return result

    def _remember(self, slots: torch.Tensor, upto: torch.Tensor, packed: torch.Tensor, tail: torch.Tensor) -> None:
        """After feeding ``slots``: keep each one's last logits and how far it is cached."""
        if self.last_logits is None:
            self.last_logits = packed.new_zeros((self.slots, packed.shape[-1]))
        self.last_logits[slots] = packed[torch.cumsum(tail, 0) - 1]
        self.last_valid[slots] = True
        self.cached[slots] = upto

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
        # Rows that joined since their last call have no cross-attention keys yet: this call projects
        # the encoder states of every row in it (and stores them), so it costs more than its positions.
        projects_encoder = self.is_encoder_decoder and not bool(self.cross_ready[slots].all())
        if self.is_encoder_decoder:
            cross_cache, encoder = self._cross(slots, projects_encoder)
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
        real = steps[None, :] < tail[:, None]  # [F, W] fed tokens, not padding
        started = time.perf_counter()
        with self._own_positions(positions.to(self.device)), self._head_on(real.to(self.device)):
            out = self.model(**kwargs)
        elapsed = time.perf_counter() - started
        self.forward_seconds += elapsed
        self.calls += 1
        self.tokens_fed += int(tail.sum())
        self.positions_computed += len(slots) * width  # padding included
        if not projects_encoder:
            self.call_cost.add(len(slots) * width, elapsed)

        cache = kwargs["cache"]  # filled in place by the model
        self_layers = cache.self_attention_cache if self.is_encoder_decoder else cache
        new = [(layer.keys[:, :, past:], layer.values[:, :, past:]) for layer in self_layers.layers]
        self.self_pool.write(device_slots, positions.to(self.device), new)
        if projects_encoder:
            self._keep_cross(slots, cache.cross_attention_cache)
        logits = out.logits
        if logits.shape[:2] == real.shape:  # the head saw the padded block (see _head_on)
            return logits[real.to(logits.device)]
        return logits.reshape(-1, logits.shape[-1])  # [sum(tail), V], rows one after another

    def _cross(self, slots: torch.Tensor, projects_encoder: bool):
        """The cross-attention cache and encoder states of ``slots``; an empty cache where some row
        has none yet (``projects_encoder``: the model then computes them for every row of the call)."""
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
        if projects_encoder:
            return DynamicCache(), encoder  # empty: the model fills it from `states`
        layers = self.cross_pool.rows(device_slots, width)
        self._cross_memo = (key, (layers, encoder))
        return DynamicCache(layers), encoder

    def _keep_cross(self, slots: torch.Tensor, cross_cache: DynamicCache) -> None:
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

    # --- the language-model head only where a token was fed -----------------------------------

    @contextlib.contextmanager
    def _head_on(self, real: torch.Tensor):
        """While the model runs, its output head reads only the hidden states of ``real`` [F, W]
        positions, packed as one row [1, N, d]: padding costs no vocabulary projection."""
        head = self.model.get_output_embeddings()
        if head is None:
            yield
            return

        def pack(module, args):
            hidden = args[0]
            if hidden.shape[:2] != real.shape:
                return None  # an unexpected layout: leave it (the caller packs the logits)
            return (hidden[real][None],) + tuple(args[1:])

        handle = head.register_forward_pre_hook(pack)
        try:
            yield
        finally:
            handle.remove()

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
