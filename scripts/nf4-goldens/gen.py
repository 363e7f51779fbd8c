#!/usr/bin/env python3
"""Reference NF4 quantisation with double quantisation, written from bitsandbytes' published
algorithm (bitsandbytes/functional.py and csrc/kernels.cu), in plain Python so that it runs
without torch or numpy. It writes engine/quant/testdata/nf4_golden.json, which engine/quant's
tests compare against bit for bit.

Every float32 operation is emulated by computing in float64 and rounding once to float32
(struct 'f'); for +, -, * and / of float32 operands this equals IEEE float32 arithmetic, because
float64 carries more than twice float32's precision.

Usage: python3 scripts/nf4-goldens/gen.py   (from the repository root)
"""
import hashlib
import json
import math
import os
import struct


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16_bits(x):
    """Round a float32 value to bfloat16, ties to even (as __float2bfloat16 does)."""
    u = f32_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def from_bf16(b):
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


# The NF4 code book: bitsandbytes get_4bit_type("nf4"), float32 values.
NF4 = [f32(v) for v in [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]]

# dQuantizeNF4 compares against the midpoints of neighbouring codes, as float32 literals,
# with '>' so that a value on a midpoint takes the lower code.
NF4_MID = [f32((NF4[i] + NF4[i + 1]) / 2) for i in range(15)]


def quantize_nf4_value(x):
    # The decision tree of dQuantizeNF4 is a binary search over the midpoints; a NaN (a block
    # whose absmax is 0 gives 0 * inf) fails every comparison and lands on code 0.
    if x != x:
        return 0
    code = 0
    for m in NF4_MID:
        if x > m:
            code += 1
    return code


def linspace_f32(start, end, steps):
    """torch.linspace on float32, the scalar CPU formula: the first half counts up from start,
    the second half down from end."""
    start, end = f32(start), f32(end)
    step = f32(f32(end - start) / (steps - 1))
    half = steps // 2
    out = []
    for i in range(steps):
        if i < half:
            out.append(f32(start + f32(step * i)))
        else:
            out.append(f32(end - f32(step * (steps - i - 1))))
    return out


def create_dynamic_map_signed():
    """bitsandbytes create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)."""
    data = []
    max_exp, non_sign = 7, 7
    for i in range(max_exp):
        items = 2 ** (i + non_sign - max_exp) + 1
        b = linspace_f32(0.1, 1, items)
        means = [f32(f32(b[k] + b[k + 1]) / 2.0) for k in range(items - 1)]
        scale = f32(10.0 ** (-(max_exp - 1) + i))
        data += [f32(scale * m) for m in means]
        data += [f32(-scale * m) for m in means]
    data.append(0.0)
    data.append(1.0)
    assert len(data) == 256
    data.sort()
    return data


def quantize_dynamic_value(code, x):
    """dQuantize<0>: the binary search of bitsandbytes' 8-bit blockwise quantiser."""
    pivot, upper_pivot, lower_pivot = 127, 255, 0
    lower, upper = -1.0, 1.0
    val = code[pivot]
    i = 64
    while i > 0:
        if x > val:
            lower_pivot, lower = pivot, val
            pivot += i
        else:
            upper_pivot, upper = pivot, val
            pivot -= i
        val = code[pivot]
        i >>= 1
    if upper_pivot == 255:
        upper = code[upper_pivot]
    if lower_pivot == 0:
        lower = code[lower_pivot]
    if x > val:
        mid = f32(f32(upper + val) * 0.5)
        return upper_pivot if x > mid else pivot
    mid = f32(f32(lower + val) * 0.5)
    return lower_pivot if x < mid else pivot


def recip(a):
    return math.inf if a == 0 else f32(1.0 / a)


def mul(a, b):
    if (a == 0 and math.isinf(b)) or (b == 0 and math.isinf(a)):
        return math.nan
    return f32(a * b)


def quantize_nf4(x, blocksize):
    n = len(x)
    nb = (n + blocksize - 1) // blocksize
    absmax, codes = [], []
    for b in range(nb):
        blk = x[b * blocksize:(b + 1) * blocksize]
        am = 0.0
        for v in blk:
            am = max(am, abs(v))
        absmax.append(am)
        inv = recip(am)
        codes += [quantize_nf4_value(mul(v, inv)) for v in blk]
    # The last byte of an odd count pairs the final element with a padding zero, quantised
    # with the block's scale like the others (code 7 unless the block is all zeros).
    if n % 2:
        codes.append(quantize_nf4_value(mul(0.0, recip(absmax[-1]))))
    packed = bytes((codes[2 * i] << 4) | codes[2 * i + 1] for i in range(len(codes) // 2))
    return packed, absmax


def quantize_blockwise(x, code, blocksize):
    n = len(x)
    nb = (n + blocksize - 1) // blocksize
    absmax, q = [], []
    for b in range(nb):
        blk = x[b * blocksize:(b + 1) * blocksize]
        am = 0.0
        for v in blk:
            am = max(am, abs(v))
        absmax.append(am)
        inv = recip(am)
        q += [quantize_dynamic_value(code, mul(v, inv)) for v in blk]
    return bytes(q), absmax


def mean_f32(xs):
    # The offset: the mean of the block absmax values, summed in float64, rounded once.
    return f32(math.fsum(xs) / len(xs))


def dequant_nested(q, absmax2, code, blocksize, offset):
    return [f32(f32(code[v] * absmax2[i // blocksize]) + offset) for i, v in enumerate(q)]


def dequant_nf4(packed, absmax, n, blocksize):
    out = []
    for i in range(n):
        byte = packed[i // 2]
        c = byte >> 4 if i % 2 == 0 else byte & 0xF
        out.append(bf16_bits(f32(NF4[c] * absmax[i // blocksize])))
    return out


def lcg_input(n, seed):
    """The test input, also generated by engine/quant's test: a 32-bit LCG, uniform in
    (-1, 1) times a scale that varies per 64-block, rounded to bfloat16."""
    s = seed & 0xFFFFFFFF
    out = []
    for i in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        u = f32(((s >> 8) - (1 << 23)) / float(1 << 23))
        scale = f32(0.01 + 0.37 * ((i // 64) % 11))
        out.append(bf16_bits(f32(u * scale)))
    return out


def case(name, n, seed, nested, full):
    xb = lcg_input(n, seed)
    x = [from_bf16(b) for b in xb]
    packed, absmax = quantize_nf4(x, 64)
    rec = {"name": name, "n": n, "seed": seed, "blocksize": 64, "nested": nested,
           "packed": packed.hex(), "absmax": [f32_bits(a) for a in absmax]}
    used = absmax
    if nested:
        code = create_dynamic_map_signed()
        offset = mean_f32(absmax)
        centred = [f32(a - offset) for a in absmax]
        q, absmax2 = quantize_blockwise(centred, code, 256)
        rec.update({"offset": f32_bits(offset), "nested_blocksize": 256,
                    "nested_codes": q.hex(), "nested_absmax": [f32_bits(a) for a in absmax2]})
        used = dequant_nested(q, absmax2, code, 256, offset)
        rec["dequant_absmax"] = [f32_bits(a) for a in used]
    deq = dequant_nf4(packed, used, n, 64)
    raw = b"".join(struct.pack("<H", v) for v in deq)
    rec["dequant_bf16_sha256"] = hashlib.sha256(raw).hexdigest()
    if full:
        rec["dequant_bf16"] = raw.hex()
    return rec


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = os.path.join(root, "engine", "quant", "testdata", "nf4_golden.json")
    golden = {
        "nf4_code": [f32_bits(v) for v in NF4],
        "nf4_midpoints": [f32_bits(v) for v in NF4_MID],
        "dynamic_map_signed": [f32_bits(v) for v in create_dynamic_map_signed()],
        "cases": [
            case("odd-partial", 64 * 3 + 37, 1, False, True),
            case("nested-small", 64 * 9 + 5, 2, True, True),
            # 300 blocks of 64: two nested blocks of 256, the second partial.
            case("nested-two-blocks", 64 * 300 - 7, 3, True, False),
        ],
    }
    with open(out, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
