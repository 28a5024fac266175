#!/usr/bin/env python3
"""Golden token ids for Phi-3's special tokens and the whitespace after them, made with an
independent tokenizer: Hugging Face `tokenizers`, not Granule's code.

The tokenizer is rebuilt from llama.cpp's Phi-3 vocabulary test file
(ggml-vocab-phi-3.gguf, which `bash packaging/setup.sh testdata` fetches) the way
transformers converts a SentencePiece model (merges from every pair of pieces whose join is
a piece, ranked by that piece's score), with Phi-3's tokenizer.json around it:
    normalizer:   Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer
    model:        BPE, unk <unk>, fuse_unk, byte_fallback
    added tokens: as Phi-3's tokenizer_config.json declares them: </s> and 32001-32010
                  (<|assistant|>, <|placeholderN|>, <|system|>, <|end|>, <|user|>) with
                  rstrip=True; <unk>, <s>, <|endoftext|> without.
The rebuilt tokenizer reproduces every one of llama.cpp's .out lines for the file (checked
below before anything is printed). Control tokens are added only for the parse_special=1
cases; for parse_special=0 only the user-defined </s> is (llama.cpp matches user-defined
tokens either way).

Usage:  pip install tokenizers gguf numpy
        python3 tests/reference/make_phi3_tokenizer_goldens.py [ggml-vocab-phi-3.gguf] \
            > tests/data/tokenizer/phi3_goldens.txt

Output: as make_smollm2_tokenizer_goldens.py: parse_special (0/1), the escaped text, the
ids (no BOS), tab separated.
"""

from tokenizers import AddedToken, Tokenizer, models, normalizers

from golden_text import escape, vocab_test_fields

CASES = [
    (1, "<|user|>\nHello<|end|>\n<|assistant|>\n"),
    (1, "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n"
        "<|assistant|>\n"),
    (1, "<|user|>\n\n\n  \t Hi<|end|>"), (1, "<|user|>Hi<|end|>"), (1, "<|end|> "),
    (1, "<|end|>\n\n"), (1, " <|end|> x"), (1, "x \n<|end|>"),
    # Unicode whitespace: Hugging Face strips it too (llama.cpp strips ASCII only)
    (1, "<|user|>\u3000Hi<|end|>\u00a0\u2029x"), (1, "<|end|>\u200bx"),
    # tokens that keep the whitespace after them
    (1, "<s> z"), (1, "<|endoftext|> w"), (1, "<unk> u"), (1, "</s>  y"),
    (1, "<|placeholder1|>\n<|placeholder6|> p"),
    # </s> is user-defined: matched, and stripping, without special parsing too
    (0, "</s>  y"), (0, "a</s>\nb"), (0, "<|user|>\nHello<|end|>\n"),
]


def main():
    path, fields = vocab_test_fields("ggml-vocab-phi-3.gguf")

    def array(name):
        field = fields[name]
        return [field.parts[i] for i in field.data]

    tokens = [bytes(p).decode("utf-8") for p in array("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in array("tokenizer.ggml.scores")]
    types = [int(p[0]) for p in array("tokenizer.ggml.token_type")]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, i in vocab.items():
        if types[i] != 1:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if types[vocab.get(left, 0)] == 1 and types[vocab.get(right, 0)] == 1:
                merges.append((scores[i], vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))

    def build(parse_special):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges],
                                   unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        rstrip = {2} | set(range(32001, 32011))
        ids = [0, 1, 2] + list(range(32000, 32011)) if parse_special else [2]
        tok.add_tokens([AddedToken(tokens[i], rstrip=i in rstrip, lstrip=False,
                                   normalized=False, special=types[i] == 3) for i in ids])
        return tok

    plain, special = build(False), build(True)
    # The rebuilt tokenizer must reproduce llama.cpp's own goldens for this file.
    texts = open(path + ".inp", encoding="utf-8", newline="").read().split("\n__ggml_vocab_test__\n")
    expected = open(path + ".out", encoding="utf-8").read().splitlines()
    for text, line in zip(texts, expected):
        got = plain.encode(text, add_special_tokens=False).ids
        assert got == [int(x) for x in line.split()], (text, got, line)
    for parse_special, text in CASES:
        tok = special if parse_special else plain
        ids = tok.encode(text, add_special_tokens=False).ids
        print("%d\t%s\t%s" % (parse_special, escape(text), " ".join(map(str, ids))))


if __name__ == "__main__":
    main()
