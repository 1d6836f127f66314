/*
 * runtime/data — datasets, from bytes on disk (or a server) to tensor-ready batches.
 *
 * Owns: the shard format (shard.h, FORMAT.md) and the dataset index (index.h), blobs (local files, and
 * HTTP/S3 objects in remote/), the block caches, tokenizers and the converter, the deterministic sample
 * order, the node cache that follows it, packing, mixing, the loader threads and the cursor. Of
 * tensors it knows only the loader's batches (device_copy.c): views of its pinned ring, or copies on a device.
 *
 * Layers, bottom up (each only calls the ones above it in this list):
 *   blob.c      WkBlob: a named run of bytes read by range, optionally mapped (a local file)
 *   remote/     remote blobs: HTTP(S) and S3 objects read by range through a node-shared disk cache
 *   shard.c     shard header, block table, document index: validation, block verify + decode
 *   index.c     index.json: parse + validate (safe names), deterministic serialization
 *   cache.c     the decoded-block cache of plain reads (wk_dataset_read): LRU, pinned entries, a budget
 *   dataset.c   WkDataset: an opened index with lazily opened shards; token reads by (shard, offset)
 *   tokenizer.c tokenizers behind one interface (tokenizer.h): bytes, and byte-level BPE from
 *               tokenizer.json and tiktoken files (tokenizer/, its own layers in tokenizer/bpe.h)
 *   convert/    the converter: its pipeline (threads, ordering, shards, progress), its inputs (.txt,
 *               .jsonl, .jsonl.zst, .bin cut into chunks and documents; Parquet through its own reader
 *               in convert/parquet/, WebDataset tar through libarchive), its output directory (lock,
 *               staging directory, swap) and the shard writer
 *   order.c     the global sample sequence: a pure function of (dataset, seed, epoch), in windows of
 *               shards, buffers of units (blocks) and samples, with the residency each sample needs
 *   unitcache.c the node's decoded units and straddler edges, shared by its ranks, held by the order
 *   residency.c a source's reads for the loader, through the unit cache (zstd decoded, raw copied)
 *   pack.c      a sample's tokens in a row -> the row's mask, padding, doc ids and positions
 *   mix.c       several sources -> one deterministic stream with per-source cursors
 *   cursor.c    the stream's state as a short line of text
 *   loader.c    C threads that read, decode, pack and batch ahead into a bounded ring
 *   device_copy.c  a ring slot's batch as tensors, and its copy to the loader's device
 *
 * This header is the internal contract between those layers; the FFI-visible API is in wick.h.
 */
#ifndef WK_DATA_H
#define WK_DATA_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- blobs ------------------------------------------------------------------------------ */

/* Anything that can serve byte ranges: a local file (pread, mmap), later HTTP and S3 objects.
 * Implementations must be safe to call read_at from several threads at once. */
typedef struct WkBlob WkBlob;
typedef enum { WK_ADVICE_WILLNEED = 0, WK_ADVICE_DONTNEED = 1 } WkAdvice;
struct WkBlob {
  const char *name;  /* path or URL, used in every error message */
  uint64_t size;     /* total bytes */
  /* Reads exactly length bytes at offset into dst; a short read is WK_ERR_FORMAT ("truncated"). */
  WkStatus (*read_at)(WkBlob *self, uint64_t offset, size_t length, void *dst);
  /* Zero-copy view of [offset, offset+length) or NULL when the source cannot map (remote). */
  const void *(*map)(WkBlob *self, uint64_t offset, size_t length);
  /* A hint about [offset, offset+length): soon needed (read ahead) or done with (let its pages go, so
   * resident memory does not grow with what has been read). Never fails; a source may ignore it. */
  void (*advise)(WkBlob *self, uint64_t offset, uint64_t length, WkAdvice advice);
  /* Drops any cached copy of [offset, offset+length), found corrupt, so the next read fetches it from
   * its origin. NULL for sources that are their own origin (local files). */
  void (*forget)(WkBlob *self, uint64_t offset, uint64_t length);
  void (*close)(WkBlob *self);
};

/* Opens a local regular file; anything else (a FIFO, device, directory, socket) is refused before a
 * byte is read, with what it is ("'x' is a FIFO (named pipe), not a regular file"). */
WkBlob *wk_blob_open_file(const char *path);
/* Opens a local location: a path or file://path. http://, https:// and s3:// are opened through a
 * remote context (remote/remote.h: wk_remote_blob_open), which the dataset owns. */
WkBlob *wk_blob_open(const char *location);
bool wk_blob_is_remote(const char *location);

/* ---- remote sources: option defaults and ranges (remote/remote.c checks them; the loader's parameter
 * table hands the same ones to Lua) ------------------------------------------------------------------ */
#define WK_REMOTE_CACHE_DISK_BYTES_DEFAULT (16ll << 30)
#define WK_REMOTE_PREFETCH_BYTES_DEFAULT (64ll << 20)
#define WK_REMOTE_PREFETCH_BYTES_MAX (1ll << 40)
#define WK_REMOTE_MAX_TRANSFERS_DEFAULT 16
#define WK_REMOTE_MAX_TRANSFERS_MAX 256
#define WK_REMOTE_CONNECT_TIMEOUT_MS_DEFAULT 10000
#define WK_REMOTE_STALL_TIMEOUT_MS_DEFAULT 30000
#define WK_REMOTE_REQUEST_TIMEOUT_MS_DEFAULT 600000
#define WK_REMOTE_TIMEOUT_MS_MAX (24ll * 3600 * 1000)
#define WK_REMOTE_RETRIES_DEFAULT 5
#define WK_REMOTE_RETRIES_MAX 100
#define WK_REMOTE_LOW_SPEED_BYTES_PER_S_DEFAULT 1024
#define WK_REMOTE_LOW_SPEED_BYTES_PER_S_MAX (1ll << 30)
#define WK_REMOTE_LOW_SPEED_WINDOW_MS_DEFAULT 30000

/* ---- datasets ----------------------------------------------------------------------------------- */

/* WkDataset, WkShardInfo and wk_dataset_* are public (Lua reads datasets through the FFI), so they
 * are declared in ../wick.h, data section, with the signatures this contract always had. Reads are
 * thread-safe; shards open on first use; memory is bounded by WK_DATASET_CACHE_BYTES and
 * WK_DATASET_MAX_OPEN_SHARDS, never by the dataset's size.
 *
 * What the loader's reads (residency.c) need beyond that: */

/* Tokens per block, one value for the whole dataset (every shard is checked against it when it opens). */
WkStatus wk_dataset_block_tokens(WkDataset *ds, uint32_t *out);
/* The first document of a shard starting at or after `token` (the document count when none does). */
WkStatus wk_dataset_first_document(WkDataset *ds, uint32_t shard, uint64_t token, uint64_t *doc);
/* The codec the shard's writer chose (WkCodec: 0 raw, 1 zstd). */
WkStatus wk_dataset_shard_codec(WkDataset *ds, uint32_t shard, uint32_t *codec);
/* wk_dataset_read into 4- or 8-byte tokens (out_bytes). */
WkStatus wk_dataset_read_into(WkDataset *ds, uint32_t shard, uint64_t offset, uint64_t count, void *out,
                              uint32_t out_bytes);
/* Verifies and decodes the blocks holding tokens [begin, end) of a shard (begin on a block boundary)
 * into dst, in the stored width, bypassing the block cache and the file mapping. */
WkStatus wk_dataset_decode_range(WkDataset *ds, uint32_t shard, uint64_t begin, uint64_t end, void *dst);
/* Passes an advice about the bytes holding tokens [begin, end) of a shard to its blob, block by block. */
WkStatus wk_dataset_advise(WkDataset *ds, uint32_t shard, uint64_t begin, uint64_t end, WkAdvice advice);
/* Adds a dataset's remote counters to sum (disk_bytes: the largest, as sources share a directory). */
void wk_remote_stats_add(WkRemoteStats *sum, WkDataset *ds);

#ifdef __cplusplus
}
#endif
#endif /* WK_DATA_H */
