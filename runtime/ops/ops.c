/*
 * ops.c — the public wk_op_* entry points: argument checks, then dispatch to runtime/ops/cpu or
 * runtime/ops/cuda (through the CUDA module's table) on the device of the tensors. Messages name the
 * op, the argument, what was expected and what came ("layernorm: weight is [8] f32 cpu, expected [16] f32, contiguous").
 *
 * Activations, their gradients and the compute copy of the weights share one dtype per op call, the
 * activation dtype: f32, or bf16/f16 under a low-precision policy, which the CPU kernels load, compute
 * in f32 and store rounded to nearest even (runtime/ops/cpu/stored.h). It is the dtype of the op's
 * first activation argument (act_dtype below); the others must match it. What stays f32 under every
 * policy is checked as WK_F32: parameter gradients (accumulated in f32), layernorm's mean and rstd,
 * rmsnorm's rstd, RoPE's inverse frequencies, the per-token losses, the optimizer's weights and
 * moments, and the ops that serve only those (scale, round, sumsq, normal, adamw). The CUDA kernels
 * (runtime/ops/cuda) take the very same dtypes, the activation dtype passed to each entry that has
 * one, and round as the CPU does (docs/gpu.md).
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
/* Elementwise ops reshape freely: any shape with n elements. ARG_FLAT_AS names the argument itself:
 * checks shared by several ops, where one tensor plays a part under another name (the fused ops' sum
 * is add's out and the norm's inp). */
#define ARG_FLAT_AS(op, name, t, dtype, ref, n) \
  WK_TRY(check_arg(op, name, t, dtype, ref, FLAT_RANK, (int64_t[]){(int64_t)(n)}, CONTIGUOUS))
#define ARG_FLAT(op, t, dtype, ref, n) ARG_FLAT_AS(op, #t, t, dtype, ref, n)
/* An i32 index tensor read in place, any strides; `layout` receives how to walk it. */
#define ARG_INDEX(op, t, ref, layout, ...)                                     \
  WK_TRY(check_arg(op, #t, t, WK_I32, ref, SHAPE(__VA_ARGS__), STRIDED));      \
  WK_TRY(index_layout(op, #t, t, layout))
#define ARG_FLAT_INDEX(op, t, ref, layout, n)                                                  \
  WK_TRY(check_arg(op, #t, t, WK_I32, ref, FLAT_RANK, (int64_t[]){(int64_t)(n)}, STRIDED));    \
  WK_TRY(index_layout(op, #t, t, layout))
#define F32(t) ((float *)tensor_ptr(t))
#define OPT_F32(t) ((t) ? F32(t) : NULL)
#define DATA(t) tensor_ptr(t)  /* an activation, of the op's activation dtype */
#define OPT_DATA(t) ((t) ? DATA(t) : NULL)
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

/* The activation dtype of an op, from its argument `name`: f32, bf16 or f16, on either device. */
static WkStatus act_dtype(const char *op, const char *name, const WkTensor *t, WkDType *out) {
  char got[128];
  if (!t) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
  if (t->dtype != WK_F32 && t->dtype != WK_BF16 && t->dtype != WK_F16)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s is %s, expected f32, bf16 or f16", op, name,
                   wk_tensor_describe(t, got, sizeof got));
  *out = t->dtype;
  return WK_OK;
}
#define ACT(op, t, act) WK_TRY(act_dtype(op, #t, t, &act))

static WkStatus check_contiguous(const char *op, const WkTensor *t) {
  char got[128];
  if (!t) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: tensor is NULL", op);
  if (!wk_tensor_is_contiguous(t))
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s must be contiguous", op, wk_tensor_describe(t, got, sizeof got));
  return WK_OK;
}

/* Two contiguous tensors (checked before) on one device: the very same bytes, or any shared. */
static bool same_bytes(const WkTensor *a, const WkTensor *b) {
  return tensor_ptr(a) == tensor_ptr(b) && numel(a) * wk_dtype_size(a->dtype) == numel(b) * wk_dtype_size(b->dtype);
}

static bool overlap(const WkTensor *a, const WkTensor *b) {
  uintptr_t x = (uintptr_t)tensor_ptr(a), y = (uintptr_t)tensor_ptr(b);
  return !(x + numel(a) * wk_dtype_size(a->dtype) <= y || y + numel(b) * wk_dtype_size(b->dtype) <= x);
}

/* Two arguments that may share no byte: an output and what the op reads while writing it. */
static WkStatus apart(const char *op, const char *a_name, const WkTensor *a, const char *b_name, const WkTensor *b) {
  if (!overlap(a, b)) return WK_OK;
  return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s and %s share memory", op, a_name, b_name);
}

/* An output that may replace an input in place: the same bytes, or none of them (a partial overlap
 * would read values the op has already written). */
static WkStatus same_or_apart(const char *op, const char *out_name, const WkTensor *out, const char *in_name,
                              const WkTensor *in) {
  if (same_bytes(out, in) || !overlap(out, in)) return WK_OK;
  return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s overlaps %s without being it (in place means the same tensor)", op,
                 out_name, in_name);
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
  return DISPATCH(t, cpu_scale(F32(t), numel(t), alpha), CUDA->scale(F32(t), numel(t), alpha));
}


/* add's checks, which the fused residual ops (add_layernorm, add_rmsnorm) make too: out (named
 * out_name), a and b of one activation dtype, as many elements each. */
static WkStatus add_args(const char *op, const char *out_name, const WkTensor *out, const WkTensor *a, const WkTensor *b,
                         WkDType *act) {
  WK_TRY(act_dtype(op, out_name, out, act));
  ARG_FLAT_AS(op, out_name, out, *act, NULL, numel(out));
  ARG_FLAT(op, a, *act, out, numel(out));
  ARG_FLAT(op, b, *act, out, numel(out));
  return WK_OK;
}

WkStatus wk_op_add(WkTensor *out, const WkTensor *a, const WkTensor *b) {
  WkDType act = WK_F32;
  WK_TRY(add_args("add", "out", out, a, b, &act));
  return DISPATCH(out, cpu_add(DATA(out), DATA(a), DATA(b), act, numel(out)), CUDA->add(act, DATA(out), DATA(a), DATA(b), numel(out)));
}

WkStatus wk_op_axpy(WkTensor *y, float alpha, const WkTensor *x) {
  WkDType act = WK_F32;
  ACT("axpy", y, act);
  ARG_FLAT("axpy", y, act, NULL, numel(y));
  ARG_FLAT("axpy", x, act, y, numel(y));
  return DISPATCH(y, cpu_axpy(DATA(y), alpha, DATA(x), act, numel(y)), CUDA->axpy(act, DATA(y), alpha, DATA(x), numel(y)));
}

WkStatus wk_op_round(WkTensor *t, WkDType dtype) {
  ARG_FLAT("round", t, WK_F32, NULL, numel(t));
  if (dtype != WK_BF16 && dtype != WK_F16 && dtype != WK_F32)
    return WK_FAIL(WK_ERR_INVALID_ARG, "round: dtype must be f32, bf16 or f16, not %s", wk_dtype_name(dtype));
  return DISPATCH(t, cpu_round(F32(t), numel(t), dtype), CUDA->round(F32(t), numel(t), dtype));
}

WkStatus wk_op_sumsq(const WkTensor *t, double *out) {
  ARG_FLAT("sumsq", t, WK_F32, NULL, numel(t));  /* the gradient norm, over f32 weight gradients */
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
  WkDType act = WK_F32;
  ACT("gelu", out, act);
  ARG_FLAT("gelu", out, act, NULL, numel(out));
  ARG_FLAT("gelu", inp, act, out, numel(out));
  return DISPATCH(out, cpu_gelu_forward(DATA(out), DATA(inp), act, numel(out)), CUDA->gelu_forward(act, DATA(out), DATA(inp), numel(out)));
}

WkStatus wk_op_gelu_backward(WkTensor *dinp, const WkTensor *dout, const WkTensor *inp) {
  WkDType act = WK_F32;
  ACT("gelu_backward", dinp, act);
  ARG_FLAT("gelu_backward", dinp, act, NULL, numel(dinp));
  ARG_FLAT("gelu_backward", dout, act, dinp, numel(dinp));
  ARG_FLAT("gelu_backward", inp, act, dinp, numel(dinp));
  return DISPATCH(dinp, cpu_gelu_backward(DATA(dinp), DATA(dout), DATA(inp), act, numel(dinp)),
                  CUDA->gelu_backward(act, DATA(dinp), DATA(dout), DATA(inp), numel(dinp)));
}

WkStatus wk_op_adamw(WkTensor *param, const WkTensor *grad, WkTensor *m, WkTensor *v, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  ARG_FLAT("adamw", param, WK_F32, NULL, numel(param));  /* the optimizer updates f32 masters from f32 state */
  ARG_FLAT("adamw", grad, WK_F32, param, numel(param));
  ARG_FLAT("adamw", m, WK_F32, param, numel(param));
  ARG_FLAT("adamw", v, WK_F32, param, numel(param));
  const WkTensor *arrays[] = {param, grad, m, v};  /* the kernels read them as four separate arrays */
  const char *names[] = {"param", "grad", "m", "v"};
  for (int a = 0; a < 4; a++)
    for (int b = a + 1; b < 4; b++) WK_TRY(apart("adamw", names[a], arrays[a], names[b], arrays[b]));
  if (step < 1) return WK_FAIL(WK_ERR_INVALID_ARG, "adamw: step counts from 1, got %lld", (long long)step);
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
    return WK_FAIL(WK_ERR_INVALID_ARG, "adamw: betas must be in [0, 1), got %g and %g", beta1, beta2);
  return DISPATCH(param,
                  cpu_adamw(F32(param), F32(grad), F32(m), F32(v), numel(param), lr, beta1, beta2, eps, weight_decay, step, grad_scale),
                  CUDA->adamw(F32(param), F32(grad), F32(m), F32(v), numel(param), lr, beta1, beta2, eps, weight_decay, step, grad_scale));
}

/* ---- a step's status (WkStepStatus in wick.h) ------------------------------------------------------ */

#define STATUS_BYTES ((int64_t)sizeof(WkStepStatus))

/* The error of a bad index marked at idx's element `at` (in row-major order). */
static WkStatus bad_index(const char *op, const char *what, uint64_t mark, int64_t limit) {
  return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s[%llu] = %d is outside [0, %lld) (tokenizer and model vocab disagree?)",
                 op, what, (unsigned long long)wk_bad_mark_element(mark), wk_bad_mark_id(mark), (long long)limit);
}

static WkStatus status_report(const WkStepStatus *s, double *loss_sum) {
  if (s->bad_token) return bad_index("embedding", "idx", s->bad_token, s->token_limit);
  if (s->bad_target) return bad_index("cross_entropy", "targets", s->bad_target, s->target_limit);
  if (loss_sum) *loss_sum = s->loss_sum;
  return WK_OK;
}

WkStatus wk_op_step_status(const WkTensor *status, double *loss_sum) {
  WK_TRY(check_arg("step_status", "status", status, WK_U8, NULL, FLAT_RANK, (int64_t[]){STATUS_BYTES}, CONTIGUOUS));
  if (!on_cuda(status)) return status_report(tensor_ptr(status), loss_sum);
  WkStepStatus host;
  WkTensor *to = wk_tensor_borrow(&host, WK_U8, 1, (int64_t[]){STATUS_BYTES});
  if (!to) return wk_last_status();
  WkStatus copied = wk_tensor_copy(to, status);
  wk_tensor_free(to);
  WK_TRY(copied);
  return status_report(&host, loss_sum);
}

/* Where an op marks what it finds: the caller's status, or else one of its own, which is read and
 * reported when the op is done (on a GPU a device tensor: that read is the host sync a status saves). */
typedef struct {
  bool given;
  WkTensor *own;        /* the op's own on a GPU */
  WkStepStatus host;    /* the op's own on the CPU */
  WkStepStatus *marks;  /* what the kernels write: one of the three */
} StatusUse;

static WkStatus status_begin(const char *op, WkTensor *given, const WkTensor *ref, StatusUse *use) {
  use->given = given != NULL;
  use->own = NULL;
  use->host = (WkStepStatus){0};
  if (given) {
    WK_TRY(check_arg(op, "status", given, WK_U8, ref, FLAT_RANK, (int64_t[]){STATUS_BYTES}, CONTIGUOUS));
    use->marks = tensor_ptr(given);
  } else if (on_cuda(ref)) {
    use->own = wk_tensor_empty(WK_U8, 1, (int64_t[]){STATUS_BYTES}, WK_DEVICE_CUDA, ref->storage->device_index);
    if (!use->own) return wk_last_status();
    WkStatus zeroed = wk_op_fill(use->own, 0);
    if (zeroed != WK_OK) wk_tensor_free(use->own);
    WK_TRY(zeroed);
    use->marks = tensor_ptr(use->own);
  } else {
    use->marks = &use->host;
  }
  return WK_OK;
}

/* ran: the op's status. The op's own marks become its result (and *loss_sum); the caller's stay. */
static WkStatus status_end(StatusUse *use, WkStatus ran, double *loss_sum) {
  if (use->given || ran != WK_OK) {
    wk_tensor_free(use->own);
    return ran;
  }
  WkStatus read = use->own ? wk_op_step_status(use->own, loss_sum) : status_report(&use->host, loss_sum);
  wk_tensor_free(use->own);
  return read;
}

/* ---- layers ----------------------------------------------------------------------------------- */

WkStatus wk_op_embedding(WkTensor *out, const WkTensor *idx, const WkTensor *wte, const WkTensor *wpe,
                         WkTensor *status) {
  WkIndexLayout at;
  ARG_INDEX("embedding", idx, NULL, &at, ANY, ANY);
  int64_t B = idx->shape[0], T = idx->shape[1];
  WkDType act = WK_F32;
  ACT("embedding", wte, act);
  ARG("embedding", wte, act, idx, ANY, ANY);
  int64_t V = wte->shape[0], C = wte->shape[1];
  ARG("embedding", wpe, act, idx, ANY, C);
  if (wpe->shape[0] < T)
    return WK_FAIL(WK_ERR_INVALID_ARG, "embedding: sequence of %lld tokens but only %lld positions", (long long)T,
                   (long long)wpe->shape[0]);
  ARG("embedding", out, act, idx, B, T, C);
  StatusUse use;
  WK_TRY(status_begin("embedding", status, idx, &use));
  WkStatus ran = DISPATCH(idx, cpu_embedding_forward(DATA(out), I32(idx), at, DATA(wte), DATA(wpe), act, (size_t)B, (size_t)T, (size_t)C, (size_t)V, use.marks),
                          CUDA->embedding_forward(act, DATA(out), I32(idx), at, DATA(wte), DATA(wpe), (size_t)B, (size_t)T, (size_t)C, (size_t)V, use.marks));
  return status_end(&use, ran, NULL);
}

WkStatus wk_op_embedding_backward(WkTensor *dwte, WkTensor *dwpe, const WkTensor *dout, const WkTensor *idx) {
  WkIndexLayout at;
  ARG_INDEX("embedding_backward", idx, NULL, &at, ANY, ANY);
  int64_t B = idx->shape[0], T = idx->shape[1];
  ARG("embedding_backward", dwte, WK_F32, idx, ANY, ANY);
  int64_t C = dwte->shape[1];
  ARG("embedding_backward", dwpe, WK_F32, idx, ANY, C);
  WkDType act = WK_F32;
  ACT("embedding_backward", dout, act);
  ARG("embedding_backward", dout, act, idx, B, T, C);
  if (dwpe->shape[0] < T) return WK_FAIL(WK_ERR_INVALID_ARG, "embedding_backward: dwpe has fewer than T rows");
  size_t V = (size_t)dwte->shape[0];  /* ids outside it were marked by the forward: skipped here */
  return DISPATCH(idx, cpu_embedding_backward(F32(dwte), F32(dwpe), DATA(dout), act, I32(idx), at, (size_t)B, (size_t)T, (size_t)C, V),
                  CUDA->embedding_backward(act, F32(dwte), F32(dwpe), DATA(dout), I32(idx), at, (size_t)B, (size_t)T, (size_t)C, V));
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

/* A norm's eps, added to the variance (or mean square) under a square root. */
static WkStatus check_eps(const char *op, float eps) {
  if (!(eps > 0) || !isfinite(eps)) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: eps must be positive and finite, got %g", op, eps);
  return WK_OK;
}

/* layernorm's checks, which add_layernorm makes too on its sum: the input (named inp_name) N rows
 * of C in the activation dtype. */
static WkStatus layernorm_args(const char *op, const char *inp_name, const WkTensor *out, const WkTensor *mean,
                               const WkTensor *rstd, const WkTensor *inp, const WkTensor *weight, const WkTensor *bias,
                               float eps, int64_t *N, int64_t *C, WkDType *act) {
  WK_TRY(rows_and_channels(op, inp, N, C));
  WK_TRY(act_dtype(op, inp_name, inp, act));
  ARG_FLAT_AS(op, inp_name, inp, *act, NULL, numel(inp));
  ARG_FLAT(op, out, *act, inp, numel(inp));
  ARG(op, mean, WK_F32, inp, *N);  /* the statistics stay f32: one pair a row, reused by backward */
  ARG(op, rstd, WK_F32, inp, *N);
  ARG(op, weight, *act, inp, *C);
  ARG(op, bias, *act, inp, *C);
  return check_eps(op, eps);
}

/* The layernorm of a (sum and b NULL), or of the sum a + b that it writes to sum first: one kernel
 * serves the plain op and the fused one. */
static WkStatus layernorm_forward(WkTensor *sum, WkTensor *out, WkTensor *mean, WkTensor *rstd, const WkTensor *a,
                                  const WkTensor *b, const WkTensor *weight, const WkTensor *bias, float eps, int64_t N,
                                  int64_t C, WkDType act) {
  return DISPATCH(a, cpu_add_layernorm_forward(OPT_DATA(sum), DATA(out), F32(mean), F32(rstd), DATA(a), OPT_DATA(b), DATA(weight), DATA(bias), act, (size_t)N, (size_t)C, eps),
                  CUDA->add_layernorm_forward(act, OPT_DATA(sum), DATA(out), F32(mean), F32(rstd), DATA(a), OPT_DATA(b), DATA(weight), DATA(bias), (size_t)N, (size_t)C, eps));
}

WkStatus wk_op_layernorm(WkTensor *out, WkTensor *mean, WkTensor *rstd, const WkTensor *inp, const WkTensor *weight,
                         const WkTensor *bias, float eps) {
  int64_t N = 0, C = 0;
  WkDType act = WK_F32;
  WK_TRY(layernorm_args("layernorm", "inp", out, mean, rstd, inp, weight, bias, eps, &N, &C, &act));
  return layernorm_forward(NULL, out, mean, rstd, inp, NULL, weight, bias, eps, N, C, act);
}

WkStatus wk_op_add_layernorm(WkTensor *sum, WkTensor *out, WkTensor *mean, WkTensor *rstd, const WkTensor *a,
                             const WkTensor *b, const WkTensor *weight, const WkTensor *bias, float eps) {
  int64_t N = 0, C = 0;
  WkDType act = WK_F32;
  WK_TRY(add_args("add_layernorm", "sum", sum, a, b, &act));
  WK_TRY(layernorm_args("add_layernorm", "sum", out, mean, rstd, sum, weight, bias, eps, &N, &C, &act));
  return layernorm_forward(sum, out, mean, rstd, a, b, weight, bias, eps, N, C, act);
}

WkStatus wk_op_layernorm_backward(WkTensor *dinp, WkTensor *dweight, WkTensor *dbias, const WkTensor *dout,
                                  const WkTensor *inp, const WkTensor *weight, const WkTensor *mean, const WkTensor *rstd) {
  int64_t N = 0, C = 0;
  WkDType act = WK_F32;
  WK_TRY(rows_and_channels("layernorm_backward", inp, &N, &C));
  ACT("layernorm_backward", inp, act);
  ARG_FLAT("layernorm_backward", inp, act, NULL, numel(inp));
  ARG_FLAT("layernorm_backward", dinp, act, inp, numel(inp));
  ARG_FLAT("layernorm_backward", dout, act, inp, numel(inp));
  ARG("layernorm_backward", mean, WK_F32, inp, N);
  ARG("layernorm_backward", rstd, WK_F32, inp, N);
  ARG("layernorm_backward", weight, act, inp, C);
  ARG("layernorm_backward", dweight, WK_F32, inp, C);  /* parameter gradients accumulate in f32 */
  ARG("layernorm_backward", dbias, WK_F32, inp, C);
  return DISPATCH(inp,
                  cpu_layernorm_backward(DATA(dinp), F32(dweight), F32(dbias), DATA(dout), DATA(inp), DATA(weight), F32(mean), F32(rstd), act, (size_t)N, (size_t)C),
                  CUDA->layernorm_backward(act, DATA(dinp), F32(dweight), F32(dbias), DATA(dout), DATA(inp), DATA(weight), F32(mean), F32(rstd), (size_t)N, (size_t)C));
}

/* inp [..., C], w [C, OC] or transposed [OC, C]. */
static WkStatus matmul_dims(const char *op, const WkTensor *inp, const WkTensor *w, int transpose_w, int64_t *N,
                            int64_t *C, int64_t *OC, WkDType *act) {
  WK_TRY(rows_and_channels(op, inp, N, C));
  WK_TRY(act_dtype(op, "inp", inp, act));
  ARG_FLAT(op, inp, *act, NULL, numel(inp));
  ARG(op, w, *act, inp, transpose_w ? ANY : *C, transpose_w ? *C : ANY);
  *OC = w->shape[transpose_w ? 0 : 1];
  return WK_OK;
}

/* An output of the product, [..., OC] with N * OC elements. */
static WkStatus matmul_output(const char *op, const char *name, const WkTensor *t, WkDType act, const WkTensor *inp,
                              int64_t N, int64_t OC) {
  WK_TRY(check_arg(op, name, t, act, inp, FLAT_RANK, (int64_t[]){N * OC}, CONTIGUOUS));
  if (t->shape[t->ndim - 1] != OC) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s's last dim must be %lld", op, name, (long long)OC);
  return WK_OK;
}

/* The forward's arguments: matmul_dims, then the output `name` and the bias (may be NULL). */
static WkStatus matmul_forward_args(const char *op, const char *name, const WkTensor *out, const WkTensor *inp,
                                    const WkTensor *w, const WkTensor *bias, int transpose_w, int64_t *N, int64_t *C,
                                    int64_t *OC, WkDType *act) {
  WK_TRY(matmul_dims(op, inp, w, transpose_w, N, C, OC, act));
  WK_TRY(matmul_output(op, name, out, *act, inp, *N, *OC));
  if (bias) ARG(op, bias, *act, inp, *OC);
  return WK_OK;
}

WkStatus wk_op_matmul(WkTensor *out, const WkTensor *inp, const WkTensor *w, const WkTensor *bias, int transpose_w) {
  int64_t N = 0, C = 0, OC = 0;
  WkDType act = WK_F32;
  WK_TRY(matmul_forward_args("matmul", "out", out, inp, w, bias, transpose_w, &N, &C, &OC, &act));
  if (!on_cuda(inp)) return cpu_matmul_forward(DATA(out), DATA(inp), DATA(w), OPT_DATA(bias), act, (size_t)N, (size_t)C, (size_t)OC, transpose_w);
  return ON_DEVICE(inp, CUDA->matmul_forward(act, DATA(out), DATA(inp), DATA(w), OPT_DATA(bias), (size_t)N, (size_t)C, (size_t)OC, transpose_w));
}

WkStatus wk_op_matmul_gelu(WkTensor *out, WkTensor *pre, const WkTensor *inp, const WkTensor *w, const WkTensor *bias,
                           int transpose_w) {
  int64_t N = 0, C = 0, OC = 0;
  WkDType act = WK_F32;
  WK_TRY(matmul_forward_args("matmul_gelu", "pre", pre, inp, w, bias, transpose_w, &N, &C, &OC, &act));
  WK_TRY(matmul_output("matmul_gelu", "out", out, act, inp, N, OC));
  WK_TRY(apart("matmul_gelu", "out", out, "pre", pre));  /* both written by one GEMM */
  if (!on_cuda(inp)) return cpu_matmul_gelu_forward(DATA(out), DATA(pre), DATA(inp), DATA(w), OPT_DATA(bias), act, (size_t)N, (size_t)C, (size_t)OC, transpose_w);
  return ON_DEVICE(inp, CUDA->matmul_gelu_forward(act, DATA(out), DATA(pre), DATA(inp), DATA(w), OPT_DATA(bias), (size_t)N, (size_t)C, (size_t)OC, transpose_w));
}

/* The backward's arguments: matmul_dims, the input gradient `name`, dw, dbias (may be NULL) and dout. */
static WkStatus matmul_backward_args(const char *op, const char *name, const WkTensor *dinp, const WkTensor *dw,
                                     const WkTensor *dbias, const WkTensor *dout, const WkTensor *inp, const WkTensor *w,
                                     int transpose_w, int64_t *N, int64_t *C, int64_t *OC, WkDType *act) {
  WK_TRY(matmul_dims(op, inp, w, transpose_w, N, C, OC, act));
  WK_TRY(check_arg(op, name, dinp, *act, inp, FLAT_RANK, (int64_t[]){numel(inp)}, CONTIGUOUS));
  ARG(op, dw, WK_F32, inp, w->shape[0], w->shape[1]);  /* parameter gradients accumulate in f32 */
  ARG_FLAT(op, dout, *act, inp, *N * *OC);
  if (dbias) ARG(op, dbias, WK_F32, inp, *OC);
  return WK_OK;
}

WkStatus wk_op_matmul_backward(WkTensor *dinp, WkTensor *dw, WkTensor *dbias, const WkTensor *dout, const WkTensor *inp,
                               const WkTensor *w, int transpose_w) {
  int64_t N = 0, C = 0, OC = 0;
  WkDType act = WK_F32;
  WK_TRY(matmul_backward_args("matmul_backward", "dinp", dinp, dw, dbias, dout, inp, w, transpose_w, &N, &C, &OC, &act));
  if (!on_cuda(inp)) return cpu_matmul_backward(DATA(dinp), F32(dw), OPT_F32(dbias), DATA(dout), DATA(inp), DATA(w), act, (size_t)N, (size_t)C, (size_t)OC, transpose_w);
  return ON_DEVICE(inp, CUDA->matmul_backward(act, DATA(dinp), F32(dw), OPT_F32(dbias), DATA(dout), DATA(inp), DATA(w), (size_t)N, (size_t)C, (size_t)OC, transpose_w));
}

WkStatus wk_op_matmul_backward_gelu(WkTensor *dpre, WkTensor *dw, WkTensor *dbias, const WkTensor *dout,
                                    const WkTensor *inp, const WkTensor *w, const WkTensor *pre, int transpose_w) {
  int64_t N = 0, C = 0, OC = 0;
  WkDType act = WK_F32;
  const char *op = "matmul_backward_gelu";
  WK_TRY(matmul_backward_args(op, "dpre", dpre, dw, dbias, dout, inp, w, transpose_w, &N, &C, &OC, &act));
  ARG_FLAT(op, pre, act, inp, numel(inp));
  /* dpre is written while the GEMMs read the others */
  WK_TRY(apart(op, "dpre", dpre, "pre", pre));
  WK_TRY(apart(op, "dpre", dpre, "inp", inp));
  WK_TRY(apart(op, "dpre", dpre, "dout", dout));
  if (!on_cuda(inp)) return cpu_matmul_backward_gelu(DATA(dpre), F32(dw), OPT_F32(dbias), DATA(dout), DATA(inp), DATA(w), DATA(pre), act, (size_t)N, (size_t)C, (size_t)OC, transpose_w);
  return ON_DEVICE(inp, CUDA->matmul_backward_gelu(act, DATA(dpre), F32(dw), OPT_F32(dbias), DATA(dout), DATA(inp), DATA(w), DATA(pre), (size_t)N, (size_t)C, (size_t)OC, transpose_w));
}

/* ---- attention and loss ----------------------------------------------------------------------- */

static WkStatus attention_dims(const char *op, const WkTensor *qkv, int heads, int64_t *B, int64_t *T, int64_t *C,
                               WkDType *act) {
  WK_TRY(act_dtype(op, "qkv", qkv, act));
  ARG(op, qkv, *act, NULL, ANY, ANY, ANY);
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
  WkDType act = WK_F32;
  WK_TRY(attention_dims("attention", qkv, heads, &B, &T, &C, &act));
  ARG("attention", out, act, qkv, B, T, C);
  ARG("attention", att, act, qkv, B, heads, T, T);
  if (!on_cuda(qkv)) return cpu_attention_forward(DATA(out), DATA(att), DATA(qkv), act, (size_t)B, (size_t)T, (size_t)C, (size_t)heads);
  return ON_DEVICE(qkv, CUDA->attention_forward(act, DATA(out), DATA(att), DATA(qkv), (size_t)B, (size_t)T, (size_t)C, (size_t)heads));
}

WkStatus wk_op_attention_backward(WkTensor *dqkv, const WkTensor *dout, const WkTensor *qkv, const WkTensor *att,
                                  int heads) {
  int64_t B = 0, T = 0, C = 0;
  WkDType act = WK_F32;
  WK_TRY(attention_dims("attention_backward", qkv, heads, &B, &T, &C, &act));
  ARG("attention_backward", dqkv, act, qkv, B, T, 3 * C);
  ARG("attention_backward", dout, act, qkv, B, T, C);
  ARG("attention_backward", att, act, qkv, B, heads, T, T);
  if (on_cuda(qkv)) return ON_DEVICE(qkv, CUDA->attention_backward(act, DATA(dqkv), DATA(dout), DATA(qkv), DATA(att), (size_t)B, (size_t)T, (size_t)C, (size_t)heads));
  return cpu_attention_backward(DATA(dqkv), DATA(dout), DATA(qkv), DATA(att), act, (size_t)B, (size_t)T, (size_t)C, (size_t)heads);
}

/* targets may be strided (a view of a loader batch); the mask is contiguous. */
static WkStatus loss_dims(const char *op, const WkTensor *logits, const WkTensor *targets, const WkTensor *mask,
                          float normalizer, int64_t *N, int64_t *V, WkIndexLayout *at, WkDType *act) {
  WK_TRY(rows_and_channels(op, logits, N, V));
  WK_TRY(act_dtype(op, "logits", logits, act));
  ARG_FLAT(op, logits, *act, NULL, numel(logits));
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
                             float normalizer, double *loss_sum, WkTensor *status) {
  int64_t N = 0, V = 0;
  WkIndexLayout at;
  WkDType act = WK_F32;
  WK_TRY(loss_dims("cross_entropy", logits, targets, mask, normalizer, &N, &V, &at, &act));
  ARG_FLAT("cross_entropy", losses, WK_F32, logits, numel(targets));  /* losses are reported values: f32 */
  if ((loss_sum == NULL) == (status == NULL))
    return WK_FAIL(WK_ERR_INVALID_ARG, "cross_entropy: give loss_sum or a step's status (one of the two)");
  StatusUse use;
  WK_TRY(status_begin("cross_entropy", status, logits, &use));
  WkStatus ran = DISPATCH(logits, cpu_cross_entropy_forward(F32(losses), DATA(logits), act, I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, use.marks),
                          CUDA->cross_entropy_forward(act, F32(losses), DATA(logits), I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, use.marks));
  return status_end(&use, ran, loss_sum);
}

WkStatus wk_op_cross_entropy_backward(WkTensor *dlogits, const WkTensor *logits, const WkTensor *targets,
                                      const WkTensor *mask, float normalizer, float dloss) {
  int64_t N = 0, V = 0;
  WkIndexLayout at;
  WkDType act = WK_F32;
  WK_TRY(loss_dims("cross_entropy_backward", logits, targets, mask, normalizer, &N, &V, &at, &act));
  ARG_FLAT("cross_entropy_backward", dlogits, act, logits, numel(logits));
  WK_TRY(same_or_apart("cross_entropy_backward", "dlogits", dlogits, "logits", logits));
  return DISPATCH(logits, cpu_cross_entropy_backward(DATA(dlogits), DATA(logits), act, I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, dloss),
                  CUDA->cross_entropy_backward(act, DATA(dlogits), DATA(logits), I32(targets), at, MASK(mask), (size_t)N, (size_t)V, normalizer, dloss));
}

/* ---- Llama-family ops ------------------------------------------------------------------------- */

/* rmsnorm's checks, which add_rmsnorm makes too on its sum: the input (named inp_name) N rows of C
 * in the activation dtype. */
static WkStatus rmsnorm_args(const char *op, const char *inp_name, const WkTensor *out, const WkTensor *rstd,
                             const WkTensor *inp, const WkTensor *weight, float eps, int64_t *N, int64_t *C, WkDType *act) {
  WK_TRY(rows_and_channels(op, inp, N, C));
  WK_TRY(act_dtype(op, inp_name, inp, act));
  ARG_FLAT_AS(op, inp_name, inp, *act, NULL, numel(inp));
  ARG_FLAT(op, out, *act, inp, numel(inp));
  ARG(op, rstd, WK_F32, inp, *N);  /* one f32 per row, as layernorm's statistics */
  ARG(op, weight, *act, inp, *C);
  return check_eps(op, eps);
}

/* The rmsnorm of a (sum and b NULL), or of the sum a + b that it writes to sum first: one kernel
 * serves the plain op and the fused one. */
static WkStatus rmsnorm_forward(WkTensor *sum, WkTensor *out, WkTensor *rstd, const WkTensor *a, const WkTensor *b,
                                const WkTensor *weight, float eps, int64_t N, int64_t C, WkDType act) {
  return DISPATCH(a, cpu_add_rmsnorm_forward(OPT_DATA(sum), DATA(out), F32(rstd), DATA(a), OPT_DATA(b), DATA(weight), act, (size_t)N, (size_t)C, eps),
                  CUDA->add_rmsnorm_forward(act, OPT_DATA(sum), DATA(out), F32(rstd), DATA(a), OPT_DATA(b), DATA(weight), (size_t)N, (size_t)C, eps));
}

WkStatus wk_op_rmsnorm(WkTensor *out, WkTensor *rstd, const WkTensor *inp, const WkTensor *weight, float eps) {
  int64_t N = 0, C = 0;
  WkDType act = WK_F32;
  WK_TRY(rmsnorm_args("rmsnorm", "inp", out, rstd, inp, weight, eps, &N, &C, &act));
  return rmsnorm_forward(NULL, out, rstd, inp, NULL, weight, eps, N, C, act);
}

WkStatus wk_op_add_rmsnorm(WkTensor *sum, WkTensor *out, WkTensor *rstd, const WkTensor *a, const WkTensor *b,
                           const WkTensor *weight, float eps) {
  int64_t N = 0, C = 0;
  WkDType act = WK_F32;
  WK_TRY(add_args("add_rmsnorm", "sum", sum, a, b, &act));
  WK_TRY(rmsnorm_args("add_rmsnorm", "sum", out, rstd, sum, weight, eps, &N, &C, &act));
  return rmsnorm_forward(sum, out, rstd, a, b, weight, eps, N, C, act);
}

WkStatus wk_op_rmsnorm_backward(WkTensor *dinp, WkTensor *dweight, const WkTensor *dout, const WkTensor *inp,
                                const WkTensor *weight, const WkTensor *rstd) {
  int64_t N = 0, C = 0;
  WkDType act = WK_F32;
  WK_TRY(rows_and_channels("rmsnorm_backward", inp, &N, &C));
  ACT("rmsnorm_backward", inp, act);
  ARG_FLAT("rmsnorm_backward", inp, act, NULL, numel(inp));
  ARG_FLAT("rmsnorm_backward", dinp, act, inp, numel(inp));
  ARG_FLAT("rmsnorm_backward", dout, act, inp, numel(inp));
  ARG("rmsnorm_backward", rstd, WK_F32, inp, N);
  ARG("rmsnorm_backward", weight, act, inp, C);
  ARG("rmsnorm_backward", dweight, WK_F32, inp, C);
  return DISPATCH(inp, cpu_rmsnorm_backward(DATA(dinp), F32(dweight), DATA(dout), DATA(inp), DATA(weight), F32(rstd), act, (size_t)N, (size_t)C),
                  CUDA->rmsnorm_backward(act, DATA(dinp), F32(dweight), DATA(dout), DATA(inp), DATA(weight), F32(rstd), (size_t)N, (size_t)C));
}

static bool positive(double x) { return x > 0 && isfinite(x); }

static WkStatus check_rope_scaling(const WkRopeScaling *s) {
  if (!positive(s->theta)) return WK_FAIL(WK_ERR_INVALID_ARG, "rope_frequencies: theta must be positive and finite, got %g", s->theta);
  if (s->kind == WK_ROPE_DEFAULT) return WK_OK;
  if (s->kind != WK_ROPE_LINEAR && s->kind != WK_ROPE_LLAMA3)
    return WK_FAIL(WK_ERR_INVALID_ARG, "rope_frequencies: kind %d is not default (0), linear (1) or llama3 (2)", (int)s->kind);
  if (!positive(s->factor)) return WK_FAIL(WK_ERR_INVALID_ARG, "rope_frequencies: factor must be positive and finite, got %g", s->factor);
  if (s->kind == WK_ROPE_LINEAR) return WK_OK;
  if (!positive(s->low_freq_factor) || !positive(s->high_freq_factor) || !(s->high_freq_factor > s->low_freq_factor))
    return WK_FAIL(WK_ERR_INVALID_ARG, "rope_frequencies: need 0 < low_freq_factor < high_freq_factor, got %g and %g",
                   s->low_freq_factor, s->high_freq_factor);
  if (!positive(s->original_max_position_embeddings))
    return WK_FAIL(WK_ERR_INVALID_ARG, "rope_frequencies: original_max_position_embeddings must be positive, got %g",
                   s->original_max_position_embeddings);
  return WK_OK;
}

WkStatus wk_op_rope_frequencies(WkTensor *inv_freq, WkRopeKind kind, double theta, double factor, double low_freq_factor,
                                double high_freq_factor, double original_max_position_embeddings) {
  WkRopeScaling scaling = {kind, theta, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings};
  WK_TRY(check_rope_scaling(&scaling));
  if (!inv_freq) return WK_FAIL(WK_ERR_INVALID_ARG, "rope_frequencies: inv_freq is NULL");
  ARG("rope_frequencies", inv_freq, WK_F32, NULL, ANY);
  if (!on_cuda(inv_freq)) {
    cpu_rope_frequencies(F32(inv_freq), numel(inv_freq), &scaling);
    return WK_OK;
  }
  /* Computed once per model: on the host, so that both devices get the very same values. */
  WkTensor *host = wk_tensor_empty(WK_F32, 1, inv_freq->shape, WK_DEVICE_CPU, 0);
  if (!host) return wk_last_status();
  cpu_rope_frequencies(F32(host), numel(host), &scaling);
  WkStatus status = wk_tensor_copy(inv_freq, host);
  wk_tensor_free(host);
  return status;
}

/* inp [B, T, heads * hs] with hs even, of the op's activation dtype; inv_freq [hs / 2] f32. */
static WkStatus rope_dims(const char *op, const WkTensor *inp, const WkTensor *inv_freq, int heads, int64_t start,
                          int64_t *B, int64_t *T, int64_t *hs, WkDType *act) {
  WK_TRY(act_dtype(op, "inp", inp, act));
  ARG(op, inp, *act, NULL, ANY, ANY, ANY);
  *B = inp->shape[0];
  *T = inp->shape[1];
  if (heads < 1 || inp->shape[2] % heads != 0 || (inp->shape[2] / heads) % 2 != 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: last dim %lld must be heads = %d times an even head size", op,
                   (long long)inp->shape[2], heads);
  *hs = inp->shape[2] / heads;
  ARG(op, inv_freq, WK_F32, inp, *hs / 2);
  if (start < 0) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: start position must be >= 0, got %lld", op, (long long)start);
  return WK_OK;
}

WkStatus wk_op_rope(WkTensor *out, const WkTensor *inp, const WkTensor *inv_freq, int heads, int64_t start) {
  int64_t B = 0, T = 0, hs = 0;
  WkDType act = WK_F32;
  WK_TRY(rope_dims("rope", inp, inv_freq, heads, start, &B, &T, &hs, &act));
  ARG("rope", out, act, inp, B, T, heads * hs);
  return DISPATCH(inp, cpu_rope_forward(DATA(out), DATA(inp), F32(inv_freq), act, (size_t)B, (size_t)T, (size_t)heads, (size_t)hs, start),
                  CUDA->rope_forward(act, DATA(out), DATA(inp), F32(inv_freq), (size_t)B, (size_t)T, (size_t)heads, (size_t)hs, start));
}

WkStatus wk_op_rope_backward(WkTensor *dinp, const WkTensor *dout, const WkTensor *inv_freq, int heads, int64_t start) {
  int64_t B = 0, T = 0, hs = 0;
  WkDType act = WK_F32;
  WK_TRY(rope_dims("rope_backward", dout, inv_freq, heads, start, &B, &T, &hs, &act));
  ARG("rope_backward", dinp, act, dout, B, T, heads * hs);
  return DISPATCH(dout, cpu_rope_backward(DATA(dinp), DATA(dout), F32(inv_freq), act, (size_t)B, (size_t)T, (size_t)heads, (size_t)hs, start),
                  CUDA->rope_backward(act, DATA(dinp), DATA(dout), F32(inv_freq), (size_t)B, (size_t)T, (size_t)heads, (size_t)hs, start));
}

WkStatus wk_op_swiglu(WkTensor *out, const WkTensor *gate, const WkTensor *up) {
  WkDType act = WK_F32;
  ACT("swiglu", out, act);
  ARG_FLAT("swiglu", out, act, NULL, numel(out));
  ARG_FLAT("swiglu", gate, act, out, numel(out));
  ARG_FLAT("swiglu", up, act, out, numel(out));
  return DISPATCH(out, cpu_swiglu_forward(DATA(out), DATA(gate), DATA(up), act, numel(out)),
                  CUDA->swiglu_forward(act, DATA(out), DATA(gate), DATA(up), numel(out)));
}

WkStatus wk_op_swiglu_backward(WkTensor *dgate, WkTensor *dup, const WkTensor *dout, const WkTensor *gate,
                               const WkTensor *up) {
  WkDType act = WK_F32;
  ACT("swiglu_backward", dout, act);
  ARG_FLAT("swiglu_backward", dout, act, NULL, numel(dout));
  ARG_FLAT("swiglu_backward", dgate, act, dout, numel(dout));
  ARG_FLAT("swiglu_backward", dup, act, dout, numel(dout));
  ARG_FLAT("swiglu_backward", gate, act, dout, numel(dout));
  ARG_FLAT("swiglu_backward", up, act, dout, numel(dout));
  return DISPATCH(dout, cpu_swiglu_backward(DATA(dgate), DATA(dup), DATA(dout), DATA(gate), DATA(up), act, numel(dout)),
                  CUDA->swiglu_backward(act, DATA(dgate), DATA(dup), DATA(dout), DATA(gate), DATA(up), numel(dout)));
}

/* q [B, T, heads * hs] of the op's activation dtype; k and v [B, T, kv_heads * hs]; kv_heads divides heads. */
static WkStatus qkv_pack_dims(const char *op, const char *name, const WkTensor *q, int heads, int kv_heads, int64_t *B,
                              int64_t *T, int64_t *hs, WkDType *act) {
  WK_TRY(act_dtype(op, name, q, act));
  WK_TRY(check_arg(op, name, q, *act, NULL, SHAPE(ANY, ANY, ANY), CONTIGUOUS));
  *B = q->shape[0];
  *T = q->shape[1];
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || q->shape[2] % heads != 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: heads = %d must be a multiple of kv_heads = %d and divide %s's last dim %lld", op,
                   heads, kv_heads, name, (long long)q->shape[2]);
  *hs = q->shape[2] / heads;
  return WK_OK;
}

WkStatus wk_op_qkv_pack(WkTensor *qkv, const WkTensor *q, const WkTensor *k, const WkTensor *v, int heads, int kv_heads) {
  int64_t B = 0, T = 0, hs = 0;
  WkDType act = WK_F32;
  WK_TRY(qkv_pack_dims("qkv_pack", "q", q, heads, kv_heads, &B, &T, &hs, &act));
  ARG("qkv_pack", k, act, q, B, T, kv_heads * hs);
  ARG("qkv_pack", v, act, q, B, T, kv_heads * hs);
  ARG("qkv_pack", qkv, act, q, B, T, 3 * heads * hs);
  return DISPATCH(q, cpu_qkv_pack(DATA(qkv), DATA(q), DATA(k), DATA(v), act, (size_t)(B * T), (size_t)heads, (size_t)kv_heads, (size_t)hs),
                  CUDA->qkv_pack(act, DATA(qkv), DATA(q), DATA(k), DATA(v), (size_t)(B * T), (size_t)heads, (size_t)kv_heads, (size_t)hs));
}

WkStatus wk_op_qkv_pack_backward(WkTensor *dq, WkTensor *dk, WkTensor *dv, const WkTensor *dqkv, int heads, int kv_heads) {
  int64_t B = 0, T = 0, hs = 0;
  WkDType act = WK_F32;
  WK_TRY(qkv_pack_dims("qkv_pack_backward", "dq", dq, heads, kv_heads, &B, &T, &hs, &act));
  ARG("qkv_pack_backward", dk, act, dq, B, T, kv_heads * hs);
  ARG("qkv_pack_backward", dv, act, dq, B, T, kv_heads * hs);
  ARG("qkv_pack_backward", dqkv, act, dq, B, T, 3 * heads * hs);
  return DISPATCH(dq, cpu_qkv_pack_backward(DATA(dq), DATA(dk), DATA(dv), DATA(dqkv), act, (size_t)(B * T), (size_t)heads, (size_t)kv_heads, (size_t)hs),
                  CUDA->qkv_pack_backward(act, DATA(dq), DATA(dk), DATA(dv), DATA(dqkv), (size_t)(B * T), (size_t)heads, (size_t)kv_heads, (size_t)hs));
}

WkStatus wk_op_attention_cached(WkTensor *out, const WkTensor *q, const WkTensor *k, const WkTensor *v, WkTensor *k_cache,
                                WkTensor *v_cache, int heads, int kv_heads, int64_t start) {
  int64_t B = 0, Tq = 0, hs = 0;
  WkDType act = WK_F32;
  WK_TRY(qkv_pack_dims("attention_cached", "q", q, heads, kv_heads, &B, &Tq, &hs, &act));
  ARG("attention_cached", k, act, q, B, Tq, kv_heads * hs);
  ARG("attention_cached", v, act, q, B, Tq, kv_heads * hs);
  ARG("attention_cached", k_cache, act, q, B, ANY, kv_heads * hs);
  int64_t Tmax = k_cache->shape[1];
  ARG("attention_cached", v_cache, act, q, B, Tmax, kv_heads * hs);
  ARG("attention_cached", out, act, q, B, Tq, heads * hs);
  if (start < 0 || start + Tq > Tmax)
    return WK_FAIL(WK_ERR_INVALID_ARG, "attention_cached: positions %lld..%lld do not fit a cache of %lld", (long long)start,
                   (long long)(start + Tq - 1), (long long)Tmax);
  return DISPATCH(q, cpu_attention_cached(DATA(out), DATA(q), DATA(k), DATA(v), DATA(k_cache), DATA(v_cache), act, (size_t)B,
                                          (size_t)Tq, (size_t)Tmax, (size_t)heads, (size_t)kv_heads, (size_t)hs, start),
                  CUDA->attention_cached(act, DATA(out), DATA(q), DATA(k), DATA(v), DATA(k_cache), DATA(v_cache), (size_t)B,
                                         (size_t)Tq, (size_t)Tmax, (size_t)heads, (size_t)kv_heads, (size_t)hs, start));
}
