"""The onnx engine's onnxruntime sessions (onnx_engine.py): one model's decoder step and its
admission of new rows, built from onnx_graph.py's graphs with the family's layers, on the CPU."""

from __future__ import annotations

import os
import tempfile

import torch

from pipeline.decoding.engines.native import NativeWeights

MISSING = "models.engine onnx needs onnxruntime and onnx: pip install onnxruntime onnx"
PROTOBUF_LIMIT = 1 << 30  # weights up to 1 GiB travel inside the serialized graph, larger ones in a file


def unsupported_reason(head_size: int) -> str | None:
    """Why the onnx engine cannot run a model with heads this wide, or None when it can."""
    if head_size % 8:
        return f"its attention heads are {head_size} wide, not a multiple of 8 (onnxruntime's GroupQueryAttention)"
    return None


def _session(graph, model):
    """An onnxruntime session on the CPU for ``model`` (built by ``graph``), run on as many threads as
    torch uses here (one per actor CPU in a job)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only
    if sum(value.nbytes for value in graph.initializers.values()) < PROTOBUF_LIMIT:
        return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    import onnx  # a protobuf message holds at most 2 GiB: the weights go beside the graph, in files

    with tempfile.TemporaryDirectory(prefix="bild-onnx-") as folder:
        path = os.path.join(folder, f"{model.graph.name}.onnx")
        onnx.save_model(model, path, save_as_external_data=True, location="weights")
        return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _graphs():
    """onnx_graph's builders; imported here: a machine without onnx and onnxruntime (the GPU check's)
    runs every other engine."""
    try:
        import onnxruntime  # noqa: F401

        from pipeline.decoding.engines import onnx_graph
    except ImportError as error:
        raise ImportError(f"{MISSING} ({error})") from error
    return onnx_graph


class OnnxSessions:
    """One model's onnxruntime sessions, shared by its engines of any number of slots: the decoder
    step, and the admission of new rows (the encoder and every decoder layer's cross-attention
    projections; or the projections alone, for states an identical encoder computed), each built when
    first used."""

    def __init__(self, weights: NativeWeights, quantize: str = "none"):
        self.weights, self.quantize = weights, quantize
        self._sessions: dict = {}

    def int8_scheme(self, int8_kernel: str) -> str | None:
        """onnx_graph.int8_scheme of an engine whose steps multiply by ``int8_kernel``; None in float32."""
        return _graphs().int8_scheme(int8_kernel) if self.quantize == "int8" else None

    def _kernel(self, int8_kernel: str) -> str:
        """The int8 kernel asked for; float32 has none (one session serves every engine)."""
        return int8_kernel if self.quantize == "int8" else "blocks"

    def step(self, int8_kernel: str = "blocks"):
        """The decoder step; ``int8_kernel``: onnx_graph's, for int8 products."""
        int8_kernel = self._kernel(int8_kernel)
        key = ("step", int8_kernel)
        if key not in self._sessions:
            graph, logits = self._step_graph(int8_kernel, "onnxruntime")
            self._sessions[key] = _session(graph, graph.model(logits))
        return self._sessions[key]

    def step_pieces(self, int8_kernel: str = "blocks") -> tuple[list, str, tuple]:
        """The decoder step with our attention kernel (onnx_segments.py): its pieces in order, a
        segment as (Segment, its session); the name of the logits' tensor; where the tensors the
        pieces hand on live (onnx_segments.buffers)."""
        int8_kernel = self._kernel(int8_kernel)
        key = ("step_pieces", int8_kernel)
        if key not in self._sessions:
            from pipeline.decoding.engines.onnx_segments import Attention, buffers, segments

            graph, logits = self._step_graph(int8_kernel, "kernel")
            pieces = [piece if isinstance(piece, Attention) else (piece, _session(graph, piece.model))
                      for piece in segments(graph, logits)]
            w = self.weights
            self._sessions[key] = (pieces, logits, buffers(pieces, w.d_model, w.heads * w.d_kv))
        return self._sessions[key]

    def _step_graph(self, int8_kernel: str, attention: str):
        """The step's graph (onnx_graph.StepGraph) built with the family's layers, and its logits' name."""
        w, graphs = self.weights, _graphs()
        graph = graphs.StepGraph(d_model=w.d_model, layers=w.layer_count, heads=w.heads, d_kv=w.d_kv,
                                 self_bias=w.position_bias, quantize=self.quantize, int8_kernel=int8_kernel,
                                 attention=attention)
        hidden = "hidden"
        for index in range(w.layer_count):
            hidden = w.decoder_layer(graph, hidden, index)
        return graph, w.logits(graph, graph.read(hidden))

    def admission(self, projections_only: bool = False, int8_kernel: str = "blocks"):
        """The admission of new rows; ``int8_kernel`` as ``step``'s."""
        int8_kernel = self._kernel(int8_kernel)
        key = ("admission", projections_only, int8_kernel)
        if key not in self._sessions:
            w, graphs = self.weights, _graphs()
            graph = graphs.EncoderGraph(d_model=w.d_model, heads=w.encoder_heads, d_kv=w.d_kv,
                                        source_bias=w.position_bias, projections_only=projections_only,
                                        quantize=self.quantize, int8_kernel=int8_kernel)
            encoded = "encoded" if projections_only else "hidden"
            if not projections_only:
                for index in range(len(w.encoder_layers)):
                    encoded = w.encoder_layer(graph, encoded, index)
                encoded = w.encoder_output(graph, encoded)
            self._sessions[key] = _session(graph, graph.model(encoded, w.cross_keys_values(graph, encoded)))
        return self._sessions[key]
