/*
 * version.c — version, build description, and the struct layout table that lets the Lua bindings
 * verify their ffi.cdef against the compiler's view of runtime/wick.h.
 */
#include <stddef.h>
#include <string.h>

#include "core.h"

#ifndef WK_BUILD_FLAGS
#define WK_BUILD_FLAGS "release"
#endif

#ifdef __clang__
#define WK_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define WK_COMPILER "gcc " __VERSION__
#else
#define WK_COMPILER "unknown"
#endif

uint32_t wk_version(void) {
  return WK_VERSION_MAJOR * 10000u + WK_VERSION_MINOR * 100u + WK_VERSION_PATCH;
}

void wk_build_info(WkBuildInfo *out) {
  out->major = WK_VERSION_MAJOR;
  out->minor = WK_VERSION_MINOR;
  out->patch = WK_VERSION_PATCH;
#ifdef WK_HAVE_CUDA
  out->has_cuda = 1;
#else
  out->has_cuda = 0;
#endif
  out->compiler = WK_COMPILER;
  out->build_flags = WK_BUILD_FLAGS;
}

/* ---- ABI layout table ------------------------------------------------------------------------ */

typedef struct {
  const char *struct_name;
  const char *field;  /* NULL for the struct's size */
  size_t value;
} LayoutEntry;

#define SIZE_OF(type) {#type, NULL, sizeof(type)}
#define OFFSET_OF(type, field) {#type, #field, offsetof(type, field)}

/* Every struct of wick.h that crosses the FFI boundary is listed here with each of its fields. */
static const LayoutEntry layout_table[] = {
    SIZE_OF(WkBuildInfo),
    OFFSET_OF(WkBuildInfo, major),
    OFFSET_OF(WkBuildInfo, minor),
    OFFSET_OF(WkBuildInfo, patch),
    OFFSET_OF(WkBuildInfo, has_cuda),
    OFFSET_OF(WkBuildInfo, compiler),
    OFFSET_OF(WkBuildInfo, build_flags),
    /* data (runtime/dataset, runtime/loader, runtime/convert) */
    SIZE_OF(WkShardInfo),
    OFFSET_OF(WkShardInfo, name),
    OFFSET_OF(WkShardInfo, tokens),
    OFFSET_OF(WkShardInfo, documents),
    OFFSET_OF(WkShardInfo, bytes),
    SIZE_OF(WkDatasetStats),
    OFFSET_OF(WkDatasetStats, cache_bytes),
    OFFSET_OF(WkDatasetStats, cache_peak_bytes),
    OFFSET_OF(WkDatasetStats, cache_budget),
    OFFSET_OF(WkDatasetStats, cache_hits),
    OFFSET_OF(WkDatasetStats, cache_misses),
    OFFSET_OF(WkDatasetStats, blocks_decoded),
    OFFSET_OF(WkDatasetStats, blocks_verified),
    OFFSET_OF(WkDatasetStats, open_shards),
    SIZE_OF(WkConvertStats),
    OFFSET_OF(WkConvertStats, inputs),
    OFFSET_OF(WkConvertStats, input_bytes),
    OFFSET_OF(WkConvertStats, documents),
    OFFSET_OF(WkConvertStats, tokens),
    OFFSET_OF(WkConvertStats, shards),
    OFFSET_OF(WkConvertStats, output_bytes),
    OFFSET_OF(WkConvertStats, bad),
    OFFSET_OF(WkConvertStats, empty),
    OFFSET_OF(WkConvertStats, seconds),
    OFFSET_OF(WkConvertStats, reused),
    OFFSET_OF(WkConvertStats, nulls),
    SIZE_OF(WkTokenizeStats),
    OFFSET_OF(WkTokenizeStats, lines),
    OFFSET_OF(WkTokenizeStats, text_bytes),
    OFFSET_OF(WkTokenizeStats, tokens),
    OFFSET_OF(WkTokenizeStats, seconds),
    OFFSET_OF(WkTokenizeStats, cpu_seconds),
    OFFSET_OF(WkTokenizeStats, threads),
    SIZE_OF(WkBatch),
    OFFSET_OF(WkBatch, tokens),
    OFFSET_OF(WkBatch, inputs),
    OFFSET_OF(WkBatch, targets),
    OFFSET_OF(WkBatch, loss_mask),
    OFFSET_OF(WkBatch, doc_ids),
    OFFSET_OF(WkBatch, positions),
    OFFSET_OF(WkBatch, slot),
    OFFSET_OF(WkBatch, rows),
    OFFSET_OF(WkBatch, seq_len),
    OFFSET_OF(WkBatch, step),
    OFFSET_OF(WkBatch, micro_step),
    OFFSET_OF(WkBatch, micro_steps),
    OFFSET_OF(WkBatch, fingerprint),
    OFFSET_OF(WkBatch, wait_ns),
    SIZE_OF(WkSampleInfo),
    OFFSET_OF(WkSampleInfo, source),
    OFFSET_OF(WkSampleInfo, shard),
    OFFSET_OF(WkSampleInfo, offset),
    OFFSET_OF(WkSampleInfo, length),
    OFFSET_OF(WkSampleInfo, epoch),
    OFFSET_OF(WkSampleInfo, token_hash),
    OFFSET_OF(WkSampleInfo, status),
    SIZE_OF(WkLoaderStats),
    OFFSET_OF(WkLoaderStats, batches),
    OFFSET_OF(WkLoaderStats, wait_ns),
    OFFSET_OF(WkLoaderStats, skipped),
    OFFSET_OF(WkLoaderStats, buffers),
    OFFSET_OF(WkLoaderStats, buffer_bytes),
    OFFSET_OF(WkLoaderStats, decoded_bytes),
    OFFSET_OF(WkLoaderStats, delivered_bytes),
    OFFSET_OF(WkLoaderStats, node_decoded_bytes),
    OFFSET_OF(WkLoaderStats, node_delivered_bytes),
    OFFSET_OF(WkLoaderStats, node_private_decodes),
    OFFSET_OF(WkLoaderStats, node_edges_saved),
    OFFSET_OF(WkLoaderStats, node_edges_used),
    OFFSET_OF(WkLoaderStats, node_edges_missing),
    OFFSET_OF(WkLoaderStats, node_edges_dropped),
    OFFSET_OF(WkLoaderStats, node_waits),
    OFFSET_OF(WkLoaderStats, node_steals),
    OFFSET_OF(WkLoaderStats, remote),
    SIZE_OF(WkRemoteStats),
    OFFSET_OF(WkRemoteStats, requests),
    OFFSET_OF(WkRemoteStats, bytes_fetched),
    OFFSET_OF(WkRemoteStats, cache_hits),
    OFFSET_OF(WkRemoteStats, cache_misses),
    OFFSET_OF(WkRemoteStats, prefetched),
    OFFSET_OF(WkRemoteStats, prefetch_dropped),
    OFFSET_OF(WkRemoteStats, retries_connect),
    OFFSET_OF(WkRemoteStats, retries_reset),
    OFFSET_OF(WkRemoteStats, retries_timeout),
    OFFSET_OF(WkRemoteStats, retries_server),
    OFFSET_OF(WkRemoteStats, retries_throttle),
    OFFSET_OF(WkRemoteStats, retries_corrupt),
    OFFSET_OF(WkRemoteStats, rate_bytes_per_s),
    OFFSET_OF(WkRemoteStats, wait_ns),
    OFFSET_OF(WkRemoteStats, disk_bytes),
    OFFSET_OF(WkRemoteStats, evicted_bytes),
    SIZE_OF(WkRemoteOptions),
    OFFSET_OF(WkRemoteOptions, cache_dir),
    OFFSET_OF(WkRemoteOptions, cache_disk_bytes),
    OFFSET_OF(WkRemoteOptions, prefetch_bytes),
    OFFSET_OF(WkRemoteOptions, max_transfers),
    OFFSET_OF(WkRemoteOptions, connect_timeout_ms),
    OFFSET_OF(WkRemoteOptions, stall_timeout_ms),
    OFFSET_OF(WkRemoteOptions, request_timeout_ms),
    OFFSET_OF(WkRemoteOptions, retries),
    OFFSET_OF(WkRemoteOptions, low_speed_bytes_per_s),
    OFFSET_OF(WkRemoteOptions, low_speed_window_ms),

    /* tensors and ops (runtime/tensor, runtime/ops) */
    SIZE_OF(WkSafetensorsEntry),
    OFFSET_OF(WkSafetensorsEntry, name),
    OFFSET_OF(WkSafetensorsEntry, dtype),
    OFFSET_OF(WkSafetensorsEntry, ndim),
    OFFSET_OF(WkSafetensorsEntry, shape),
    OFFSET_OF(WkSafetensorsEntry, offset),
    OFFSET_OF(WkSafetensorsEntry, bytes),
    SIZE_OF(WkAllocatorStats),
    OFFSET_OF(WkAllocatorStats, bytes_in_use),
    OFFSET_OF(WkAllocatorStats, bytes_cached),
    OFFSET_OF(WkAllocatorStats, device_allocs),
    OFFSET_OF(WkAllocatorStats, cache_hits),
    OFFSET_OF(WkAllocatorStats, bytes_peak),

    /* distributed (runtime/dist) */
    SIZE_OF(WkWorld),
    OFFSET_OF(WkWorld, rank),
    OFFSET_OF(WkWorld, world_size),
    OFFSET_OF(WkWorld, local_rank),
    OFFSET_OF(WkWorld, local_world_size),
    OFFSET_OF(WkWorld, master_port),
    OFFSET_OF(WkWorld, source),
    OFFSET_OF(WkWorld, master_addr),
    SIZE_OF(WkDistStats),
    OFFSET_OF(WkDistStats, collectives),
    OFFSET_OF(WkDistStats, bytes),
    OFFSET_OF(WkDistStats, wait_ns),
};

int64_t wk_abi_layout(const char *struct_name, const char *field) {
  if (!struct_name) return -1;
  for (size_t i = 0; i < sizeof layout_table / sizeof layout_table[0]; i++) {
    const LayoutEntry *e = &layout_table[i];
    if (strcmp(e->struct_name, struct_name) != 0) continue;
    if ((field == NULL) != (e->field == NULL)) continue;
    if (field == NULL || strcmp(e->field, field) == 0) return (int64_t)e->value;
  }
  return -1;
}
