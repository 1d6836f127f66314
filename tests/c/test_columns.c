/*
 * test_columns.c — format version 2 from C: the shard writer and the dataset reader round trip every column
 * kind (raw and zstd, columns of many blocks), a dataset of tokens only is still version 1 byte for byte, and
 * each bad column input is one error naming the file and what is wrong.
 *
 * `test_columns write DIR [raw]` writes the small dataset the Lua specs read (tests/dataset/columns_spec.lua),
 * zstd or raw (the fuzz seeds tests/fuzz/corpus/shard/v2-*.wks are its shards): 2 shards, 6 records with tokens, loss_mask, label, score, emb (f32 [2,3]) and image (PNG, JPEG, GIF,
 * WebP headers, plain bytes, an empty blob).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dataset/dataset.h"
#include "format/index.h"
#include "format/shard.h"
#include "format/shard_writer.h"

enum { VOCAB = 257, EOS = 256 };

static uint64_t hash_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  static uint8_t buf[1 << 22];
  *size = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (f) fclose(f);
  return wk_hash64(buf, *size);
}

static void write_text(const char *path, const char *text, size_t length) {
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(text, 1, length, f) == length);
  if (f) fclose(f);
}

/* dir/index.json from ix, as the converter formats it. */
static void write_index(const char *dir, const WkIndex *ix) {
  char *text;
  size_t length;
  CHECK(wk_index_format(ix, NULL, &text, &length) == WK_OK);
  char path[300];
  snprintf(path, sizeof path, "%s/index.json", dir);
  write_text(path, text, length);
  free(text);
}

static void remove_tree(const char *dir) {
  char command[300];
  snprintf(command, sizeof command, "rm -rf '%s'", dir);
  CHECK(system(command) == 0);
}

/* ---- a dataset of records ------------------------------------------------------------------------- */

/* One shard's records, as the converter would hand them to the writer. */
typedef struct {
  uint64_t docs, tokens;
  uint16_t *stream;        /* each record's tokens, then EOS */
  uint64_t *starts;
  uint8_t *mask;           /* token_u8: per position; an EOS repeats its record's last value, 0 when empty */
  int64_t *label;
  float *score;
  float *emb;              /* [docs][2][3] */
  uint8_t *blobs;
  uint64_t *blob_ends;
} Records;

static void records_free(Records *r) {
  free(r->stream), free(r->starts), free(r->mask), free(r->label), free(r->score), free(r->emb), free(r->blobs),
      free(r->blob_ends);
  memset(r, 0, sizeof *r);
}

static const WkColumnInfo COLUMNS[] = {
    {.name = "loss_mask", .kind = WK_COLUMN_TOKEN_U8, .dtype = WK_U8},
    {.name = "label", .kind = WK_COLUMN_I64, .dtype = WK_I64},
    {.name = "score", .kind = WK_COLUMN_F32, .dtype = WK_F32},
    {.name = "emb", .kind = WK_COLUMN_TENSOR, .dtype = WK_F32, .ndim = 2, .shape = {2, 3}},
    {.name = "image", .kind = WK_COLUMN_BYTES, .dtype = WK_U8},
};
enum { EXTRA = sizeof COLUMNS / sizeof COLUMNS[0] };

static void columns_of(const Records *r, WkShardColumn out[EXTRA]) {
  const void *data[EXTRA] = {r->mask, r->label, r->score, r->emb, r->blobs};
  uint64_t bytes[EXTRA] = {r->tokens, r->docs * 8, r->docs * 4, r->docs * 24, r->docs ? r->blob_ends[r->docs - 1] : 0};
  for (int c = 0; c < EXTRA; c++)
    out[c] = (WkShardColumn){.info = COLUMNS[c], .data = data[c], .data_bytes = bytes[c],
                             .blob_ends = c == 4 ? r->blob_ends : NULL};
}

/* Writes shards (names s0.wks, ...) and their index with columns [first, first + count) of COLUMNS. */
static WkIndex write_dataset(const char *dir, Records *shards, int shard_count, WkCodec codec, uint32_t block_tokens,
                             int first, int count) {
  WkIndex ix = {.tokenizer = "bytes", .vocab_size = VOCAB, .eos = EOS, .token_bytes = 2, .shard_count = shard_count};
  ix.shards = calloc(shard_count, sizeof *ix.shards);
  ix.column_count = 1 + count;
  ix.columns = calloc(1 + count, sizeof *ix.columns);
  wk_index_tokens_column(2, &ix.columns[0]);
  for (int c = 0; c < count; c++) ix.columns[1 + c] = COLUMNS[first + c];
  for (int s = 0; s < shard_count; s++) {
    WkShardColumn columns[EXTRA];
    columns_of(&shards[s], columns);
    char path[300];
    snprintf(path, sizeof path, "%s/s%d.wks", dir, s);
    WkShardWriteOptions opt = {.token_bytes = 2, .vocab_size = VOCAB, .eos = EOS, .block_tokens = block_tokens,
                               .codec = codec, .level = 3};
    WkShardWritten w = {0};
    WkStatus status = wk_shard_write_columns(path, &opt, shards[s].stream, shards[s].tokens, shards[s].starts,
                                             shards[s].docs, columns + first, (uint32_t)count, &w);
    if (status != WK_OK) fprintf(stderr, "%s\n", wk_last_error());
    CHECK(status == WK_OK);
    ix.shards[s] = (WkIndexShard){.name = strdup(path + strlen(dir) + 1), .tokens = shards[s].tokens,
                                  .documents = shards[s].docs, .bytes = w.bytes, .checksum = w.header_hash};
    ix.tokens += shards[s].tokens;
    ix.documents += shards[s].docs;
  }
  write_index(dir, &ix);
  return ix;
}

static void index_free(WkIndex *ix) {
  ix->tokenizer = NULL; /* a literal */
  wk_index_free(ix);
}

/* Random records: lengths 0..5, a mask, a label, a score, an embedding, a blob of 0..40 bytes (some repetitive). */
static Records random_records(uint64_t docs, unsigned seed) {
  Records r = {.docs = docs};
  r.stream = malloc(docs * 6 * sizeof *r.stream);
  r.mask = malloc(docs * 6);
  r.starts = malloc(docs * sizeof *r.starts);
  r.label = malloc(docs * sizeof *r.label);
  r.score = malloc(docs * sizeof *r.score);
  r.emb = malloc(docs * 6 * sizeof *r.emb);
  r.blobs = malloc(docs * 40 + 1);
  r.blob_ends = malloc(docs * sizeof *r.blob_ends);
  uint64_t blob_at = 0;
  for (uint64_t d = 0; d < docs; d++) {
    r.starts[d] = r.tokens;
    int n = rand_r(&seed) % 6;
    uint8_t last = 0;
    for (int k = 0; k < n; k++) {
      r.stream[r.tokens] = (uint16_t)(rand_r(&seed) % 256);
      r.mask[r.tokens++] = last = (uint8_t)(rand_r(&seed) % 2);
    }
    r.stream[r.tokens] = EOS;
    r.mask[r.tokens++] = last;
    r.label[d] = (int64_t)rand_r(&seed) - RAND_MAX / 2;
    r.score[d] = (float)rand_r(&seed) / 1000.0f;
    for (int k = 0; k < 6; k++) r.emb[d * 6 + k] = (float)(d * 6 + (uint64_t)k);
    int bytes = rand_r(&seed) % 41;
    bool plain = rand_r(&seed) % 2;
    for (int k = 0; k < bytes; k++) r.blobs[blob_at++] = plain ? (uint8_t)'a' : (uint8_t)rand_r(&seed);
    r.blob_ends[d] = blob_at;
  }
  return r;
}

/* ---- round trips ---------------------------------------------------------------------------------- */

static void check_dataset(WkDataset *ds, Records *shards, int shard_count) {
  CHECK(wk_dataset_column_count(ds) == 1 + EXTRA);
  WkColumnInfo info;
  CHECK(wk_dataset_column_info(ds, 0, &info) == WK_OK && strcmp(info.name, "tokens") == 0 &&
        info.kind == WK_COLUMN_TOKENS && info.dtype == WK_U16 && info.element_bytes == 2);
  CHECK(wk_dataset_column_info(ds, 4, &info) == WK_OK && strcmp(info.name, "emb") == 0 && info.ndim == 2 &&
        info.shape[0] == 2 && info.shape[1] == 3 && info.element_bytes == 24);
  uint32_t column = 0;
  CHECK(wk_dataset_column_find(ds, "image", &column) == WK_OK && column == 5);
  CHECK(wk_dataset_column_find(ds, "imag", &column) == WK_ERR_INVALID_ARG &&
        strstr(wk_last_error(), "no column 'imag' (its columns: tokens, loss_mask:token_u8, label:i64, score:f32, "
                                "emb:tensor(f32[2,3]), image:bytes)"));
  for (int s = 0; s < shard_count; s++) {
    const Records *r = &shards[s];
    uint8_t *mask = malloc(r->tokens + 1);
    int64_t *label = malloc(r->docs * 8 + 8);
    float *score = malloc(r->docs * 4 + 4), *emb = malloc(r->docs * 24 + 24);
    /* In uneven pieces, across block boundaries. */
    for (uint64_t at = 0, step = 1; at < r->tokens; at += step, step = step * 3 % 1001 + 1) {
      uint64_t n = at + step > r->tokens ? r->tokens - at : step;
      CHECK(wk_dataset_read_column(ds, 1, (uint32_t)s, at, n, mask + at) == WK_OK);
    }
    CHECK(memcmp(mask, r->mask, r->tokens) == 0);
    for (uint64_t at = 0, step = 7; at < r->docs; at += step, step = step * 5 % 3001 + 1) {
      uint64_t n = at + step > r->docs ? r->docs - at : step;
      CHECK(wk_dataset_read_column(ds, 2, (uint32_t)s, at, n, label + at) == WK_OK);
      CHECK(wk_dataset_read_column(ds, 3, (uint32_t)s, at, n, score + at) == WK_OK);
      CHECK(wk_dataset_read_column(ds, 4, (uint32_t)s, at, n, emb + at * 6) == WK_OK);
    }
    CHECK(memcmp(label, r->label, r->docs * 8) == 0);
    CHECK(memcmp(score, r->score, r->docs * 4) == 0);
    CHECK(memcmp(emb, r->emb, r->docs * 24) == 0);
    int blob_failures = 0;
    for (uint64_t d = 0; d < r->docs; d++) {
      uint8_t blob[64];
      uint64_t size = 0, start = d ? r->blob_ends[d - 1] : 0;
      if (wk_dataset_read_blob(ds, 5, (uint32_t)s, d, blob, sizeof blob, &size) != WK_OK ||
          size != r->blob_ends[d] - start || memcmp(blob, r->blobs + start, size) != 0)
        blob_failures++;
    }
    CHECK(blob_failures == 0);
    /* The loader's path: whole blocks of the per-token column into one buffer. */
    uint32_t block_tokens = 0;
    CHECK(wk_dataset_block_tokens(ds, &block_tokens) == WK_OK);
    uint64_t from = r->tokens > block_tokens ? block_tokens : 0;
    memset(mask, 0xee, r->tokens);
    CHECK(wk_dataset_decode_column_range(ds, 1, (uint32_t)s, from, r->tokens, mask) == WK_OK);
    CHECK(memcmp(mask, r->mask + from, r->tokens - from) == 0);
    CHECK(wk_dataset_decode_column_range(ds, 2, (uint32_t)s, 0, 1, mask) == WK_ERR_INVALID_ARG);
    /* Read-ahead of a column's blocks: any rows, past the end clipped; a column out of range refused. */
    CHECK(wk_dataset_advise_column(ds, 5, (uint32_t)s, 0, r->docs + 10, WK_ADVICE_WILLNEED) == WK_OK);
    CHECK(wk_dataset_advise_column(ds, 1, (uint32_t)s, 0, r->tokens, WK_ADVICE_WILLNEED) == WK_OK);
    CHECK(wk_dataset_advise_column(ds, 6, (uint32_t)s, 0, 1, WK_ADVICE_WILLNEED) == WK_ERR_INVALID_ARG);
    free(mask), free(label), free(score), free(emb);
  }
}

static void test_round_trip(void) {
  for (int codec = 0; codec < 2; codec++) {
    char dir[] = "/tmp/wick-test-columns-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    /* 20000 records: label and score take 2 and 1 blocks of 128 KiB, emb 10. */
    Records shards[2] = {random_records(20000, 1), random_records(3, 2)};
    WkIndex ix = write_dataset(dir, shards, 2, (WkCodec)codec, 1000, 0, EXTRA);
    WkDataset *ds = wk_dataset_open(dir);
    CHECK(ds != NULL);
    if (ds) {
      CHECK(wk_dataset_set(ds, WK_DATASET_BLOCK_CACHE_BYTES, 64 << 10) == WK_OK); /* smaller than a label block */
      check_dataset(ds, shards, 2);
      WkDatasetStats stats;
      wk_dataset_stats(ds, &stats);
      CHECK(codec == 0 || stats.blocks_decoded > 0);
      wk_dataset_close(ds);
    }
    records_free(&shards[0]);
    records_free(&shards[1]);
    index_free(&ix);
    remove_tree(dir);
  }
}

/* A shard of tokens only is the version 1 file Wick always wrote (hashes from before columns existed). */
static void test_version1_unchanged(void) {
  enum { N = 1000 };
  uint16_t t[N];
  for (int k = 0; k < N; k++) t[k] = (uint16_t)((k * 7919u) % 251u);
  uint64_t starts[5] = {0, 100, 350, 351, 700};
  for (int d = 1; d < 5; d++) t[starts[d] - 1] = EOS;
  t[N - 1] = EOS;
  const uint64_t want[2] = {0xa1c896615489dae3ull, 0x9908ef793860014aull};
  char dir[] = "/tmp/wick-test-v1-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[300];
  snprintf(path, sizeof path, "%s/g.wks", dir);
  for (int codec = 0; codec < 2; codec++) {
    WkShardWriteOptions opt = {.token_bytes = 2, .vocab_size = VOCAB, .eos = EOS, .block_tokens = 128,
                               .codec = (WkCodec)codec, .level = 3};
    WkShardWritten w;
    size_t size = 0;
    CHECK(wk_shard_write_columns(path, &opt, t, N, starts, 5, NULL, 0, &w) == WK_OK);
    CHECK(hash_file(path, &size) == want[codec] && size == w.bytes);
  }
  /* Its index: version 1, no "columns"; read back as the one tokens column. */
  WkIndexShard shard = {.name = "g.wks", .tokens = N, .documents = 5, .bytes = 128, .checksum = 1};
  WkIndex ix = {.version = WK_INDEX_VERSION, .tokenizer = "bytes", .vocab_size = VOCAB, .eos = EOS, .token_bytes = 2,
                .tokens = N, .documents = 5, .shard_count = 1, .shards = &shard};
  char *text;
  size_t length;
  CHECK(wk_index_format(&ix, NULL, &text, &length) == WK_OK);
  CHECK(strstr(text, "\"version\": 1,") && !strstr(text, "columns"));
  WkIndex back;
  CHECK(wk_index_parse(text, length, "index.json", &back) == WK_OK && back.column_count == 1 &&
        strcmp(back.columns[0].name, "tokens") == 0 && back.columns[0].element_bytes == 2);
  wk_index_free(&back);
  free(text);
  remove_tree(dir);
}

/* ---- bad input ------------------------------------------------------------------------------------ */

static bool fails_with(WkStatus status, WkStatus want, const char *text) {
  bool ok = status == want && strstr(wk_last_error(), text) != NULL;
  if (!ok) fprintf(stderr, "  expected %s '%s', got %s '%s'\n", wk_status_name(want), text, wk_status_name(status),
                   wk_last_error());
  return ok;
}

static void test_writer_refuses(void) {
  char dir[] = "/tmp/wick-test-colw-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[300];
  snprintf(path, sizeof path, "%s/s.wks", dir);
  Records r = random_records(10, 3);
  WkShardColumn columns[EXTRA];
  columns_of(&r, columns);
  WkShardWriteOptions opt = {.token_bytes = 2, .vocab_size = VOCAB, .eos = EOS, .block_tokens = 4, .codec = WK_CODEC_ZSTD};
  WkShardWritten w;
#define WRITE(cols, n) wk_shard_write_columns(path, &opt, r.stream, r.tokens, r.starts, r.docs, cols, n, &w)
  WkShardColumn bad = columns[0];
  bad.data_bytes = r.tokens - 1; /* a per-token column one short of its tokens */
  CHECK(fails_with(WRITE(&bad, 1), WK_ERR_INVALID_ARG, "column 'loss_mask' (token_u8): "));
  CHECK(strstr(wk_last_error(), "expected") && strstr(wk_last_error(), "tokens") && strstr(wk_last_error(), path));
  WkShardColumn twice[2] = {columns[1], columns[1]};
  CHECK(fails_with(WRITE(twice, 2), WK_ERR_INVALID_ARG, "two columns are named 'label'"));
  bad = columns[1];
  bad.info.dtype = WK_F32;
  CHECK(fails_with(WRITE(&bad, 1), WK_ERR_INVALID_ARG, "column 'label' (i64) holds dtype f32"));
  bad = columns[3];
  bad.info.ndim = 5;
  CHECK(fails_with(WRITE(&bad, 1), WK_ERR_INVALID_ARG, "column 'emb' (tensor) has 5 dimensions, expected 1..4"));
  bad = columns[4];
  bad.data_bytes += 1;
  CHECK(fails_with(WRITE(&bad, 1), WK_ERR_INVALID_ARG, "column 'image': "));
  bad = columns[2];
  snprintf(bad.info.name, sizeof bad.info.name, "tokens");
  CHECK(fails_with(WRITE(&bad, 1), WK_ERR_INVALID_ARG, "two columns are named 'tokens'"));
  snprintf(bad.info.name, sizeof bad.info.name, "9lives");
  CHECK(fails_with(WRITE(&bad, 1), WK_ERR_INVALID_ARG, "column name '9lives' is not"));
  CHECK(access(path, F_OK) != 0); /* nothing written */
#undef WRITE
  records_free(&r);
  remove_tree(dir);
}

static void test_index_refuses(void) {
  const char *head = "{\"format\": \"wick-dataset\", \"version\": 2, \"tokenizer\": \"bytes\", \"vocab_size\": 257, "
                     "\"eos\": 256, \"token_bytes\": 2, \"tokens\": 0, \"documents\": 0, \"shards\": [], ";
  const struct {
    const char *columns, *error;
  } cases[] = {
      {"\"columns\": [{\"name\": \"tokens\", \"kind\": \"tokens\"}, {\"name\": \"x\", \"kind\": \"floats\"}]",
       "index 'data/index.json' column 'x': unknown kind 'floats'"},
      {"\"columns\": [{\"name\": \"tokens\", \"kind\": \"tokens\"}, {\"name\": \"x\", \"kind\": \"i64\"}, "
       "{\"name\": \"x\", \"kind\": \"f32\"}]",
       "index 'data/index.json': two columns are named 'x'"},
      {"\"columns\": [{\"name\": \"x\", \"kind\": \"i64\"}]", "index 'data/index.json': the first column must be"},
      {"\"x\": 1", "index 'data/index.json': version 2 needs a \"columns\" list"},
      {"\"columns\": [{\"name\": \"tokens\", \"kind\": \"tokens\"}, {\"name\": \"e\", \"kind\": \"tensor\", "
       "\"dtype\": \"f16\", \"shape\": [2]}]",
       "index 'data/index.json' column 'e': a tensor needs \"dtype\""},
      {"\"columns\": [{\"name\": \"tokens\", \"kind\": \"tokens\"}, {\"name\": \"e\", \"kind\": \"tensor\", "
       "\"dtype\": \"f32\", \"shape\": [2, 0]}]",
       "index 'data/index.json' column 'e': \"shape\" must be 1 to 4 sizes"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s}", head, cases[i].columns);
    WkIndex ix;
    CHECK(fails_with(wk_index_parse(text, strlen(text), "data/index.json", &ix), WK_ERR_FORMAT, cases[i].error));
  }
  char text[1024];
  snprintf(text, sizeof text, "%s%s}", head,
           "\"columns\": [{\"name\": \"tokens\", \"kind\": \"tokens\"}, {\"name\": \"e\", \"kind\": \"tensor\", "
           "\"dtype\": \"i32\", \"shape\": [2, 5]}]");
  WkIndex ix;
  CHECK(wk_index_parse(text, strlen(text), "data/index.json", &ix) == WK_OK && ix.column_count == 2 &&
        ix.columns[1].element_bytes == 40 && ix.columns[1].dtype == WK_I32);
  char *again;
  size_t length;
  CHECK(wk_index_format(&ix, NULL, &again, &length) == WK_OK);
  CHECK(strstr(again, "\"version\": 2,") &&
        strstr(again, "\"columns\": [{\"name\": \"tokens\", \"kind\": \"tokens\"}, {\"name\": \"e\", \"kind\": "
                      "\"tensor\", \"dtype\": \"i32\", \"shape\": [2, 5]}],"));
  free(again);
  wk_index_free(&ix);
}

/* ---- damaged files: patched, then every checksum above the patch recomputed, so the reader meets the lie ---- */

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Reads shard s of dir, lets patch change it, re-hashes its column tables and header, writes it and the index. */
static void patch_shard(const char *dir, WkIndex *ix, int s, void (*patch)(uint8_t *d, size_t size)) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s", dir, ix->shards[s].name);
  static uint8_t d[1 << 20];
  FILE *f = fopen(path, "rb");
  size_t size = fread(d, 1, sizeof d, f);
  fclose(f);
  patch(d, size);
  uint32_t count = (uint32_t)get64(d + 68) & 0xffffffffu;
  uint64_t table = get64(d + 88) + get64(d + 40) * 8;
  for (uint32_t c = 0; c < count; c++) {
    uint8_t *e = d + table + c * WK_SHARD_COLUMN_ENTRY_BYTES;
    uint64_t at = get64(e + 88), blocks = get64(e + 80) & 0xffffffffu;
    if (at <= size && blocks * 24 <= size - at) put64(e + 96, wk_hash64(d + at, blocks * 24));
  }
  put64(d + 112, wk_hash64(d + table, (size_t)count * WK_SHARD_COLUMN_ENTRY_BYTES));
  put64(d + 120, wk_hash64(d, 120));
  write_text(path, (const char *)d, size);
  ix->shards[s].checksum = get64(d + 120);
  char *text;
  size_t length;
  CHECK(wk_index_format(ix, NULL, &text, &length) == WK_OK);
  snprintf(path, sizeof path, "%s/index.json", dir);
  write_text(path, text, length);
  free(text);
}

static uint8_t *column_entry(uint8_t *d, uint32_t c) {
  return d + get64(d + 88) + get64(d + 40) * 8 + c * WK_SHARD_COLUMN_ENTRY_BYTES;
}
/* Column 4 (image) is the last: its block 1's entry offset moved past the payload. */
static void blob_past_end(uint8_t *d, size_t size) {
  uint8_t *e = column_entry(d, 4);
  uint8_t *entry = d + get64(e + 88) + 1 * 24;
  put64(entry, size - 2);
}
static void lying_block_count(uint8_t *d, size_t size) {
  (void)size;
  put32(column_entry(d, 1) + 80, 2); /* label: 2 blocks for 3 records of one block */
}
static void same_name(uint8_t *d, size_t size) {
  (void)size;
  memcpy(column_entry(d, 2), "label", 6); /* score renamed label */
}
static void short_mask_block(uint8_t *d, size_t size) {
  (void)size;
  uint8_t *e = column_entry(d, 0);
  uint8_t *entry = d + get64(e + 88);
  put32(entry + 8, (uint32_t)get64(entry + 8) - 1); /* a raw mask block one byte short of its tokens */
}

static void test_damaged_columns(void) {
  const struct {
    void (*patch)(uint8_t *, size_t);
    const char *error;
  } cases[] = {
      {blob_past_end, "s0.wks' column 'image' block 1: stored at ["},
      {lying_block_count, "s0.wks' column 'label' (i64): 2 blocks, but 3 records in blocks of 16384 need 1"},
      {same_name, "s0.wks': two columns are named 'label'"},
      {short_mask_block, "s0.wks' column 'loss_mask' block 0: raw block of 3 bytes, expected 4"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[] = "/tmp/wick-test-cold-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    Records shards[1] = {random_records(3, 7)};
    WkIndex ix = write_dataset(dir, shards, 1, WK_CODEC_RAW, 4, 0, EXTRA);
    patch_shard(dir, &ix, 0, cases[i].patch);
    WkDataset *ds = wk_dataset_open(dir);
    CHECK(ds != NULL);
    if (ds) {
      CHECK(fails_with(wk_dataset_check_shard(ds, 0), WK_ERR_FORMAT, cases[i].error));
      wk_dataset_close(ds);
    }
    records_free(&shards[0]);
    index_free(&ix);
    remove_tree(dir);
  }
}

/* The index and a shard that disagree on the columns; calls on a column of the wrong kind. */
static void test_disagreement_and_wrong_kind(void) {
  char dir[] = "/tmp/wick-test-cols-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  Records shards[1] = {random_records(5, 9)};
  WkIndex ix = write_dataset(dir, shards, 1, WK_CODEC_ZSTD, 8, 0, EXTRA);
  WkDataset *ds = wk_dataset_open(dir);
  uint64_t size = 0;
  int64_t label;
  CHECK(fails_with(wk_dataset_read_blob(ds, 2, 0, 0, NULL, 0, &size), WK_ERR_INVALID_ARG,
                   "wk_dataset_read_blob cannot read column 'label' (i64)"));
  CHECK(fails_with(wk_dataset_read_column(ds, 5, 0, 0, 1, &label), WK_ERR_INVALID_ARG,
                   "wk_dataset_read_column cannot read column 'image' (bytes)"));
  CHECK(fails_with(wk_dataset_read_column(ds, 2, 0, 4, 2, &label), WK_ERR_INVALID_ARG,
                   "column 'label': rows [4, +2) past its end (5 rows)"));
  CHECK(fails_with(wk_dataset_read_blob(ds, 5, 0, 5, NULL, 0, &size), WK_ERR_INVALID_ARG, "record 5 out of range"));
  for (uint64_t d = 0; d < 5; d++) {
    uint64_t want = shards[0].blob_ends[d] - (d ? shards[0].blob_ends[d - 1] : 0);
    CHECK(wk_dataset_read_blob(ds, 5, 0, d, NULL, 0, &size) == WK_OK && size == want);
    if (want > 0) {
      uint8_t small[1];
      CHECK(want == 1 || fails_with(wk_dataset_read_blob(ds, 5, 0, d, small, 1, &size), WK_ERR_INVALID_ARG,
                                    "does not fit in 1"));
    }
  }
  wk_dataset_close(ds);
  /* The same shards under an index that lists other columns. */
  ix.columns[2].kind = WK_COLUMN_F32, ix.columns[2].dtype = WK_F32;
  write_index(dir, &ix);
  ds = wk_dataset_open(dir);
  CHECK(ds && fails_with(wk_dataset_check_shard(ds, 0), WK_ERR_FORMAT,
                         "s0.wks' has the columns (tokens, loss_mask:token_u8, label:i64, score:f32, "
                         "emb:tensor(f32[2,3]), image:bytes) but the index says (tokens, loss_mask:token_u8, "
                         "label:f32, "));
  wk_dataset_close(ds);
  /* A version 1 index over version 2 shards. */
  ix.column_count = 1;
  write_index(dir, &ix);
  ds = wk_dataset_open(dir);
  CHECK(ds && wk_dataset_column_count(ds) == 1 &&
        fails_with(wk_dataset_check_shard(ds, 0), WK_ERR_FORMAT, "but the index says (tokens)"));
  wk_dataset_close(ds);
  ix.column_count = 1 + EXTRA;
  records_free(&shards[0]);
  index_free(&ix);
  remove_tree(dir);
}

/* ---- the specs' dataset ------------------------------------------------------------------------------ */

static void add_record(Records *r, const uint16_t *tokens, const uint8_t *mask, int n, int64_t label, float score,
                       const void *blob, size_t blob_bytes) {
  uint64_t d = r->docs++;
  r->starts[d] = r->tokens;
  for (int k = 0; k < n; k++) r->stream[r->tokens] = tokens[k], r->mask[r->tokens++] = mask[k];
  r->stream[r->tokens] = EOS;
  r->mask[r->tokens++] = n ? mask[n - 1] : 0;
  r->label[d] = label;
  r->score[d] = score;
  for (int k = 0; k < 6; k++) r->emb[d * 6 + k] = (float)d + (float)k / 4;
  uint64_t at = d ? r->blob_ends[d - 1] : 0;
  memcpy(r->blobs + at, blob, blob_bytes);
  r->blob_ends[d] = at + blob_bytes;
}

static Records empty_records(void) {
  Records r = {0};
  r.stream = malloc(64 * sizeof *r.stream), r.mask = malloc(64), r.starts = malloc(8 * 8), r.label = malloc(8 * 8);
  r.score = malloc(8 * 4), r.emb = malloc(8 * 24), r.blobs = malloc(1024), r.blob_ends = malloc(8 * 8);
  return r;
}

static int write_spec_dataset(const char *dir, WkCodec codec) {
  /* PNG 64x48 (signature, IHDR), JPEG 40x30 (SOI, APP0, SOF0), GIF 2x3, WebP VP8X 5x7, plain bytes. */
  static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                                0, 0, 0, 64, 0, 0, 0, 48, 8, 6, 0, 0, 0, 1, 2, 3, 4};
  static const uint8_t jpeg[] = {0xff, 0xd8, 0xff, 0xe0, 0, 4, 'J', 'F', 0xff, 0xc0, 0, 11, 8, 0, 30, 0, 40, 1, 1,
                                 0x11, 0, 0xff, 0xd9};
  static const uint8_t gif[] = {'G', 'I', 'F', '8', '9', 'a', 2, 0, 3, 0, 0, 0, 0};
  static const uint8_t webp[] = {'R', 'I', 'F', 'F', 22, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X',
                                 10, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 6, 0, 0};
  Records shards[2] = {empty_records(), empty_records()};
  add_record(&shards[0], (const uint16_t[]){72, 105, 33}, (const uint8_t[]){0, 1, 1}, 3, 3, 0.5f, png, sizeof png);
  add_record(&shards[0], NULL, NULL, 0, -7, -1.25f, jpeg, sizeof jpeg);
  add_record(&shards[0], (const uint16_t[]){111, 107}, (const uint8_t[]){1, 0}, 2, 0, 2.0f, "hello", 5);
  add_record(&shards[1], (const uint16_t[]){120}, (const uint8_t[]){1}, 1, 5, 0.25f, gif, sizeof gif);
  add_record(&shards[1], (const uint16_t[]){97, 98, 99, 100}, (const uint8_t[]){1, 1, 0, 1}, 4, 9, 3.5f, "", 0);
  add_record(&shards[1], (const uint16_t[]){65}, (const uint8_t[]){0}, 1, 1, 0.1f, webp, sizeof webp);
  WkIndex ix = write_dataset(dir, shards, 2, codec, 4, 0, EXTRA);
  records_free(&shards[0]);
  records_free(&shards[1]);
  index_free(&ix);
  return check_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "write") == 0)
    return write_spec_dataset(argv[2], argc == 4 && strcmp(argv[3], "raw") == 0 ? WK_CODEC_RAW : WK_CODEC_ZSTD);
  RUN_TEST(test_round_trip);
  RUN_TEST(test_version1_unchanged);
  RUN_TEST(test_writer_refuses);
  RUN_TEST(test_index_refuses);
  RUN_TEST(test_damaged_columns);
  RUN_TEST(test_disagreement_and_wrong_kind);
  return check_failures ? 1 : 0;
}
