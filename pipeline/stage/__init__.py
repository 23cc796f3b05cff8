"""The Ray Data decoding stage (decode_stage.py) and what guards its calls against records that kill an actor
(in_flight.py)."""

from pipeline.stage.decode_stage import BASELINE, DOCUMENT, DecodeStage, DecodeStageSpec, PairedBaseline, record_seed

__all__ = ["BASELINE", "DOCUMENT", "DecodeStage", "DecodeStageSpec", "PairedBaseline", "record_seed"]
