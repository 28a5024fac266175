#!/usr/bin/env python3
"""Golden token ids for DeepSeek LLM around U+2029, U+3000 and tabs, made with an independent
tokenizer: Hugging Face `tokenizers`, not Granule's code.

The tokenizer is rebuilt from llama.cpp's DeepSeek LLM vocabulary test file
(ggml-vocab-deepseek-llm.gguf, from llama.cpp's models/ folder: llama-cpp-python's source
distribution holds it under vendor/llama.cpp/models) with the pre-tokenizer its
tokenizer.json declares: the Split sequence in make_pretokenizer_goldens.py, then
ByteLevel(add_prefix_space=False, use_regex=False); BPE with the file's merges. The rebuilt
tokenizer reproduces all of llama.cpp's .out lines for the file (checked before anything is
printed).

Where llama.cpp differs: for 'мир→\\u2029 \\n' llama.cpp gives 23665 14728 350 20535 185
(its \\s+$ keeps "\\u2029 " as one word); Hugging Face gives 23665 14728 350 102 207 185,
because the CJK split [\\u4e00-\\u9fa5\\u0800-\\u4e00\\uac00-\\ud7ff]+ that follows takes U+2029
(and U+3000, U+2192, ...: all of U+0800-U+4E00) out of the word first.

Usage:  pip install tokenizers gguf numpy
        python3 tests/reference/make_deepseek_llm_tokenizer_goldens.py [ggml-vocab-deepseek-llm.gguf] \\
            > tests/data/tokenizer/deepseek_llm_goldens.txt

Output: as make_smollm2_tokenizer_goldens.py (parse_special, escaped text, ids; no BOS).
"""
import importlib.util
import os

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from golden_text import escape, vocab_test_fields

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("pre", os.path.join(HERE, "make_pretokenizer_goldens.py"))
pre = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pre)

CASES = [
    "\u043c\u0438\u0440\u2192\u2029 \n", "\u2029 ", " \u2029", "a\u2029 b", "x\u2029\u2029  ",
    "\u3000 x\t\ty \t\n", "\u3000\u3000", "a \u3000", "\u3000\u4f60\u597d \u3000", "tab\t",
    "\t\ttabs\t \t", "a\t\n\tb ", "\u2028\u2029\u3000\u00a0 \t", "end \u2029", "\u00a0x\u00a0 ",
    "\u2192 \u2190\t", "\u4f60\u597d\u2029\u4e16\u754c", "line\u2029\tnext\u3000 ", "  \t  ",
    "\u041f\u0440\u0438\u0432\u0435\u0442\t\u043c\u0438\u0440 \u2029",
]


def main():
    path, fields = vocab_test_fields("ggml-vocab-deepseek-llm.gguf")

    def array(name):
        field = fields[name]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens = array("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in array("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    # The user-defined tokens (ids 100002-100014: single Latin-1 letters such as "ü") are
    # added tokens, matched before the pre-tokenizer, as in the model's tokenizer.json.
    field = fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(tokens, types) if kind == 4])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre.FAMILIES["deepseek-llm"],
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    texts = open(path + ".inp", encoding="utf-8", newline="").read().split("\n__ggml_vocab_test__\n")
    expected = open(path + ".out", encoding="utf-8").read().splitlines()
    for text, line in zip(texts, expected):
        got = tok.encode(text, add_special_tokens=False).ids
        assert got == [int(x) for x in line.split()], (text, got, line)
    for text in CASES:
        ids = tok.encode(text, add_special_tokens=False).ids
        print("0\t%s\t%s" % (escape(text), " ".join(map(str, ids))))


if __name__ == "__main__":
    main()
