/*
 * test_tfevents.c — TensorBoard event files of runtime/core (tfevents.c): CRC-32C against RFC 3720's
 * vectors, the exact bytes of a file, and the cut a resumed run makes (later steps, a partial tail,
 * a damaged record refused with its offset).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/core.h"

static void test_crc32c_matches_rfc3720(void) {
  uint8_t bytes[32];
  memset(bytes, 0, sizeof bytes); /* RFC 3720 B.4 */
  CHECK(wk_crc32c(bytes, sizeof bytes) == 0x8a9136aau);
  memset(bytes, 0xff, sizeof bytes);
  CHECK(wk_crc32c(bytes, sizeof bytes) == 0x62a8ab43u);
  for (int i = 0; i < 32; i++) bytes[i] = (uint8_t)i;
  CHECK(wk_crc32c(bytes, sizeof bytes) == 0x46dd794eu);
  for (int i = 0; i < 32; i++) bytes[i] = (uint8_t)(31 - i);
  CHECK(wk_crc32c(bytes, sizeof bytes) == 0x113fdb5cu);
}

/* The file of a version record and one step (3, wall time 1.5 s, train/loss = 2.5), written down from
 * the format: TFRecord frames (length, masked CRC-32C of it, data, masked CRC-32C of the data) of
 * Event protobufs. The same bytes came out of tensorboard 2.21's RecordWriter fed with
 * Event(wall_time=1.5, file_version="brain.Event:2") and Event(wall_time=1.5, step=3,
 * summary=Summary(value=[Value(tag="train/loss", simple_value=2.5)])), checked once. */
static const uint8_t KNOWN_FILE[] = {
    /* record 1: 24 bytes */
    0x18, 0, 0, 0, 0, 0, 0, 0, 0xa3, 0x7f, 0x4b, 0x22,
    0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f,                     /* wall_time (1, fixed64) = 1.5 */
    0x1a, 0x0d, 'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':', '2', /* file_version (3) */
    0x2a, 0x28, 0x64, 0x6c,
    /* record 2: 32 bytes */
    0x20, 0, 0, 0, 0, 0, 0, 0, 0x29, 0xed, 0xa9, 0x50,
    0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f,                     /* wall_time = 1.5 */
    0x10, 0x03,                                             /* step (2, varint) = 3 */
    0x2a, 0x13,                                             /* summary (5): 19 bytes */
    0x0a, 0x11,                                             /*   value (1): 17 bytes */
    0x0a, 0x0a, 't', 'r', 'a', 'i', 'n', '/', 'l', 'o', 's', 's', /* tag (1) */
    0x15, 0x00, 0x00, 0x20, 0x40,                           /*   simple_value (2, fixed32) = 2.5f */
    0x12, 0xe1, 0xbd, 0xac,
};

static char *make_dir(void) {
  static char dir[] = "/tmp/wick-tfevents-XXXXXX";
  strcpy(dir + strlen(dir) - 6, "XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
  return dir;
}

static size_t read_whole(const char *path, uint8_t *out, size_t capacity) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  size_t n = fread(out, 1, capacity, f);
  fclose(f);
  return n;
}

static void test_file_is_the_known_bytes(void) {
  char *dir = make_dir();
  char sub[256];
  snprintf(sub, sizeof sub, "%s/tb", dir);
  WkEvents *w = wk_events_open(sub, 1.5);
  CHECK(w != NULL);
  if (!w) return;
  char host[256] = {0}, want[512];
  gethostname(host, sizeof host - 1);
  snprintf(want, sizeof want, "%s/events.out.tfevents.1.%s.%d", sub, host, (int)getpid());
  CHECK(strcmp(wk_events_path(w), want) == 0);
  const char *tags[] = {"train/loss"};
  const float values[] = {2.5f};
  CHECK(wk_events_write_scalars(w, 3, 1.5, 1, tags, values) == WK_OK);
  uint8_t bytes[256];
  size_t n = read_whole(wk_events_path(w), bytes, sizeof bytes); /* before close: every record is written through */
  CHECK(n == sizeof KNOWN_FILE && memcmp(bytes, KNOWN_FILE, n) == 0);
  CHECK(wk_events_open(sub, 1.5) == NULL); /* the same name: another writer's file is never reused */
  CHECK(wk_events_close(w) == WK_OK);
  char command[300];
  snprintf(command, sizeof command, "rm -rf %s", dir);
  CHECK(system(command) == 0);
}

static void test_bad_arguments_are_refused(void) {
  char *dir = make_dir();
  WkEvents *w = wk_events_open(dir, 10);
  CHECK(w != NULL);
  if (!w) return;
  const char *empty[] = {""};
  const float one[] = {1};
  CHECK(wk_events_write_scalars(w, -1, 10, 1, (const char *const[]){"a"}, one) == WK_ERR_INVALID_ARG);
  CHECK(wk_events_write_scalars(w, 1, 10, 1, empty, one) == WK_ERR_INVALID_ARG);
  CHECK(wk_events_write_scalars(w, 1, -1, 1, (const char *const[]){"a"}, one) == WK_ERR_INVALID_ARG);
  CHECK(wk_events_open(dir, 0.0 / 0.0) == NULL);
  char file[300];
  snprintf(file, sizeof file, "%s/plain", dir);
  FILE *f = fopen(file, "w");
  fclose(f);
  CHECK(wk_events_open(file, 10) == NULL && strstr(wk_last_error(), "not a directory") != NULL);
  wk_events_close(w);
  char command[300];
  snprintf(command, sizeof command, "rm -rf %s", dir);
  CHECK(system(command) == 0);
}

/* Steps 1..5, one value each, in a file named after wall_time; returns its path in out. */
static void write_steps(const char *dir, double wall_time, char *out, size_t capacity) {
  WkEvents *w = wk_events_open(dir, wall_time);
  CHECK(w != NULL);
  if (!w) return;
  snprintf(out, capacity, "%s", wk_events_path(w));
  for (int step = 1; step <= 5; step++) {
    float v = (float)step;
    CHECK(wk_events_write_scalars(w, step, wall_time + step, 1, (const char *const[]){"train/loss"}, &v) == WK_OK);
  }
  wk_events_close(w);
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void append(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "ab");
  CHECK(fwrite(bytes, 1, n, f) == n);
  fclose(f);
}

enum { VERSION_RECORD = 12 + 24 + 4, STEP_RECORD = 12 + 32 + 4 };

static void test_truncate_cuts_later_steps_and_a_partial_tail(void) {
  char *dir = make_dir(), path[512];
  write_steps(dir, 100, path, sizeof path);
  uint64_t removed = 99;
  CHECK(wk_events_truncate(path, 5, &removed) == WK_OK && removed == 0);
  CHECK(file_size(path) == VERSION_RECORD + 5 * STEP_RECORD);
  CHECK(wk_events_truncate(path, 3, &removed) == WK_OK && removed == 2);
  CHECK(file_size(path) == VERSION_RECORD + 3 * STEP_RECORD);
  append(path, KNOWN_FILE + VERSION_RECORD, 20); /* a writer killed inside a record */
  CHECK(wk_events_truncate(path, 3, &removed) == WK_OK && removed == 0);
  CHECK(file_size(path) == VERSION_RECORD + 3 * STEP_RECORD);
  append(path, KNOWN_FILE, 5); /* inside the length itself */
  CHECK(wk_events_truncate(path, 3, &removed) == WK_OK);
  CHECK(file_size(path) == VERSION_RECORD + 3 * STEP_RECORD);
  CHECK(wk_events_truncate(path, 0, &removed) == WK_OK && removed == 3);
  CHECK(file_size(path) == VERSION_RECORD); /* a run started again keeps the file version only */
  char second[512], other[600];
  write_steps(dir, 200, second, sizeof second); /* a second file in the directory, and a file of someone else's */
  snprintf(other, sizeof other, "%s/notes.txt", dir);
  append(other, "not an event file", 17);
  CHECK(wk_events_truncate_dir(dir, 2, &removed) == WK_OK && removed == 3);
  CHECK(file_size(second) == VERSION_RECORD + 2 * STEP_RECORD && file_size(other) == 17);
  CHECK(wk_events_truncate_dir(other, 2, &removed) == WK_ERR_IO);
  snprintf(other, sizeof other, "%s/missing", dir);
  CHECK(wk_events_truncate_dir(other, 2, &removed) == WK_OK && removed == 0);
  char command[600];
  snprintf(command, sizeof command, "rm -rf %s", dir);
  CHECK(system(command) == 0);
}

static void test_truncate_refuses_a_damaged_record_naming_its_offset(void) {
  char *dir = make_dir(), path[512];
  write_steps(dir, 100, path, sizeof path);
  int fd = open(path, O_WRONLY);
  uint8_t flipped = 0x55;
  CHECK(pwrite(fd, &flipped, 1, VERSION_RECORD + STEP_RECORD + 20) == 1); /* inside step 2's data */
  close(fd);
  uint64_t removed;
  CHECK(wk_events_truncate(path, 4, &removed) == WK_ERR_FORMAT);
  char want[64];
  snprintf(want, sizeof want, "offset %d: record data checksum mismatch", VERSION_RECORD + STEP_RECORD);
  CHECK(strstr(wk_last_error(), want) != NULL && strstr(wk_last_error(), path) != NULL);
  CHECK(file_size(path) == VERSION_RECORD + 5 * STEP_RECORD); /* nothing cut */
  char other[600];
  snprintf(other, sizeof other, "%s/not-events", dir);
  FILE *f = fopen(other, "w");
  fputs("{\"step\": 1}\n{\"step\": 2}\n", f);
  fclose(f);
  CHECK(wk_events_truncate(other, 0, &removed) == WK_ERR_FORMAT && strstr(wk_last_error(), "offset 0") != NULL);
  CHECK(wk_events_truncate(dir, 0, &removed) == WK_ERR_IO);
  char link[600];
  snprintf(link, sizeof link, "%s/events.out.tfevents.link", dir);
  CHECK(symlink(path, link) == 0);
  CHECK(wk_events_truncate(link, 0, &removed) == WK_ERR_IO); /* a link into our files is not followed */
  CHECK(file_size(path) == VERSION_RECORD + 5 * STEP_RECORD);
  if (geteuid() == 0) { /* as root: hand the file to nobody (65534), the other user of any system */
    CHECK(chown(path, 65534, 65534) == 0);
    CHECK(wk_events_truncate(path, 0, &removed) == WK_ERR_IO && strstr(wk_last_error(), "another user") != NULL);
    CHECK(file_size(path) == VERSION_RECORD + 5 * STEP_RECORD);
  } else {
    printf("skipped: a file of another user needs root to make\n");
  }
  char command[600];
  snprintf(command, sizeof command, "rm -rf %s", dir);
  CHECK(system(command) == 0);
}

int main(void) {
  RUN_TEST(test_crc32c_matches_rfc3720);
  RUN_TEST(test_file_is_the_known_bytes);
  RUN_TEST(test_bad_arguments_are_refused);
  RUN_TEST(test_truncate_cuts_later_steps_and_a_partial_tail);
  RUN_TEST(test_truncate_refuses_a_damaged_record_naming_its_offset);
  return check_failures ? 1 : 0;
}
