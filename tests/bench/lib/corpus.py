"""The documents of make bench's data corpus, as JSONL (tests/bench/lib/data_corpus.lua runs this once).

  corpus.py OUT.jsonl --tokens N                  text files this machine has, until N tokens
  corpus.py OUT.jsonl --tokens N --from IN.jsonl  N tokens made from IN's documents (copies, see below)

Tokens are counted as the bytes tokenizer makes them: one per UTF-8 byte, plus one EOS per document.
The last document taken is the one that reaches N (as the converter closes a shard).

The machine's text: regular files (no links, so nothing twice) under ROOTS, each walked in byte-wise
sorted order (Python sources first, as wick.data.corpus does, then headers, then /usr/share), that
are valid UTF-8 without NUL bytes and at most MAX_DOCUMENT_BYTES; one document per file.

Copies: when the source holds fewer than N tokens, copy k > 0 repeats its documents in another
order (a permutation seeded by k) with a first line naming the copy, so no block of a copy is a
block of another (every block boundary moves) and the page and block caches see distinct data;
each copy still compresses as the original does. Deterministic: the same inputs give the same file.
Writes OUT atomically (OUT.tmp, then renamed) and prints one summary line.
"""
import argparse
import json
import os
import random
import sys

ROOTS = ["/usr/lib/python3.11", "/usr/lib/python3", "/usr/include", "/usr/share"]
MAX_DOCUMENT_BYTES = 8 << 20
LINE_HEAD = '{"text":"'


def machine_documents():
    """Yields the text of every qualifying file under ROOTS, in a reproducible order."""
    for root in ROOTS:
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
            for name in sorted(names):
                path = os.path.join(folder, name)
                if name.startswith(".") or os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    if os.path.getsize(path) > MAX_DOCUMENT_BYTES:
                        continue
                    with open(path, "rb") as f:
                        raw = f.read()
                except OSError:
                    continue
                if not raw or b"\0" in raw:
                    continue
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError:
                    continue


def line_of(text):
    return LINE_HEAD + json.dumps(text, ensure_ascii=False)[1:] + "}\n"


def tokens_of_line(line):
    return len(json.loads(line)["text"].encode("utf-8")) + 1


def copies(lines, counts):
    """Copy 0 is the source as it is; copy k > 0 is permuted and headed (see the module text)."""
    k = 0
    while True:
        if k == 0:
            yield from zip(lines, counts)
        else:
            order = list(range(len(lines)))
            random.Random(k).shuffle(order)
            head = "# copy %d\n" % k
            head_json = json.dumps(head)[1:-1]
            for i in order:
                yield LINE_HEAD + head_json + lines[i][len(LINE_HEAD):], counts[i] + len(head)
        k += 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--tokens", type=float, required=True)
    parser.add_argument("--from", dest="source")
    args = parser.parse_args()
    want = int(args.tokens)
    if args.source:
        with open(args.source, encoding="utf-8") as f:
            lines = f.readlines()
        if not lines:
            sys.exit("corpus.py: %s holds no documents" % args.source)
        stream = copies(lines, [tokens_of_line(line) for line in lines])
        what = args.source
    else:
        texts = machine_documents()
        first = [(line_of(text), len(text.encode("utf-8")) + 1) for text in _take(texts, want)]
        if not first:
            sys.exit("corpus.py: no UTF-8 text files under %s" % ", ".join(ROOTS))
        stream = copies([line for line, _ in first], [n for _, n in first])
        what = ", ".join(ROOTS)
    tokens = documents = 0
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for line, n in stream:
            out.write(line)
            tokens += n
            documents += 1
            if tokens >= want:
                break
    os.replace(tmp, args.out)
    print("%s: %d documents, %.1f M tokens from %s" % (args.out, documents, tokens / 1e6, what))


def _take(texts, want):
    """Texts until their tokens reach want (all of them when there are fewer)."""
    total = 0
    for text in texts:
        yield text
        total += len(text.encode("utf-8")) + 1
        if total >= want:
            return


if __name__ == "__main__":
    main()
