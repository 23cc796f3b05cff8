/* Decode-step attention for the onnx engine's kernel mode (attention_kernel.py builds and loads this).

   A decode step attends with a few query positions per row over that row's own keys. onnxruntime's
   attention ops spend 2-4 us per row and head on it (3.5-4.8x reading the keys and values once,
   BENCHMARKS.md); this file is that loop with nothing else in it: per row, head and fed position, the
   scores over the row's keys, a softmax, and the weighted sum of the values.

   Every (row, position, head) is computed by the same code in the same order whatever the other rows
   and positions of the call are, so a row's result does not depend on its neighbours, bit for bit
   (BiLD with rollback_threshold 0 must give `large`'s tokens at every batch size).

   Layouts (row-major, float32): a step's A rows of W fed positions, H heads of DK, caches of C
   positions (a layer's block: [A, H, C, DK], one contiguous piece).
   Rows feed counts[a] <= W positions starting at position positions[a]; positions past a row's count,
   and rows with none, are left zero. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16 /* partial sums per dot product: a fixed order the compiler vectorizes */

static float dot(const float *a, const float *b, int n) {
    float partial[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int lane = 0; lane < LANES; lane++) partial[lane] += a[i + lane] * b[i + lane];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int lane = 0; lane < width; lane++) partial[lane] += partial[lane + width];
    return partial[0] + tail;
}

/* out[dk] = softmax(scale * q.k_t + bias_t over t < n) . v_t; scores: room for n floats. */
static void attend(const float *q, const float *keys, const float *values, int n, int dk, float scale,
                   const float *bias, float *scores, float *out) {
    float top = -INFINITY;
    for (int t = 0; t < n; t++) {
        float score = scale * dot(q, keys + (int64_t)t * dk, dk);
        if (bias) score += bias[t];
        scores[t] = score;
        if (score > top) top = score;
    }
    float total = 0.0f;
    for (int t = 0; t < n; t++) {
        scores[t] = expf(scores[t] - top);
        total += scores[t];
    }
    float inverse = 1.0f / total;
    memset(out, 0, sizeof(float) * dk);
    for (int t = 0; t < n; t++) {
        float weight = scores[t] * inverse;
        const float *value = values + (int64_t)t * dk;
        for (int d = 0; d < dk; d++) out[d] += weight * value[d];
    }
}

/* Causal self-attention of the fed positions. qkv [A, W, 3 * H * DK] (q | k | v, heads in order);
   writes each fed position's key and value into cache_k, cache_v [A, H, C, DK] at its place, then
   each fed position attends to its row's positions up to its own, adding bias [A, H, bias_rows, C]
   (T5's relative positions; NULL: none). out [A, W, H * DK]; scores: room for C floats. */
void self_attention(const float *qkv, float *cache_k, float *cache_v, const int32_t *positions,
                    const int32_t *counts, const float *bias, int bias_rows, int rows, int width, int heads,
                    int dk, int capacity, float scale, float *scores, float *out) {
    int inner = heads * dk;
    memset(out, 0, sizeof(float) * (size_t)rows * width * inner);
    for (int a = 0; a < rows; a++) {
        int position = positions[a], count = counts[a];
        for (int i = 0; i < count; i++) {
            const float *fed = qkv + ((int64_t)a * width + i) * 3 * inner;
            for (int h = 0; h < heads; h++) {
                int64_t at = (((int64_t)a * heads + h) * capacity + position + i) * dk;
                memcpy(cache_k + at, fed + inner + h * dk, sizeof(float) * dk);
                memcpy(cache_v + at, fed + 2 * inner + h * dk, sizeof(float) * dk);
            }
        }
        for (int i = 0; i < count; i++) {
            const float *query = qkv + ((int64_t)a * width + i) * 3 * inner;
            for (int h = 0; h < heads; h++) {
                int64_t block = ((int64_t)a * heads + h) * capacity * dk;
                const float *row_bias = bias ? bias + (((int64_t)a * heads + h) * bias_rows + i) * capacity : 0;
                attend(query + h * dk, cache_k + block, cache_v + block, position + i + 1, dk, scale, row_bias,
                       scores, out + ((int64_t)a * width + i) * inner + h * dk);
            }
        }
    }
}

/* Attention of the fed positions over each row's first lengths[a] encoder keys and values,
   cross_k, cross_v [A, H, S, DK]. query, out [A, W, H * DK]; scores: room for S floats. */
void cross_attention(const float *query, const float *cross_k, const float *cross_v, const int32_t *lengths,
                     const int32_t *counts, int rows, int width, int heads, int dk, int sources, float scale,
                     float *scores, float *out) {
    int inner = heads * dk;
    memset(out, 0, sizeof(float) * (size_t)rows * width * inner);
    for (int a = 0; a < rows; a++)
        for (int i = 0; i < counts[a]; i++)
            for (int h = 0; h < heads; h++) {
                int64_t block = ((int64_t)a * heads + h) * sources * dk;
                int64_t at = ((int64_t)a * width + i) * inner + h * dk;
                attend(query + at, cross_k + block, cross_v + block, lengths[a], dk, scale, 0, scores, out + at);
            }
}
