/*
 * hash.c — wk_hash64, the one content hash: shard headers, tables and blocks are checked with it, and
 * the node disk cache spreads its claims over lock slots with it. A fact of the shard format
 * (runtime/format/FORMAT.md names XXH3-64), kept in core so the layers below the format can use it.
 */
#include <xxhash.h>

#include "core.h"

uint64_t wk_hash64(const void *data, size_t length) { return XXH3_64bits(data, length); }
