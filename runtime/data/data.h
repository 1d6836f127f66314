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
 *   format_shard.c  shard header, block table, document index: validation, block verify + decode
 *   format_index.c  index.json: parse + validate (safe names), deterministic serialization
 *   shard_writer.c  one shard file from a token stream (blocks compressed, checksummed)
 *   cache.c     the decoded-block cache: LRU, pinned entries, a byte budget, single-flight decodes
 *   dataset.c   WkDataset: an opened index with lazily opened shards; token reads by (shard, offset)
 *   tokenizer.c tokenizers behind one interface (bytes now; BPE later)
 *   convert.c   the converter pipeline (threads, ordering, shards, progress); convert_input.c cuts
 *               inputs (.txt, .jsonl, .jsonl.zst, .bin) into chunks and chunks into documents
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
/* Opens a location by its scheme: a local path (or file://) now; http://, https:// and s3:// report
 * WK_ERR_UNSUPPORTED until the remote sources exist. The dataset reader opens everything through
 * this, so remote datasets need no change above it. */
WkByteSource *wk_source_open(const char *location);
bool wk_source_is_remote(const char *location);

/* ---- datasets ----------------------------------------------------------------------------------- */

/* WkDataset, WkShardInfo and wk_dataset_* are public (Lua reads datasets through the FFI), so they
 * are declared in ../wick.h, data section, with the signatures this contract always had. Reads are
 * thread-safe; shards open on first use; memory is bounded by WK_DATASET_CACHE_BYTES and
 * WK_DATASET_MAX_OPEN_SHARDS, never by the dataset's size. */

#ifdef __cplusplus
}
#endif
#endif /* WK_DATA_H */
