/*
 * rope.c — rotary position embeddings (RoPE) on the CPU, in Hugging Face Llama's rotate-half
 * convention: a head vector x of size hs is split into halves (x1, x2), and at position p with
 * angles a_i = p * inv_freq[i], out = (x1 cos a - x2 sin a, x2 cos a + x1 sin a). The backward is the
 * rotation by -a. Also here: the inverse frequencies themselves (plain, `linear` or `llama3`
 * scaling), computed once per model so that every layer and both passes use the very same values.
 *
 * The angle is the f32 product p * inv_freq[i], as in transformers, whose cos/sin tables are f32.
 * The inverse frequencies stay f32 under every policy; the rotated activations and their gradients
 * are read and written in their stored dtype (stored.h), the rotation computed in f32.
 */
#include <math.h>

#include "../ops.h"
#include "parallel.h"
#include "stored.h"

void cpu_rope_frequencies(float *inv_freq, size_t half, const WkRopeScaling *scaling) {
  double dim = 2.0 * (double)half;
  for (size_t i = 0; i < half; i++) {
    double freq = 1.0 / pow(scaling->theta, (double)(2 * i) / dim);
    if (scaling->kind == WK_ROPE_LINEAR) freq /= scaling->factor;
    if (scaling->kind == WK_ROPE_LLAMA3) {
      /* Wavelengths longer than the original context are slowed by factor, shorter than
       * context / high_freq_factor kept, and those in between interpolated smoothly. */
      double context = scaling->original_max_position_embeddings, wavelen = 2.0 * M_PI / freq;
      double low = scaling->low_freq_factor, high = scaling->high_freq_factor;
      if (wavelen > context / low) {
        freq /= scaling->factor;
      } else if (wavelen >= context / high) {
        double smooth = (context / wavelen - low) / (high - low);
        freq = (1.0 - smooth) * freq / scaling->factor + smooth * freq;
      }
    }
    inv_freq[i] = (float)freq;
  }
}

typedef struct {
  void *out;
  const void *inp;
  const float *inv_freq;
  WkDType act;
  size_t T, H, hs;
  int64_t start;
  float sign;       /* +1 rotates forward, -1 back (the backward) */
  bool accumulate;  /* add into out (a gradient) rather than overwrite it */
} RopeJob;

static void rope_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  RopeJob *j = ctx;
  size_t half = j->hs / 2, width = j->H * j->hs;
  WkDType act = j->act;
  for (size_t n = begin; n < end; n++) {
    float position = (float)(j->start + (int64_t)(n % j->T));
    for (size_t i = 0; i < half; i++) {
      float angle = position * j->inv_freq[i];
      float cos_a = cosf(angle), sin_a = j->sign * sinf(angle);
      for (size_t h = 0; h < j->H; h++) {
        size_t first = n * width + h * j->hs + i, second = first + half;
        float x1 = stored_get(j->inp, act, first), x2 = stored_get(j->inp, act, second);
        float y1 = j->accumulate ? stored_get(j->out, act, first) : 0.0f;
        float y2 = j->accumulate ? stored_get(j->out, act, second) : 0.0f;
        stored_put(j->out, act, first, y1 + (x1 * cos_a - x2 * sin_a));
        stored_put(j->out, act, second, y2 + (x2 * cos_a + x1 * sin_a));
      }
    }
  }
}

static void rope_apply(void *out, const void *inp, const float *inv_freq, WkDType act, size_t B, size_t T, size_t H,
                       size_t hs, int64_t start, float sign, bool accumulate) {
  RopeJob job = {out, inp, inv_freq, act, T, H, hs, start, sign, accumulate};
  parallel_for(B * T, parallel_row_grain(4 * H * hs), rope_rows, &job);
}

void cpu_rope_forward(void *out, const void *inp, const float *inv_freq, WkDType act, size_t B, size_t T, size_t H,
                      size_t hs, int64_t start) {
  rope_apply(out, inp, inv_freq, act, B, T, H, hs, start, 1.0f, false);
}

void cpu_rope_backward(void *dinp, const void *dout, const float *inv_freq, WkDType act, size_t B, size_t T,
                       size_t H, size_t hs, int64_t start) {
  rope_apply(dinp, dout, inv_freq, act, B, T, H, hs, start, -1.0f, true);
}
