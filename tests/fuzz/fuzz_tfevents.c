/*
 * fuzz_tfevents.c — libFuzzer target for the TensorBoard event file reader a resumed run cuts its
 * log directory with (wk_events_truncate: TFRecord frames, then each Event's protobuf fields).
 *
 * Random bytes rarely get past the frames' checksums, so when the first input byte is odd the rest
 * is cut into records (each piece's length from its first byte) and framed with correct checksums,
 * which reaches the protobuf scan behind them; the second byte is the step to cut after. The input is
 * written to a file on /dev/shm (the reader works on files), and the cut must leave a prefix of it.
 *
 *   make fuzz && build/fuzz/fuzz_tfevents -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/tfevents
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

enum { MAX_FILE = 1 << 16, HEADER = 12, FOOTER = 4 };

static uint32_t masked(const uint8_t *p, size_t n) {
  uint32_t crc = wk_crc32c(p, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Frames pieces of data as records; returns the file's length. */
static size_t frame_records(const uint8_t *data, size_t size, uint8_t *out) {
  size_t n = 0;
  while (size > 0) {
    size_t length = data[0] % 64;
    data++, size--;
    if (length > size) length = size;
    if (n + HEADER + length + FOOTER > MAX_FILE) break;
    put(out + n, length, 8);
    put(out + n + 8, masked(out + n, 8), 4);
    memcpy(out + n + HEADER, data, length);
    put(out + n + HEADER + length, masked(data, length), 4);
    n += HEADER + length + FOOTER;
    data += length, size -= length;
  }
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t file[MAX_FILE];
  if (size < 2) return 0;
  bool framed = data[0] & 1;
  int64_t step = data[1];
  size_t n = framed ? frame_records(data + 2, size - 2, file) : (size - 2 < MAX_FILE ? size - 2 : MAX_FILE);
  if (!framed) memcpy(file, data + 2, n);
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/wick-fuzz-tfevents-%d", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (fwrite(file, 1, n, f) != n) abort();
  fclose(f);
  uint64_t removed = 0;
  WkStatus status = wk_events_truncate(path, step, &removed);
  struct stat st;
  if (stat(path, &st) != 0) abort();
  if (status == WK_OK ? (uint64_t)st.st_size > n : (uint64_t)st.st_size != n) abort(); /* a prefix, or untouched */
  if (status != WK_OK && strlen(wk_last_error()) == 0) abort();
  unlink(path);
  return 0;
}
