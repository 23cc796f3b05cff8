"""Convert a checkpoint published as pytorch_model.bin into a safetensors copy this pipeline loads.

    python scripts/convert_to_safetensors.py kssteven/T5-large-cnndm /models/T5-large-cnndm
    python scripts/convert_to_safetensors.py kssteven/T5-large-cnndm --push-to-hub YOUR-ORG/T5-large-cnndm

bild-pipeline loads weights from safetensors only (never pickle). Some published checkpoints, the
BiLD authors' among them, ship pytorch_model.bin only. This loads one such checkpoint once, with
torch's weights-only unpickler, and saves model, config and tokenizer with safetensors, to a local
folder (put it where every Ray worker sees it: the image, a shared volume) or a hub repository.
Only convert checkpoints you trust.
"""

from __future__ import annotations

import argparse

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer


def convert(source: str, output: str | None = None, push_to_hub: str | None = None) -> None:
    config = AutoConfig.from_pretrained(source)
    loader = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = loader.from_pretrained(source, use_safetensors=False)  # torch.load(weights_only=True) inside
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        tokenizer = None  # no tokenizer files: give the job a models.tokenizer
    if output:
        model.save_pretrained(output)  # transformers >= 5 always writes safetensors
        if tokenizer is not None:
            tokenizer.save_pretrained(output)
    if push_to_hub:
        model.push_to_hub(push_to_hub)
        if tokenizer is not None:
            tokenizer.push_to_hub(push_to_hub)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="hub id or local folder holding pytorch_model.bin")
    parser.add_argument("output", nargs="?", help="local folder for the safetensors copy")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO", help="hub repository to upload to")
    args = parser.parse_args()
    if not args.output and not args.push_to_hub:
        parser.error("give an output folder, --push-to-hub REPO, or both")
    convert(args.source, args.output, args.push_to_hub)


if __name__ == "__main__":
    main()
