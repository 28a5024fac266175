#!/usr/bin/env python3
"""Writes tests/data/quant/quant_goldens.bin: encoded blocks of every GGUF block type the
engine supports with their decoded floats, and f32 inputs with their encodings, all
produced by the `gguf` Python package (gguf.quants, an implementation independent of ours).
quant_test.cpp compares the engine's dequantize_row / quantize_row with it bit for bit.

    pip install gguf numpy && python3 tests/reference/make_quant_goldens.py

File layout (little-endian): magic b"GQGD", u32 record count, then per record
  u32 kind (0 = decode: bytes -> floats, 1 = encode: floats -> bytes), u32 ggml type id,
  u32 element count, u32 byte count, then for kind 0 the bytes followed by the floats,
  for kind 1 the floats followed by the bytes.
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = Path(__file__).resolve().parents[1] / "data" / "quant" / "quant_goldens.bin"
rng = np.random.default_rng(20261202)


def finite_halves(count: int) -> np.ndarray:
    """Scales as a real file holds them: finite fp16, mostly normal, some subnormal,
    some zero, some negative (valid bit patterns the decoder must handle)."""
    normal = (rng.standard_normal(count) * 0.05).astype(np.float16)
    subnormal = (rng.integers(1, 0x400, count, dtype=np.uint16)).view(np.float16)
    pick = rng.random(count)
    h = np.where(pick < 0.8, normal, np.where(pick < 0.9, subnormal, np.float16(0)))
    return h.astype(np.float16).view(np.uint8).reshape(count, 2)


def random_blocks(qtype: T, n_blocks: int) -> np.ndarray:
    """Random bytes for every field, then the fp16 scale fields replaced by finite values."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    # Byte offsets of the fp16 fields in each block layout (ggml-common.h).
    half_fields = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
                   T.Q6_K: [208], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q2_K: [80, 82], T.Q3_K: [108],
                   T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: []}[qtype]
    for off in half_fields:
        blocks[:, off:off + 2] = finite_halves(n_blocks)
    return blocks


records = []


def decode_record(qtype: T, raw: np.ndarray) -> None:
    values = quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
    records.append((0, int(qtype), values.size, raw.tobytes(), values.tobytes()))


def encode_record(qtype: T, values: np.ndarray) -> None:
    values = values.astype(np.float32).reshape(-1)
    if qtype == T.F16:
        raw = values.astype(np.float16).view(np.uint8)
    else:
        raw = quants.quantize(values.reshape(1, -1), qtype)
    records.append((1, int(qtype), values.size, np.asarray(raw).tobytes(), values.tobytes()))


# Decoding: random blocks of each quantised type (odd counts, so no type fits by luck).
for qtype, n_blocks in [(T.Q4_0, 37), (T.Q4_1, 37), (T.Q8_0, 37), (T.Q4_K, 9), (T.Q5_K, 9),
                        (T.Q6_K, 9)]:
    decode_record(qtype, random_blocks(qtype, n_blocks))

# fp16 -> f32: every subnormal-boundary and special pattern, plus random halves.
specials = [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x3c00, 0xbc00,
            0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x3555, 0x0200, 0x7800]
halves = np.concatenate([np.array(specials, dtype=np.uint16),
                         rng.integers(0, 0x7c00, 1007, dtype=np.uint16),
                         rng.integers(0x8000, 0xfc00, 1000, dtype=np.uint16)])
decode_record(T.F16, halves.view(np.uint8))
# bf16 -> f32 (no NaN: numpy cannot promise a payload).
bf = rng.integers(0, 0x10000, 2048, dtype=np.uint16)
bf = bf[(bf & 0x7f80) != 0x7f80][:1500]
decode_record(T.BF16, np.concatenate([np.array([0, 0x8000, 0x7f80, 0xff80, 1, 0x8001], np.uint16), bf]).view(np.uint8))

# f32 -> fp16 by numpy's round-to-nearest-even: ties, the overflow edge, subnormals.
tricky = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e6, -1e6,
                   np.inf, -np.inf, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 3 * 2.0**-25,
                   2.0**-14, 2.0**-14 - 2.0**-25, 1e-10, -1e-10, 1 + 2.0**-11, 1 + 3 * 2.0**-11,
                   1 + 2.0**-11 + 2.0**-20, 2.0**-15, 0.1, 1 / 3], dtype=np.float32)
encode_record(T.F16, np.concatenate([tricky, (rng.standard_normal(998) * 10.0**rng.integers(-8, 5, 998)).astype(np.float32)]))
# f32 -> bf16 (gguf's copy of ggml_compute_fp32_to_bf16).
bits = np.array([0x3f808000, 0x3f818000, 0x3f808001, 0x7f7fffff, 0xff7fffff, 0x00000001],
                dtype=np.uint32).view(np.float32)
encode_record(T.BF16, np.concatenate([bits, np.array([np.inf, -np.inf, 0.0, -0.0], np.float32),
                                      rng.standard_normal(990).astype(np.float32)]))

# Encoding with ggml's reference quantisers (gguf.quants is bit-exact with them for
# these types): random rows, a row with an all-zero block and one with a constant block.
def encode_spread_record(qtype):
    x = rng.standard_normal(32 * 29).astype(np.float32) * 3
    x[32:64] = 0
    x[64:96] = 1.25
    x[96:128] *= 1e-3
    encode_record(qtype, x)


for qtype in (T.Q4_0, T.Q4_1, T.Q8_0):
    encode_spread_record(qtype)

# The block types added later, after the first ones so those records keep their bytes.
for qtype, n_blocks in [(T.Q5_0, 37), (T.Q5_1, 37), (T.Q2_K, 9), (T.Q3_K, 9), (T.IQ4_NL, 37),
                        (T.IQ4_XS, 9), (T.MXFP4, 37)]:
    decode_record(qtype, random_blocks(qtype, n_blocks))
# MXFP4's E8M0 scale byte: every exponent, including 0 and 1 (subnormal scales) and 255
# (2^127: large levels overflow to infinity, as in ggml).
mx = random_blocks(T.MXFP4, 256)
mx[:, 0] = np.arange(256, dtype=np.uint8)
with np.errstate(over="ignore"):
    decode_record(T.MXFP4, mx)
for qtype in (T.Q5_0, T.Q5_1, T.MXFP4):
    encode_spread_record(qtype)

with OUT.open("wb") as f:
    f.write(b"GQGD")
    f.write(struct.pack("<I", len(records)))
    for kind, type_id, n_elems, raw, floats in records:
        f.write(struct.pack("<IIII", kind, type_id, n_elems, len(raw)))
        if kind == 0:
            f.write(raw)
            f.write(floats)
        else:
            f.write(floats)
            f.write(raw)
print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(records)} records)", file=sys.stderr)
