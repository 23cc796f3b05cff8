"""bild-pipeline: batch translation and summarization with Big Little Decoder."""

__version__ = "0.1.0"
