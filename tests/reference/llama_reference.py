#!/usr/bin/env python3
"""Independent float64 numpy forward pass of the llama family (Llama 2/3, Mistral, SmolLM2,
Qwen2 with QKV bias, Qwen3 with QK-norm) over a GGUF file: the reference the CPU backend's
goldens come from.

Weights are read and dequantised with the `gguf` package (gguf.quants), not with Granule's
code; every operation is written here from the published model definitions.

Usage:
  python3 tests/reference/llama_reference.py MODEL.gguf --tokens 1,2,3 [--greedy 32] [--out FILE]

Output (text, FILE or stdout):
  model_fnv1a64 <hex>      FNV-1a 64 of the model file (tests check they run the same bytes)
  tokens <ids...>          the prompt
  greedy <ids...>          greedy continuation (argmax, ties to the lowest id), when asked
  logits <rows> <n_vocab>  teacher-forced logits after each prompt token (--last-only: 1 row)
  <row values, %.9g>
"""
import argparse
import math
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Model:
    def __init__(self, path):
        self.reader = GGUFReader(path)
        self.fields = self.reader.fields
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.field("general.architecture")
        if self.arch not in ("llama", "mistral", "qwen2", "qwen3"):
            raise SystemExit(f"unsupported architecture {self.arch}")
        a = self.arch + "."
        self.n_layer = int(self.field(a + "block_count"))
        self.n_embd = int(self.field(a + "embedding_length"))
        self.n_head = int(self.field(a + "attention.head_count"))
        self.n_head_kv = int(self.field(a + "attention.head_count_kv", self.n_head))
        self.head_dim = int(self.field(a + "attention.key_length", self.n_embd // self.n_head))
        self.eps = float(self.field(a + "attention.layer_norm_rms_epsilon", 1e-5))
        self.theta = float(self.field(a + "rope.freq_base", 10000.0))
        # GGUF llama weights are permuted to interleaved rotation pairs; Qwen keeps halves.
        self.neox = self.arch in ("qwen2", "qwen3")
        self.cache = {}
        self.freqs = self.rope_freqs()

    def field(self, key, default=None):
        f = self.fields.get(key)
        if f is None:
            if default is None:
                raise KeyError(key)
            return default
        return f.contents()

    def weight(self, name):
        """The tensor as float64 with shape (rows, cols) (numpy order), or None."""
        if name not in self.cache:
            t = self.tensors.get(name)
            if t is None:
                return None
            values = dequantize(t.data, t.tensor_type)
            shape = [int(d) for d in reversed(t.shape)]
            self.cache[name] = np.asarray(values, dtype=np.float32).reshape(shape).astype(np.float64)
        return self.cache[name]

    def rope_freqs(self):
        d = self.head_dim
        base = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        a = self.arch + "."
        scaling = self.field(a + "rope.scaling.type", "none")
        factors = self.weight("rope_freqs.weight")
        if scaling == "llama3" or factors is not None:
            factor = float(self.field(a + "rope.scaling.factor", 8.0))
            low = float(self.field(a + "rope.scaling.low_freq_factor", 1.0))
            high = float(self.field(a + "rope.scaling.high_freq_factor", 4.0))
            orig = float(self.field(a + "rope.scaling.original_context_length", 8192))
            # Meta's Llama 3.1 rule: keep high frequencies, divide low ones by `factor`,
            # interpolate between.
            wavelen = 2 * math.pi / base
            smooth = (orig / wavelen - low) / (high - low)
            divisor = np.where(wavelen < orig / high, 1.0,
                               np.where(wavelen > orig / low, factor,
                                        1.0 / ((1 - smooth) / factor + smooth)))
            if factors is not None:
                # The file's rope_freqs.weight is what llama.cpp uses; check it agrees.
                assert np.allclose(factors.reshape(-1), divisor, rtol=1e-6), "rope_freqs mismatch"
                divisor = factors.reshape(-1)
            return base / divisor
        if scaling == "linear":
            return base / float(self.field(a + "rope.scaling.factor"))
        return base

    def rope(self, x, positions):
        """x: (tokens, heads, head_dim)."""
        ang = positions[:, None].astype(np.float64) * self.freqs[None, :]   # (T, d/2)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        if self.neox:
            h = self.head_dim // 2
            x0, x1 = x[..., :h], x[..., h:]
            out[..., :h] = x0 * cos - x1 * sin
            out[..., h:] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = x0 * cos - x1 * sin
            out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def forward(self, tokens, kv, start):
        """Runs tokens at positions start..; kv is a per-layer list of (K, V) lists. Returns
        logits (T, n_vocab)."""
        T = len(tokens)
        positions = np.arange(start, start + T)
        x = self.weight("token_embd.weight")[np.asarray(tokens)]
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rms_norm(x, self.weight(p + "attn_norm.weight"))
            q = h @ self.weight(p + "attn_q.weight").T
            k = h @ self.weight(p + "attn_k.weight").T
            v = h @ self.weight(p + "attn_v.weight").T
            for name, y in (("attn_q.bias", q), ("attn_k.bias", k), ("attn_v.bias", v)):
                b = self.weight(p + name)
                if b is not None:
                    y += b
            q = q.reshape(T, nh, hd)
            k = k.reshape(T, nkv, hd)
            v = v.reshape(T, nkv, hd)
            qn = self.weight(p + "attn_q_norm.weight")
            if qn is not None:
                q = self.rms_norm(q, qn)
                k = self.rms_norm(k, self.weight(p + "attn_k_norm.weight"))
            q = self.rope(q, positions)
            k = self.rope(k, positions)
            kv[i][0].append(k)
            kv[i][1].append(v)
            K = np.concatenate(kv[i][0])   # (L, nkv, hd)
            V = np.concatenate(kv[i][1])
            L = K.shape[0]
            group = nh // nkv
            Kh = np.repeat(K, group, axis=1)   # (L, nh, hd)
            Vh = np.repeat(V, group, axis=1)
            scores = np.einsum("thd,lhd->htl", q, Kh) / math.sqrt(hd)
            mask = positions[:, None] < np.arange(L)[None, :]   # causal: key l <= query position
            scores = np.where(mask[None], -np.inf, scores)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = np.einsum("htl,lhd->thd", probs, Vh).reshape(T, nh * hd)
            x = x + attn @ self.weight(p + "attn_output.weight").T
            h = self.rms_norm(x, self.weight(p + "ffn_norm.weight"))
            g = h @ self.weight(p + "ffn_gate.weight").T
            u = h @ self.weight(p + "ffn_up.weight").T
            x = x + (g / (1 + np.exp(-g)) * u) @ self.weight(p + "ffn_down.weight").T
        x = self.rms_norm(x, self.weight("output_norm.weight"))
        head = self.weight("output.weight")
        if head is None:
            head = self.weight("token_embd.weight")
        return x @ head.T


def fnv1a64(path):
    h = 0xCBF29CE484222325
    data = open(path, "rb").read()
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--greedy", type=int, default=0, help="greedy tokens to generate")
    ap.add_argument("--last-only", action="store_true", help="write only the last row of logits")
    ap.add_argument("--out", help="output file (default stdout)")
    args = ap.parse_args()

    model = Model(args.model)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    kv = [([], []) for _ in range(model.n_layer)]
    logits = model.forward(tokens, kv, 0)

    greedy = []
    last = logits[-1]
    for _ in range(args.greedy):
        nxt = int(np.argmax(last))   # numpy argmax returns the first (lowest) index on ties
        greedy.append(nxt)
        last = model.forward([nxt], kv, len(tokens) + len(greedy) - 1)[-1]

    rows = logits[-1:] if args.last_only else logits
    out = open(args.out, "w") if args.out else sys.stdout
    out.write(f"# llama_reference.py {args.model.split('/')[-1]}\n")
    out.write(f"model_fnv1a64 {fnv1a64(args.model):016x}\n")
    out.write("tokens " + " ".join(map(str, tokens)) + "\n")
    if args.greedy:
        out.write("greedy " + " ".join(map(str, greedy)) + "\n")
    out.write(f"logits {rows.shape[0]} {rows.shape[1]}\n")
    for r in rows:
        out.write(" ".join(f"{v:.9g}" for v in r) + "\n")


if __name__ == "__main__":
    main()
