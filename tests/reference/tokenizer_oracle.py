#!/usr/bin/env python3
"""Expected ids for tests/fixtures/tokenizer/ from the Hugging Face `tokenizers` package.

usage: tokenizer_oracle.py --corpus corpus.json --out expected.json NAME=tokenizer.json ...

For every tokenizer and every case of the corpus it records the ids of encode() without and
with the post-processor's special tokens, and decode() of the plain ids (keeping specials,
as `hyla-tokenize --decode` does) and of the ids with specials (skipping them). The output is
committed as tests/fixtures/tokenizer/expected.json; test_tokenizer compares hyla's tokenizer
with it.
"""
import argparse
import json

import tokenizers
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("tokenizers", nargs="+", help="NAME=path/to/tokenizer.json")
    a = ap.parse_args()
    cases = json.load(open(a.corpus, encoding="utf-8"))["cases"]
    out = {"tokenizers_version": tokenizers.__version__, "results": {}}
    for spec in a.tokenizers:
        name, path = spec.split("=", 1)
        tok = Tokenizer.from_file(path)
        rows = []
        for text in cases:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_sp = tok.encode(text, add_special_tokens=True).ids
            rows.append({
                "ids": ids,
                "ids_special": ids_sp,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids_sp, skip_special_tokens=True),
            })
        out["results"][name] = rows
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
