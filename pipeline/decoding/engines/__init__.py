"""The engines behind the seam of ``pipeline/decoding/engine.py``: each runs one model's decoder over a
pool of row slots (admit, forward, rewind, release).

| module | engine |
|---|---|
| native.py | what the native engines share: the weights' layout, a preallocated cache, one decoder pass |
| t5_engine.py, bart_engine.py | the T5 and BART families: their weights, and their layers written once |
| torch_verbs.py | the verbs those layers are written with, in torch (onnx_graph.py has them as ONNX nodes) |
| int8.py | int8 matrices for the native engine (fbgemm) |
| onnx_engine.py | the onnx engine: the native engine's step and admission as onnxruntime calls |
| onnx_attention.py | how its step attends: onnxruntime's ops or our kernel (onnx_segments.py, attention_kernel.py) |
| cache_rows.py | what the cached engines share: buffer growth, span or gather, padded admission ids |
| onnx_graph.py, onnx_sessions.py | the graphs it runs, and their sessions |
| hf_engine.py | the Hugging Face engine: any architecture, the reference in tests |
| ct2_engine.py | CTranslate2 for plain decoding in jobs (it cannot rewind a cache) |
"""
