/*
 * test_format.c — the format layer from C: JSON and UTF-8 edge cases, index name safety, the block
 * cache's budget, and a u32-token dataset (written with the shard writer) read by several threads at
 * once through a cache much smaller than the data.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/json.h"
#include "dataset/cache.h"
#include "format/shard_writer.h"
#include "format/index.h"
#include "format/shard.h"
#include "tokenizer/tokenizer.h"

/* ---- JSON ------------------------------------------------------------------------------------- */

static void test_json_tree(void) {
  const char *text = "{\"a\": [1, 2.5e3, -0, true, false, null], \"b\": \"x\\u00e9\\ud83d\\ude00\\n\", "
                     "\"n\": 18446744073709551615, \"big\": 18446744073709551616}";
  WkJson *root = NULL;
  CHECK(wk_json_parse(text, strlen(text), &root) == WK_OK);
  const WkJson *b = wk_json_get(root, "b");
  CHECK(b && b->type == WK_JSON_STRING && strcmp(b->string, "x\xc3\xa9\xf0\x9f\x98\x80\n") == 0);
  uint64_t v = 0;
  CHECK(wk_json_u64(wk_json_get(root, "n"), &v) && v == UINT64_MAX);
  CHECK(!wk_json_u64(wk_json_get(root, "big"), &v));
  CHECK(!wk_json_u64(wk_json_get(root, "a")->child->next, &v)); /* 2.5e3 is not an integer here */
  wk_json_free(root);

  const char *bad[] = {"", "{", "{\"a\" 1}", "[1,]", "{\"a\":1,}", "01", "\"\x01\"", "[1] x", "tru", "\"\\q\"",
                       "\"\xff\"", "\"\\ud800\"", "-", "1.", "1e",
                       "\"abcdefghijk\x01lmnopq\"", "\"abcdefghijklmnop\xc3\"", "\"abcdefgh"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    root = NULL;
    CHECK(wk_json_parse(bad[i], strlen(bad[i]), &root) == WK_ERR_FORMAT && root == NULL);
  }
  CHECK(strstr(wk_last_error(), "line 1 column") != NULL);

  /* Deep nesting is refused, not a stack overflow. */
  enum { DEPTH = 100000 };
  char *deep = malloc(2 * DEPTH);
  memset(deep, '[', DEPTH);
  memset(deep + DEPTH, ']', DEPTH);
  CHECK(wk_json_parse(deep, 2 * DEPTH, &root) == WK_ERR_FORMAT);
  CHECK(strstr(wk_last_error(), "nested too deeply") != NULL);
  WkScratch scratch = {0};
  const char *t;
  size_t n;
  char reason[128];
  memcpy(deep, "{\"a\":", 5);
  CHECK(!wk_json_line_field(deep, 2 * DEPTH, "text", &scratch, &t, &n, reason));
  free(deep);
  free(scratch.data);
}

static void test_json_line_field(void) {
  WkScratch scratch = {0};
  const char *t;
  size_t n;
  char reason[128];
  const char *line = "{\"id\": {\"text\": 1}, \"text\": \"a\\tb\", \"text\": \"second\"}";
  CHECK(wk_json_line_field(line, strlen(line), "text", &scratch, &t, &n, reason));
  CHECK(n == 3 && memcmp(t, "a\tb", 3) == 0);
  line = "{\"text\": \"0123456789abcdef\\\"quoted\\\" and \\\\ more than eight\"}";
  CHECK(wk_json_line_field(line, strlen(line), "text", &scratch, &t, &n, reason));
  CHECK(n == strlen("0123456789abcdef\"quoted\" and \\ more than eight"));
  CHECK(memcmp(t, "0123456789abcdef\"quoted\" and \\ more than eight", n) == 0);
  line = "{\"text\": \"nul\\u0000inside\"}";
  CHECK(wk_json_line_field(line, strlen(line), "text", &scratch, &t, &n, reason) && n == 10 && t[3] == '\0');
  line = "{\"text\": \"x\"";
  CHECK(!wk_json_line_field(line, strlen(line), "text", &scratch, &t, &n, reason));
  CHECK(strstr(reason, "invalid JSON at column") != NULL);
  line = "[\"text\"]";
  CHECK(!wk_json_line_field(line, strlen(line), "text", &scratch, &t, &n, reason));
  CHECK(strstr(reason, "not a JSON object") != NULL);
  free(scratch.data);
}

static void test_utf8(void) {
  struct { const char *s; size_t valid; } cases[] = {
      {"plain ascii text, long enough for the 8-byte path", 49},
      {"caf\xc3\xa9", 5},
      {"\xc0\xaf", 0},          /* overlong */
      {"a\xed\xa0\x80", 1},     /* surrogate */
      {"\xf4\x90\x80\x80", 0},  /* past U+10FFFF */
      {"ab\xe2\x82", 2},        /* truncated */
      {"\xf0\x9f\x98\x80!", 5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    CHECK(wk_utf8_valid_prefix((const uint8_t *)cases[i].s, strlen(cases[i].s)) == cases[i].valid);
}

static void test_index_names(void) {
  const char *ok[] = {"shard-00000.wks", "a/b/c.wks", "..x", "x..", "a.b"};
  const char *bad[] = {"", "/abs", "..", "../x", "a/../b", "a/..", "./a", "a//b", "a/", "a\\b", "a\nb"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) CHECK(wk_index_name_is_safe(ok[i]));
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK(!wk_index_name_is_safe(bad[i]));
}

/* ---- cache --------------------------------------------------------------------------------------- */

static WkCacheEntry *put(WkBlockCache *c, uint64_t key, uint64_t bytes) {
  bool fill = false;
  WkCacheEntry *e = wk_cache_get(c, key, bytes, &fill);
  if (e && fill) {
    wk_cache_buffer(e, "test");
    wk_cache_fill(c, e);
  }
  return e;
}

static void test_cache_budget_and_pins(void) {
  WkBlockCache *c = wk_cache_new(300);
  WkCacheEntry *a = put(c, 1, 100);
  WkCacheEntry *b = put(c, 2, 100);
  CHECK(a && b);
  wk_cache_release(c, b);
  /* 150 more: b (unpinned) goes, a stays pinned. */
  WkCacheEntry *d = put(c, 3, 150);
  CHECK(d != NULL);
  WkDatasetStats s;
  wk_cache_stats(c, &s);
  CHECK(s.cache_bytes == 250 && s.cache_peak_bytes <= 300);
  /* Everything pinned: a reservation that does not fit is refused. */
  CHECK(put(c, 4, 100) == NULL);
  bool fill = true;
  WkCacheEntry *hit = wk_cache_get(c, 1, 100, &fill);
  CHECK(hit == a && !fill);
  wk_cache_release(c, hit);
  wk_cache_release(c, a);
  wk_cache_release(c, d);
  wk_cache_set_budget(c, 100);
  wk_cache_stats(c, &s);
  CHECK(s.cache_bytes <= 100);
  /* An abandoned reservation leaves nothing behind: the next reader reserves afresh. */
  WkCacheEntry *r = wk_cache_get(c, 9, 50, &fill);
  CHECK(r && fill);
  wk_cache_abandon(c, r);
  r = wk_cache_get(c, 9, 50, &fill);
  CHECK(r && fill);
  wk_cache_buffer(r, "test");
  wk_cache_fill(c, r);
  wk_cache_release(c, r);
  wk_cache_free(c);
}

/* Many threads missing the same block: one decodes, the others wait and hit. */
typedef struct {
  WkBlockCache *cache;
  int decodes;
  pthread_mutex_t lock;
} Flight;

static void *want_block(void *arg) {
  Flight *f = arg;
  for (uint64_t key = 0; key < 200; key++) {
    bool fill = false;
    WkCacheEntry *e = wk_cache_get(f->cache, key, 64, &fill);
    if (!e) continue;
    if (fill) {
      uint8_t *data = wk_cache_buffer(e, "test");
      for (int k = 0; k < 64; k++) data[k] = (uint8_t)key;
      pthread_mutex_lock(&f->lock);
      f->decodes++;
      pthread_mutex_unlock(&f->lock);
      wk_cache_fill(f->cache, e);
    }
    const uint8_t *d = wk_cache_data(e);
    if (d[0] != (uint8_t)key || d[63] != (uint8_t)key) abort();
    wk_cache_release(f->cache, e);
  }
  return NULL;
}

static void test_cache_single_flight(void) {
  Flight f = {.cache = wk_cache_new(1 << 20)};
  pthread_mutex_init(&f.lock, NULL);
  pthread_t threads[4];
  for (int t = 0; t < 4; t++) pthread_create(&threads[t], NULL, want_block, &f);
  for (int t = 0; t < 4; t++) pthread_join(threads[t], NULL);
  CHECK(f.decodes == 200); /* each block decoded once, whoever asked first */
  WkDatasetStats s;
  wk_cache_stats(f.cache, &s);
  CHECK(s.cache_hits == 600 && s.cache_misses == 200);
  wk_cache_free(f.cache);
  pthread_mutex_destroy(&f.lock);
}

/* ---- a u32 dataset read by several threads ---------------------------------------------------------- */

enum { DOCS = 400, THREADS = 4, READS = 3000, VOCAB = 100000, EOS = 99999 };

typedef struct {
  WkDataset *ds;
  uint32_t *expected[2];
  uint64_t tokens[2];
  unsigned seed;
  int failures;
} Reader;

static void *read_randomly(void *arg) {
  Reader *r = arg;
  uint32_t *out = malloc(5000 * sizeof *out);
  for (int i = 0; i < READS; i++) {
    uint32_t shard = (uint32_t)(rand_r(&r->seed) % 2);
    uint64_t offset = (uint64_t)rand_r(&r->seed) % r->tokens[shard];
    uint64_t count = 1 + (uint64_t)rand_r(&r->seed) % 4999;
    if (count > r->tokens[shard] - offset) count = r->tokens[shard] - offset;
    if (wk_dataset_read(r->ds, shard, offset, count, out) != WK_OK ||
        memcmp(out, r->expected[shard] + offset, count * sizeof *out) != 0)
      r->failures++;
  }
  free(out);
  return NULL;
}

static void test_u32_dataset_concurrent_reads(void) {
  char dir[] = "/tmp/wick-test-format-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  WkIndex index = {.version = 1, .tokenizer = "test", .vocab_size = VOCAB, .eos = EOS, .token_bytes = 4,
                   .shard_count = 2};
  WkIndexShard shards[2];
  uint32_t *expected[2];
  uint64_t tokens[2];
  unsigned seed = 12345;
  for (int s = 0; s < 2; s++) {
    uint32_t *stream = malloc(DOCS * 600 * sizeof *stream);
    uint64_t *starts = malloc(DOCS * sizeof *starts);
    uint8_t *stored = malloc(DOCS * 600 * 4);
    uint64_t n = 0;
    for (int d = 0; d < DOCS; d++) {
      starts[d] = n;
      int length = rand_r(&seed) % 500;
      for (int k = 0; k < length; k++) stream[n++] = (uint32_t)(rand_r(&seed) % (VOCAB - 1)) / (1 + k % 7);
      stream[n++] = EOS;
    }
    memcpy(stored, stream, n * 4); /* little-endian host */
    char path[256];
    snprintf(path, sizeof path, "%s/s%d.wks", dir, s);
    WkShardWriteOptions opt = {.token_bytes = 4, .vocab_size = VOCAB, .eos = EOS, .block_tokens = 1000,
                               .codec = s == 0 ? WK_CODEC_ZSTD : WK_CODEC_RAW, .level = 1};
    WkShardWritten written;
    CHECK(wk_shard_write(path, &opt, stored, n, starts, DOCS, &written) == WK_OK);
    shards[s] = (WkIndexShard){.name = s == 0 ? "s0.wks" : "s1.wks", .tokens = n, .documents = DOCS,
                               .bytes = written.bytes, .checksum = written.header_hash};
    index.tokens += n;
    index.documents += DOCS;
    expected[s] = stream;
    tokens[s] = n;
    free(starts);
    free(stored);
  }
  index.shards = shards;
  char *text;
  size_t length;
  CHECK(wk_index_format(&index, NULL, &text, &length) == WK_OK);
  char path[256];
  snprintf(path, sizeof path, "%s/index.json", dir);
  FILE *f = fopen(path, "wb");
  fwrite(text, 1, length, f);
  fclose(f);
  free(text);

  WkDataset *ds = wk_dataset_open(dir);
  CHECK(ds != NULL);
  if (ds) {
    CHECK(wk_dataset_token_bytes(ds) == 4 && wk_dataset_vocab_size(ds) == VOCAB && wk_dataset_eos(ds) == EOS);
    CHECK(wk_dataset_set(ds, WK_DATASET_BLOCK_CACHE_BYTES, 3 * 4000) == WK_OK); /* 3 of 20+ blocks */
    CHECK(wk_dataset_set(ds, WK_DATASET_MAX_OPEN_SHARDS, 1) == WK_OK);
    Reader readers[THREADS];
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) {
      readers[t] = (Reader){.ds = ds, .expected = {expected[0], expected[1]}, .tokens = {tokens[0], tokens[1]},
                            .seed = (unsigned)t + 1};
      pthread_create(&threads[t], NULL, read_randomly, &readers[t]);
    }
    int failures = 0;
    for (int t = 0; t < THREADS; t++) {
      pthread_join(threads[t], NULL);
      failures += readers[t].failures;
    }
    CHECK(failures == 0);
    WkDatasetStats s;
    wk_dataset_stats(ds, &s);
    CHECK(s.cache_peak_bytes <= 3 * 4000);
    CHECK(s.open_shards <= 1);
    uint64_t start, len;
    CHECK(wk_dataset_document(ds, 1, 0, &start, &len) == WK_OK && start == 0);
    CHECK(wk_dataset_document(ds, 1, DOCS - 1, &start, &len) == WK_OK && start + len + 1 == tokens[1]);
    CHECK(wk_dataset_document(ds, 1, DOCS, &start, &len) == WK_ERR_INVALID_ARG);
    wk_dataset_close(ds);
  }
  free(expected[0]);
  free(expected[1]);
  char command[300];
  snprintf(command, sizeof command, "rm -rf '%s'", dir);
  CHECK(system(command) == 0);
}

/* Threads asking for the same corrupted zstd block all get the error; none hangs or gets tokens. */
typedef struct {
  WkDataset *ds;
  int errors;
} Victim;

static void *read_bad_block(void *arg) {
  Victim *v = arg;
  uint32_t out[16];
  for (int i = 0; i < 50; i++)
    if (wk_dataset_read(v->ds, 0, 1000 + (uint64_t)i, 16, out) == WK_ERR_FORMAT &&
        strstr(wk_last_error(), "block 1: checksum") != NULL)
      v->errors++;
  return NULL;
}

static void test_corrupt_block_concurrent_readers(void) {
  char dir[] = "/tmp/wick-test-corrupt-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  enum { N = 5000 };
  uint16_t *tokens = malloc(N * sizeof *tokens);
  for (int k = 0; k < N; k++) tokens[k] = (uint16_t)(k % 97);
  tokens[N - 1] = 256;
  uint64_t start = 0;
  char path[300];
  snprintf(path, sizeof path, "%s/s.wks", dir);
  WkShardWriteOptions opt = {.token_bytes = 2, .vocab_size = 257, .eos = 256, .block_tokens = 1000,
                             .codec = WK_CODEC_ZSTD, .level = 1};
  WkShardWritten written;
  CHECK(wk_shard_write(path, &opt, tokens, N, &start, 1, &written) == WK_OK);
  /* Block 1 starts at the second table entry's offset; damage its middle. */
  FILE *f = fopen(path, "r+b");
  uint8_t header[128], entry[24];
  CHECK(fread(header, 1, 128, f) == 128);
  uint64_t table = 0, offset = 0;
  for (int i = 7; i >= 0; i--) table = table << 8 | header[80 + i];
  fseek(f, (long)(table + 24), SEEK_SET);
  CHECK(fread(entry, 1, 24, f) == 24);
  for (int i = 7; i >= 0; i--) offset = offset << 8 | entry[i];
  fseek(f, (long)offset + 5, SEEK_SET);
  fputc(0xAB, f);
  fclose(f);
  WkIndexShard shard = {.name = "s.wks", .tokens = N, .documents = 1, .bytes = written.bytes,
                        .checksum = written.header_hash};
  WkIndex index = {.version = 1, .tokenizer = "bytes", .vocab_size = 257, .eos = 256, .token_bytes = 2,
                   .tokens = N, .documents = 1, .shard_count = 1, .shards = &shard};
  char *text;
  size_t length;
  CHECK(wk_index_format(&index, NULL, &text, &length) == WK_OK);
  snprintf(path, sizeof path, "%s/index.json", dir);
  f = fopen(path, "wb");
  fwrite(text, 1, length, f);
  fclose(f);
  free(text);
  WkDataset *ds = wk_dataset_open(dir);
  CHECK(ds != NULL);
  if (ds) {
    Victim victims[4];
    pthread_t threads[4];
    for (int t = 0; t < 4; t++) {
      victims[t] = (Victim){.ds = ds};
      pthread_create(&threads[t], NULL, read_bad_block, &victims[t]);
    }
    for (int t = 0; t < 4; t++) {
      pthread_join(threads[t], NULL);
      CHECK(victims[t].errors == 50);
    }
    uint32_t out[10];
    CHECK(wk_dataset_read(ds, 0, 0, 10, out) == WK_OK && out[5] == 5); /* block 0 is fine */
    WkDatasetStats s;
    wk_dataset_stats(ds, &s);
    CHECK(s.cache_bytes <= 2 * 1000 * 2); /* no reservation left behind for the bad block */
    wk_dataset_close(ds);
  }
  free(tokens);
  char command[300];
  snprintf(command, sizeof command, "rm -rf '%s'", dir);
  CHECK(system(command) == 0);
}

/* Every header check, each on a header that is valid but for one field (re-encoded, so the checksum
 * holds and the check behind it is what answers). */
static void test_header_checks(void) {
  WkShardHeader good = {.version = 1, .token_bytes = 2, .codec = WK_CODEC_ZSTD, .block_tokens = 100,
                        .block_count = 3, .vocab_size = 257, .eos = 256, .tokens = 250, .documents = 2,
                        .payload_offset = 128, .block_table_offset = 1024, .doc_index_offset = 1024 + 72};
  good.file_bytes = good.doc_index_offset + 16;
  uint8_t bytes[WK_SHARD_HEADER_BYTES];
  WkShardHeader parsed;
  wk_shard_header_encode(&good, bytes);
  CHECK(wk_shard_header_parse(bytes, sizeof bytes, good.file_bytes, "s", &parsed) == WK_OK);
  CHECK(parsed.tokens == 250 && parsed.header_hash != 0);
  struct { const char *field; uint64_t value; const char *message; } cases[] = {
      {"flags", 4, "unknown flags 0x4"},
      {"token_bytes", 3, "token width 3 bytes"},
      {"codec", 9, "unknown codec 9"},
      {"block_tokens", 0, "0 tokens per block"},
      {"vocab_size", 70000, "vocabulary 70000 with EOS 256 does not fit 2-byte tokens"},
      {"eos", 257, "EOS 257"},
      {"block_count", 2, "2 blocks for 250 tokens"},
      {"documents", 251, "251 documents cannot end 250 tokens"},
      {"file_bytes", 5000, "header says 5000 bytes but the file has"},
      {"block_table_offset", 1000, "do not tile the file"},
      {"payload_offset", 64, "do not tile the file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    WkShardHeader h = good;
    const char *f = cases[i].field;
    uint64_t v = cases[i].value;
    if (!strcmp(f, "flags")) h.flags = (uint32_t)v;
    else if (!strcmp(f, "token_bytes")) h.token_bytes = (uint32_t)v;
    else if (!strcmp(f, "codec")) h.codec = (uint32_t)v;
    else if (!strcmp(f, "block_tokens")) h.block_tokens = (uint32_t)v;
    else if (!strcmp(f, "vocab_size")) h.vocab_size = (uint32_t)v;
    else if (!strcmp(f, "eos")) h.eos = (uint32_t)v;
    else if (!strcmp(f, "block_count")) h.block_count = (uint32_t)v;
    else if (!strcmp(f, "documents")) h.documents = v;
    else if (!strcmp(f, "file_bytes")) h.file_bytes = v;
    else if (!strcmp(f, "block_table_offset")) h.block_table_offset = v;
    else if (!strcmp(f, "payload_offset")) h.payload_offset = v;
    wk_shard_header_encode(&h, bytes);
    WkStatus status = wk_shard_header_parse(bytes, sizeof bytes, good.file_bytes, "s", &parsed);
    bool named = strstr(wk_last_error(), cases[i].message) != NULL;
    if (status != WK_ERR_FORMAT || !named) fprintf(stderr, "%s: %s\n", f, wk_last_error());
    CHECK(status == WK_ERR_FORMAT && named);
  }
  /* Block entries: outside the payload, a raw size that is not the token count, a zstd size past the
   * bound. */
  uint8_t table[3 * WK_SHARD_BLOCK_ENTRY_BYTES];
  WkBlockEntry entries[3] = {{.offset = 128, .stored_bytes = 50, .codec = WK_CODEC_ZSTD},
                             {.offset = 200, .stored_bytes = 201, .codec = WK_CODEC_RAW},
                             {.offset = 1000, .stored_bytes = 100, .codec = WK_CODEC_ZSTD}};
  for (int b = 0; b < 3; b++) wk_block_entry_encode(&entries[b], table + b * WK_SHARD_BLOCK_ENTRY_BYTES);
  WkBlockEntry e;
  CHECK(wk_block_entry_parse(table, &good, 0, "s", &e) == WK_OK && e.stored_bytes == 50);
  CHECK(wk_block_entry_parse(table, &good, 1, "s", &e) == WK_ERR_FORMAT && strstr(wk_last_error(), "raw block of 201 bytes, expected 200"));
  CHECK(wk_block_entry_parse(table, &good, 2, "s", &e) == WK_ERR_FORMAT && strstr(wk_last_error(), "outside the payload"));
}

int main(void) {
  RUN_TEST(test_json_tree);
  RUN_TEST(test_json_line_field);
  RUN_TEST(test_utf8);
  RUN_TEST(test_index_names);
  RUN_TEST(test_header_checks);
  RUN_TEST(test_cache_budget_and_pins);
  RUN_TEST(test_cache_single_flight);
  RUN_TEST(test_u32_dataset_concurrent_reads);
  RUN_TEST(test_corrupt_block_concurrent_readers);
  return check_failures ? 1 : 0;
}
