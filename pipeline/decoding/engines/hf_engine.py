"""The Hugging Face engine: any transformers model behind the engine seam (the reference in tests).

With one slot (batch size 1) the model keeps its own cache as it grows it, cut back to a row's
length before each pass: nothing is copied beyond what the model itself does. With several slots,
every row owns a *slot* in a pool of key/value tensors: slot s holds its row's first
``lengths[s]`` positions, left-aligned. A forward pass over one row hands the model views of its
slot; over several rows it gathers their caches into one right-aligned (left-padded) Hugging Face
cache, feeds each row's tokens (right-padded), and writes the new keys and values back. So a
rollback is only a shorter length, and only the rows that need the model take part in its pass.

Right alignment keeps each row's tokens contiguous and directly before its new tokens, so T5's
relative position bias sees true distances; models with absolute positions get each row's own
positions (``position_ids`` for decoder-only models, a hook on the decoder's position embedding
for BART-like encoder-decoders).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import BaseModelOutput

from pipeline.decoding.engine import Engine, Feed, place_logits
from pipeline.decoding.engines.cache_rows import grown, padded_ids, resized


class UnsupportedModelError(ValueError):
    """The model cannot be decoded in a batch with per-row lengths (use batch_size 1)."""


def _holding(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A DynamicCache over these (keys, values) [B, H, T, D] as they are: ``DynamicCache(data)`` would
    copy each into a fresh tensor first; the model's own update then concatenates once, as always."""
    cache = DynamicCache()
    for keys, values in layers:
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


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
        capacity = grown(max(positions, 16), self.capacity)
        held = self.layers or [[t.new_zeros((self.slots, t.shape[1], 0, t.shape[3])) for t in pair] for pair in like]
        self.layers = [[resized(t, 2, capacity) for t in pair] for pair in held]

    def write(self, slots: torch.Tensor, positions: torch.Tensor, layers) -> None:
        """Store [R, H, W, D] keys/values of each layer at per-row ``positions`` [R, W]."""
        self.reserve(layers, int(positions.max()) + 1)
        for pool, new in zip(self.layers, layers):
            for pooled, tensor in zip(pool, new):
                pooled[slots[:, None], :, positions] = tensor.transpose(1, 2)  # [R, W, H, D]

    def write_one(self, slot: int, position: int, layers) -> None:
        """Store one row's [1, H, W, D] keys/values of each layer from ``position`` on."""
        width = layers[0][0].shape[2]
        self.reserve(layers, position + width)
        for pool, new in zip(self.layers, layers):
            for pooled, tensor in zip(pool, new):
                pooled[slot, :, position : position + width] = tensor[0]

    def rows(self, slots: torch.Tensor, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values) [R, H, width, D]: the first ``width`` positions of ``slots``."""
        return [tuple(t.index_select(0, slots)[:, :, :width].contiguous() for t in pool) for pool in self.layers]

    def view(self, slot: int, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One slot's first ``width`` positions of each layer, as views [1, H, width, D] (no copy)."""
        return [tuple(t[slot : slot + 1, :, :width] for t in pool) for pool in self.layers]

    def read(self, slots: torch.Tensor, index: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values) [R, H, P, D] at per-row positions ``index`` [R, P]."""
        return [tuple(t[slots[:, None], :, index].transpose(1, 2) for t in pool) for pool in self.layers]


class _OneRow:
    """The cache of an engine with a single slot: Hugging Face's own, as the model grows it."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.is_encoder_decoder = bool(model.config.is_encoder_decoder)
        self.cache = None
        self.encoder = None  # (BaseModelOutput, attention mask) of the admitted row

    def admit(self, input_ids: torch.Tensor, encoded: torch.Tensor | None) -> torch.Tensor | None:
        if not self.is_encoder_decoder:
            self.cache = DynamicCache()
            return None
        device = self.model.device
        mask = torch.ones((1, len(input_ids)), dtype=torch.long, device=device)
        if encoded is None:
            encoded = self.model.get_encoder()(input_ids=input_ids[None].to(device), attention_mask=mask).last_hidden_state
        self.encoder = (BaseModelOutput(last_hidden_state=encoded), mask)
        self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        return encoded

    def forward(self, tokens: torch.Tensor, position: int, reads: int) -> torch.Tensor:
        """Logits [1, reads, V]; the cache is cut back to ``position`` first (a rollback since the last pass)."""
        if self.cache.get_seq_length() > position:
            self.cache.crop(position - self.cache.get_seq_length())  # a negative count: positions to drop
        tokens = tokens.to(self.model.device)
        if self.is_encoder_decoder:
            states, mask = self.encoder
            out = self.model(encoder_outputs=states, attention_mask=mask, decoder_input_ids=tokens, cache=self.cache,
                             use_cache=True)
        else:
            out = self.model(input_ids=tokens, cache=self.cache, use_cache=True)
        return out.logits[:, -reads:]


class HFEngine(Engine):
    """A Hugging Face model's decoder over a pool of row slots (or, with one slot, its own cache)."""

    kind = "hf"

    def __init__(self, model: PreTrainedModel, slots: int):
        config = model.config
        if slots > 1 and (getattr(config, "sliding_window", None)
                          or "sliding_attention" in (getattr(config, "layer_types", None) or [])):
            raise UnsupportedModelError(
                f"{config.model_type}: sliding-window attention is not supported in batched decoding; use batch_size 1"
            )
        super().__init__(slots, model.device)
        self.model = model
        self.is_encoder_decoder = bool(config.is_encoder_decoder)
        self.self_pool = _SlotPool(slots)
        self.cross_pool = _SlotPool(slots)
        self.encoder_states: torch.Tensor | None = None  # [slots, S, d]
        self.encoder_lengths = torch.zeros(slots, dtype=torch.long)
        self.cross_ready = torch.zeros(slots, dtype=torch.bool)  # cross-attention keys/values stored
        # The cross-attention inputs of the last row set: reused while the same rows run again.
        self._cross_memo: tuple[tuple[int, ...], tuple] | None = None
        self._position_embedding = self._absolute_position_embedding()
        self.one_row = _OneRow(model) if slots == 1 else None

    # --- rows joining -----------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self, slots: list[int], input_ids: list[torch.Tensor], encoded: torch.Tensor | None):
        if self.one_row is not None:
            return self.one_row.admit(input_ids[0], encoded)
        if not self.is_encoder_decoder:
            return None
        index = torch.tensor(slots, dtype=torch.long)
        lengths = torch.tensor([len(ids) for ids in input_ids])
        if encoded is None:
            padded = padded_ids(input_ids, int(lengths.max()))
            mask = (torch.arange(padded.shape[1])[None, :] < lengths[:, None]).long()
            encoded = self.model.get_encoder()(input_ids=padded.to(self.device), attention_mask=mask.to(self.device))
            encoded = encoded.last_hidden_state  # [J, S, d]
        self._reserve_encoder(encoded, encoded.shape[1])
        self.encoder_states[index.to(self.device), : encoded.shape[1]] = encoded
        self.encoder_lengths[index] = lengths
        self.cross_ready[index] = False
        self._cross_memo = None
        return encoded

    def _reserve_encoder(self, like: torch.Tensor, length: int) -> None:
        have = 0 if self.encoder_states is None else self.encoder_states.shape[1]
        if length <= have:
            return
        if self.encoder_states is None:
            self.encoder_states = like.new_zeros((self.slots, 0, like.shape[2]))
        self.encoder_states = resized(self.encoder_states, 1, grown(length, have))

    # --- the forward pass -----------------------------------------------------------------------

    @torch.inference_mode()
    def _forward(self, feed: Feed) -> torch.Tensor:
        if self.one_row is not None:
            return self.one_row.forward(feed.tokens, feed.positions[0], feed.reads[0])
        slots = torch.tensor(feed.slots)
        cached = torch.tensor(feed.positions)
        tail = torch.tensor(feed.counts)
        width, past = feed.width, int(cached.max())
        steps = torch.arange(width)
        positions = cached[:, None] + steps[None, :]  # [R, W] each row's own positions
        tokens = feed.tokens.to(self.device)
        single = len(feed.slots) == 1
        device_slots = slots.to(self.device)
        if single:  # one row: its slot's views, no padding, the model numbers positions itself
            self_cache = _holding(self.self_pool.view(feed.slots[0], past)) if past else DynamicCache()
            attention_mask = None
        else:
            # Past keys right-aligned: row r's cached positions land in the last cached[r] columns.
            columns = torch.arange(past)
            past_mask = columns[None, :] >= (past - cached)[:, None]  # [R, P]
            index = (columns[None, :] - (past - cached)[:, None]).clamp(min=0)
            attention_mask = torch.cat([past_mask, torch.ones((len(slots), width), dtype=torch.bool)], dim=1)
            attention_mask = attention_mask.long().to(self.device)
            self_cache = _holding(self.self_pool.read(device_slots, index.to(self.device))) if past else DynamicCache()

        kwargs = dict(use_cache=True)
        # Rows that joined since their last call have no cross-attention keys yet: this call projects
        # the encoder states of every row in it (and stores them).
        projects_encoder = self.is_encoder_decoder and not bool(self.cross_ready[slots].all())
        if self.is_encoder_decoder:
            cross_cache, encoder = self._cross(slots, projects_encoder)
            kwargs.update(encoder_outputs=BaseModelOutput(last_hidden_state=encoder["states"]),
                          attention_mask=encoder["mask"], decoder_input_ids=tokens,
                          decoder_attention_mask=attention_mask, cache=EncoderDecoderCache(self_cache, cross_cache))
        else:
            kwargs.update(input_ids=tokens, attention_mask=attention_mask, cache=self_cache,
                          position_ids=None if single else positions.to(self.device))
        real = steps[None, :] < tail[:, None]  # [R, W] fed tokens, not padding
        if single:
            out = self.model(**kwargs)
        else:
            with self._own_positions(positions.to(self.device)), self._head_on(real.to(self.device)):
                out = self.model(**kwargs)

        cache = kwargs["cache"]  # filled in place by the model
        self_layers = cache.self_attention_cache if self.is_encoder_decoder else cache
        new = [(layer.keys[:, :, past:], layer.values[:, :, past:]) for layer in self_layers.layers]
        if single:
            self.self_pool.write_one(feed.slots[0], past, new)
        else:
            self.self_pool.write(device_slots, positions.to(self.device), new)
        if projects_encoder:
            self._keep_cross(slots, cache.cross_attention_cache)
        return self._read(out.logits, real, feed)

    def _read(self, logits: torch.Tensor, real: torch.Tensor, feed: Feed) -> torch.Tensor:
        """[R, max(reads), V]: each row's last ``reads`` real positions."""
        if logits.shape[:2] == real.shape:  # the head saw the padded block
            logits = logits[real.to(logits.device)]
        else:
            logits = logits.reshape(-1, logits.shape[-1])  # [sum(counts), V], rows one after another
        if len(feed.slots) == 1:
            return logits[-feed.reads[0] :][None]
        offsets, source, target, most = 0, [], [], max(feed.reads)
        for r, (count, read) in enumerate(zip(feed.counts, feed.reads)):
            source.extend(range(offsets + count - read, offsets + count))
            target.extend(range(r * most, r * most + read))
            offsets += count
        device = logits.device
        return place_logits(logits[torch.tensor(source, device=device)], torch.tensor(target, device=device), feed)

    def _cross(self, slots: torch.Tensor, projects_encoder: bool):
        """The cross-attention cache and encoder states of ``slots``; an empty cache where some row
        has none yet (``projects_encoder``: the model then computes them for every row of the call)."""
        key = tuple(slots.tolist())
        if self._cross_memo is not None and self._cross_memo[0] == key:
            layers, encoder = self._cross_memo[1]
            return _holding(layers), encoder
        lengths = self.encoder_lengths[slots]
        width = int(lengths.max())
        device_slots = slots.to(self.device)
        states = self.encoder_states[device_slots, :width]
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long().to(self.device)
        encoder = {"states": states, "mask": mask}
        if projects_encoder:
            return DynamicCache(), encoder  # empty: the model fills it from `states`
        if len(key) == 1:
            layers = self.cross_pool.view(key[0], width)
        else:
            layers = self.cross_pool.rows(device_slots, width)
        self._cross_memo = (key, (layers, encoder))
        return _holding(layers), encoder

    def _keep_cross(self, slots: torch.Tensor, cross_cache: DynamicCache) -> None:
        layers = [(layer.keys, layer.values) for layer in cross_cache.layers]
        width = layers[0][0].shape[2]
        positions = torch.arange(width)[None, :].expand(len(slots), -1).to(self.device)
        self.cross_pool.write(slots.to(self.device), positions, layers)
        self.cross_ready[slots] = True
        self._cross_memo = None

    # --- the language-model head only where a token was fed -----------------------------------

    @contextlib.contextmanager
    def _head_on(self, real: torch.Tensor):
        """While the model runs, its output head reads only the hidden states of ``real`` [R, W]
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


# --- as the registry sees it (registry.py) ---------------------------------------------------------------------

def unsupported_reason(model: PreTrainedModel) -> None:
    """None: Hugging Face's modules run any model they load."""
    return None


def prepare(model: PreTrainedModel, quantize: str = "none") -> None:
    """Nothing shared between its engines (it multiplies as loaded: rules.engine_problem refuses int8)."""
    return None


def build(model: PreTrainedModel, prepared: None, slots: int) -> HFEngine:
    return HFEngine(model, slots)
