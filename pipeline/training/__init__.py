"""Training a real small/large T5 pair from scratch (German->English, Multi30k).

Modules:
  data         reading parallel text, length-bucketed token batching
  tokenizer    a joint SentencePiece tokenizer saved as a Hugging Face T5 tokenizer
  model_shapes the T5Configs (large; the earlier from-scratch small) and the small model's SHRINK spec
  shrink       shrink_from_large: the small model cut out of the trained large one (deep encoder,
               one decoder layer, weights copied), then only its decoder is fine-tuned
  train        the resumable training loop (checkpoints, val BLEU, best export)
  align        BiLD prediction alignment (paper section 3.4) for any HF seq2seq pair
  evaluate     greedy corpus BLEU (metrics.quality), per-token decode cost
Run ``python -m pipeline.training --help``.
"""
