/*
 * test_placement.c — that every CUDA entry point runs on its tensors' device, over a fake CUDA module
 * of two devices (wk_cuda_use, wk_cuda_ops_use) that records the device current when each of its entries is called:
 * ops enter their tensors' device, allocations and copies theirs, an op mixing devices is refused
 * naming both before anything runs, a thread's current stream is per device, pinned memory is made
 * on the process's default device, copy_async casts and copies on the stream it is given, and the
 * Llama ops (the fused add_rmsnorm too) reach their CUDA entries with the CPU kernels' sizes.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops/ops.h"

static _Thread_local int fake_current = -1;  /* the fake driver's current device, per thread */
static int set_device_calls, add_device, copy_device, copy_convert_device, host_alloc_device;
static void *copy_stream, *copy_convert_stream, *recorded_stream;

static int fake_device_count(void) { return 2; }

static WkStatus fake_set_device(int device) {
  if (device >= 2) return WK_FAIL(WK_ERR_UNSUPPORTED, "cuda:%d: the fake has 2 devices", device);
  fake_current = device;
  set_device_calls++;
  return WK_OK;
}

static WkStatus fake_alloc(int device, size_t bytes, void **out, size_t *reserved) {
  if (fake_current != device) return WK_FAIL(WK_ERR_DEVICE, "alloc for cuda:%d while cuda:%d is current", device, fake_current);
  *out = calloc(1, bytes ? bytes : 1);
  *reserved = bytes;
  return WK_OK;
}

static void fake_release(int device, void *ptr) { free(ptr); }

static WkStatus fake_host_alloc(size_t bytes, void **out) {
  host_alloc_device = fake_current;
  *out = calloc(1, bytes ? bytes : 1);
  return WK_OK;
}

static void fake_host_free(void *ptr) { free(ptr); }

static WkStatus fake_add(WkDType dtype, void *out, const void *a, const void *b, size_t n) {
  add_device = fake_current;
  for (size_t i = 0; i < n; i++) ((float *)out)[i] = ((const float *)a)[i] + ((const float *)b)[i];
  return WK_OK;
}

/* The Llama ops' entries record the device and the sizes ops.c hands them (the kernels' own
 * arithmetic is checked against the CPU in tests/ops/cuda_spec.lua, on a GPU). */
static struct {
  int device;
  WkDType dtype;
  size_t a, b, c, d;
} llama_call;

static void record_llama_call(WkDType dtype, size_t a, size_t b, size_t c, size_t d) {
  llama_call.device = fake_current;
  llama_call.dtype = dtype;
  llama_call.a = a, llama_call.b = b, llama_call.c = c, llama_call.d = d;
}

/* c records whether the residual came (the fused op) or not (the plain one, which hands sum NULL too). */
static WkStatus fake_add_rmsnorm_forward(WkDType dtype, void *sum, void *out, float *rstd, const void *a, const void *b,
                                         const void *weight, size_t N, size_t C, float eps) {
  record_llama_call(dtype, N, C, b != NULL, sum != NULL);
  return eps == 1e-5f ? WK_OK : WK_FAIL(WK_ERR_INVALID_ARG, "eps %g reached the kernel", eps);
}

static WkStatus fake_swiglu_forward(WkDType dtype, void *out, const void *gate, const void *up, size_t n) {
  record_llama_call(dtype, n, 0, 0, 0);
  return WK_OK;
}

static WkStatus fake_qkv_pack_backward(WkDType dtype, void *dq, void *dk, void *dv, const void *dqkv, size_t N,
                                       size_t NH, size_t KVH, size_t hs) {
  record_llama_call(dtype, N, NH, KVH, hs);
  return WK_OK;
}

static WkStatus fake_copy(void *dst, const void *src, size_t bytes, WkStream *stream) {
  copy_device = stream ? stream->device_index : fake_current;
  copy_stream = stream ? stream->handle : NULL;
  memcpy(dst, src, bytes);
  return WK_OK;
}

static WkStatus fake_copy_convert(WkTensor *dst, const WkTensor *src, WkStream *stream) {
  copy_convert_device = stream ? stream->device_index : fake_current;
  copy_convert_stream = stream ? stream->handle : NULL;
  wk_tensor_copy_cpu(dst, src);  /* the CPU's cast loops stand in for the kernel */
  return WK_OK;
}

static WkStatus fake_record_stream(int device, void *ptr, void *stream) {
  recorded_stream = stream;
  return WK_OK;
}

static WkStatus fake_stream_new(int device, void **handle) {
  *handle = (void *)(intptr_t)(0x100 + device);
  return WK_OK;
}

static void fake_stream_free(void *handle) {}
static WkStatus fake_synchronize(void *handle) { return WK_OK; }

static WkCudaModule fake;
static WkCudaOps fake_ops;

static void use_fake(void) {
  fake = *wk_cuda();  /* the stand-ins, for every entry not faked */
  fake.device_count = fake_device_count;
  fake.set_device = fake_set_device;
  fake.alloc = fake_alloc;
  fake.release = fake_release;
  fake.host_alloc = fake_host_alloc;
  fake.host_free = fake_host_free;
  fake.copy = fake_copy;
  fake.copy_convert = fake_copy_convert;
  fake.record_stream = fake_record_stream;
  fake.stream_new = fake_stream_new;
  fake.stream_free = fake_stream_free;
  fake.stream_synchronize = fake_synchronize;
  wk_cuda_use(&fake);
  fake_ops = *wk_cuda_ops();
  fake_ops.add = fake_add;
  fake_ops.add_rmsnorm_forward = fake_add_rmsnorm_forward;
  fake_ops.swiglu_forward = fake_swiglu_forward;
  fake_ops.qkv_pack_backward = fake_qkv_pack_backward;
  wk_cuda_ops_use(&fake_ops);
}

static WkTensor *vector(WkDType dtype, int device) {
  int64_t shape[1] = {4};
  return wk_tensor_empty(dtype, 1, shape, device < 0 ? WK_DEVICE_CPU : WK_DEVICE_CUDA, device < 0 ? 0 : device);
}

static void test_an_op_runs_on_its_tensors_device(void) {
  for (int device = 1; device >= 0; device--) {
    WkTensor *out = vector(WK_F32, device), *a = vector(WK_F32, device), *b = vector(WK_F32, device);
    CHECK(out && a && b);
    fake_current = 1 - device;  /* whatever the thread had made current before */
    add_device = -1;
    CHECK(wk_op_add(out, a, b) == WK_OK);
    CHECK(add_device == device);
    wk_tensor_free(out);
    wk_tensor_free(a);
    wk_tensor_free(b);
  }
}

static WkTensor *tensor3(WkDType dtype, int64_t B, int64_t T, int64_t C, int device) {
  int64_t shape[3] = {B, T, C};
  return wk_tensor_empty(dtype, 3, shape, WK_DEVICE_CUDA, device);
}

/* rmsnorm, swiglu and qkv_pack (and, by the same DISPATCH, the others) reach the kernels' table on
 * their tensors' device with the activation dtype and the sizes the CPU kernels get. */
static void test_the_llama_ops_reach_the_cuda_kernels(void) {
  int64_t rows_shape[1] = {6};
  WkTensor *x = tensor3(WK_BF16, 2, 3, 8, 1), *out = tensor3(WK_BF16, 2, 3, 8, 1);
  WkTensor *rstd = wk_tensor_empty(WK_F32, 1, rows_shape, WK_DEVICE_CUDA, 1);
  int64_t w_shape[1] = {8};
  WkTensor *weight = wk_tensor_empty(WK_BF16, 1, w_shape, WK_DEVICE_CUDA, 1);
  CHECK(x && out && rstd && weight);
  fake_current = 0;
  memset(&llama_call, 0, sizeof llama_call);
  CHECK(wk_op_rmsnorm(out, rstd, x, weight, 1e-5f) == WK_OK);
  CHECK(llama_call.device == 1 && llama_call.dtype == WK_BF16 && llama_call.a == 6 && llama_call.b == 8);
  CHECK(llama_call.c == 0 && llama_call.d == 0);
  WkTensor *sum = tensor3(WK_BF16, 2, 3, 8, 1);
  CHECK(sum != NULL);
  memset(&llama_call, 0, sizeof llama_call);
  CHECK(wk_op_add_rmsnorm(sum, out, rstd, x, x, weight, 1e-5f) == WK_OK);
  CHECK(llama_call.device == 1 && llama_call.a == 6 && llama_call.b == 8 && llama_call.c == 1 && llama_call.d == 1);
  wk_tensor_free(sum);
  CHECK(wk_op_swiglu(out, x, x) == WK_OK);
  CHECK(llama_call.device == 1 && llama_call.a == 48);
  WkTensor *dq = tensor3(WK_BF16, 2, 3, 8, 1), *dk = tensor3(WK_BF16, 2, 3, 4, 1), *dv = tensor3(WK_BF16, 2, 3, 4, 1);
  WkTensor *dqkv = tensor3(WK_BF16, 2, 3, 24, 1);
  CHECK(dq && dk && dv && dqkv);
  CHECK(wk_op_qkv_pack_backward(dq, dk, dv, dqkv, 4, 2) == WK_OK);
  CHECK(llama_call.a == 6 && llama_call.b == 4 && llama_call.c == 2 && llama_call.d == 2);
  WkTensor *all[] = {x, out, rstd, weight, dq, dk, dv, dqkv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) wk_tensor_free(all[i]);
}

static void test_mixing_devices_names_both_and_runs_nothing(void) {
  WkTensor *out = vector(WK_F32, 0), *a = vector(WK_F32, 1), *b = vector(WK_F32, 0), *host = vector(WK_F32, -1);
  set_device_calls = 0;
  add_device = -1;
  CHECK(wk_op_add(out, a, b) == WK_ERR_INVALID_ARG);
  CHECK(strstr(wk_last_error(), "cuda:1") && strstr(wk_last_error(), "cuda:0"));
  CHECK(wk_op_add(out, b, host) == WK_ERR_INVALID_ARG);
  CHECK(strstr(wk_last_error(), "cpu") && strstr(wk_last_error(), "cuda:0"));
  CHECK(set_device_calls == 0 && add_device == -1);
  wk_tensor_free(out);
  wk_tensor_free(a);
  wk_tensor_free(b);
  wk_tensor_free(host);
}

static void test_allocations_and_copies_enter_their_device(void) {
  fake_current = 0;
  WkTensor *on1 = vector(WK_F32, 1), *host = vector(WK_F32, -1);  /* fake_alloc refuses another device */
  CHECK(on1 != NULL && fake_current == 1);
  fake_current = 0;
  copy_device = -1;
  CHECK(wk_tensor_copy(on1, host) == WK_OK && copy_device == 1);
  fake_current = 0;
  copy_device = -1;
  CHECK(wk_tensor_copy(host, on1) == WK_OK && copy_device == 1);
  wk_tensor_free(on1);
  wk_tensor_free(host);
}

static void test_the_current_stream_is_per_device(void) {
  WkStream *s1 = wk_stream_new(WK_DEVICE_CUDA, 1), *s0 = wk_stream_new(WK_DEVICE_CUDA, 0);
  CHECK(s1 && s0);
  wk_stream_set_current(s1);
  CHECK(wk_stream_current_on(1) == s1 && wk_stream_current_on(0) == NULL);
  wk_stream_set_current(s0);
  CHECK(wk_stream_current_on(1) == s1 && wk_stream_current_on(0) == s0);
  wk_stream_free(s1);  /* freeing the current stream leaves its device on the default one */
  CHECK(wk_stream_current_on(1) == NULL && wk_stream_current_on(0) == s0);
  wk_stream_set_current(NULL);
  CHECK(wk_stream_current_on(0) == NULL && wk_stream_current_on(-1) == NULL && wk_stream_current_on(WK_MAX_DEVICES) == NULL);
  wk_stream_free(s0);
}

static void test_copy_async_casts_and_copies_on_its_stream(void) {
  WkStream *stream = wk_stream_new(WK_DEVICE_CUDA, 1);
  WkTensor *f32 = vector(WK_F32, 1), *bf16 = vector(WK_BF16, 1), *host = vector(WK_F32, -1);
  for (int64_t i = 0; i < 4; i++) wk_tensor_set(host, i, 1.5 * (double)i);
  CHECK(wk_tensor_copy(f32, host) == WK_OK);
  copy_convert_stream = recorded_stream = NULL;
  CHECK(wk_tensor_copy_async(bf16, f32, stream) == WK_OK);
  CHECK(copy_convert_stream == stream->handle && copy_convert_device == 1);
  CHECK(recorded_stream == stream->handle);  /* the allocator knows the stream uses both blocks */
  WkTensor *back = vector(WK_F32, -1);
  double v = 0;
  CHECK(wk_tensor_copy(back, bf16) == WK_OK && wk_tensor_get(back, 3, &v) == WK_OK && v == 4.5);
  wk_tensor_free(back);
  /* a cast from the host stages on the host, then moves bytes on the stream */
  copy_stream = NULL;
  CHECK(wk_tensor_copy_async(bf16, host, stream) == WK_OK && copy_stream == stream->handle);
  wk_tensor_free(f32);
  wk_tensor_free(bf16);
  wk_tensor_free(host);
  wk_stream_free(stream);
}

static void *pinned_on_a_new_thread(void *unused) {
  int64_t shape[1] = {16};
  WkTensor *t = wk_tensor_empty_pinned(WK_U8, 1, shape);
  wk_tensor_free(t);
  return t;
}

static void test_pinned_memory_is_made_on_the_default_device(void) {
  CHECK(wk_cuda_set_default_device(1) == WK_OK);
  CHECK(wk_cuda_set_default_device(-1) == WK_ERR_INVALID_ARG && wk_cuda_set_default_device(WK_MAX_DEVICES) == WK_ERR_INVALID_ARG);
  pthread_t thread;
  void *made = NULL;
  host_alloc_device = -1;
  CHECK(pthread_create(&thread, NULL, pinned_on_a_new_thread, NULL) == 0 && pthread_join(thread, &made) == 0);
  CHECK(made != NULL && host_alloc_device == 1);  /* a loader thread's first pinned buffer: not GPU 0 */
  CHECK(wk_cuda_set_default_device(0) == WK_OK);
}

int main(void) {
  use_fake();
  RUN_TEST(test_an_op_runs_on_its_tensors_device);
  RUN_TEST(test_the_llama_ops_reach_the_cuda_kernels);
  RUN_TEST(test_mixing_devices_names_both_and_runs_nothing);
  RUN_TEST(test_allocations_and_copies_enter_their_device);
  RUN_TEST(test_the_current_stream_is_per_device);
  RUN_TEST(test_copy_async_casts_and_copies_on_its_stream);
  RUN_TEST(test_pinned_memory_is_made_on_the_default_device);
  wk_cuda_ops_use(NULL);
  wk_cuda_use(NULL);
  return check_failures ? 1 : 0;
}
