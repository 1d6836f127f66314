/*
 * test_tensor.c — scalar conversions and storage ownership of runtime/tensor, checked exhaustively
 * where the domain is small (all 65536 half and bfloat16 patterns), and the CUDA module's table:
 * its stand-ins where no module is loaded, and a module that exports every entry of the list.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tensor/cuda_module.h"

static float bits_to_float(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static void test_every_f16_and_bf16_value_round_trips(void) {
  int f16_mismatches = 0, bf16_mismatches = 0;
  for (uint32_t h = 0; h <= 0xffffu; h++) {
    float f = wk_f16_to_f32((uint16_t)h);
    if (isnan(f) ? !isnan(wk_f16_to_f32(wk_f32_to_f16(f))) : wk_f32_to_f16(f) != h) f16_mismatches++;
    float b = wk_bf16_to_f32((uint16_t)h);
    if (isnan(b) ? !isnan(wk_bf16_to_f32(wk_f32_to_bf16(b))) : wk_f32_to_bf16(b) != h) bf16_mismatches++;
  }
  CHECK(f16_mismatches == 0);
  CHECK(bf16_mismatches == 0);
  CHECK(wk_f16_to_f32(0x3c00) == 1.0f && wk_f16_to_f32(0x7bff) == 65504.0f && wk_f16_to_f32(0x0001) == ldexpf(1, -24));
}

/* f32 -> f16 must pick the nearest half, and the even one on a tie. */
static void test_f16_rounding_is_nearest_even(void) {
  int wrong = 0;
  for (uint32_t bits = 0x33000000u; bits < 0x477ff000u; bits += 4093u) {  /* 2^-25 .. 65504 */
    float x = bits_to_float(bits);
    uint16_t h = wk_f32_to_f16(x);
    float here = wk_f16_to_f32(h), below = wk_f16_to_f32((uint16_t)(h - 1)), above = wk_f16_to_f32((uint16_t)(h + 1));
    float d = fabsf(x - here);
    if (d > fabsf(x - below) || d > fabsf(x - above)) wrong++;
    if ((d == fabsf(x - below) || d == fabsf(x - above)) && (h & 1u)) wrong++;
  }
  CHECK(wrong == 0);
  CHECK(wk_f32_to_f16(65519.0f) == 0x7bff && wk_f32_to_f16(65520.0f) == 0x7c00);  /* the overflow edge */
  CHECK(wk_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00);                         /* tie to even */
  CHECK(wk_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80);                          /* tie to even */
  CHECK(wk_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)) == 0x3f82);
}

static void test_views_keep_storage_alive(void) {
  int64_t shape[2] = {3, 4}, view_shape[1] = {3}, view_strides[1] = {4};
  WkTensor *t = wk_tensor_empty(WK_F32, 2, shape, WK_DEVICE_CPU, 0);
  CHECK(t != NULL);
  for (int64_t i = 0; i < 12; i++) wk_tensor_set(t, i, (double)i);
  WkTensor *column = wk_tensor_view(t, 1, 1, view_shape, view_strides);
  wk_tensor_free(t);  /* the view still owns a reference: reading it must be valid (ASan checks) */
  double v = 0;
  CHECK(wk_tensor_get(column, 2, &v) == WK_OK && v == 9.0);
  CHECK(!wk_tensor_is_contiguous(column));
  CHECK(wk_tensor_get(column, 3, &v) == WK_ERR_INVALID_ARG);
  wk_tensor_free(column);
  wk_tensor_free(NULL);
}

static void test_bad_shapes_and_dtypes_are_refused(void) {
  int64_t negative[1] = {-1}, shape[1] = {2};
  CHECK(wk_tensor_empty(WK_F32, 1, negative, WK_DEVICE_CPU, 0) == NULL && wk_last_status() == WK_ERR_INVALID_ARG);
  CHECK(wk_tensor_empty((WkDType)42, 1, shape, WK_DEVICE_CPU, 0) == NULL);
  CHECK(strstr(wk_last_error(), "unknown dtype 42") != NULL);
  CHECK(wk_tensor_empty(WK_F32, WK_MAX_DIMS + 1, shape, WK_DEVICE_CPU, 0) == NULL);
  WkTensor *t = wk_tensor_empty(WK_F32, 1, shape, WK_DEVICE_CPU, 0);
  CHECK(wk_op_scale(NULL, 2.0f) == WK_ERR_INVALID_ARG);
  CHECK(wk_op_round(t, WK_I32) == WK_ERR_INVALID_ARG);
  wk_tensor_free(t);
}

/* Without an NVIDIA device node nothing is loaded: entries fail with the reason, or report no device. */
static void test_cuda_table_stands_in_without_a_device(void) {
  if (access("/dev/nvidiactl", F_OK) == 0) {
    printf("skipped: this machine has an NVIDIA device node\n");
    return;
  }
  const WkCudaModule *cuda = wk_cuda();
  CHECK(cuda != NULL && cuda == wk_cuda());
  CHECK(cuda->device_count() == 0 && wk_cuda_device_count() == 0);
  void *ptr = NULL;
  size_t reserved = 0;
  CHECK(cuda->alloc(0, 16, &ptr, &reserved) == WK_ERR_UNSUPPORTED && ptr == NULL);
#ifdef WK_HAVE_CUDA
  CHECK(strstr(wk_last_error(), "the CUDA backend is not available") != NULL);
#else
  CHECK(strstr(wk_last_error(), "built without CUDA") != NULL);
#endif
  cuda->release(0, NULL); /* a void entry does nothing */
  int64_t shape[1] = {4};
  CHECK(wk_tensor_empty(WK_F32, 1, shape, WK_DEVICE_CUDA, 0) == NULL);
  CHECK(strncmp(wk_last_error(), "cuda:0 tensor: ", strlen("cuda:0 tensor: ")) == 0);
  CHECK(wk_stream_new(WK_DEVICE_CUDA, 0) == NULL && wk_last_status() == WK_ERR_UNSUPPORTED);
  CHECK(wk_cuda_empty_cache(0) == WK_OK); /* nothing is cached without a device */
}

/* The module this build made (build/libwick_cuda.so, next to this test's build/tests/) exports
 * cuda_NAME for every entry of the list, so the loader can fill the whole table. */
static void test_cuda_module_exports_every_entry(void) {
#ifdef WK_HAVE_CUDA
  char exe[PATH_MAX] = "", path[PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  CHECK(n > 0);
  char *slash = strrchr(exe, '/');
  if (slash) *slash = '\0';
  snprintf(path, sizeof path, "%s/../libwick_cuda.so", exe);
  void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!module) fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
  CHECK(module != NULL);
  if (!module) return;
  int missing = 0;
#define EXPECT_EXPORT(ret, name, params)                          \
  if (!dlsym(module, "cuda_" #name)) {                            \
    fprintf(stderr, "%s lacks cuda_%s\n", path, #name);          \
    missing++;                                                    \
  }
  WK_CUDA_MODULE_FUNCTIONS(EXPECT_EXPORT)
#undef EXPECT_EXPORT
  CHECK(missing == 0);
  /* Left loaded: cudart's and libstdc++'s load-time allocations would read as leaks once unmapped. */
#else
  printf("skipped: built without CUDA\n");
#endif
}

int main(void) {
  RUN_TEST(test_every_f16_and_bf16_value_round_trips);
  RUN_TEST(test_f16_rounding_is_nearest_even);
  RUN_TEST(test_views_keep_storage_alive);
  RUN_TEST(test_bad_shapes_and_dtypes_are_refused);
  RUN_TEST(test_cuda_table_stands_in_without_a_device);
  RUN_TEST(test_cuda_module_exports_every_entry);
  return check_failures ? 1 : 0;
}
