"""Probe (not shipped code): one decode step's attention at the demo pair's `large` shapes (12 layers,
4 heads of 64), 32 rows of 2 query positions (the onnx engine's extra row), each row attending to
``keys`` positions of its own, every layer on its own buffers (as in a step: nothing stays in cache
from the layer before), one thread. Every formulation available without compiling a kernel, timed
in interleaved rounds; prints ms per step (12 layers) and microseconds per (row, head, layer). The
matmul formulations do less than the two attention ops (no per-row key lengths, no cache write):
lower bounds for them.

    .venv/bin/python docs/bench-attention/attention_probe.py [rounds]
"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

torch.set_num_threads(1)
A, H, DK, L, Q = 32, 4, 64, 12, 2
F, I32 = TensorProto.FLOAT, TensorProto.INT32
GQA = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
       "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
       "k_norm_weight", "query_seqlens")


def positional(**given):
    last = max(GQA.index(name) for name in given)
    return [given.get(name, "") for name in GQA[: last + 1]]


def session(nodes, inputs, outputs):
    model = helper.make_model(helper.make_graph(nodes, "probe", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def candidates(keys: int, rng):
    """name -> a function running the 12 layers once."""
    lengths = np.full(A, keys, np.int32)
    capacity = keys + Q  # room for GQA's written positions
    q3 = rng.standard_normal((A, Q, H * DK), dtype=np.float32)
    q4 = np.ascontiguousarray(q3.reshape(A, Q, H, DK).transpose(0, 2, 1, 3))
    ks = [rng.standard_normal((A, H, capacity, DK), dtype=np.float32) for _ in range(L)]
    vs = [rng.standard_normal((A, H, capacity, DK), dtype=np.float32) for _ in range(L)]
    runs = {}

    # onnxruntime GroupQueryAttention, as the step's self-attention: writes Q positions, attends to each row's own.
    nodes, inputs, outputs = [], [info("q", F, [A, Q, 3 * H * DK]), info("sk", I32, [A]), info("tot", I32, []),
                                  info("qs", I32, [A])], []
    for layer in range(L):
        inputs += [info(f"k{layer}", F, [A, H, capacity, DK]), info(f"v{layer}", F, [A, H, capacity, DK])]
        nodes.append(helper.make_node("GroupQueryAttention", positional(
            query="q", past_key=f"k{layer}", past_value=f"v{layer}", seqlens_k="sk", total_sequence_length="tot",
            query_seqlens="qs"), [f"o{layer}", f"pk{layer}", f"pv{layer}"], domain="com.microsoft", num_heads=H,
            kv_num_heads=H))
        outputs += [info(name, F, None) for name in (f"o{layer}", f"pk{layer}", f"pv{layer}")]
    gqa = session(nodes, inputs, outputs)
    binding = gqa.io_binding()
    packed = rng.standard_normal((A, Q, 3 * H * DK), dtype=np.float32)
    for name, value in (("q", packed), ("sk", lengths + Q - 1), ("tot", np.array(capacity, np.int32)),
                        ("qs", np.full(A, Q, np.int32))):
        binding.bind_cpu_input(name, value)
    gk, gv = [k.copy() for k in ks], [v.copy() for v in vs]
    for layer in range(L):
        for kind, array in (("k", gk[layer]), ("v", gv[layer])):
            value = ort.OrtValue.ortvalue_from_numpy(array)
            binding.bind_ortvalue_input(f"{kind}{layer}", value)
            binding.bind_ortvalue_output(f"p{kind}{layer}", value)
        binding.bind_output(f"o{layer}")
    runs["ort GroupQueryAttention (self)"] = lambda: gqa.run_with_iobinding(binding)

    # onnxruntime MultiHeadAttention with per-row key lengths, as the step's cross-attention.
    nodes, inputs, outputs = [], [info("q", F, [A, Q, H * DK]), info("len", I32, [A])], []
    for layer in range(L):
        inputs += [info(f"k{layer}", F, [A, H, keys, DK]), info(f"v{layer}", F, [A, H, keys, DK])]
        nodes.append(helper.make_node("MultiHeadAttention", ["q", f"k{layer}", f"v{layer}", "", "len"], [f"o{layer}"],
                                      domain="com.microsoft", num_heads=H))
        outputs.append(info(f"o{layer}", F, None))
    mha = session(nodes, inputs, outputs)
    feeds = {"q": q3, "len": lengths}
    for layer in range(L):
        feeds[f"k{layer}"] = np.ascontiguousarray(ks[layer][:, :, :keys])
        feeds[f"v{layer}"] = np.ascontiguousarray(vs[layer][:, :, :keys])
    mha_binding = mha.io_binding()
    for name, value in feeds.items():
        mha_binding.bind_cpu_input(name, value)
    for layer in range(L):
        mha_binding.bind_output(f"o{layer}")
    runs["ort MultiHeadAttention (cross)"] = lambda: mha.run_with_iobinding(mha_binding)

    # onnxruntime primitives: MatMul(q, K^T) + Softmax + MatMul(p, V), batched over rows and heads.
    nodes, inputs, outputs = [], [info("q", F, [A, H, Q, DK])], []
    for layer in range(L):
        inputs += [info(f"k{layer}", F, [A, H, keys, DK]), info(f"v{layer}", F, [A, H, keys, DK])]
        nodes += [helper.make_node("FusedMatMul", ["q", f"k{layer}"], [f"s{layer}"], domain="com.microsoft",
                                   transB=1, alpha=0.125),
                  helper.make_node("Softmax", [f"s{layer}"], [f"p{layer}"], axis=-1),
                  helper.make_node("MatMul", [f"p{layer}", f"v{layer}"], [f"o{layer}"])]
        outputs.append(info(f"o{layer}", F, None))
    primitives = session(nodes, inputs, outputs)
    prim_binding = primitives.io_binding()
    prim_binding.bind_cpu_input("q", q4)
    for layer in range(L):
        prim_binding.bind_cpu_input(f"k{layer}", feeds[f"k{layer}"])
        prim_binding.bind_cpu_input(f"v{layer}", feeds[f"v{layer}"])
        prim_binding.bind_output(f"o{layer}")
    runs["ort FusedMatMul + Softmax + MatMul"] = lambda: primitives.run_with_iobinding(prim_binding)

    # torch: batched matmuls (MKL), and scaled_dot_product_attention.
    tq = torch.from_numpy(q4)
    tk = [torch.from_numpy(feeds[f"k{layer}"]) for layer in range(L)]
    tv = [torch.from_numpy(feeds[f"v{layer}"]) for layer in range(L)]

    def torch_matmul():
        for layer in range(L):
            torch.matmul(torch.softmax(torch.matmul(tq, tk[layer].transpose(-1, -2)), -1), tv[layer])

    def torch_sdpa():
        for layer in range(L):
            torch.nn.functional.scaled_dot_product_attention(tq, tk[layer], tv[layer])

    runs["torch matmul + softmax + matmul"] = torch_matmul
    runs["torch scaled_dot_product_attention"] = torch_sdpa
    # The floor: reading every layer's keys and values once, nothing else (numpy's sum streams them).
    arrays = [feeds[f"{kind}{layer}"] for layer in range(L) for kind in "kv"]
    runs["floor: read every K and V once (numpy sum)"] = lambda: [array.sum() for array in arrays]
    return runs


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rng = np.random.default_rng(0)
    print(f"{A} rows x {H} heads of {DK}, {Q} query positions, {L} layers, one thread; onnxruntime {ort.__version__}, "
          f"torch {torch.__version__}; median over {rounds} interleaved rounds of 30 calls")
    print("| keys per row | formulation | ms per step (12 layers) | us per (row, head, layer) |")
    print("|---|---|---|---|")
    for keys in (16, 32):
        runs = candidates(keys, rng)
        times = {name: [] for name in runs}
        for round_ in range(rounds):
            order = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
            for name in order:
                for _ in range(3):
                    runs[name]()
                started = time.perf_counter()
                for _ in range(30):
                    runs[name]()
                times[name].append((time.perf_counter() - started) / 30)
        for name, values in times.items():
            ms = statistics.median(values) * 1e3
            print(f"| {keys} | {name} | {ms:.2f} | {ms * 1e3 / (A * H * L):.2f} |")


if __name__ == "__main__":
    main()
