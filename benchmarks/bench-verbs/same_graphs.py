"""Hashes of the ONNX graphs each family's layers build for the onnx engine (the step with onnxruntime's
attention, the step cut for our kernel, the admission; float32, int8 by blocks, int8 by rows), the operand
order of Add and Skip*Normalization nodes made canonical (a sum is the same either way).

    PYTHONPATH=<a checkout> .venv/bin/python benchmarks/bench-verbs/same_graphs.py   # from outside that checkout

Works on the code before the layers were written once (``decoder_layer_graph`` ...) and after.
"""
import hashlib, sys, torch
def canon(m):
    for n in m.graph.node:
        if n.op_type == "Add" or n.op_type.startswith("Skip"):
            a, b = sorted(n.input[:2]); n.input[0] = a; n.input[1] = b
    return m
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "tests"))
from support.native_models import build
from pipeline.decoding.models import native_weights
from pipeline.decoding.engines.onnx_sessions import OnnxSessions
from pipeline.decoding.engines import onnx_graph
out = []
for family in ("t5-v1.0", "t5-v1.1", "bart", "mbart", "marian", "nllb"):
    try:
        model = build(family)
    except Exception as e:
        out.append(f"{family}: {type(e).__name__}"); continue
    w = native_weights(model)
    for quantize, kernel in (("none", "blocks"), ("int8", "blocks"), ("int8", "rows")):
        s = OnnxSessions(w, quantize)
        for name, (graph, logits) in (("step", s._step_graph(kernel, "onnxruntime")), ("kernel-step", s._step_graph(kernel, "kernel"))):
            model_proto = canon(graph.model(logits))
            out.append(f"{family} {quantize} {kernel} {name} {hashlib.sha1(model_proto.SerializeToString()).hexdigest()[:10]} nodes={len(model_proto.graph.node)}")
        g = onnx_graph.EncoderGraph(d_model=w.d_model, heads=w.encoder_heads, d_kv=w.d_kv, source_bias=w.position_bias, quantize=quantize, int8_kernel=kernel)
        enc = "hidden"
        for i in range(len(w.encoder_layers)):
            enc = (w.encoder_layer if hasattr(w, "encoder_layer") else w.encoder_layer_graph)(g, enc, i)
        enc = (w.encoder_output if hasattr(w, "encoder_output") else w.encoder_output_graph)(g, enc)
        kv = w.cross_keys_values(g, enc) if not hasattr(w, "cross_kv_graph") else w.cross_kv_graph(g, enc)
        m = canon(g.model(enc, kv))
        out.append(f"{family} {quantize} {kernel} admission {hashlib.sha1(m.SerializeToString()).hexdigest()[:10]} nodes={len(m.graph.node)}")
print("\n".join(out))
