/* Decode-step attention for the onnx engine's kernel mode (attention_kernel.py builds and loads this).

   A decode step attends with a few query positions per row over that row's own keys. onnxruntime's
   attention ops spend 2-4 us per row and head on it (3.5-4.8x reading the keys and values once,
   BENCHMARKS.md); this file is that loop with nothing else in it: per row, head and fed position, the
   scores over the row's keys, a softmax, and the weighted sum of the values.

   Every (row, position, head) is computed by the same code in the same order whatever the other rows
   and positions of the call are, so a row's result does not depend on its neighbours, bit for bit
   (BiLD with rollback_threshold 0 must give `large`'s tokens at every batch size).

   Layouts (row-major, float32): a step's A rows of W fed positions, H heads of DK; a layer's caches
   [slots, C, H, DK] of C positions (a slot's positions in order, each with its heads side by side:
   attention streams through a row's keys, then its values, once). Row a of a step is the engine's
   slot slots[a], read and written in place (no copy of a cache whatever slots a step runs over).
   Rows feed counts[a] <= W positions starting at position positions[a]; positions past a row's count,
   and rows with none, are left zero.

   Both entry points check every row's indices before they write anything (a slot among the caches',
   0 <= count <= W, 0 <= position and position + count <= C, a slot's source length <= S) and return
   0, or what the first row that fails breaks: CHECK_* + CHECK_ROW * row (attention_kernel.py raises,
   naming the argument). Array shapes, dtypes and layouts are the binding's to check (once per bound
   call: these run every step). Built with -ffp-contract=off: no fused multiply-adds, so every compiler
   rounds each product and sum as written, and the nodes of a cluster decode a record alike.

   It is built for any x86-64, not for the machine that builds it (a wheel's library runs elsewhere):
   attend, where the time goes, is compiled twice, for AVX2 machines (x86-64-v3) and for the baseline,
   and the loader picks one by the CPU (both entry points at 32 rows of 4 heads of 64, AVX-512 machine:
   the baseline alone took 1.18x the time of -march=native, the two clones 1.00x). Both give the same
   bits: without fast-math the compiler may not reorder a sum, so a vector of any width computes the
   LANES partial sums as written. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16 /* partial sums per dot product: a fixed order the compiler vectorizes */

/* The clones need GCC 11 or later (the name x86-64-v3) and glibc (its loader picks one: an ifunc);
   elsewhere attend is built once, for the target. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define CLONED __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONED
#endif

/* The sha256 of this file's text where the build names it (setup.py does): attention_kernel.py loads
   an installed library only where it was built from the decode_attention.c beside it. */
#ifndef SOURCE_DIGEST
#define SOURCE_DIGEST ""
#endif
const char source_digest[] = SOURCE_DIGEST;

enum { CHECK_SLOT = 1, CHECK_COUNT = 2, CHECK_POSITION = 3, CHECK_LENGTH = 4, CHECK_ROW = 8 };

/* 0 where row a's slot and count fit (its slot one of ``slot_count``, 0 <= count <= width), else what fails. */
static int check_row(const int32_t *slots, const int32_t *counts, int a, int slot_count, int width) {
    if (slots[a] < 0 || slots[a] >= slot_count) return CHECK_SLOT + CHECK_ROW * a;
    if (counts[a] < 0 || counts[a] > width) return CHECK_COUNT + CHECK_ROW * a;
    return 0;
}

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

/* For one query position of a row, every head at once, over the first n positions of the row's cache
   [C, H, DK] (a position's keys of every head side by side, so the keys are read in one pass in memory
   order, and the values in another): per head, out = softmax(scale * q.k_t + bias_t) . v_t.
   q, out [H * DK]; bias: head h's row at bias + h * bias_stride (NULL: none); scores: room for H * n. */
CLONED static void attend(const float *restrict q, const float *restrict keys, const float *restrict values,
                          int n, int heads, int dk, float scale, const float *restrict bias, int64_t bias_stride,
                          float *restrict scores, float *restrict out) {
    int inner = heads * dk;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            float score = scale * dot(q + h * dk, keys + (int64_t)t * inner + h * dk, dk);
            if (bias) score += bias[h * bias_stride + t];
            scores[h * n + t] = score;
        }
    for (int h = 0; h < heads; h++) {
        float *row = scores + h * n, top = -INFINITY, total = 0.0f;
        for (int t = 0; t < n; t++)
            if (row[t] > top) top = row[t];
        for (int t = 0; t < n; t++) {
            row[t] = expf(row[t] - top);
            total += row[t];
        }
        float inverse = 1.0f / total;
        for (int t = 0; t < n; t++) row[t] *= inverse;
    }
    memset(out, 0, sizeof(float) * inner);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            float weight = scores[h * n + t], *head_out = out + h * dk;
            const float *value = values + (int64_t)t * inner + h * dk;
            for (int d = 0; d < dk; d++) head_out[d] += weight * value[d];
        }
}

/* Causal self-attention of the fed positions. qkv [A, W, 3 * H * DK] (q | k | v, heads in order);
   writes each fed position's keys and values into cache_k, cache_v [slots, C, H, DK] at its place in
   its row's slot, then each fed position attends to its row's positions up to its own, adding bias
   [A, H, bias_rows >= W, C] (T5's relative positions; NULL: none). out [A, W, H * DK]; scores: room
   for H * C floats. The caches hold slot_count slots. */
int self_attention(const float *qkv, float *cache_k, float *cache_v, const int32_t *slots, const int32_t *positions,
                   const int32_t *counts, const float *bias, int bias_rows, int rows, int width, int heads, int dk,
                   int slot_count, int capacity, float scale, float *scores, float *out) {
    for (int a = 0; a < rows; a++) {
        int failed = check_row(slots, counts, a, slot_count, width);
        if (failed) return failed;
        if (positions[a] < 0 || (int64_t)positions[a] + counts[a] > capacity) return CHECK_POSITION + CHECK_ROW * a;
    }
    int inner = heads * dk;
    memset(out, 0, sizeof(float) * (size_t)rows * width * inner);
    for (int a = 0; a < rows; a++) {
        int position = positions[a], count = counts[a];
        int64_t block = (int64_t)slots[a] * capacity * inner;  /* the row's cache */
        for (int i = 0; i < count; i++) {
            const float *fed = qkv + ((int64_t)a * width + i) * 3 * inner;
            memcpy(cache_k + block + (int64_t)(position + i) * inner, fed + inner, sizeof(float) * inner);
            memcpy(cache_v + block + (int64_t)(position + i) * inner, fed + 2 * inner, sizeof(float) * inner);
        }
        for (int i = 0; i < count; i++) {
            const float *query = qkv + ((int64_t)a * width + i) * 3 * inner;
            const float *row_bias = bias ? bias + ((int64_t)a * heads * bias_rows + i) * capacity : 0;
            attend(query, cache_k + block, cache_v + block, position + i + 1, heads, dk, scale, row_bias,
                   (int64_t)bias_rows * capacity, scores, out + ((int64_t)a * width + i) * inner);
        }
    }
    return 0;
}

/* Attention of the fed positions over the first lengths[slot] encoder keys and values of each row's
   slot, cross_k, cross_v [slots, S, H, DK] of slot_count slots; lengths [slot_count]. query, out
   [A, W, H * DK]; scores: room for H * S floats. */
int cross_attention(const float *query, const float *cross_k, const float *cross_v, const int32_t *slots,
                    const int32_t *lengths, const int32_t *counts, int rows, int width, int heads, int dk,
                    int slot_count, int sources, float scale, float *scores, float *out) {
    for (int a = 0; a < rows; a++) {
        int failed = check_row(slots, counts, a, slot_count, width);
        if (failed) return failed;
        if (lengths[slots[a]] < 0 || lengths[slots[a]] > sources) return CHECK_LENGTH + CHECK_ROW * a;
    }
    int inner = heads * dk;
    memset(out, 0, sizeof(float) * (size_t)rows * width * inner);
    for (int a = 0; a < rows; a++) {
        int64_t block = (int64_t)slots[a] * sources * inner;
        for (int i = 0; i < counts[a]; i++) {
            int64_t at = ((int64_t)a * width + i) * inner;
            attend(query + at, cross_k + block, cross_v + block, lengths[slots[a]], heads, dk, scale, 0, 0, scores,
                   out + at);
        }
    }
    return 0;
}
