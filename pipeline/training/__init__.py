"""Training a real small/large T5 pair from scratch (German->English, Multi30k).

Modules:
  data         reading parallel text, length-bucketed token batching
  tokenizer    a joint SentencePiece tokenizer saved as a Hugging Face T5 tokenizer
  model_shapes the two T5Configs (large, small)
  train        the resumable training loop (checkpoints, val BLEU, best export)
  align        BiLD prediction alignment (paper section 3.4) for any HF seq2seq pair
  evaluate     greedy corpus BLEU with sacrebleu, per-token decode cost
Run ``python -m pipeline.training --help``.
"""
