/*
 * file.c — a tokenizer's file read whole (a Llama 3 tokenizer.json is ~9 MB, an o200k rank file
 * ~3.6 MB), bounded so that a wrong path to a huge file fails at once instead of filling memory.
 */
#include <stdlib.h>

#include "../../io/blob.h"
#include "bpe.h"

#define MAX_TOKENIZER_FILE_BYTES (1ull << 30)

WkStatus bpe_read_file(const char *path, char **text, size_t *length) {
  *text = NULL;
  *length = 0;
  WkBlob *blob = wk_blob_open_file(path);
  if (!blob) return wk_last_status();
  WkStatus status = WK_OK;
  if (blob->size > MAX_TOKENIZER_FILE_BYTES) {
    status = WK_FAIL(WK_ERR_FORMAT, "tokenizer file '%s' is %llu bytes, more than the %llu a tokenizer may have "
                     "(is it a tokenizer?)", path, (unsigned long long)blob->size, MAX_TOKENIZER_FILE_BYTES);
  } else {
    *text = wk_malloc((size_t)blob->size + 1, "a tokenizer file");
    if (!*text) status = wk_last_status();
    else status = blob->size ? blob->read_at(blob, 0, (size_t)blob->size, *text) : WK_OK;
    if (status == WK_OK) {
      (*text)[blob->size] = '\0';
      *length = (size_t)blob->size;
    } else {
      free(*text);
      *text = NULL;
    }
  }
  blob->close(blob);
  return status;
}
