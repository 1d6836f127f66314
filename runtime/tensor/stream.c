/*
 * stream.c — streams and events. On the CPU every op completes before it returns, so CPU streams
 * and events are no-ops kept only so that recipe code is the same on both devices.
 */
#include <stdlib.h>

#include "tensor.h"

static _Thread_local WkStream *current_stream;

WkStream *wk_stream_current(void) { return current_stream; }
void wk_stream_set_current(WkStream *stream) { current_stream = stream; }

#ifndef WK_HAVE_CUDA
static WkStatus no_cuda(void) {
  return WK_FAIL(WK_ERR_UNSUPPORTED, "CUDA streams and events: this libwick was built without CUDA");
}
#endif

WkStream *wk_stream_new(WkDeviceType device, int device_index) {
  WkStream *s = wk_calloc(1, sizeof *s, "stream");
  if (!s) return NULL;
  s->device = device;
  s->device_index = device_index;
  if (device == WK_DEVICE_CPU) return s;
#ifdef WK_HAVE_CUDA
  if (wk_cuda_stream_new(device_index, &s->handle) == WK_OK) return s;
#else
  no_cuda();
#endif
  free(s);
  return NULL;
}

void wk_stream_free(WkStream *stream) {
  if (!stream) return;
  if (current_stream == stream) current_stream = NULL;
#ifdef WK_HAVE_CUDA
  if (stream->handle) wk_cuda_stream_free(stream->handle);
#endif
  free(stream);
}

/* NULL is the current stream of the calling thread (the default stream when none is set). */
WkStatus wk_stream_synchronize(WkStream *stream) {
  if (!stream) stream = current_stream;
  if (stream && stream->device == WK_DEVICE_CPU) return WK_OK;
#ifdef WK_HAVE_CUDA
  return wk_cuda_stream_synchronize(stream ? stream->handle : NULL);
#else
  return stream ? no_cuda() : WK_OK;
#endif
}

WkStatus wk_device_synchronize(WkDeviceType device, int device_index) {
  if (device == WK_DEVICE_CPU) return WK_OK;
#ifdef WK_HAVE_CUDA
  return wk_cuda_device_synchronize(device_index);
#else
  return no_cuda();
#endif
}

WkEvent *wk_event_new(WkDeviceType device, int device_index) {
  WkEvent *e = wk_calloc(1, sizeof *e, "event");
  if (!e) return NULL;
  e->device = device;
  if (device == WK_DEVICE_CPU) return e;
#ifdef WK_HAVE_CUDA
  if (wk_cuda_event_new(device_index, &e->handle) == WK_OK) return e;
#else
  no_cuda();
#endif
  free(e);
  return NULL;
}

void wk_event_free(WkEvent *event) {
  if (!event) return;
#ifdef WK_HAVE_CUDA
  if (event->handle) wk_cuda_event_free(event->handle);
#endif
  free(event);
}

WkStatus wk_event_record(WkEvent *event, WkStream *stream) {
  if (event->device == WK_DEVICE_CPU) return WK_OK;
#ifdef WK_HAVE_CUDA
  if (!stream) stream = current_stream;
  return wk_cuda_event_record(event->handle, stream ? stream->handle : NULL);
#else
  return no_cuda();
#endif
}

WkStatus wk_event_synchronize(WkEvent *event) {
  if (event->device == WK_DEVICE_CPU) return WK_OK;
#ifdef WK_HAVE_CUDA
  return wk_cuda_event_synchronize(event->handle);
#else
  return no_cuda();
#endif
}

WkStatus wk_stream_wait_event(WkStream *stream, WkEvent *event) {
  if (event->device == WK_DEVICE_CPU) return WK_OK;
#ifdef WK_HAVE_CUDA
  if (!stream) stream = current_stream;
  return wk_cuda_stream_wait_event(stream ? stream->handle : NULL, event->handle);
#else
  return no_cuda();
#endif
}
