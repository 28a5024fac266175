#!/usr/bin/env python3
"""Perplexity as llama.cpp's llama-perplexity computes it, over token ids, with the
independent float64 numpy forward pass of llama_reference.py: the reference
`granule-cli perplexity` is checked against (tests/cli/perplexity_test.sh).

Non-overlapping chunks of CTX tokens; when the vocabulary adds BOS, each chunk's first token
is replaced by BOS; the logits of positions CTX/2 .. CTX-2 score the next token. Prints the
running value after each chunk as llama.cpp does ("[1]12.3456,[2]...") and the final
"Final estimate: PPL = X +/- Y" with llama.cpp's error formula.

Usage:
  python3 tests/reference/perplexity_reference.py MODEL.gguf --tokens-file IDS --ctx 64
  (IDS: whitespace-separated ids of the whole text, BOS included as the tokenizer adds it,
  e.g. the output of `granule-cli tokenize MODEL -f TEXT`)
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_reference import Model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens-file", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args()

    model = Model(args.model)
    tokens = [int(t) for t in open(args.tokens_file).read().split()]
    add_bos = bool(model.fields.get("tokenizer.ggml.add_bos_token") and
                   model.field("tokenizer.ggml.add_bos_token"))
    bos = int(model.field("tokenizer.ggml.bos_token_id")) if add_bos else None
    n_ctx = args.ctx
    if len(tokens) < 2 * n_ctx:
        raise SystemExit(f"{len(tokens)} tokens; a context of {n_ctx} needs {2 * n_ctx}")
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for chunk in range(len(tokens) // n_ctx):
        ids = tokens[chunk * n_ctx:(chunk + 1) * n_ctx]
        if add_bos:
            ids = [bos] + ids[1:]
        kv = [([], []) for _ in range(model.n_layer)]
        logits = model.forward(ids, kv, 0)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            log_prob = row[ids[j + 1]] - m - math.log(np.exp(row - m).sum())
            nll += -log_prob
            nll2 += log_prob * log_prob
            count += 1
        running.append(f"[{chunk + 1}]{math.exp(nll / count):.4f},")
    print("".join(running))
    mean = nll / count
    ppl = math.exp(mean)
    variance = nll2 / count - mean * mean
    print(f"Final estimate: PPL = {ppl:.4f} +/- {math.sqrt(variance / (count - 1)) * ppl:.5f}")


if __name__ == "__main__":
    main()
