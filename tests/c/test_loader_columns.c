/*
 * test_loader_columns.c — the loader's columns from C: a pad-mode batch carries each row's record's
 * loss_mask (folded into loss_mask), label and image blob in place, a packed loader refuses the label,
 * and a per-token column read with its units (node cache, edges, a pad row's EOS) holds what the dataset
 * holds at the row's positions, in both modes, over small units drawn in many small buffers.
 *
 * `test_loader_columns write DIR RECORDS_PER_SHARD LABEL_KIND` writes the records dataset the Lua spec
 * reads (tests/loader/columns_spec.lua) from stdin, one record a line: TEXT<tab>MASK<tab>LABEL<tab>BLOB,
 * MASK one '0' or '1' per byte of TEXT; bytes tokenizer (a token a byte, EOS 256), columns loss_mask
 * (token_u8), label (LABEL_KIND i64 or f32) and image (bytes); zstd blocks of 512 tokens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "format/index.h"
#include "format/shard_writer.h"

enum { VOCAB = 257, EOS = 256, BLOCK_TOKENS = 512, LINE_BYTES = 4096, COLUMNS = 3 };

typedef struct {
  char text[LINE_BYTES], mask[LINE_BYTES], blob[LINE_BYTES];
  int64_t label;
} Record;

/* A shard's columns as the writer takes them. */
typedef struct {
  uint16_t *stream;
  uint64_t *starts, *blob_ends, tokens;
  uint8_t *mask, *blobs;
  int64_t *labels;
  float *scores;
} Shard;

static void shard_of(const Record *r, uint64_t docs, Shard *s) {
  uint64_t tokens = 0, blob_bytes = 0;
  for (uint64_t d = 0; d < docs; d++) tokens += strlen(r[d].text) + 1, blob_bytes += strlen(r[d].blob);
  *s = (Shard){.stream = malloc(tokens * 2), .starts = malloc(docs * 8), .blob_ends = malloc(docs * 8),
               .mask = malloc(tokens), .blobs = malloc(blob_bytes + 1), .labels = malloc(docs * 8),
               .scores = malloc(docs * 4)};
  uint64_t at = 0, blob_at = 0;
  for (uint64_t d = 0; d < docs; d++) {
    size_t n = strlen(r[d].text);
    s->starts[d] = at;
    for (size_t t = 0; t < n; t++, at++) s->stream[at] = (uint8_t)r[d].text[t], s->mask[at] = r[d].mask[t] == '1';
    s->stream[at] = EOS;
    s->mask[at] = n ? (uint8_t)(r[d].mask[n - 1] == '1') : 0; /* an EOS takes its record's last value */
    at++;
    memcpy(s->blobs + blob_at, r[d].blob, strlen(r[d].blob));
    blob_at += strlen(r[d].blob);
    s->blob_ends[d] = blob_at;
    s->labels[d] = r[d].label;
    s->scores[d] = (float)r[d].label;
  }
  s->tokens = tokens;
}

static void shard_free(Shard *s) {
  free(s->stream), free(s->starts), free(s->blob_ends), free(s->mask), free(s->blobs), free(s->labels), free(s->scores);
}

/* Writes records [0, count) into shards of per_shard records, and the index. */
static WkStatus write_dataset(const char *dir, const Record *records, uint64_t count, uint64_t per_shard, bool f32,
                              uint32_t block_tokens) {
  WkColumnInfo info[COLUMNS] = {{.name = "loss_mask", .kind = WK_COLUMN_TOKEN_U8, .dtype = WK_U8},
                                {.name = "label", .kind = f32 ? WK_COLUMN_F32 : WK_COLUMN_I64, .dtype = f32 ? WK_F32 : WK_I64},
                                {.name = "image", .kind = WK_COLUMN_BYTES, .dtype = WK_U8}};
  uint32_t shards = (uint32_t)((count + per_shard - 1) / per_shard);
  WkIndex ix = {.tokenizer = "bytes", .vocab_size = VOCAB, .eos = EOS, .token_bytes = 2, .shard_count = shards,
                .column_count = 1 + COLUMNS, .columns = calloc(1 + COLUMNS, sizeof(WkColumnInfo)),
                .shards = calloc(shards, sizeof(WkIndexShard))};
  wk_index_tokens_column(2, &ix.columns[0]);
  memcpy(ix.columns + 1, info, sizeof info);
  WkStatus status = WK_OK;
  for (uint32_t i = 0; i < shards && status == WK_OK; i++) {
    uint64_t first = i * per_shard, docs = count - first < per_shard ? count - first : per_shard;
    Shard s;
    shard_of(records + first, docs, &s);
    WkShardColumn columns[COLUMNS] = {
        {.info = info[0], .data = s.mask, .data_bytes = s.tokens},
        {.info = info[1], .data = f32 ? (void *)s.scores : (void *)s.labels, .data_bytes = docs * (f32 ? 4 : 8)},
        {.info = info[2], .data = s.blobs, .data_bytes = s.blob_ends[docs - 1], .blob_ends = s.blob_ends}};
    for (int c = 0; c < COLUMNS; c++) columns[c].info.element_bytes = c == 0 ? 1 : c == 1 ? (f32 ? 4 : 8) : 0;
    char path[1024];
    snprintf(path, sizeof path, "%s/shard-%05u.wks", dir, i);
    WkShardWriteOptions opt = {.token_bytes = 2, .vocab_size = VOCAB, .eos = EOS, .block_tokens = block_tokens,
                               .codec = WK_CODEC_ZSTD, .level = 3};
    WkShardWritten w = {0};
    status = wk_shard_write_columns(path, &opt, s.stream, s.tokens, s.starts, docs, columns, COLUMNS, &w);
    ix.shards[i] = (WkIndexShard){.name = strdup(path + strlen(dir) + 1), .tokens = s.tokens, .documents = docs,
                                  .bytes = w.bytes, .checksum = w.header_hash};
    ix.tokens += s.tokens;
    ix.documents += docs;
    shard_free(&s);
  }
  char *text = NULL, path[1024];
  size_t length = 0;
  if (status == WK_OK) status = wk_index_format(&ix, NULL, &text, &length);
  snprintf(path, sizeof path, "%s/index.json", dir);
  FILE *f = status == WK_OK ? fopen(path, "w") : NULL;
  if (status == WK_OK && (!f || fwrite(text, 1, length, f) != length)) status = WK_FAIL(WK_ERR_IO, "cannot write %s", path);
  if (f) fclose(f);
  free(text);
  ix.tokenizer = NULL; /* a literal */
  wk_index_free(&ix);
  return status;
}

/* One record a line of stdin (see the top of this file). */
static Record *read_records(FILE *in, uint64_t *count) {
  Record *records = NULL;
  char line[4 * LINE_BYTES];
  *count = 0;
  while (fgets(line, sizeof line, in)) {
    line[strcspn(line, "\n")] = 0;
    records = realloc(records, (*count + 1) * sizeof *records);
    Record *r = &records[(*count)++];
    char *fields[4] = {line, NULL, NULL, NULL};
    for (int f = 1; f < 4 && fields[f - 1]; f++) {
      char *tab = strchr(fields[f - 1], '\t');
      if (tab) *tab = 0, fields[f] = tab + 1;
    }
    snprintf(r->text, sizeof r->text, "%s", fields[0]);
    snprintf(r->mask, sizeof r->mask, "%s", fields[1] ? fields[1] : "");
    r->label = fields[2] ? strtoll(fields[2], NULL, 10) : 0;
    snprintf(r->blob, sizeof r->blob, "%s", fields[3] ? fields[3] : "");
  }
  return records;
}

/* ---- the loader over such a dataset ---------------------------------------------------------------- */

enum { SEQ = 24, DOCS = 40 };

static Record *made_records(void) {
  Record *r = calloc(DOCS, sizeof *r);
  for (int d = 0; d < DOCS; d++) {
    int n = snprintf(r[d].text, sizeof r[d].text, "r%d %.*s", d, d % 15, "abcdefghijklmnop");
    for (int t = 0; t < n; t++) r[d].mask[t] = t >= 3 && d % 4 ? '1' : '0';
    r[d].label = 100 + d;
    snprintf(r[d].blob, sizeof r[d].blob, "image %d", d);
  }
  return r;
}

static WkLoader *pad_loader(const char *dir, int mode) {
  WkLoader *l = wk_loader_new();
  uint32_t source;
  CHECK(wk_loader_add_source(l, dir, 0, &source) == WK_OK);
  CHECK(wk_loader_set(l, WK_LOADER_SEQ_LEN, SEQ) == WK_OK && wk_loader_set(l, WK_LOADER_GLOBAL_BATCH, 4) == WK_OK);
  CHECK(wk_loader_set(l, WK_LOADER_MODE, mode) == WK_OK && wk_loader_set(l, WK_LOADER_BLOB_BYTES, 32) == WK_OK);
  return l;
}

static void test_pad_rows(const char *dir, const Record *records) {
  WkLoader *l = pad_loader(dir, 1);
  const char *names[] = {"loss_mask", "label", "image"};
  for (int c = 0; c < 3; c++) CHECK(wk_loader_add_column(l, names[c]) == WK_OK);
  CHECK(wk_loader_start(l) == WK_OK);
  WkBatch b;
  CHECK(wk_loader_next(l, &b) == WK_OK);
  CHECK(b.column_count == 3 && b.column_sizes[0] == NULL && b.column_sizes[1] == NULL && b.column_sizes[2] != NULL);
  const int32_t *tokens = wk_tensor_data(b.tokens);
  const uint8_t *mask = wk_tensor_data(b.columns[0]), *trained = wk_tensor_data(b.loss_mask);
  const int64_t *labels = wk_tensor_data(b.columns[1]), *sizes = wk_tensor_data(b.column_sizes[2]);
  const char *blobs = wk_tensor_data(b.columns[2]);
  for (uint32_t row = 0; row < b.rows; row++) {
    int d = 0; /* the record the row's text names: "r<d> ..." */
    for (const int32_t *t = tokens + row * (SEQ + 1) + 1; *t != ' '; t++) d = d * 10 + (*t - '0');
    const Record *r = &records[d];
    int n = (int)strlen(r->text);
    CHECK(labels[row] == r->label);
    CHECK(sizes[row] == (int64_t)strlen(r->blob) && memcmp(blobs + row * 32, r->blob, strlen(r->blob)) == 0);
    for (int t = 0; t < SEQ; t++) {
      uint8_t want = t + 1 <= n && (t + 1 < n ? r->mask[t + 1] : r->mask[n - 1]) == '1';
      CHECK(trained[row * SEQ + t] == want);
      CHECK(mask[row * (SEQ + 1) + t] == (t < n ? r->mask[t] == '1' : t == n ? r->mask[n - 1] == '1' : 0));
    }
  }
  wk_loader_free(l);
}

static void test_packed_refuses_a_record_column(const char *dir) {
  WkLoader *l = pad_loader(dir, 0);
  CHECK(wk_loader_add_column(l, "label") == WK_OK);
  CHECK(wk_loader_start(l) == WK_ERR_INVALID_ARG);
  CHECK(strstr(wk_last_error(), "holds one i64 per record, but packed rows cut across records") != NULL);
  wk_loader_free(l);
}

/* Each row's loss_mask against the dataset's bytes at its sample's positions (pad: the EOS after its
 * record too, then 0), over `batches` micro-batches of 4 rows: units of one 64-token block, buffers of
 * two units, so straddlers come from edges, from units still resident, or from a decode of their own. */
static void test_token_column_matches_the_dataset(const char *dir, int mode, int batches) {
  WkLoader *l = pad_loader(dir, mode);
  CHECK(wk_loader_set(l, WK_LOADER_POOL_TOKENS, 128) == WK_OK && wk_loader_set(l, WK_LOADER_THREADS, 2) == WK_OK);
  CHECK(wk_loader_add_column(l, "loss_mask") == WK_OK);
  CHECK(wk_loader_start(l) == WK_OK);
  WkDataset *ds = wk_dataset_open(dir);
  uint32_t column = 0;
  CHECK(ds && wk_dataset_column_find(ds, "loss_mask", &column) == WK_OK);
  for (int i = 0; i < batches && ds; i++) {
    WkBatch b;
    CHECK(wk_loader_next(l, &b) == WK_OK);
    const uint8_t *mask = wk_tensor_data(b.columns[0]);
    for (uint32_t row = 0; row < b.rows; row++) {
      WkSampleInfo info;
      CHECK(wk_loader_sample_info(l, row, &info) == WK_OK);
      uint8_t want[SEQ + 1] = {0};
      uint64_t count = info.length + (mode == 1 && info.length < SEQ + 1);
      CHECK(wk_dataset_read_column(ds, column, info.shard, info.offset, count, want) == WK_OK);
      if (memcmp(mask + row * (SEQ + 1), want, SEQ + 1) != 0) {
        printf("  mode %d batch %d row %u (shard %u offset %llu length %llu): mask differs\n", mode, i, row, info.shard,
               (unsigned long long)info.offset, (unsigned long long)info.length);
        check_failures++;
      }
    }
  }
  WkLoaderStats stats;
  wk_loader_stats(l, &stats);
  CHECK(stats.node_edges_used + stats.node_edges_missing > 0); /* straddlers read their first part from an edge */
  wk_dataset_close(ds);
  wk_loader_free(l);
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "write") == 0) {
    uint64_t count;
    Record *records = read_records(stdin, &count);
    WkStatus status = count ? write_dataset(argv[2], records, count, strtoull(argv[3], NULL, 10),
                                            strcmp(argv[4], "f32") == 0, BLOCK_TOKENS)
                            : WK_FAIL(WK_ERR_INVALID_ARG, "no records on stdin");
    free(records);
    if (status != WK_OK) fprintf(stderr, "test_loader_columns write: %s\n", wk_last_error());
    return status == WK_OK ? 0 : 1;
  }
  char dir[] = "/tmp/wick-loader-columns-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  Record *records = made_records();
  CHECK(write_dataset(dir, records, DOCS, 12, false, BLOCK_TOKENS) == WK_OK);
  int before = check_failures;
  test_pad_rows(dir, records);
  printf("%s test_pad_rows\n", check_failures == before ? "ok" : "FAIL");
  before = check_failures;
  test_packed_refuses_a_record_column(dir);
  printf("%s test_packed_refuses_a_record_column\n", check_failures == before ? "ok" : "FAIL");
  char small[sizeof dir + 8];
  snprintf(small, sizeof small, "%s/small", dir);
  CHECK(mkdir(small, 0755) == 0 && write_dataset(small, records, DOCS, 12, false, 64) == WK_OK);
  before = check_failures;
  for (int mode = 0; mode <= 1; mode++) test_token_column_matches_the_dataset(small, mode, 60);
  printf("%s test_token_column_matches_the_dataset\n", check_failures == before ? "ok" : "FAIL");
  free(records);
  char command[256];
  snprintf(command, sizeof command, "rm -rf %s", dir);
  CHECK(system(command) == 0);
  return check_failures ? 1 : 0;
}
