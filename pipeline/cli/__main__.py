"""``python -m pipeline.cli``: the same commands as ``bild-pipeline``."""

from pipeline.cli import main

main()
