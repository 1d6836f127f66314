/*
 * runtime/tokenizer/bpe/ — BPE tokenizers behind the WkTokenizer interface of ../tokenizer.h:
 * Hugging Face tokenizer.json files with a BPE model, byte-level (GPT-2, Llama 3, Qwen style) or
 * SentencePiece-style (byte_fallback, "▁" for spaces: Llama 2, Mistral, Gemma), and tiktoken rank
 * files (r50k/gpt2, p50k, cl100k, o200k). A tokenizer.json with a Unigram model (T5 style) is the
 * same tokenizer with ../unigram/ turning pieces into tokens.
 *
 *   bytelevel.c    GPT-2's byte <-> printable character alphabet that tokenizer.json vocabularies use
 *   vocab.c        token ids <-> bytes, and the merge table: a pair of ids -> (rank, merged id)
 *   merge.c        BPE of one piece (lowest rank first, leftmost on ties; a heap for long pieces,
 *                  so a piece of n bytes costs O(n log n)) and the per-thread cache of pieces; a
 *                  SentencePiece-style piece starts as characters, with byte fallback and unk
 *   normalize.c    normalizers (NFC, NFKC, Prepend, Replace, Strip, Lowercase, a Sequence of them)
 *   precompiled.c  SentencePiece's precompiled_charsmap (the Precompiled normalizer)
 *   decode.c       the decoders of SentencePiece-style files (Replace, ByteFallback, Fuse, Strip,
 *                  Metaspace)
 *   pretokenize.c  text -> pieces with PCRE2 regexes (JIT, UTF | UCP | DOLLAR_ENDONLY); the patterns
 *                  tiktoken and tokenizer.json files name; Metaspace
 *   ascii.c        hand-written matchers of the common patterns for ASCII text (PCRE2 for the rest)
 *   added.c        added and special tokens found in text (leftmost-longest, Hugging Face's rules)
 *   encode.c       the encoder (added tokens -> NFC -> pieces -> merges) and decoder; per-thread state
 *   huggingface.c  tokenizer.json -> a tokenizer (BPE or Unigram), or an error naming the unsupported
 *                  component
 *   tiktoken.c     .tiktoken rank files, with the pattern and special tokens of their encoding
 *   file.c         reading a tokenizer's files whole
 *   tokenize.c     JSONL of text <-> JSONL of id arrays on all cores (`run -m wick.data.tokenize`)
 *
 * Encoding is thread-safe: the tokenizer is read-only once built; what a call needs to write (the
 * regex match data, merge scratch, the piece cache) belongs to the calling thread (encode.c).
 *
 * Internal header of this folder; ../tokenizer.h is the contract for the rest of runtime/.
 */
#ifndef WK_TOKENIZER_BPE_H
#define WK_TOKENIZER_BPE_H

#include <pthread.h>

#include "../tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { BPE_NO_TOKEN = UINT32_MAX };
/* Token ids are below this (the largest vocabularies have ~256k tokens; tables are sized by the
 * largest id, so a stray huge id in a file is an error, not gigabytes of memory). */
#define BPE_MAX_VOCAB (1u << 22)

/* ---- vocabulary and merges (vocab.c) --------------------------------------------------------- */

/* Token ids 0..count-1 and the bytes each stands for; ids without bytes are absent (a gap). */
typedef struct {
  uint32_t count;
  uint64_t *start;    /* [count] where the id's bytes begin in bytes */
  uint32_t *length;   /* [count] */
  uint8_t *present;   /* [count] 1 when the id has a token */
  uint8_t *bytes;
  size_t bytes_length, bytes_capacity;
  uint32_t max_token_bytes;
  /* bytes -> id: open addressing over ids (BPE_NO_TOKEN = empty), tagged with the hash's top bits */
  uint64_t *index;
  uint64_t index_mask;
} Vocab;

WkStatus vocab_init(Vocab *v, uint32_t count);
void vocab_free(Vocab *v);
/* Sets the bytes of an id (each id once; the same bytes twice is an error naming both ids). */
WkStatus vocab_set(Vocab *v, uint32_t id, const uint8_t *bytes, size_t length, const char *source);
/* Builds the bytes -> id index once every id is set. */
WkStatus vocab_finish(Vocab *v);
uint32_t vocab_find(const Vocab *v, const uint8_t *bytes, size_t length);
static inline bool vocab_has(const Vocab *v, uint32_t id) { return id < v->count && v->present[id]; }
static inline const uint8_t *vocab_bytes(const Vocab *v, uint32_t id, size_t *length) {
  *length = v->length[id];
  return v->bytes + v->start[id];
}

/* (left, right) -> (rank, merged): the merges of the model. */
typedef struct {
  uint64_t key;  /* left << 32 | right; UINT64_MAX = empty */
  uint32_t rank, merged;
} PairSlot;

typedef struct {
  PairSlot *slots;
  uint64_t mask;
  size_t count;
} PairTable;

WkStatus pairs_init(PairTable *p, size_t expected);
void pairs_free(PairTable *p);
/* Adds or replaces (a later merge of the same pair replaces the earlier one, as Hugging Face does). */
WkStatus pairs_put(PairTable *p, uint32_t left, uint32_t right, uint32_t rank, uint32_t merged);

/* Fibonacci hashing, folded so that the low bits (the slot) depend on every bit of both ids. */
static inline uint64_t pair_hash(uint64_t key) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 32);
}

/* The merge of (left, right), or NULL. Inline: the merge loop's innermost call. */
static inline const PairSlot *pairs_find(const PairTable *p, uint32_t left, uint32_t right) {
  uint64_t key = (uint64_t)left << 32 | right;
  for (uint64_t i = pair_hash(key) & p->mask;; i = (i + 1) & p->mask) {
    const PairSlot *s = &p->slots[i];
    if (s->key == key) return s;
    if (s->key == UINT64_MAX) return NULL;
  }
}

/* ---- byte-level alphabet (bytelevel.c) -------------------------------------------------------- */

/* The byte a character of GPT-2's alphabet stands for, or -1 when it is not one of the 256. */
int bytelevel_byte(uint32_t codepoint);
/* UTF-8 of the character standing for byte b (at most 2 bytes); returns its length. */
size_t bytelevel_char(uint8_t b, uint8_t out[2]);
/* A tokenizer.json vocabulary string -> the bytes it stands for (characters outside the alphabet
 * are kept as their own UTF-8). out has room for length bytes. Returns the byte count. */
size_t bytelevel_decode(const char *text, size_t length, uint8_t *out);

/* ---- UTF-8 and Unicode White_Space --------------------------------------------------------------- */

/* Length of the UTF-8 character that starts with byte c (valid text). */
static inline size_t utf8_length(uint8_t c) {
  return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
}

/* The code point of the n-byte character at s (valid text). */
static inline uint32_t utf8_decode(const uint8_t *s, size_t n) {
  uint32_t c = s[0];
  if (n == 1) return c;
  c &= n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07;
  for (size_t i = 1; i < n; i++) c = c << 6 | (s[i] & 0x3F);
  return c;
}

/* Unicode White_Space (Rust's char::is_whitespace, which Hugging Face's strip options use). */
static inline bool white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- normalizers (normalize.c) ------------------------------------------------------------------ */

enum { NORMALIZE_MAX_STEPS = 8 };

/* A string and what it becomes (Replace), or a string alone (Prepend); empty strings are NULL. */
typedef struct {
  uint8_t *text, *with;
  size_t text_length, with_length;
} Rewrite;

/* *to = a copy of from's strings (what names them in errors); rewrite_free frees a copy. */
WkStatus rewrite_copy(Rewrite *to, const Rewrite *from, const char *what);
void rewrite_free(Rewrite *r);

typedef enum {
  NORMALIZE_NFC,          /* Unicode NFC (libunistring) */
  NORMALIZE_NFKC,
  NORMALIZE_PREPEND,      /* text in front of a non-empty run */
  NORMALIZE_REPLACE,      /* every occurrence of a string (or a regex's match) -> another string */
  NORMALIZE_STRIP,        /* White_Space off the left and/or right end */
  NORMALIZE_LOWERCASE,    /* Rust's char::to_lowercase, character by character */
  NORMALIZE_PRECOMPILED,  /* SentencePiece's precompiled_charsmap (precompiled.c) */
} NormalizeKind;

typedef struct Charsmap Charsmap;

typedef struct {
  NormalizeKind kind;
  Rewrite rewrite;     /* Prepend: text; Replace: text -> with */
  void *regex;         /* Replace with a Regex pattern: its pcre2_code * (owned); NULL: text is a literal */
  bool left, right;    /* Strip */
  Charsmap *charsmap;  /* Precompiled (owned) */
} NormalizeStep;

/* Steps applied in order (a tokenizer.json normalizer, a Sequence flattened). */
typedef struct {
  NormalizeStep steps[NORMALIZE_MAX_STEPS];
  int count;
} Normalizer;

/* Adds a step (its strings are copied). what names it in errors. */
WkStatus normalizer_add(Normalizer *n, const NormalizeStep *step, const char *what);
void normalizer_free(Normalizer *n);

/* Two buffers a thread normalizes through (the steps alternate between them). */
typedef struct {
  WkByteVec buffer[2];
  void *match;          /* pcre2_match_data * for Replace's regexes, made on first use */
  char *breaks;         /* grapheme cluster breaks (Precompiled) */
  size_t breaks_capacity;
} NormalizeScratch;

void normalize_scratch_free(NormalizeScratch *s);
/* *text (valid UTF-8) through every step; the result is in the scratch, or still the input. */
WkStatus normalize(const Normalizer *n, NormalizeScratch *s, const uint8_t **text, size_t *length);
/* text with every non-overlapping occurrence of from (leftmost first) as with, appended to out. */
WkStatus replace_all(WkByteVec *out, const uint8_t *text, size_t length, const uint8_t *from, size_t from_length,
                     const uint8_t *with, size_t with_length);

/* A regex of Replace (PCRE2, compiled as the pre-tokenizer's are: pretokenize.c). */
WkStatus normalize_regex(const char *pattern, size_t length, void **out, const char *what);
void normalize_regex_free(void *regex);
/* text with every match of regex as with, appended to out; *match is the thread's match data. */
WkStatus regex_replace_all(const void *regex, void **match, WkByteVec *out, const uint8_t *text, size_t length,
                           const uint8_t *with, size_t with_length);

/* SentencePiece's precompiled_charsmap (precompiled.c): a little-endian u32 size of a darts-clone
 * double-array trie, the trie's u32 units, then NUL-terminated normalized strings. charsmap_load
 * refuses a blob that is cut short, names strings outside itself or that are not UTF-8. */
WkStatus charsmap_load(const uint8_t *blob, size_t length, Charsmap **out, const char *what);
void charsmap_free(Charsmap *c);
/* text through the charsmap as Hugging Face's Precompiled normalizer runs it, appended to out. */
WkStatus charsmap_normalize(const Charsmap *c, NormalizeScratch *s, const uint8_t *text, size_t length,
                            WkByteVec *out);

/* ---- Metaspace (pretokenize.c) and the decoders (decode.c) ------------------------------------- */

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } PrependScheme;

/* Hugging Face's Metaspace pre-tokenizer: spaces become the replacement character, which is put in
 * front of a piece (always, or only at the start of the text), and the piece is split in front of
 * each run of replacement characters (split). */
typedef struct {
  bool on;
  uint8_t replacement[4];
  size_t replacement_length;
  PrependScheme prepend;
  bool split;
} Metaspace;

enum { DECODE_MAX_STEPS = 8 };

typedef enum {
  DECODE_REPLACE,        /* a string -> another, in each token */
  DECODE_BYTE_FALLBACK,  /* runs of <0xNN> tokens -> their bytes (U+FFFD each when not UTF-8) */
  DECODE_FUSE,           /* every token -> one */
  DECODE_STRIP,          /* up to start / stop characters `content` off each token's ends */
  DECODE_METASPACE,      /* the replacement -> a space (none in the first token, unless prepend never) */
} DecodeKind;

typedef struct {
  DecodeKind kind;
  Rewrite rewrite;       /* Replace */
  uint32_t content;      /* Strip */
  size_t start, stop;
  Metaspace metaspace;   /* Metaspace */
} DecodeStep;

/* Hugging Face's decoders, applied in order to the list of token strings; none: concatenation. */
typedef struct {
  DecodeStep steps[DECODE_MAX_STEPS];
  int count;
} Decoder;

WkStatus decoder_add(Decoder *d, const DecodeStep *step, const char *what);
void decoder_free(Decoder *d);
/* The tokens' strings (each ends at ends[i] in bytes) through the decoders, appended to out. */
WkStatus decoder_run(const Decoder *d, const uint8_t *bytes, const size_t *ends, size_t count, WkByteVec *out);

/* ---- pre-tokenizer (pretokenize.c) --------------------------------------------------------- */

enum { PRETOKENIZE_MAX_LEVELS = 4 };

/* Patterns with a hand-written matcher for ASCII text (ascii.c). */
typedef enum { FAST_NONE = 0, FAST_GPT2, FAST_CL100K, FAST_LLAMA3, FAST_QWEN2 } FastPattern;

/* The end of the match at text[at] (> at) when it depends on ASCII characters only, else 0. */
size_t fast_match(FastPattern kind, const uint8_t *text, size_t length, size_t at);

/* Regexes applied one after the other: level 0 splits the text, level 1 splits each of its pieces,
 * and so on. Unmatched text between matches is a piece of its own (Hugging Face's "Isolated"). */
typedef struct {
  void *code[PRETOKENIZE_MAX_LEVELS];  /* pcre2_code * */
  bool jit[PRETOKENIZE_MAX_LEVELS];    /* JIT-compiled */
  FastPattern fast[PRETOKENIZE_MAX_LEVELS];  /* FAST_NONE: every match through PCRE2 */
  bool matches_only[PRETOKENIZE_MAX_LEVELS]; /* the text between matches is dropped (WhitespaceSplit) */
  int levels;
} Pretokenizer;

/* Compiles a regex (Rust/Oniguruma syntax as tokenizers write it; \s and \S mean Unicode
 * White_Space, as there) as the next level. what names it in errors. */
WkStatus pretokenizer_add(Pretokenizer *pt, const char *pattern, size_t length, const char *what);
/* A regex whose matches alone are pieces, as the next level (WhitespaceSplit: \S+). */
WkStatus pretokenizer_add_matches(Pretokenizer *pt, const char *pattern, const char *what);
/* A literal string as the next level (Hugging Face Split with a String pattern). */
WkStatus pretokenizer_add_literal(Pretokenizer *pt, const char *literal, size_t length, const char *what);
void pretokenizer_free(Pretokenizer *pt);

/* The regex a built-in name stands for: "bytelevel" (Hugging Face's ByteLevel pre-tokenizer, GPT-2's
 * original), "r50k" (tiktoken's r50k, p50k and gpt2), "cl100k", "o200k", "llama3", "qwen2" (their
 * tokenizer.json Split regexes); NULL for an unknown name. */
const char *pretokenizer_pattern(const char *name);

/* Per-thread matching state (encode.c keeps one per thread and tokenizer). */
typedef struct PretokenizeState PretokenizeState;
PretokenizeState *pretokenize_state_new(void);
void pretokenize_state_free(PretokenizeState *s);

typedef WkStatus (*PieceFn)(void *context, const uint8_t *piece, size_t length);
/* Calls piece() for each piece of valid UTF-8 text, in order. No levels: the text is one piece. */
WkStatus pretokenize(const Pretokenizer *pt, PretokenizeState *s, const uint8_t *text, size_t length,
                     PieceFn piece, void *context);
/* Metaspace of one piece, written in buffer (which text must not be in); starts_text: the piece is at
 * the start of the whole text (prepend_scheme first). */
WkStatus metaspace_split(const Metaspace *m, WkByteVec *buffer, const uint8_t *text, size_t length, bool starts_text,
                         PieceFn piece, void *context);

/* ---- added and special tokens (added.c) ------------------------------------------------------ */

typedef struct {
  uint32_t id;
  uint8_t *bytes;     /* what is matched in text and decoded: a normalized token's content normalized */
  size_t length;
  const uint8_t *content;  /* the token's text as the file writes it (lookup); in bytes' allocation */
  size_t content_length;
  bool special;  /* text only unless special tokens are honoured */
  bool lstrip, rstrip;  /* the match takes the whitespace before / after it */
} AddedToken;

/* A set matched together, leftmost-longest. */
typedef struct {
  AddedToken *tokens;  /* sorted by first byte, then longest first (added_finish) */
  size_t count, capacity;
  size_t plain;        /* tokens that are not special */
  uint32_t begin[257]; /* tokens[begin[b] .. begin[b + 1]) start with byte b */
  uint8_t *pairs;      /* [65536 / 8] bit (b0 << 8 | b1) set when a token of 2+ bytes starts with b0 b1 */
  uint8_t single[256]; /* 1 when a one-byte token is this byte */
} AddedSet;

/* A token of text content, found in text as match (NULL: as content). */
WkStatus added_add(AddedSet *set, uint32_t id, const uint8_t *content, size_t content_length, const uint8_t *match,
                   size_t match_length, bool special, bool lstrip, bool rstrip);
/* Orders the set for matching, once every token is added. */
WkStatus added_finish(AddedSet *set);
void added_free(AddedSet *set);

typedef WkStatus (*SegmentFn)(void *context, const uint8_t *text, size_t length, uint32_t added);
/* Splits text at the set's tokens: segment() gets each run of plain text (added = BPE_NO_TOKEN) and
 * each token found (its id). A special token is text unless honour_special. */
WkStatus added_split(const AddedSet *set, bool honour_special, const uint8_t *text, size_t length,
                     SegmentFn segment, void *context);

/* ---- the tokenizer (encode.c) ---------------------------------------------------------------- */

typedef struct ThreadState ThreadState;
typedef struct Unigram Unigram;  /* ../unigram/unigram.h */

typedef struct {
  WkTokenizer base;  /* first: a Bpe * is a WkTokenizer * */
  char *name;
  Vocab vocab;       /* the model's tokens: what merges produce and pieces are looked up in */
  PairTable pairs;
  uint32_t byte_token[256];  /* the token of each single byte, BPE_NO_TOKEN when the model lacks it */
  uint32_t unk;              /* stands for a byte (a character) without a token; BPE_NO_TOKEN: dropped */
  bool ignore_merges;        /* a piece that is a token is that token, unmerged (tiktoken, Llama 3) */
  bool add_prefix_space;     /* each run of text gets a leading space unless it has one */
  /* SentencePiece-style (no ByteLevel pre-tokenizer): the vocabulary's strings are text, a piece
   * starts as its characters; one without a token is its bytes' <0xNN> tokens (byte_fallback, when
   * the model has all of them), else unk (one unk for a run of them with fuse_unk). */
  bool chars;
  bool fuse_unk;
  /* No merge joins a token ending in another character to one starting with this word mark (the
   * Metaspace replacement, else "▁"), which has its own token: a piece is merged word by word, each
   * cut before a run of marks, with the same result (and the piece cache). bpe_finish decides. */
  uint8_t word_mark[4];
  size_t word_mark_length;
  uint32_t fallback_token[256];  /* <0xNN>, BPE_NO_TOKEN without byte_fallback */
  Normalizer normalizer;     /* applied to each run of text between added tokens */
  Pretokenizer pre;
  Metaspace metaspace;       /* after pre's splits, when on */
  Decoder decoder;           /* none: a token's bytes are its text */
  Unigram *unigram;          /* a Unigram model (scores, a trie) turns pieces into tokens instead of merges */
  /* Hugging Face matches tokens that are not normalized before those that are; tiktoken uses [0]. */
  AddedSet added[2];
  uint32_t *added_of;        /* [base.vocab_size]: index into added[0] | added[1] << 31, or NONE */
  uint32_t max_decode_bytes; /* the longest token's bytes */
  /* Threads that encoded with this tokenizer, each with its own state (freed with the tokenizer). */
  pthread_key_t key;
  bool key_made;
  pthread_mutex_t lock;
  ThreadState *states;
} Bpe;

/* A zeroed Bpe wired to the encoder and decoder; the loaders fill it in and call bpe_finish. */
Bpe *bpe_new(const char *name);
/* Derives what encoding needs (vocabulary size, the decode table, byte tokens, a default EOS); the
 * loader has called vocab_finish. */
WkStatus bpe_finish(Bpe *bpe);
void bpe_free(Bpe *bpe);

/* One piece -> tokens (merge.c); scratch and cache come from the thread's state. */
WkStatus bpe_merge_piece(const Bpe *bpe, ThreadState *ts, const uint8_t *piece, size_t length, WkTokenVec *out);
/* The same, word by word when the model allows (word_mark; else the piece whole). */
WkStatus bpe_merge_words(const Bpe *bpe, ThreadState *ts, const uint8_t *piece, size_t length, WkTokenVec *out);
/* Sets word_mark when no merge crosses the mark (SentencePiece-style models). */
void bpe_find_word_mark(Bpe *bpe);

/* ---- per-thread state (encode.c owns it; merge.c and pretokenize.c use its parts) --------------- */

enum { CACHE_PIECE_BYTES = 22, CACHE_PIECE_TOKENS = 8, CACHE_ENTRIES = 1 << 12 };

typedef struct {
  uint64_t hash;  /* 0 = empty */
  uint8_t length, count;
  uint8_t bytes[CACHE_PIECE_BYTES];
  uint32_t tokens[CACHE_PIECE_TOKENS];
} CacheEntry;

/* Scratch of the merge of one piece. */
typedef struct {
  uint32_t *symbol, *rank, *merged, *prev, *next;
  struct HeapEntry *heap;
  size_t capacity, heap_capacity;
} MergeScratch;

struct ThreadState {
  const Bpe *owner;
  CacheEntry *cache;  /* [CACHE_ENTRIES], direct-mapped */
  MergeScratch scratch;
  PretokenizeState *pre;
  uint8_t *prefixed;  /* a segment with its leading space (add_prefix_space) */
  size_t prefixed_capacity;
  NormalizeScratch normalized;  /* a segment normalized */
  WkByteVec spaced;  /* a piece through Metaspace */
  /* A Unigram piece's lattice (../unigram/unigram.c): per byte position, the best path's score (here),
   * where its last token starts and which it is (scratch.prev and scratch.next). */
  double *lattice_score;
  size_t lattice_capacity;
  ThreadState *next;
};

void merge_scratch_free(MergeScratch *s);

/* Room for n symbols in each of the scratch's arrays (merge.c). */
WkStatus merge_scratch_reserve(MergeScratch *s, size_t n);

/* The thread's cache of pieces (merge.c): lookup appends the tokens of a piece seen before (*hit) and
 * gives its hash, 0 for a piece too long to cache; store remembers a piece's tokens (up to
 * CACHE_PIECE_TOKENS of them) under that hash. */
WkStatus piece_cache_lookup(const ThreadState *ts, const uint8_t *piece, size_t length, uint64_t *hash, bool *hit,
                            WkTokenVec *out);
void piece_cache_store(ThreadState *ts, const uint8_t *piece, size_t length, uint64_t hash, const uint32_t *tokens,
                       size_t count);

/* Standard base64 with padding -> out (room for length bytes); -1 when malformed (tiktoken.c). */
long base64_decode(const char *s, size_t length, uint8_t *out);

/* ---- loaders ---------------------------------------------------------------------------------- */

/* A tokenizer's file, whole and NUL-terminated (file.c); free *text. */
WkStatus bpe_read_file(const char *path, char **text, size_t *length);

/* tokenizer.json (huggingface.c) and .tiktoken files (tiktoken.c); pattern: the encoding of a rank
 * file, NULL to take it from the file name. text is the whole file. */
WkStatus bpe_load_huggingface(const char *path, const char *text, size_t length, Bpe **out);
WkStatus bpe_load_tiktoken(const char *path, const char *text, size_t length, const char *pattern, Bpe **out);

#ifdef __cplusplus
}
#endif
#endif /* WK_TOKENIZER_BPE_H */
