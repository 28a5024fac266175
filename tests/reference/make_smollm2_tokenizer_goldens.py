#!/usr/bin/env python3
"""Golden token ids for the default model (SmolLM2-135M-Instruct), made with an
independent tokenizer: Hugging Face `tokenizers`, not Granule's code.

The tokenizer is rebuilt from the GGUF's own vocabulary and merges, with SmolLM2's
pre-tokenizer and decoder as its tokenizer.json (HuggingFaceTB/SmolLM2-135M-Instruct)
declares them:
    pre_tokenizer: Sequence[Digits(individual_digits=True),
                            ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]
    decoder:       ByteLevel
    model:         BPE, no unk token, no dropout
Control tokens (<|im_start|> ...) are added as special tokens only for the
parse_special=1 cases; for parse_special=0 they are plain text, as in llama.cpp.

Usage:  pip install tokenizers gguf numpy
        python3 tests/reference/make_smollm2_tokenizer_goldens.py [MODEL.gguf] \
            > tests/data/tokenizer/smollm2_goldens.txt

Output: one case per line, tab separated: parse_special (0/1), the text escaped
(\\\\ \\n \\t \\r and \\xHH for other control bytes; UTF-8 kept as is), the ids
separated by spaces (no BOS).
"""
import os
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from golden_text import escape

CASES = [
    # whitespace
    (0, ""), (0, " "), (0, "  "), (0, "   "), (0, "\t"), (0, "\n"), (0, "\n\n"), (0, "\t\n"),
    (0, " \n \n\n  \t \t\t"), (0, "a" + " " * 20 + "b"), (0, "   leading"), (0, "trailing   "),
    (0, "a\r\nb"), (0, "\n\n\n\n  \n"), (0, "x\u00a0y"), (0, "zero\u200bwidth"),
    (0, "ideographic\u3000space"),
    # words and punctuation
    (0, "Hello world"), (0, " Hello world"), (0, "Hello  world"), (0, "Hello, world!"),
    (0, "I'm sure they'll say it's fine, don't you think? We've seen it."),
    (0, "'s 'S 'T 'LL"), (0, "!!!!!!"), (0, "......"), (0, "--- (parens) [brackets] {braces}"),
    # digits: SmolLM2 splits every digit
    (0, "1234567"), (0, "3.14159"), (0, "a1b2c3"), (0, "x = 42;"), (0, " 2024-12-02"),
    (0, "\uff11\uff12\uff13 full-width"), (0, "\u0663\u0664 arabic-indic"), (0, "\u00bd \u00be"),
    # emoji, scripts, accents
    (0, "\U0001f999\U0001f680 \U0001f44d\U0001f3fd"), (0, "\U0001f1fa\U0001f1f8"),
    (0, "\u4f60\u597d\uff0c\u4e16\u754c\uff01"), (0, "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8"),
    (0, "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8"), (0, "\u0420\u043e\u0441\u0441\u0438\u044f"),
    (0, "\u0645\u0631\u062d\u0628\u0627"), (0, "\u0928\u092e\u0938\u094d\u0924\u0947"),
    (0, "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00c5ngstr\u00f6m"),
    (0, "e\u0301 combining"),
    # code
    (0, "def foo(x):\n    return x ** 2  # comment\n"),
    (0, "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}"),
    (0, "<html><body class=\"x\">&amp;</body></html>"),
    # special tokens as text and as tokens
    (0, "<|im_start|>user\nHi<|im_end|>\n"), (1, "<|im_start|>user\nHi<|im_end|>\n"),
    (1, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n"),
    (1, "<|endoftext|>"), (1, "<|im_start|><|im_end|>"), (1, "a<|im_start|>b"),
    (1, "<|im_start <|im_end|"), (1, " <|im_end|> "),
]


def build(reader, with_specials):
    fields = reader.fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    merges = []
    for merge in fields["tokenizer.ggml.merges"].contents():
        space = merge.find(" ", 1)
        merges.append((merge[:space], merge[space + 1:]))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    if with_specials:
        control = [t for t, ty in zip(tokens, types) if ty == 3]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.local/share/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    reader = gguf.GGUFReader(path)
    assert reader.fields["tokenizer.ggml.pre"].contents() == "smollm"
    tokenizers = {0: build(reader, False), 1: build(reader, True)}
    for parse_special, text in CASES:
        ids = tokenizers[parse_special].encode(text, add_special_tokens=False).ids
        print("%d\t%s\t%s" % (parse_special, escape(text), " ".join(map(str, ids))))


if __name__ == "__main__":
    main()
