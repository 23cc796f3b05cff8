"""The command earlier versions documented for the paper's Table 1: it runs `bild-pipeline bench-table1` (same options)."""

import sys

from pipeline.cli import main

main(["bench-table1", *sys.argv[1:]], prog_name="demo_table.py")
