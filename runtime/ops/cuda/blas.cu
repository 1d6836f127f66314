/*
 * blas.cu — the GEMMs of the CUDA backend: the matmul op through cuBLASLt, the strided-batched
 * products of attention through cuBLAS, and the bias gradient's column reduction.
 *
 * Precision: the storage type of the tensors picks the GEMM. 2-byte tensors (bf16, f16) multiply on
 * the tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F over 16-bit inputs), the output rounded
 * once; the weight gradient, f32 under every policy as on the CPU, is the same product with an f32
 * C/D (cuBLASLt's COMPUTE_32F takes 16-bit A/B with an f32 C/D), so it accumulates unrounded. f32 tensors run
 * true fp32 arithmetic, TF32 off: the f32 path is the one checked against the CPU reference within
 * 1e-4 (TF32's 10-bit mantissa errs by ~1e-3), and a run that wants speed stores its weights in bf16.
 * The bias is added by the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS), not by a pass of its own, and so
 * is the MLP's GELU: the up-projection writes the pre-activation and its GELU in one GEMM
 * (GELU_AUX_BIAS, the GELU of the unrounded f32 value), the down-projection's input gradient goes
 * through gelu' before its one rounding (DGELU, reading the pre-activation back as aux).
 * The bias gradient (f32) is a deterministic two-stage block reduction (column tiles x row chunks into
 * scratch, then a sum over chunks added to dbias): the BGRAD epilogues would overwrite dbias where the
 * op accumulates, and are supported for fewer layouts than the op allows.
 *
 * cuBLAS is column-major: a row-major [R, K] matrix is the column-major [K, R] one, so each
 * row-major product below is issued as the transposed product with the operands swapped.
 * One cuBLAS and one cuBLASLt handle per device, made on first use; each call binds the current stream.
 */
#include <cublasLt.h>
#include <pthread.h>

#include "common.cuh"

enum { LT_WORKSPACE_BYTES = 32 << 20 };  /* what cuBLASLt's Hopper kernels ask for, as in llm.c */

static cublasHandle_t handles[MAX_DEVICES];
static cublasLtHandle_t lt_handles[MAX_DEVICES];
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;

static WkStatus handles_for_current_device(cublasHandle_t *out, cublasLtHandle_t *lt_out) {
  int device = 0;
  CUDA_TRY(cudaGetDevice(&device));
  WK_TRY(check_device(device));
  pthread_mutex_lock(&handles_lock);  /* a handle belongs to the device current at its creation */
  cublasStatus_t status = handles[device] ? CUBLAS_STATUS_SUCCESS : cublasCreate(&handles[device]);
  if (status == CUBLAS_STATUS_SUCCESS && !lt_handles[device]) status = cublasLtCreate(&lt_handles[device]);
  pthread_mutex_unlock(&handles_lock);
  if (status != CUBLAS_STATUS_SUCCESS)
    return WK_FAIL(WK_ERR_DEVICE, "creating the cuBLAS handles of cuda:%d: %s", device, cublasGetStatusString(status));
  CUBLAS_TRY(cublasSetStream(handles[device], current_stream()));
  if (out) *out = handles[device];
  if (lt_out) *lt_out = lt_handles[device];
  return WK_OK;
}

WkStatus cublas_for_current_device(cublasHandle_t *out) { return handles_for_current_device(out, NULL); }

static cudaDataType_t cuda_type(WkDType dtype) {
  return dtype == WK_BF16 ? CUDA_R_16BF : dtype == WK_F16 ? CUDA_R_16F : CUDA_R_32F;
}

WkStatus gemm_strided_batched(cublasHandle_t handle, size_t batch, bool trans_a, bool trans_b, size_t M, size_t N,
                              size_t K, float alpha, BatchOperand A, BatchOperand B, float beta, BatchOutput C) {
  if (A.dtype != B.dtype || (C.dtype != A.dtype && C.dtype != WK_F32))
    return WK_FAIL(WK_ERR_INVALID_ARG, "batched GEMM of %s by %s into %s: the operands must share a dtype, the output "
                   "be of theirs or f32", wk_dtype_name(A.dtype), wk_dtype_name(B.dtype), wk_dtype_name(C.dtype));
  cudaDataType_t type = cuda_type(A.dtype);
  /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
  CUBLAS_TRY(cublasGemmStridedBatchedEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        (int)N, (int)M, (int)K, &alpha, B.data, type, (int)B.ld, (long long)B.stride,
                                        A.data, type, (int)A.ld, (long long)A.stride, &beta, C.data, cuda_type(C.dtype),
                                        (int)C.ld, (long long)C.stride, (int)batch, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
  return WK_OK;
}

/* ---- cuBLASLt ------------------------------------------------------------------------------------ */

/* What the epilogue does with GELU, through aux (the pre-activation: D's dtype, layout and ld). */
enum LtGelu {
  NO_GELU,
  GELU_FORWARD,   /* aux = x, D = gelu(x), x the product (+ bias) in f32 */
  GELU_BACKWARD,  /* D = gelu'(aux) * (the product + beta D); no bias */
};

/* cuBLASLt's rule for a GELU epilogue's aux: its ld a multiple of 8 (cublasLt.h, EPILOGUE_AUX_LD). */
enum { AUX_LD_MULTIPLE = 8 };

/* A column-major product D[m, n] = alpha op(A) op(B) + beta D, with an optional bias and GELU epilogue. */
struct LtGemm {
  bool trans_a, trans_b;
  size_t m, n, k;
  const void *A;
  size_t lda;
  const void *B;
  size_t ldb;
  void *D;
  size_t ldd;
  float beta;
  const void *bias;  /* [m], added to every column of D; NULL: none */
  LtGelu gelu;
  const void *aux;   /* [m, n], ld ldd: written by GELU_FORWARD, read by GELU_BACKWARD */
};

static cublasLtEpilogue_t epilogue_of(const LtGemm &g) {
  switch (g.gelu) {
    case GELU_FORWARD: return g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case GELU_BACKWARD: return CUBLASLT_EPILOGUE_DGELU;
    default: return g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
}

/* The descriptors of one call, freed together whatever failed. */
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~LtDescriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

/* The largest power of two up to 256 that divides the address. */
static uint32_t alignment_of(const void *p) {
  uint32_t alignment = 256;
  while (alignment > 1 && (uintptr_t)p % alignment) alignment /= 2;
  return alignment;
}

/* type: A's, B's and the bias's; d_type: C's and D's. */
static WkStatus describe(LtDescriptors *desc, const LtGemm &g, cudaDataType_t type, cudaDataType_t d_type) {
  cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_TRY(cublasLtMatmulDescCreate(&desc->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  cublasLtEpilogue_t epilogue = epilogue_of(g);
  CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (g.bias) {
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
  }
  if (g.gelu != NO_GELU) {  /* the heuristic reads the aux pointer's alignment, as the operands' below */
    int64_t aux_ld = (int64_t)g.ldd;
    int32_t aux_type = d_type;  /* stored as D: the activation dtype */
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof aux_type));
  }
  /* op(A) is [m, k], op(B) [k, n]: the stored shapes are those, transposed where op is T */
  CUBLAS_TRY(cublasLtMatrixLayoutCreate(&desc->a, type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, (int64_t)g.lda));
  CUBLAS_TRY(cublasLtMatrixLayoutCreate(&desc->b, type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, (int64_t)g.ldb));
  CUBLAS_TRY(cublasLtMatrixLayoutCreate(&desc->d, d_type, g.m, g.n, (int64_t)g.ldd));
  CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&desc->preference));
  uint64_t workspace = LT_WORKSPACE_BYTES;
  CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(desc->preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace, sizeof workspace));
  /* The heuristic assumes 256-byte aligned operands unless told: a view at an offset must get an
   * algorithm that can read it. */
  const cublasLtMatmulPreferenceAttributes_t alignments[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const void *operands[] = {g.A, g.B, g.D, g.D};
  for (int i = 0; i < 4; i++) {
    uint32_t alignment = alignment_of(operands[i]);
    CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(desc->preference, alignments[i], &alignment, sizeof alignment));
  }
  return WK_OK;
}

/* D = op(A) op(B) (+ beta D) with A and B of dtype and D of d_dtype (dtype, or f32), when cuBLASLt
 * has an algorithm for it: *ran says whether it had one. A GELU epilogue narrows the choice (a
 * layout or dtype may have none, and an aux ld off cuBLASLt's rule none at all), so its callers
 * keep a way without it. */
static WkStatus lt_gemm_if_supported(const LtGemm &g, WkDType dtype, WkDType d_dtype, bool *ran) {
  *ran = g.m == 0 || g.n == 0;
  if (*ran || (g.gelu != NO_GELU && g.ldd % AUX_LD_MULTIPLE != 0)) return WK_OK;
  cublasLtHandle_t lt;
  WK_TRY(handles_for_current_device(NULL, &lt));
  LtDescriptors desc;
  WK_TRY(describe(&desc, g, cuda_type(dtype), cuda_type(d_dtype)));
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(lt, desc.op, desc.a, desc.b, desc.d, desc.d, desc.preference,
                                                        1, &heuristic, &found);
  if (asked == CUBLAS_STATUS_NOT_SUPPORTED || (asked == CUBLAS_STATUS_SUCCESS && found == 0)) return WK_OK;
  CUBLAS_TRY(asked);
  DeviceScratch workspace;
  WK_TRY(scratch_new(&workspace, LT_WORKSPACE_BYTES));
  float alpha = 1.0f;
  cublasStatus_t status = cublasLtMatmul(lt, desc.op, &alpha, g.A, desc.a, g.B, desc.b, &g.beta, g.D, desc.d, g.D,
                                         desc.d, &heuristic.algo, workspace.ptr, LT_WORKSPACE_BYTES, current_stream());
  scratch_free(&workspace);
  if (status != CUBLAS_STATUS_SUCCESS)
    return WK_FAIL(WK_ERR_DEVICE, "cublasLtMatmul (%s, [%zu x %zu x %zu]): %s", wk_dtype_name(dtype), g.m, g.n, g.k,
                   cublasGetStatusString(status));
  *ran = true;
  return WK_OK;
}

/* lt_gemm_if_supported, where no algorithm is an error. */
static WkStatus lt_gemm(const LtGemm &g, WkDType dtype, WkDType d_dtype) {
  bool ran = false;
  WK_TRY(lt_gemm_if_supported(g, dtype, d_dtype, &ran));
  if (!ran)
    return WK_FAIL(WK_ERR_DEVICE, "cuBLASLt has no algorithm for a %s GEMM into %s [%zu x %zu x %zu]%s",
                   wk_dtype_name(dtype), wk_dtype_name(d_dtype), g.m, g.n, g.k, g.bias ? " with a bias epilogue" : "");
  return WK_OK;
}

/* ---- the bias gradient: dbias[o] += sum over rows of dout[:, o] ----------------------------------- */

enum { ROWS_PER_CHUNK = 256 };

/* Block (x: a tile of WARP columns, y: a chunk of rows): each warp sums every WARPS_PER_BLOCK-th row
 * of the chunk (a warp reads WARP adjacent columns: coalesced), the warps' sums meet in shared memory,
 * and the chunk's total goes to partial[chunk][column]. */
template <typename Storage>
__global__ static void column_partial_sums_kernel(float *partial, const Storage *dout, size_t N, size_t OC) {
  __shared__ float sums[WARPS_PER_BLOCK][WARP];
  size_t column = blockIdx.x * (size_t)WARP + lane(), warp = threadIdx.x / WARP;
  size_t first = blockIdx.y * (size_t)ROWS_PER_CHUNK, last = min(first + ROWS_PER_CHUNK, N);
  float sum = 0.0f;
  if (column < OC)
    for (size_t n = first + warp; n < last; n += WARPS_PER_BLOCK) sum += to_float(dout[n * OC + column]);
  sums[warp][lane()] = sum;
  __syncthreads();
  if (warp == 0 && column < OC) {
    for (int w = 1; w < WARPS_PER_BLOCK; w++) sum += sums[w][lane()];
    partial[blockIdx.y * OC + column] = sum;
  }
}

__global__ static void add_chunk_sums_kernel(float *dbias, const float *partial, size_t chunks, size_t OC) {
  GRID_STRIDE(o, OC) {
    float sum = 0.0f;
    for (size_t c = 0; c < chunks; c++) sum += partial[c * OC + o];
    dbias[o] += sum;
  }
}

template <typename Storage>
static WkStatus bias_gradient(const char *op, float *dbias, const Storage *dout, size_t N, size_t OC) {
  size_t chunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
  if (chunks > 65535) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %zu rows exceed the bias reduction's grid", op, N);
  DeviceScratch partial;
  WK_TRY(scratch_new(&partial, chunks * OC * sizeof(float)));
  dim3 grid((unsigned)((OC + WARP - 1) / WARP), (unsigned)chunks);
  column_partial_sums_kernel<Storage><<<grid, THREADS, 0, current_stream()>>>((float *)partial.ptr, dout, N, OC);
  WkStatus status = launch_status("bias gradient (partial sums)");
  if (status == WK_OK) {
    add_chunk_sums_kernel<<<blocks_for(OC, THREADS), THREADS, 0, current_stream()>>>(dbias, (float *)partial.ptr, chunks, OC);
    status = launch_status("bias gradient (chunk sums)");
  }
  scratch_free(&partial);
  return status;
}

/* ---- the matmul op ------------------------------------------------------------------------------- */

/* out^T[OC, N] = op(w)[OC, C] @ inp^T[C, N] (+ bias): w row-major [C, OC] is column-major [OC, C] */
static LtGemm forward_gemm(void *out, const void *inp, const void *w, const void *bias, size_t N, size_t C, size_t OC,
                           int transpose_w) {
  LtGemm g = {};
  g.trans_a = transpose_w != 0;
  g.m = OC, g.n = N, g.k = C;
  g.A = w, g.lda = transpose_w ? C : OC;
  g.B = inp, g.ldb = C;
  g.D = out, g.ldd = OC;
  g.bias = bias;
  return g;
}

extern "C" WkStatus cuda_matmul_forward(WkDType dtype, void *out, const void *inp, const void *w, const void *bias,
                                        size_t N, size_t C, size_t OC, int transpose_w) {
  return lt_gemm(forward_gemm(out, inp, w, bias, N, C, OC, transpose_w), dtype, dtype);
}

/* dinp^T[C, N] = op(w)^T[C, OC] @ dout^T[OC, N] + beta dinp^T */
static LtGemm input_gradient_gemm(void *dinp, float beta, const void *dout, const void *w, size_t N, size_t C,
                                  size_t OC, int transpose_w) {
  LtGemm g = {};
  g.trans_a = !transpose_w;
  g.m = C, g.n = N, g.k = OC;
  g.A = w, g.lda = transpose_w ? C : OC;
  g.B = dout, g.ldb = OC;
  g.D = dinp, g.ldd = C, g.beta = beta;
  return g;
}

/* dw += and dbias += (when given); op names the caller in errors. */
static WkStatus parameter_gradients(const char *op, WkDType dtype, float *dw, float *dbias, const void *dout,
                                    const void *inp, size_t N, size_t C, size_t OC, int transpose_w) {
  LtGemm weight = {};
  weight.trans_b = true, weight.k = N, weight.beta = 1.0f, weight.D = dw;
  if (transpose_w) { /* dw row-major [OC, C] += dout^T @ inp: column-major [C, OC] = inp^T-view @ dout-view^T */
    weight.m = C, weight.n = OC, weight.A = inp, weight.lda = C, weight.B = dout, weight.ldb = OC, weight.ldd = C;
  } else { /* dw row-major [C, OC] += inp^T @ dout: column-major [OC, C] = dout-view @ inp-view^T */
    weight.m = OC, weight.n = C, weight.A = dout, weight.lda = OC, weight.B = inp, weight.ldb = C, weight.ldd = OC;
  }
  WK_TRY(lt_gemm(weight, dtype, WK_F32));  /* the parameter gradient accumulates in f32 */
  if (!dbias || !OC || !N) return WK_OK;
  STORAGE_DISPATCH(dtype, op, bias_gradient(op, dbias, (const Storage *)dout, N, OC));
}

extern "C" WkStatus cuda_matmul_backward(WkDType dtype, void *dinp, float *dw, float *dbias, const void *dout,
                                         const void *inp, const void *w, size_t N, size_t C, size_t OC,
                                         int transpose_w) {
  WK_TRY(lt_gemm(input_gradient_gemm(dinp, 1.0f, dout, w, N, C, OC, transpose_w), dtype, dtype));
  return parameter_gradients("matmul_backward", dtype, dw, dbias, dout, inp, N, C, OC, transpose_w);
}

/* ---- GELU in the epilogue: the MLP's two products ------------------------------------------------ */

/* Where cuBLASLt has no algorithm for the GELU epilogue (the aux ld is not a multiple of 8, or the
 * layout or dtype has none), the same op runs as the GEMM and then elementwise.cu's GELU pass: the
 * same values but for one rounding, since the pass reads the product as stored (pre, dpre) where the
 * epilogue takes it unrounded, as the CPU does. */

extern "C" WkStatus cuda_matmul_gelu_forward(WkDType dtype, void *out, void *pre, const void *inp, const void *w,
                                             const void *bias, size_t N, size_t C, size_t OC, int transpose_w) {
  LtGemm g = forward_gemm(out, inp, w, bias, N, C, OC, transpose_w);
  g.gelu = GELU_FORWARD, g.aux = pre;
  bool ran = false;
  WK_TRY(lt_gemm_if_supported(g, dtype, dtype, &ran));
  if (ran) return WK_OK;
  WK_TRY(cuda_matmul_forward(dtype, pre, inp, w, bias, N, C, OC, transpose_w));
  return cuda_gelu_forward(dtype, out, pre, N * OC);
}

extern "C" WkStatus cuda_matmul_backward_gelu(WkDType dtype, void *dpre, float *dw, float *dbias, const void *dout,
                                              const void *inp, const void *w, const void *pre, size_t N, size_t C,
                                              size_t OC, int transpose_w) {
  LtGemm input = input_gradient_gemm(dpre, 0.0f, dout, w, N, C, OC, transpose_w);  /* dpre written */
  input.gelu = GELU_BACKWARD, input.aux = pre;
  bool ran = false;
  WK_TRY(lt_gemm_if_supported(input, dtype, dtype, &ran));
  if (!ran) {
    input.gelu = NO_GELU;
    WK_TRY(lt_gemm(input, dtype, dtype));
    WK_TRY(gelu_derivative_times(dtype, dpre, pre, N * C));
  }
  return parameter_gradients("matmul_backward_gelu", dtype, dw, dbias, dout, inp, N, C, OC, transpose_w);
}
