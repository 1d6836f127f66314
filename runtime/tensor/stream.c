/*
 * stream.c — streams and events. On the CPU every op completes before it returns, so CPU streams
 * and events are no-ops kept only so that recipe code is the same on both devices; CUDA ones are
 * handles of the CUDA module (runtime/tensor/cuda/stream.cu), through its table. A thread has one
 * current stream per CUDA device, so an op on cuda:1 never launches on a stream of cuda:0.
 */
#include <stdlib.h>

#include "cuda_module.h"

static _Thread_local WkStream *current_streams[WK_MAX_DEVICES];

static bool is_cuda_stream(const WkStream *s) {
  return s && s->device == WK_DEVICE_CUDA && s->device_index >= 0 && s->device_index < WK_MAX_DEVICES;
}

WkStream *wk_stream_current_on(int device_index) {
  return device_index >= 0 && device_index < WK_MAX_DEVICES ? current_streams[device_index] : NULL;
}

/* NULL: every device back to its default stream. A CPU stream changes nothing (CPU ops are synchronous). */
void wk_stream_set_current(WkStream *stream) {
  if (!stream) memset(current_streams, 0, sizeof current_streams);
  else if (is_cuda_stream(stream)) current_streams[stream->device_index] = stream;
}

/* NULL is the calling thread's current stream on the device it last entered. */
static WkStream *or_current(WkStream *stream) { return stream ? stream : wk_stream_current_on(wk_cuda_current_device()); }

WkStream *wk_stream_new(WkDeviceType device, int device_index) {
  WkStream *s = wk_calloc(1, sizeof *s, "stream");
  if (!s) return NULL;
  s->device = device;
  s->device_index = device_index;
  if (device == WK_DEVICE_CPU) return s;
  if (wk_cuda()->stream_new(device_index, &s->handle) == WK_OK) return s;
  wk_error_context("cuda:%d stream", device_index);
  free(s);
  return NULL;
}

void wk_stream_free(WkStream *stream) {
  if (!stream) return;
  if (is_cuda_stream(stream) && current_streams[stream->device_index] == stream)
    current_streams[stream->device_index] = NULL;
  if (stream->handle) wk_cuda()->stream_free(stream->handle);
  free(stream);
}

WkStatus wk_stream_synchronize(WkStream *stream) {
  stream = or_current(stream);
  if (stream && stream->device == WK_DEVICE_CPU) return WK_OK;
  if (!stream && wk_cuda_device_count() == 0) return WK_OK; /* no device: nothing can have been queued */
  return wk_cuda()->stream_synchronize(stream ? stream->handle : NULL);
}

WkStatus wk_device_synchronize(WkDeviceType device, int device_index) {
  if (device == WK_DEVICE_CPU) return WK_OK;
  return wk_cuda()->device_synchronize(device_index);
}

WkEvent *wk_event_new(WkDeviceType device, int device_index) {
  WkEvent *e = wk_calloc(1, sizeof *e, "event");
  if (!e) return NULL;
  e->device = device;
  if (device == WK_DEVICE_CPU) return e;
  if (wk_cuda()->event_new(device_index, &e->handle) == WK_OK) return e;
  wk_error_context("cuda:%d event", device_index);
  free(e);
  return NULL;
}

void wk_event_free(WkEvent *event) {
  if (!event) return;
  if (event->handle) wk_cuda()->event_free(event->handle);
  free(event);
}

WkStatus wk_event_record(WkEvent *event, WkStream *stream) {
  if (event->device == WK_DEVICE_CPU) return WK_OK;
  stream = or_current(stream);
  return wk_cuda()->event_record(event->handle, stream ? stream->handle : NULL);
}

WkStatus wk_event_synchronize(WkEvent *event) {
  if (event->device == WK_DEVICE_CPU) return WK_OK;
  return wk_cuda()->event_synchronize(event->handle);
}

WkStatus wk_stream_wait_event(WkStream *stream, WkEvent *event) {
  if (event->device == WK_DEVICE_CPU) return WK_OK;
  stream = or_current(stream);
  return wk_cuda()->stream_wait_event(stream ? stream->handle : NULL, event->handle);
}
