#!/usr/bin/env python3
"""Independent reference for granule::Sampler (tests/engine/sampler_test.cpp).

Computes, in float64 with a full sort, the exact distribution the sampler draws from:
penalties (llama.cpp rule) -> top-k -> temperature -> softmax -> top-p -> min-p, and the
first draws of splitmix64 for a seed. Prints C++ initialisers that the test embeds.
Run: python3 tests/reference/sampler_reference.py
"""
import math

MASK = (1 << 64) - 1


def splitmix64_uniforms(seed, count):
    state = seed
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out.append((z >> 40) * 2.0 ** -24)   # the top 24 bits, as the device sampler
    return out


def distribution(logits, history=(), temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                 repetition=1.0, frequency=0.0, presence=0.0, last_n=64):
    values = [float(v) for v in logits]
    window = list(history)[-last_n:] if last_n > 0 else list(history)
    for token in set(window):
        count = window.count(token)
        v = values[token]
        v = v * repetition if v <= 0 else v / repetition
        values[token] = v - count * frequency - presence
    ranked = sorted(range(len(values)), key=lambda i: (-values[i], i))
    if 0 < top_k < len(values):
        ranked = ranked[:top_k]
    best = values[ranked[0]]
    weights = {i: math.exp((values[i] - best) / temperature) for i in ranked}
    total = sum(weights.values())
    if top_p < 1.0:
        kept, mass = [], 0.0
        for i in ranked:
            kept.append(i)
            mass += weights[i] / total
            if mass >= top_p:
                break
        ranked = kept
    if min_p > 0.0:
        ranked = [i for i in ranked if weights[i] >= min_p] or ranked[:1]
    kept_total = sum(weights[i] for i in ranked)
    return [weights[i] / kept_total if i in ranked else 0.0 for i in range(len(values))]


CASES = {
    # name: (logits, history, params)
    "AllStagesTogether": ([2.0, 1.5, 1.2, 0.9, 0.3, -0.2, -0.4, -1.0, 1.9, 0.0],
                          [0, 0, 3, 6, 9], dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.25,
                                                repetition=1.3, frequency=0.2, presence=0.5)),
    "SoftmaxAtTemperatureOne": ([0.5, -1.0, 2.0, 1.0, 0.0, -0.5, 1.5, -2.0], [], {}),
    "TopPOnly": ([3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -3.0], [], dict(top_p=0.7)),
    "MinPOnly": ([3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -3.0], [], dict(min_p=0.2)),
    "TopPAndMinPWithoutTopK": ([1.0, 2.8, 2.5, 0.2, 2.9, 0.0, -1.0, 1.7], [],
                               dict(temperature=1.5, top_p=0.8, min_p=0.3)),
}


def main():
    for name, (logits, history, params) in CASES.items():
        probs = distribution(logits, history, **params)
        print(f"// {name}")
        print("{" + ", ".join(f"{p:.12f}" for p in probs) + "}")
    print("// splitmix64 seed 42, uniform logits over 1000 tokens: first 10 draws")
    print("{" + ", ".join(str(int(u * 1000)) for u in splitmix64_uniforms(42, 10)) + "}")


if __name__ == "__main__":
    main()
