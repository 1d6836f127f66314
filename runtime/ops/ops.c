/*
 * ops.c — the public wk_op_* entry points: argument checks, then dispatch to runtime/ops/cpu or
 * runtime/ops/cuda (through the CUDA module's table) on the device of the tensors. Messages name the
 * op, the argument, what was expected and what came ("layernorm: weight is [8] f32 cpu, expected [16] f32, contiguous").
 */
#include <math.h>
#include <stdio.h>

#include "ops.h"

enum { ANY = -1 };        /* a wildcard dimension in an expected shape */
enum { FLAT_RANK = -1 };  /* expected "rank" meaning: any shape with shape[0] elements */
/* What an argument's strides may be: kernels read most arguments as packed arrays, index tensors
 * (idx, targets) through a WkIndexLayout. */
typedef enum { CONTIGUOUS, STRIDED } Strides;

/* Checks dtype, rank, dimensions (ANY matches all), contiguity and that t lives where ref does. */
static WkStatus check_arg(const char *op, const char *name, const WkTensor *t, WkDType dtype, const WkTensor *ref,
                          int ndim, const int64_t *shape, Strides strides) {
  char got[128];
  if (!t) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
  bool flat = ndim == FLAT_RANK, packed = strides == STRIDED || wk_tensor_is_contiguous(t);
  bool ok = t->dtype == dtype && packed && (flat ? wk_tensor_numel(t) == shape[0] : t->ndim == ndim);
  for (int d = 0; ok && !flat && d < ndim; d++) ok = shape[d] == ANY || shape[d] == t->shape[d];
  if (!ok) {
    char want[128] = "[";
    size_t used = 1;
    if (flat) used += (size_t)snprintf(want + used, sizeof want - used, "%lld elements of any shape", (long long)shape[0]);
    for (int d = 0; !flat && d < ndim && used < sizeof want; d++)
      used += (size_t)(shape[d] == ANY ? snprintf(want + used, sizeof want - used, d ? ", *" : "*")
                                        : snprintf(want + used, sizeof want - used, d ? ", %lld" : "%lld", (long long)shape[d]));
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s is %s%s, expected %s] %s%s", op, name,
                   wk_tensor_describe(t, got, sizeof got), wk_tensor_is_contiguous(t) ? "" : " (strided)", want,
                   wk_dtype_name(dtype), strides == CONTIGUOUS ? ", contiguous" : "");
  }
  if (ref && (tensor_device(t) != tensor_device(ref) || t->storage->device_index != ref->storage->device_index)) {
    char where[128];
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s is %s but the op runs where %s is", op, name,
                   wk_tensor_describe(t, got, sizeof got), wk_tensor_describe(ref, where, sizeof where));
  }
  return WK_OK;
}

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define ARG(op, t, dtype, ref, ...) WK_TRY(check_arg(op, #t, t, dtype, ref, SHAPE(__VA_ARGS__), CONTIGUOUS))
/* Elementwise ops reshape freely: any shape with n elements. */
#define ARG_FLAT(op, t, dtype, ref, n) WK_TRY(check_arg(op, #t, t, dtype, ref, FLAT_RANK, (int64_t[]){(int64_t)(n)}, CONTIGUOUS))
/* An i32 index tensor read in place, any strides; `layout` receives how to walk it. */
#define ARG_INDEX(op, t, ref, layout, ...)                                     \
  WK_TRY(check_arg(op, #t, t, WK_I32, ref, SHAPE(__VA_ARGS__), STRIDED));      \
  WK_TRY(index_layout(op, #t, t, layout))
#define ARG_FLAT_INDEX(op, t, ref, layout, n)                                                  \
  WK_TRY(check_arg(op, #t, t, WK_I32, ref, FLAT_RANK, (int64_t[]){(int64_t)(n)}, STRIDED));    \
  WK_TRY(index_layout(op, #t, t, layout))
#define F32(t) ((float *)tensor_ptr(t))
#define OPT_F32(t) ((t) ? F32(t) : NULL)
#define I32(t) ((const int32_t *)tensor_ptr(t))

static bool on_cuda(const WkTensor *t) { return tensor_device(t) == WK_DEVICE_CUDA; }

static WkStatus index_layout(const char *op, const char *name, const WkTensor *t, WkIndexLayout *out) {
  if (wk_tensor_index_layout(t, out) != WK_OK) return wk_error_context("%s: %s", op, name);
  return WK_OK;
}

/* A kernel of the CUDA module: CUDA->fill(...) (runtime/ops/cuda_ops.h). */
#define CUDA wk_cuda_ops()

/* Runs cuda_call on t's device: the op's arguments all live there (check_arg), so entering it once
 * puts the launches, the cuBLAS handle and the scratch memory on the right GPU. */
static WkStatus enter_device(const WkTensor *t) { return wk_cuda_enter(t->storage->device_index); }
#define ON_DEVICE(t, cuda_call) (enter_device(t) == WK_OK ? (cuda_call) : wk_last_status())

/* Runs cpu_call (which cannot fail) or cuda_call by the device of t. */
#define DISPATCH(t, cpu_call, cuda_call) (on_cuda(t) ? ON_DEVICE(t, cuda_call) : ((cpu_call), WK_OK))

static size_t numel(const WkTensor *t) { return t ? (size_t)wk_tensor_numel(t) : 0; }

static WkStatus check_contiguous(const char *op, const WkTensor *t) {
  char got[128];
  if (!t) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: tensor is NULL", op);
  if (!wk_tensor_is_contiguous(t))
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s must be contiguous", op, wk_tensor_describe(t, got, sizeof got));
  return WK_OK;
}

/* ---- elementwise ------------------------------------------------------------------------------ */

WkStatus wk_op_fill(WkTensor *t, double value) {
  WK_TRY(check_contiguous("fill", t));
  unsigned char pattern[8];
  WkTensor one = {.storage = &(WkStorage){.data = pattern, .bytes = sizeof pattern}, .dtype = t->dtype, .ndim = 0};
  WK_TRY(wk_tensor_set(&one, 0, value));  /* the element's bytes in t's dtype */
  return DISPATCH(t, cpu_fill(tensor_ptr(t), numel(t), wk_dtype_size(t->dtype), pattern),
                  CUDA->fill(tensor_ptr(t), numel(t), wk_dtype_size(t->dtype), pattern));
}

WkStatus wk_op_scale(WkTensor *t, float alpha) {
  ARG_FLAT("scale", t, WK_F32, NULL, numel(t));
  return DISPATCH(t, cpu_scale(F32(t), numel(t), alpha), CUDA->scale(t->dtype, tensor_ptr(t), numel(t), alpha));
}


WkStatus wk_op_add(WkTensor *out, const WkTensor *a, const WkTensor *b) {
  ARG_FLAT("add", out, WK_F32, NULL, numel(out));
  ARG_FLAT("add", a, WK_F32, out, numel(out));
  ARG_FLAT("add", b, WK_F32, out, numel(out));
  return DISPATCH(out, cpu_add(F32(out), F32(a), F32(b), numel(out)), CUDA->add(out->dtype, tensor_ptr(out), tensor_ptr(a), tensor_ptr(b), numel(out)));
}

WkStatus wk_op_axpy(WkTensor *y, float alpha, const WkTensor *x) {
  ARG_FLAT("axpy", y, WK_F32, NULL, numel(y));
  ARG_FLAT("axpy", x, WK_F32, y, numel(y));
  return DISPATCH(y, cpu_axpy(F32(y), alpha, F32(x), numel(y)), CUDA->axpy(y->dtype, tensor_ptr(y), alpha, tensor_ptr(x), numel(y)));
}

WkStatus wk_op_round(WkTensor *t, WkDType dtype) {
  ARG_FLAT("round", t, WK_F32, NULL, numel(t));
  if (dtype != WK_BF16 && dtype != WK_F16 && dtype != WK_F32)
    return WK_FAIL(WK_ERR_INVALID_ARG, "round: dtype must be f32, bf16 or f16, not %s", wk_dtype_name(dtype));
  return DISPATCH(t, cpu_round(F32(t), numel(t), dtype), CUDA->round(F32(t), numel(t), dtype));
}

WkStatus wk_op_sumsq(const WkTensor *t, double *out) {
  ARG_FLAT("sumsq", t, WK_F32, NULL, numel(t));
  return DISPATCH(t, *out = cpu_sumsq(F32(t), numel(t)), CUDA->sumsq(F32(t), numel(t), out));
}

WkStatus wk_op_normal(WkTensor *t, uint64_t seed, float mean, float std) {
  ARG_FLAT("normal", t, WK_F32, NULL, numel(t));
  if (!on_cuda(t)) {
    cpu_normal(F32(t), numel(t), seed, mean, std);
    return WK_OK;
  }
  /* Initialisation is rare: generate on the host so both devices get the very same values. */
  WkTensor *host = wk_tensor_empty(WK_F32, t->ndim, t->shape, WK_DEVICE_CPU, 0);
  if (!host) return wk_last_status();
  cpu_normal(F32(host), numel(t), seed, mean, std);
  WkStatus status = wk_tensor_copy(t, host);
  wk_tensor_free(host);
  return status;
}

WkStatus wk_op_gelu(WkTensor *out, const WkTensor *inp) {
  ARG_FLAT("gelu", out, WK_F32, NULL, numel(out));
  ARG_FLAT("gelu", inp, WK_F32, out, numel(out));
  return DISPATCH(out, cpu_gelu_forward(F32(out), F32(inp), numel(out)), CUDA->gelu_forward(out->dtype, tensor_ptr(out), tensor_ptr(inp), numel(out)));
}

WkStatus wk_op_gelu_backward(WkTensor *dinp, const WkTensor *dout, const WkTensor *inp) {
  ARG_FLAT("gelu_backward", dinp, WK_F32, NULL, numel(dinp));
  ARG_FLAT("gelu_backward", dout, WK_F32, dinp, numel(dinp));
  ARG_FLAT("gelu_backward", inp, WK_F32, dinp, numel(dinp));
  return DISPATCH(dinp, cpu_gelu_backward(F32(dinp), F32(dout), F32(inp), numel(dinp)),
                  CUDA->gelu_backward(dinp->dtype, tensor_ptr(dinp), tensor_ptr(dout), tensor_ptr(inp), numel(dinp)));
}

WkStatus wk_op_adamw(WkTensor *param, const WkTensor *grad, WkTensor *m, WkTensor *v, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  ARG_FLAT("adamw", param, WK_F32, NULL, numel(param));
  ARG_FLAT("adamw", grad, WK_F32, param, numel(param));
  ARG_FLAT("adamw", m, WK_F32, param, numel(param));
  ARG_FLAT("adamw", v, WK_F32, param, numel(param));
  if (step < 1) return WK_FAIL(WK_ERR_INVALID_ARG, "adamw: step counts from 1, got %lld", (long long)step);
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
    return WK_FAIL(WK_ERR_INVALID_ARG, "adamw: betas must be in [0, 1), got %g and %g", beta1, beta2);
  return DISPATCH(param,
                  cpu_adamw(F32(param), F32(grad), F32(m), F32(v), numel(param), lr, beta1, beta2, eps, weight_decay, step, grad_scale),
                  CUDA->adamw(F32(param), F32(grad), F32(m), F32(v), numel(param), lr, beta1, beta2, eps, weight_decay, step, grad_scale));
}

/* ---- layers ----------------------------------------------------------------------------------- */

/* `at` counts idx's elements in row-major order. */
static WkStatus bad_index(const char *op, const char *what, const WkTensor *idx, WkIndexLayout layout, int64_t at,
                          int64_t limit) {
  return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s[%lld] = %d is outside [0, %lld) (tokenizer and model vocab disagree?)",
                 op, what, (long long)at, I32(idx)[wk_index_offset(layout, at)], (long long)limit);
}

WkStatus wk_op_embedding(WkTensor *out, const WkTensor *idx, const WkTensor *wte, const WkTensor *wpe) {
  WkIndexLayout at;
  ARG_INDEX("embedding", idx, NULL, &at, ANY, ANY);
  int64_t B = idx->shape[0], T = idx->shape[1];
  ARG("embedding", wte, WK_F32, idx, ANY, ANY);
  int64_t V = wte->shape[0], C = wte->shape[1];
  ARG("embedding", wpe, WK_F32, idx, ANY, C);
  if (wpe->shape[0] < T)
    return WK_FAIL(WK_ERR_INVALID_ARG, "embedding: sequence of %lld tokens but only %lld positions", (long long)T,
                   (long long)wpe->shape[0]);
  ARG("embedding", out, WK_F32, idx, B, T, C);
  if (on_cuda(out)) return ON_DEVICE(out, CUDA->embedding_forward(F32(out), I32(idx), at, F32(wte), F32(wpe), (size_t)B, (size_t)T, (size_t)C, (size_t)V));
  int64_t bad = cpu_embedding_forward(F32(out), I32(idx), at, F32(wte), F32(wpe), (size_t)B, (size_t)T, (size_t)C, (size_t)V);
  return bad < 0 ? WK_OK : bad_index("embedding", "idx", idx, at, bad, V);
}

WkStatus wk_op_embedding_backward(WkTensor *dwte, WkTensor *dwpe, const WkTensor *dout, const WkTensor *idx) {
  WkIndexLayout at;
  ARG_INDEX("embedding_backward", idx, NULL, &at, ANY, ANY);
  int64_t B = idx->shape[0], T = idx->shape[1];
  ARG("embedding_backward", dwte, WK_F32, idx, ANY, ANY);
  int64_t C = dwte->shape[1];
  ARG("embedding_backward", dwpe, WK_F32, idx, ANY, C);
  ARG("embedding_backward", dout, WK_F32, idx, B, T, C);
  if (dwpe->shape[0] < T) return WK_FAIL(WK_ERR_INVALID_ARG, "embedding_backward: dwpe has fewer than T rows");
  return DISPATCH(idx, cpu_embedding_backward(F32(dwte), F32(dwpe), F32(dout), I32(idx), at, (size_t)B, (size_t)T, (size_t)C),
                  CUDA->embedding_backward(F32(dwte), F32(dwpe), F32(dout), I32(idx), at, (size_t)B, (size_t)T, (size_t)C));
}

/* Rows N = product of all but the last dim of inp, C = the last. Callers zero-initialise the
 * outputs: -O3 flow analysis cannot see that WK_TRY returns before they would be read. */
static WkStatus rows_and_channels(const char *op, const WkTensor *inp, int64_t *N, int64_t *C) {
  WK_TRY(check_contiguous(op, inp));
  if (inp->ndim < 1) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: input must have at least one dim", op);
  *C = inp->shape[inp->ndim - 1];
  *N = wk_tensor_numel(inp) / (*C ? *C : 1);
  return WK_OK;
}

WkStatus wk_op_layernorm(WkTensor *out, WkTensor *mean, WkTensor *rstd, const WkTensor *inp, const WkTensor *weight,
                         const WkTensor *bias, float eps) {
  int64_t N = 0, C = 0;
  WK_TRY(rows_and_channels("layernorm", inp, &N, &C));
  ARG_FLAT("layernorm", inp, WK_F32, NULL, numel(inp));
  ARG_FLAT("layernorm", out, WK_F32, inp, numel(inp));
  ARG("layernorm", mean, WK_F32, inp, N);
  ARG("layernorm", rstd, WK_F32, inp, N);
  ARG("layernorm", weight, WK_F32, inp, C);
  ARG("layernorm", bias, WK_F32, inp, C);
  return DISPATCH(inp, cpu_layernorm_forward(F32(out), F32(mean), F32(rstd), F32(inp), F32(weight), F32(bias), (size_t)N, (size_t)C, eps),
                  CUDA->layernorm_forward(inp->dtype, tensor_ptr(out), F32(mean), F32(rstd), tensor_ptr(inp), tensor_ptr(weight), tensor_ptr(bias), (size_t)N, (size_t)C, eps));
}

WkStatus wk_op_layernorm_backward(WkTensor *dinp, WkTensor *dweight, WkTensor *dbias, const WkTensor *dout,
                                  const WkTensor *inp, const WkTensor *weight, const WkTensor *mean, const WkTensor *rstd) {
  int64_t N = 0, C = 0;
  WK_TRY(rows_and_channels("layernorm_backward", inp, &N, &C));
  ARG_FLAT("layernorm_backward", inp, WK_F32, NULL, numel(inp));
  ARG_FLAT("layernorm_backward", dinp, WK_F32, inp, numel(inp));
  ARG_FLAT("layernorm_backward", dout, WK_F32, inp, numel(inp));
  ARG("layernorm_backward", mean, WK_F32, inp, N);
  ARG("layernorm_backward", rstd, WK_F32, inp, N);
  ARG("layernorm_backward", weight, WK_F32, inp, C);
  ARG("layernorm_backward", dweight, WK_F32, inp, C);
  ARG("layernorm_backward", dbias, WK_F32, inp, C);
  return DISPATCH(inp,
                  cpu_layernorm_backward(F32(dinp), F32(dweight), F32(dbias), F32(dout), F32(inp), F32(weight), F32(mean), F32(rstd), (size_t)N, (size_t)C),
                  CUDA->layernorm_backward(inp->dtype, tensor_ptr(dinp), tensor_ptr(dweight), tensor_ptr(dbias), tensor_ptr(dout), tensor_ptr(inp), tensor_ptr(weight), F32(mean), F32(rstd), (size_t)N, (size_t)C));
}

/* inp [..., C], w [C, OC] or transposed [OC, C]. */
static WkStatus matmul_dims(const char *op, const WkTensor *inp, const WkTensor *w, int transpose_w, int64_t *N,
                            int64_t *C, int64_t *OC) {
  WK_TRY(rows_and_channels(op, inp, N, C));
  ARG_FLAT(op, inp, WK_F32, NULL, numel(inp));
  ARG(op, w, WK_F32, inp, transpose_w ? ANY : *C, transpose_w ? *C : ANY);
  *OC = w->shape[transpose_w ? 0 : 1];
  return WK_OK;
}

WkStatus wk_op_matmul(WkTensor *out, const WkTensor *inp, const WkTensor *w, const WkTensor *bias, int transpose_w) {
  int64_t N = 0, C = 0, OC = 0;
  WK_TRY(matmul_dims("matmul", inp, w, transpose_w, &N, &C, &OC));
  ARG_FLAT("matmul", out, WK_F32, inp, N * OC);
  if (bias) ARG("matmul", bias, WK_F32, inp, OC);
  if (out->shape[out->ndim - 1] != OC) return WK_FAIL(WK_ERR_INVALID_ARG, "matmul: out's last dim must be %lld", (long long)OC);
  return DISPATCH(inp, cpu_matmul_forward(F32(out), F32(inp), F32(w), OPT_F32(bias), (size_t)N, (size_t)C, (size_t)OC, transpose_w),
                  CUDA->matmul_forward(inp->dtype, tensor_ptr(out), tensor_ptr(inp), tensor_ptr(w), bias ? tensor_ptr(bias) : NULL, (size_t)N, (size_t)C, (size_t)OC, transpose_w));
}

WkStatus wk_op_matmul_backward(WkTensor *dinp, WkTensor *dw, WkTensor *dbias, const WkTensor *dout, const WkTensor *inp,
                               const WkTensor *w, int transpose_w) {
  int64_t N = 0, C = 0, OC = 0;
  WK_TRY(matmul_dims("matmul_backward", inp, w, transpose_w, &N, &C, &OC));
  ARG_FLAT("matmul_backward", dinp, WK_F32, inp, numel(inp));
  ARG("matmul_backward", dw, WK_F32, inp, w->shape[0], w->shape[1]);
  ARG_FLAT("matmul_backward", dout, WK_F32, inp, N * OC);
  if (dbias) ARG("matmul_backward", dbias, WK_F32, inp, OC);
  return DISPATCH(inp, cpu_matmul_backward(F32(dinp), F32(dw), OPT_F32(dbias), F32(dout), F32(inp), F32(w), (size_t)N, (size_t)C, (size_t)OC, transpose_w),
                  CUDA->matmul_backward(inp->dtype, tensor_ptr(dinp), tensor_ptr(dw), dbias ? tensor_ptr(dbias) : NULL, tensor_ptr(dout), tensor_ptr(inp), tensor_ptr(w), (size_t)N, (size_t)C, (size_t)OC, transpose_w));
}

/* ---- attention and loss ----------------------------------------------------------------------- */

static WkStatus attention_dims(const char *op, const WkTensor *qkv, int heads, int64_t *B, int64_t *T, int64_t *C) {
  ARG(op, qkv, WK_F32, NULL, ANY, ANY, ANY);
  *B = qkv->shape[0];
  *T = qkv->shape[1];
  *C = qkv->shape[2] / 3;
  if (heads < 1 || qkv->shape[2] % 3 != 0 || *C % heads != 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: qkv's last dim %lld must be 3 * C with C divisible by heads = %d", op,
                   (long long)qkv->shape[2], heads);
  return WK_OK;
}

WkStatus wk_op_attention(WkTensor *out, WkTensor *att, const WkTensor *qkv, int heads) {
  int64_t B = 0, T = 0, C = 0;
  WK_TRY(attention_dims("attention", qkv, heads, &B, &T, &C));
  ARG("attention", out, WK_F32, qkv, B, T, C);
  ARG("attention", att, WK_F32, qkv, B, heads, T, T);
  return DISPATCH(qkv, cpu_attention_forward(F32(out), F32(att), F32(qkv), (size_t)B, (size_t)T, (size_t)C, (size_t)heads),
                  CUDA->attention_forward(F32(out), F32(att), F32(qkv), (size_t)B, (size_t)T, (size_t)C, (size_t)heads));
}

WkStatus wk_op_attention_backward(WkTensor *dqkv, const WkTensor *dout, const WkTensor *qkv, const WkTensor *att,
                                  int heads) {
  int64_t B = 0, T = 0, C = 0;
  WK_TRY(attention_dims("attention_backward", qkv, heads, &B, &T, &C));
  ARG("attention_backward", dqkv, WK_F32, qkv, B, T, 3 * C);
  ARG("attention_backward", dout, WK_F32, qkv, B, T, C);
  ARG("attention_backward", att, WK_F32, qkv, B, heads, T, T);
  if (on_cuda(qkv)) return ON_DEVICE(qkv, CUDA->attention_backward(F32(dqkv), F32(dout), F32(qkv), F32(att), (size_t)B, (size_t)T, (size_t)C, (size_t)heads));
  return cpu_attention_backward(F32(dqkv), F32(dout), F32(qkv), F32(att), (size_t)B, (size_t)T, (size_t)C, (size_t)heads);
}

/* targets may be strided (a view of a loader batch); the mask is contiguous. */
static WkStatus loss_dims(const char *op, const WkTensor *logits, const WkTensor *targets, const WkTensor *mask,
                          float normalizer, int64_t *N, int64_t *V, WkIndexLayout *at) {
  WK_TRY(rows_and_channels(op, logits, N, V));
  ARG_FLAT(op, logits, WK_F32, NULL, numel(logits));
  ARG_FLAT_INDEX(op, targets, logits, at, numel(targets));
  if (wk_tensor_numel(targets) != *N)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %lld targets for %lld rows of logits", op, (long long)wk_tensor_numel(targets), (long long)*N);
  if (mask) ARG_FLAT(op, mask, WK_U8, logits, numel(mask));
  if (mask && wk_tensor_numel(mask) != *N) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: mask must have one entry per target", op);
  if (!(normalizer > 0) || !isfinite(normalizer))
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: normalizer must be a positive token count, got %g", op, normalizer);
  return WK_OK;
}

#define MASK(m) ((m) ? (const uint8_t *)tensor_ptr(m) : NULL)

WkStatus wk_op_cross_entropy(WkTensor *losses, const WkTensor *logits, const WkTensor *targets, const WkTensor *mask,
                             float normalizer, double *loss_sum) {
  int64_t N = 0, V = 0;
  WkIndexLayout at;
  WK_TRY(loss_dims("cross_entropy", logits, targets, mask, normalizer, &N, &V, &at));
  ARG_FLAT("cross_entropy", losses, WK_F32, logits, numel(targets));
  if (on_cuda(logits)) return ON_DEVICE(logits, CUDA->cross_entropy_forward(F32(losses), F32(logits), I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, loss_sum));
  int64_t bad = cpu_cross_entropy_forward(F32(losses), F32(logits), I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, loss_sum);
  return bad < 0 ? WK_OK : bad_index("cross_entropy", "targets", targets, at, bad, V);
}

WkStatus wk_op_cross_entropy_backward(WkTensor *dlogits, const WkTensor *logits, const WkTensor *targets,
                                      const WkTensor *mask, float normalizer, float dloss) {
  int64_t N = 0, V = 0;
  WkIndexLayout at;
  WK_TRY(loss_dims("cross_entropy_backward", logits, targets, mask, normalizer, &N, &V, &at));
  ARG_FLAT("cross_entropy_backward", dlogits, WK_F32, logits, numel(logits));
  return DISPATCH(logits, cpu_cross_entropy_backward(F32(dlogits), F32(logits), I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, dloss),
                  CUDA->cross_entropy_backward(F32(dlogits), F32(logits), I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, dloss));
}
