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

from golden_text import escape, vocab_test_file

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
# DeepSeek LLM's Split sequence, its tokenizer.json regexes with the characters written as
# escapes (the letter class lists Latin, Greek, Cyrillic, Armenian, ... case-paired ranges).
DEEPSEEK_LLM_LETTERS = ("\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0"
    "-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-"
    "\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    "\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-"
    "\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
    "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00"
    "-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-"
    "\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-"
    "\U000118df\U0001e900-\U0001e943]+")
DEEPSEEK_LLM_PUNCT = ("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+")
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
    "deepseek-llm": P.Sequence([
        split(r"[\r\n]"), split(DEEPSEEK_LLM_LETTERS), split(DEEPSEEK_LLM_PUNCT), split(r"\s+$"),
        split(DEEPSEEK_CJK), split(r"\p{N}+")]),
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
    # whitespace beside U+2029, U+3000 and tabs (the DeepSeek LLM cases llama.cpp splits
    # differently: its \s+$ keeps "\u2029 " whole, Hugging Face's CJK range U+0800-U+4E00
    # takes U+2029 and U+3000 out first)
    "\u043c\u0438\u0440\u2192\u2029 \n", "\u2029 ", " \u2029", "a\u2029 b", "x\u2029\u2029  ",
    "\u3000 x\t\ty \t\n", "\u3000\u3000", "a \u3000", "tab\t", "\t\ttabs\t \t", "a\t\n\tb ",
    "\u2028\u2029\u3000\u00a0 \t", "end \u2029", "\u00a0x\u00a0 ", "\u2192 \u2190\t",
]


def main():
    texts = []
    inp = vocab_test_file("ggml-vocab-gpt-2.gguf.inp")
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
