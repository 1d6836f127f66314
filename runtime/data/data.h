/*
 * runtime/data — datasets, from bytes on disk (or a server) to tensor-ready batches.
 *
 * Owns: the shard format and dataset index (format.h, FORMAT.md), byte sources (local file now,
 * HTTP/S3 later), the block cache, tokenizers and the converter, the deterministic sample order,
 * packing, mixing, the loader threads and the cursor. It knows nothing about tensors beyond
 * writing int32 tokens into caller-provided buffers.
 *
 * Layers, bottom up (each only calls the ones above it in this list):
 *   source.c    WkByteSource: size + read_at(offset) + optional zero-copy map, named for errors
 *   format*.c   shard + index reading/writing, block verification and decoding
 *   dataset.c   WkDataset: an opened index with lazily opened shards; token reads by (shard, offset)
 *   order.c     the global sample sequence: a pure function of (dataset, seed, epoch)
 *   pack.c      samples -> [micro_batch, seq_len+1] int32 rows + masks/doc ids
 *   mix.c       several sources -> one deterministic stream with per-source cursors
 *   loader.c    C threads that read, decode, pack and batch ahead into a bounded ring
 *
 * This header is the internal contract between those layers; the FFI-visible API is in wick.h.
 */
#ifndef WK_DATA_H
#define WK_DATA_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- byte sources ------------------------------------------------------------------------------ */

/* Anything that can serve byte ranges: a local file (pread, mmap), later HTTP and S3 objects.
 * Implementations must be safe to call read_at from several threads at once. */
typedef struct WkByteSource WkByteSource;
struct WkByteSource {
  const char *name;  /* path or URL, used in every error message */
  uint64_t size;     /* total bytes */
  /* Reads exactly length bytes at offset into dst; a short read is WK_ERR_FORMAT ("truncated"). */
  WkStatus (*read_at)(WkByteSource *self, uint64_t offset, size_t length, void *dst);
  /* Zero-copy view of [offset, offset+length) or NULL when the source cannot map (remote). */
  const void *(*map)(WkByteSource *self, uint64_t offset, size_t length);
  void (*close)(WkByteSource *self);
};

WkByteSource *wk_source_open_file(const char *path);

/* ---- datasets ----------------------------------------------------------------------------------- */

/* An opened dataset: the index is parsed at open (O(1) in shard data: no shard is touched);
 * shards are opened on first read. Reads are thread-safe. */
typedef struct WkDataset WkDataset;

typedef struct {
  const char *name;     /* shard file name relative to the dataset directory */
  uint64_t tokens;      /* tokens in the shard's stream, EOS separators included */
  uint64_t documents;   /* documents in the shard */
  uint64_t bytes;       /* shard file size */
} WkShardInfo;

/* path is a dataset directory (holding index.json) or the index file itself. */
WkDataset *wk_dataset_open(const char *path);
void wk_dataset_close(WkDataset *ds);

const char *wk_dataset_name(const WkDataset *ds);         /* the path it was opened from */
uint32_t wk_dataset_shard_count(const WkDataset *ds);
uint64_t wk_dataset_token_count(const WkDataset *ds);     /* all shards */
uint32_t wk_dataset_vocab_size(const WkDataset *ds);
uint32_t wk_dataset_eos(const WkDataset *ds);             /* the EOS token id separating documents */
WkStatus wk_dataset_shard_info(const WkDataset *ds, uint32_t shard, WkShardInfo *out);

/* The shard's token stream is its documents, each followed by one EOS token. Reads tokens
 * [offset, offset+count) of that stream, verifying and decoding every block it touches.
 * Bad data -> WK_ERR_FORMAT with a message naming the file, the block and the reason. */
WkStatus wk_dataset_read(WkDataset *ds, uint32_t shard, uint64_t offset, uint64_t count, uint32_t *out);

/* Document doc of a shard spans tokens [*start, *start + *length) of its stream, EOS excluded. */
WkStatus wk_dataset_document(WkDataset *ds, uint32_t shard, uint64_t doc, uint64_t *start,
                             uint64_t *length);

#ifdef __cplusplus
}
#endif
#endif /* WK_DATA_H */
