/*
 * runtime/dataset — an opened dataset: its index, its lazily opened shards, the decoded-block cache.
 *
 * Owns: WkDataset (dataset.c: an opened index with lazily opened shards, token reads by (shard,
 * offset), remote sources through the context it owns) and the decoded-block cache of plain reads
 * (cache.c: LRU, pinned entries, a budget). Does not own the shard format (runtime/format/) nor the
 * order of reads (runtime/loader/).
 *
 * Layer: above core/, io/, tokenizer/ and format/ (runtime/LAYERS). This header is the internal
 * contract with the loader; the FFI-visible API is in wick.h.
 */
#ifndef WK_DATASET_H
#define WK_DATASET_H

#include "../io/blob.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets ----------------------------------------------------------------------------------- */

/* WkDataset, WkShardInfo and wk_dataset_* are public (Lua reads datasets through the FFI), so they
 * are declared in ../wick.h, data section, with the signatures this contract always had. Reads are
 * thread-safe; shards open on first use; memory is bounded by WK_DATASET_BLOCK_CACHE_BYTES and
 * WK_DATASET_MAX_OPEN_SHARDS, never by the dataset's size.
 *
 * What the loader's reads (node_reader.c) need beyond that: */

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
/* The same for a TOKEN_U8 column (its blocks cover the token blocks' positions): bytes of positions
 * [begin, end) into dst. */
WkStatus wk_dataset_decode_column_range(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t begin, uint64_t end,
                                        void *dst);
/* Passes an advice about the bytes holding tokens [begin, end) of a shard to its blob, block by block. */
WkStatus wk_dataset_advise(WkDataset *ds, uint32_t shard, uint64_t begin, uint64_t end, WkAdvice advice);
/* Adds a dataset's remote counters to sum (disk_bytes: the largest, as sources share a directory). */
void wk_remote_stats_add(WkRemoteStats *sum, WkDataset *ds);

#ifdef __cplusplus
}
#endif
#endif /* WK_DATASET_H */
