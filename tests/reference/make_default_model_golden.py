#!/usr/bin/env python3
"""Golden for the default model (SmolLM2-135M-Instruct Q4_1): a fixed ChatML prompt,
tokenised independently of Granule (Hugging Face `tokenizers` byte-level BPE built from the
GGUF's vocabulary and merges, SmolLM2's pre-tokenizer: single digits, then byte-level), then
run through llama_reference.py for the last-position logits and 32 greedy tokens.

Usage:
  pip install numpy gguf tokenizers
  python3 tests/reference/make_default_model_golden.py \
      ~/.local/share/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      tests/data/reference/smollm2-135m-q4_1.chat.txt
"""
import os
import subprocess
import sys

from gguf import GGUFReader
from tokenizers import Tokenizer, AddedToken, pre_tokenizers, decoders
from tokenizers.models import BPE

PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
          "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
          "<|im_start|>assistant\n")
GREEDY_TOKENS = 32
KEPT_LOGITS = 64   # the golden keeps the first logits of the last row, and its top entries


def build_tokenizer(path):
    r = GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def main():
    model, out = sys.argv[1], sys.argv[2]
    tok = build_tokenizer(model)
    ids = tok.encode(PROMPT).ids
    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run(
        [sys.executable, os.path.join(here, "llama_reference.py"), model,
         "--tokens", ",".join(map(str, ids)), "--greedy", str(GREEDY_TOKENS), "--last-only"],
        check=True, capture_output=True, text=True).stdout.splitlines()
    greedy = [int(t) for t in next(l for l in result if l.startswith("greedy ")).split()[1:]]
    last = [float(v) for v in result[-1].split()]
    top = sorted(range(len(last)), key=lambda i: -last[i])[:16]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write("# Made by tests/reference/make_default_model_golden.py (float64 numpy reference)\n")
        f.write(f"# completion: {tok.decode(greedy)!r}\n")
        f.write("prompt " + PROMPT.encode("unicode_escape").decode() + "\n")
        f.write("tokens " + " ".join(map(str, ids)) + "\n")
        f.write("greedy " + " ".join(map(str, greedy)) + "\n")
        f.write("logit_ids " + " ".join(map(str, list(range(KEPT_LOGITS)) + top)) + "\n")
        f.write("logit_values " + " ".join(f"{last[i]:.9g}" for i in list(range(KEPT_LOGITS)) + top) + "\n")
        f.write(f"logit_max_abs {max(abs(v) for v in last):.9g}\n")
    print(open(out).read())


if __name__ == "__main__":
    main()
