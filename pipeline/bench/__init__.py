"""The benchmark commands, one harness under them all (docs/design.md §5: ratios measured side by side).

harness        interleaved repetitions, timing, output quality, environment line, Markdown tables
cost           the cost model: model steps timed here, a method's time predicted from its calls
hf             Hugging Face generate() (plain and assisted) as a baseline
ct2            CTranslate2 on the same checkpoints as a baseline (optional: pip install -e .[bench])
methods        `bench`: every method at batch 1 with the cost model (and the two below)
engines        `bench --compare-engines`: our native engine against Hugging Face's
loop           `bench-loop`: per-token overhead of the decode loops
batch          `bench-batch`: throughput of batched decoding per method and batch size
pipeline_job   `bench-pipeline`: what the Ray pipeline adds over decoding in-process
table1         `bench-table1`: the paper's Table 1 on our pair
"""
