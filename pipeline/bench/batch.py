"""`bild-pipeline bench-batch`: output tokens/s of batched decoding per method and batch size.

Every cell (method, batch size, verify share) decodes the same inputs with greedy decoding; repetitions
are interleaved with a balanced cell order (harness.interleave, one turn per repetition; balanced over
whole cycles only, and the header says how much of one a run took), so slow phases of a shared machine
hit every cell alike. Batch size 1 is also run through the record-by-record loop (``loop``), the path
the pipeline takes at ``compute.batch_size: 1``. A batch row's outputs must equal the same method's
outputs at batch size 1; the report says whether they do. With ``ct2`` models, ``ct2_large`` (and
``ct2_small``) cells run CTranslate2 on the same checkpoints and inputs with ``max_batch_size`` = the
cell's batch size. ``time_split`` says where a cell's last run went (the engines' steps, admissions, the
rest).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

from pipeline.bench.harness import (
    bleu_line,
    dict_table,
    environment,
    environment_line,
    format_number,
    interleave,
    score_outputs,
)
from pipeline.bench.methods import CT2, method_of, method_windows
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.pair_decoder import PairDecoder
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest
from pipeline.metrics.interleaving import order_coverage
from pipeline.metrics.quality import signatures

DRAFTING = ("bild", "speculative")
COLUMNS = ["cell", "tokens_per_s", "ratio_vs_loop_b1", "ratio_vs_batch_b1", "ratio_vs_large_same_b", "paired_vs_large",
           "ratio_vs_ct2_large_same_b", "ratio_vs_ct2_large_int8_same_b", "large_calls", "large_padding_share",
           "bleu", "identical_to_b1", "identical_to_ours", "time_split"]


@dataclass
class Cell:
    method: str
    batch_size: int  # 0: the record-by-record loop
    verify_share: float | None = None
    seconds: list[float] = field(default_factory=list)  # one per repetition
    tokens: list[list[int]] = field(default_factory=list)  # outputs of the last repetition
    large_fed: int = 0  # large-model positions fed (last run); padding excluded ...
    large_computed: int = 0  # ... and included
    large_calls: int = 0
    time_spent: dict = field(default_factory=dict)  # the last run's seconds: wall, forward, runtime, admit

    @property
    def name(self) -> str:
        size = "loop" if self.batch_size == 0 else f"B={self.batch_size}"
        share = f" share={self.verify_share}" if self.verify_share is not None else ""
        return f"{self.method} {size}{share}"

    @property
    def output_tokens(self) -> int:
        """Tokens the last repetition made (each repetition decodes the same inputs)."""
        return sum(len(t) for t in self.tokens)


def make_cells(methods, batch_sizes, verify_shares) -> list[Cell]:
    """One cell per (method, batch size, share); a value given twice makes no second cell."""
    methods, batch_sizes, verify_shares = (list(dict.fromkeys(v)) for v in (methods, batch_sizes, verify_shares))
    cells = [Cell(m, 0) for m in methods if m not in CT2]  # CTranslate2 has no record-by-record loop of ours
    for method in methods:
        for size in batch_sizes:
            drafting = method_of(method) in DRAFTING
            shares = verify_shares if drafting and size > 1 else [None]  # a share means nothing at B=1
            for share in shares:
                cells.append(Cell(method, size, share))
    return cells


def run_cell(pair: ModelPair, cell: Cell, config: DecodingConfig, requests: list[BatchRequest],
             ct2: dict | None = None, ct2_inputs: list[list[int]] | None = None,
             decoders: dict | None = None) -> list[list[int]]:
    """The cell's outputs for every request; the large model's work of this run is left on the cell.
    CTranslate2 takes the requests' ids as lists (``ct2_inputs``, made once, outside the timings). ``decoders``:
    each config's PairDecoder, kept across the cells' repetitions with the window chooser it keeps per batch size."""
    if cell.method in CT2:
        model = ct2[cell.method.removeprefix("ct2_")]
        return model.generate(ct2_inputs, config.max_new_tokens, max_batch_size=cell.batch_size)
    config = dataclasses.replace(method_windows(cell.method, config), do_sample=False)
    method = config.method
    large = pair.engine("large", max(cell.batch_size, 1)) if method != "small" else None
    before = (large.tokens_fed, large.positions_computed, large.calls) if large is not None else (0, 0, 0)
    engines = [pair.engine(role, max(cell.batch_size, 1)) for role in ("small", "large")
               if method in (role, *DRAFTING)]
    decoders = {} if decoders is None else decoders
    if config not in decoders:
        decoders[config] = PairDecoder(pair, config)
    decoder, policy = decoders[config], BatchPolicy(batch_size=max(cell.batch_size, 1),
                                                    verify_share=cell.verify_share or 1.0)
    spent_before, started = _engine_seconds(engines), time.perf_counter()
    if cell.batch_size == 0:  # record by record, as Generator.decode_ids runs each
        tokens = [decoder.decode_requests([r], policy)[0].tokens for r in requests]
    else:
        tokens = [output.tokens for output in decoder.decode_requests(requests, policy)]
    cell.time_spent = {"wall": time.perf_counter() - started,
                       **{key: spent - spent_before[key] for key, spent in _engine_seconds(engines).items()}}
    if large is not None and cell.batch_size > 0:  # the engines outlive the cell: count this run's work
        cell.large_fed = large.tokens_fed - before[0]
        cell.large_computed = large.positions_computed - before[1]
        cell.large_calls = large.calls - before[2]
    return tokens


def _engine_seconds(engines) -> dict[str, float]:
    """The engines' seconds so far: forward steps, inside them the runtime's own call, admissions."""
    return {key: sum(getattr(engine, f"{key}_seconds") for engine in engines) for key in ("forward", "runtime", "admit")}


def time_split(spent: dict) -> str:
    """Where a run's wall time went: the engines' steps (of which inside the runtime's call, where an
    engine has one), admissions (encoder and cross-attention projections), and the rest (the scheduler's
    Python: feeding, choosing tokens, rows joining and leaving)."""
    wall = spent.get("wall")
    if not wall:
        return ""
    runtime = f" (runtime {spent['runtime'] / wall:.0%})" if spent["runtime"] else ""
    rest = 1 - (spent["forward"] + spent["admit"]) / wall
    return f"steps {spent['forward'] / wall:.0%}{runtime}, admission {spent['admit'] / wall:.0%}, rest {rest:.0%}"


def run_batch_bench(pair: ModelPair, texts: list[str], references: list[str] | None, config: DecodingConfig,
                    methods=("large", "bild", "speculative"), batch_sizes=(1, 4, 16, 32),
                    verify_shares=(0.5,), repeats: int = 2, ct2: dict | None = None) -> dict:
    """Every cell, repetitions interleaved; ``ct2`` ({"small": CT2Model, "large": ...}) adds ct2_large cells."""
    encoder = Generator(pair, config)
    requests = [BatchRequest(encoder.encode(text)[0][0].to(pair.device)) for text in texts]
    if ct2:
        methods = (*methods, *[name for name in ("ct2_large", "ct2_large_int8") if name not in methods])
    ct2_inputs = [r.input_ids.tolist() for r in requests] if ct2 else None
    cells = make_cells(methods, batch_sizes, list(verify_shares))
    decoders: dict = {}  # each config's decoder (and its window choosers), across warm-up and repetitions
    for cell in cells:  # warm-up on a few inputs, outside the measurements
        run_cell(pair, cell, config, requests[:4], ct2, ct2_inputs and ct2_inputs[:4], decoders)
    runs = interleave({cell.name: (lambda _, cell=cell: run_cell(pair, cell, config, requests, ct2, ct2_inputs,
                                                                 decoders))
                       for cell in cells}, 1, repeats, pair.device, warm_up=False)
    for cell in cells:
        cell.seconds, cell.tokens = runs[cell.name].repetition_seconds(), runs[cell.name].last[0]
    report = summarize(pair, cells, references, config, len(texts), repeats)
    report["ct2"] = ct2["large"].description if ct2 else None
    return report


def summarize(pair, cells: list[Cell], references, config, inputs: int, repeats: int) -> dict:
    def rate(cell: Cell) -> float:  # over the median repetition: one disturbed repetition does not move it
        return cell.output_tokens / statistics.median(cell.seconds)

    one = {c.method: c for c in cells if c.batch_size == 1}
    loop = {c.method: c for c in cells if c.batch_size == 0}
    rows = []
    for cell in cells:
        first = loop.get(cell.method) or one.get(cell.method)  # the method at batch size 1
        row = {"cell": cell.name, "method": cell.method, "batch_size": cell.batch_size or 1,
               "path": "loop" if cell.batch_size == 0 else "batch", "verify_share": cell.verify_share,
               "output_tokens": cell.output_tokens, "tokens_per_s": rate(cell),
               "seconds": [round(s, 3) for s in cell.seconds],
               "identical_to_b1": cell.tokens == first.tokens if first else None}
        if cell.method in loop:
            row["ratio_vs_loop_b1"] = row["tokens_per_s"] / rate(loop[cell.method])
        if cell.method in CT2 and cell.method.removeprefix("ct2_") in loop:  # the same tokens as ours?
            row["identical_to_ours"] = cell.tokens == loop[cell.method.removeprefix("ct2_")].tokens
        for yardstick in ("ct2_large", "ct2_large_int8"):
            same_ct2 = [c for c in cells if c.method == yardstick and c.batch_size == (cell.batch_size or 1)]
            if same_ct2:
                row[f"ratio_vs_{yardstick}_same_b"] = row["tokens_per_s"] / rate(same_ct2[0])
        if cell.method in one:
            row["ratio_vs_batch_b1"] = row["tokens_per_s"] / rate(one[cell.method])
        same_large = [c for c in cells if c.method == "large" and c.batch_size == cell.batch_size]
        if same_large:
            row["ratio_vs_large_same_b"] = row["tokens_per_s"] / rate(same_large[0])
            row["paired_vs_large"] = paired_ratio(cell, same_large[0])
        if cell.large_computed:
            row["large_calls"] = cell.large_calls
            row["large_padding_share"] = 1 - cell.large_fed / cell.large_computed
        if cell.time_spent:
            row["time_spent"] = {key: round(value, 4) for key, value in cell.time_spent.items()}
            row["time_split"] = time_split(cell.time_spent)
        if references:
            row["bleu"] = score_outputs(pair.tokenizer, cell.tokens, references).bleu
        rows.append(row)
    report = {"inputs": inputs, "repeats": repeats, "order": order_coverage(len(cells), repeats),  # a turn per repetition
              "decoding": config.to_dict(), **environment(pair), "rows": rows}
    if references:
        report["bleu_signature"] = signatures("translation")["bleu"]
    return report


def paired_ratio(cell: Cell, yardstick: Cell) -> float | None:
    """The median over repetitions of the cell's tokens/s over the yardstick's in the same repetition: on a
    machine whose speed drifts between repetitions, a steadier figure than the ratio of the two medians
    (each repetition runs every cell back to back). None unless both ran every repetition."""
    if len(cell.seconds) != len(yardstick.seconds) or not cell.seconds:
        return None
    return statistics.median(cell.output_tokens / own * theirs / yardstick.output_tokens
                             for own, theirs in zip(cell.seconds, yardstick.seconds))


def _cell(value) -> str:
    if isinstance(value, float):  # ratios and tokens/s: two decimals are enough
        return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    return format_number(value)


def render_markdown(report: dict) -> str:
    lines = [f"inputs: {report['inputs']}, repetitions: {report['repeats']} (interleaved, {report['order']}; "
             "tokens/s over each cell's median repetition), greedy, " + environment_line(report), ""]
    return "\n".join(lines + dict_table(COLUMNS, report["rows"], _cell) + bleu_line(report))
