#!/usr/bin/env python3
"""Golden pre-tokenizer splits for the families Granule knows but has no test vocabulary
for, made by an independent engine: Hugging Face `tokenizers` (Oniguruma regexes), with
each family's pre_tokenizer as its tokenizer.json declares it (the regexes below are the
tokenizer.json ones, e.g. with (?i:'s|...) where Granule spells out ASCII classes).

Usage:  pip install tokenizers
        python3 tests/reference/make_pretokenizer_goldens.py \
            > tests/data/tokenizer/pretokenizer_goldens.txt

Output: one case per line, tab separated: the tokenizer.ggml.pre name, the text escaped
(\\\\ \\n \\t \\r \\xHH; UTF-8 kept as is), the byte lengths of the words it splits into.
The texts are llama.cpp's vocabulary test strings (when `bash packaging/setup.sh testdata`
has put them in the data folder) and a few more.
"""
import os
import sys

from tokenizers import Regex, pre_tokenizers as P

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
         r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


def split(pattern):
    return P.Split(Regex(pattern), behavior="isolated", invert=False)


def byte_level_regex():
    return P.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


FAMILIES = {
    "gpt2": byte_level_regex(),
    "smollm": P.Sequence([P.Digits(individual_digits=True), byte_level_regex()]),
    "llama-bpe": split(LLAMA3),
    "qwen2": split(QWEN2),
    "gpt-4o": split(O200K),
    "tekken": split(TEKKEN),
    "deepseek-coder": P.Sequence([
        split(r"[\r\n]"), split(r"\s?\p{L}+"), split(r"\s?\p{P}+"), split(DEEPSEEK_CJK),
        P.Digits(individual_digits=True)]),
}

EXTRA = [
    "I'm sure they'll say it's fine, DON'T you think? We'VE seen it.",
    "HTTPServer parseJSON XMLHttpRequest camelCase snake_case",
    "1234567 3.14159 1,000,000 \uff11\uff12\uff13",
    "  leading\n\n\n  indented\r\n\ttab  \t  trailing   ",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4",
    "Caf\u00e9 na\u00efve e\u0301 \u00c5ngstr\u00f6m \u0928\u092e\u0938\u094d\u0924\u0947",
    "\U0001f999\U0001f680 \U0001f44d\U0001f3fd \U0001f1fa\U0001f1f8",
    "def foo(x):\n    return x ** 2  # comment\n",
    "path/to/file.txt http://example.com/a?b=c",
]


def escape(text):
    named = {0x5C: b"\\\\", 0x0A: b"\\n", 0x09: b"\\t", 0x0D: b"\\r"}
    out = bytearray()
    for byte in text.encode("utf-8"):
        if byte in named:
            out += named[byte]
        elif byte < 0x20 or byte == 0x7F:
            out += b"\\x%02x" % byte
        else:
            out.append(byte)
    return out.decode("utf-8")


def main():
    texts = []
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    inp = os.path.join(data_home, "granule/testdata/tokenizer/ggml-vocab-gpt-2.gguf.inp")
    if len(sys.argv) > 1:
        inp = sys.argv[1]
    if os.path.exists(inp):
        raw = open(inp, encoding="utf-8", newline="").read()
        texts += [t for t in raw.split("\n__ggml_vocab_test__\n") if t]
    texts += EXTRA
    for name, pre in FAMILIES.items():
        for text in texts:
            # offsets are character offsets into the original text: turn them into bytes
            pieces = pre.pre_tokenize_str(text)
            lengths = [len(text[begin:end].encode("utf-8")) for _, (begin, end) in pieces]
            assert sum(lengths) == len(text.encode("utf-8")), (name, text)
            print("%s\t%s\t%s" % (name, escape(text), " ".join(map(str, lengths))))


if __name__ == "__main__":
    main()
