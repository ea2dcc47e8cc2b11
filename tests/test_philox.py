"""Stochastic rounding's counter-based generators, checked from outside.

The oracle is Philox4x32-10 written here again in plain Python integers from
its definition (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as
easy as 1, 2, 3", SC 2011), itself checked on the known-answer vectors that
Random123 publishes (its ``kat_vectors`` file, the three ``philox4x32 10``
lines). ``numpy.random.Philox`` cannot serve: it is the 4x64 variant.

Checked against it: the host's draws (:func:`fpemu.quantize.stochastic_bits`),
the draws of ``fpemu.torch`` (torch integer code, what CUDA runs), stochastic
rounding's results (up exactly where the draw lies below the dropped part,
read from exact fractions), and ``"srN"`` block rounding's bits on both
drivers. ``rng="pcg64"`` / the splitmix64 default still give the streams of
earlier releases.
"""

from fractions import Fraction

import numpy as np
import pytest

import fpemu
from fpemu import block
from fpemu.errors import FpemuValueError
from fpemu.block.host import srn_draws
from fpemu.quantize import stochastic_bits

M32 = (1 << 32) - 1

# Random123's kat_vectors, "philox4x32 10": counter (4 words), key (2), result (4)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox(ctr, key, rounds=10):
    """Philox4x32-R in Python integers: each round multiplies counter words 0
    and 2 by the two multipliers, swaps the halves of the products into a new
    counter with the key xored in, and bumps the key by the Weyl constants."""
    x0, x1, x2, x3 = ctr
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        a = 0xD2511F53 * x0
        b = 0xCD9E8D57 * x2
        x0, x1, x2, x3 = (b >> 32) ^ x1 ^ k0, b & M32, (a >> 32) ^ x3 ^ k1, a & M32
    return x0, x1, x2, x3


def key_of(seed):
    """The 64-bit key of a seed: NumPy's SeedSequence's first word."""
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])


def draw63(seed, index):
    """The 63-bit draw of element ``index`` (docs/numeric-contract.md)."""
    k = key_of(seed)
    w0, w1, _, _ = philox((index & M32, index >> 32, 0, 0), (k & M32, k >> 32))
    return ((w1 << 32) | w0) >> 1


@pytest.mark.parametrize("ctr, key, want", KAT)
def test_the_oracle_gives_random123s_known_answers(ctr, key, want):
    assert philox(ctr, key) == want


def test_host_draws_are_philox_by_counter_and_key():
    for seed, offset in ((0, 0), (7, 10), (2**40 + 3, 2**32 - 3), (123, 2**61)):
        got = stochastic_bits((seed, offset), 8, rng="philox")
        assert got.dtype == np.int64
        assert got.tolist() == [draw63(seed, offset + i) for i in range(8)], (seed, offset)
    # a slice with its offset draws what the whole call draws there
    assert np.array_equal(stochastic_bits((5, 1000), 50, rng="philox"),
                          stochastic_bits(5, 1050, rng="philox")[1000:])


def test_the_default_stream_is_still_splitmix64():
    """rng=None keeps fpemu's first stream: splitmix64 of key + (i + 1) * golden."""
    def splitmix63(seed, i):
        z = (key_of(seed) + (i + 1) * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        return (z ^ (z >> 31)) >> 1

    assert stochastic_bits(9, 6).tolist() == [splitmix63(9, i) for i in range(6)]
    assert stochastic_bits(9, 6, rng="splitmix64").tolist() == stochastic_bits(9, 6).tolist()


def _exact_sr(x, fmt, draws):
    """Stochastic rounding from exact fractions: between the neighbours lo
    (toward zero) and hi (away), up where draw < (|x| - |lo|) / (|hi| - |lo|)
    * 2**63 (both from fpemu's directed roundings, checked by their own
    oracles in test_quantize.py)."""
    lo = fpemu.quantize(x, fmt, rounding="rtz").astype(np.float64)
    hi_up = fpemu.quantize(x, fmt, rounding="rup").astype(np.float64)
    hi_dn = fpemu.quantize(x, fmt, rounding="rdn").astype(np.float64)
    hi = np.where(x > 0, hi_up, hi_dn)
    out = []
    for v, a, b, r in zip(x.astype(np.float64), lo, hi, draws):
        if a == b:
            out.append(a)
            continue
        frac = (abs(Fraction(v)) - abs(Fraction(a))) / (abs(Fraction(b)) - abs(Fraction(a)))
        out.append(b if Fraction(int(r)) < frac * 2**63 else a)
    return np.array(out, np.float64)


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "e2m1", "fp16"])
def test_philox_stochastic_rounding_from_exact_fractions(fmt):
    rng = np.random.default_rng(3)
    f = fpemu.format(fmt)
    x = (rng.standard_normal(3000) * f.max / 8).astype(np.float32)
    x = x[np.abs(x) < f.max]
    seed = (11, 500)
    got = fpemu.quantize(x, fmt, rounding="sr", seed=seed, rng="philox").astype(np.float64)
    want = _exact_sr(x, fmt, [draw63(11, 500 + i) for i in range(x.size)])
    np.testing.assert_array_equal(got, want)
    codes = fpemu.encode(x, fmt, rounding="sr", seed=seed, rng="philox")
    np.testing.assert_array_equal(fpemu.decode(codes, fmt).astype(np.float64), want)


@pytest.mark.parametrize("path", ["numba", "torch-code"])
def test_torch_draws_and_rounds_as_the_oracle(path, monkeypatch):
    torch = pytest.importorskip("torch")
    import fpemu.torch
    from fpemu.torch import _quantize
    monkeypatch.setattr(_quantize, "CPU_KERNELS", path == "numba")
    x = np.random.default_rng(4).standard_normal((40, 75)).astype(np.float32)
    for fmt in ("bf16", "e5m2", "e2m1"):
        for seed in (3, (3, 2**33 + 5)):
            want = fpemu.quantize(x, fmt, rounding="sr", seed=seed, rng="philox")
            got = fpemu.torch.quantize(torch.from_numpy(x), fmt, rounding="sr", seed=seed,
                                       rng="philox").numpy()
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
            codes = fpemu.torch.encode(torch.from_numpy(x), fmt, rounding="sr", seed=seed,
                                       rng="philox").numpy()
            np.testing.assert_array_equal(codes, fpemu.encode(x, fmt, rounding="sr", seed=seed,
                                                              rng="philox"))
    d = _quantize._philox63(key_of(8), 2**32 - 2, torch.Size([5]), "cpu")
    assert d.tolist() == [draw63(8, 2**32 - 2 + i) for i in range(5)]


def test_srn_block_rounding_takes_the_top_bits_of_the_philox_draw():
    x = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
    q = block.quantize_blocks(x, "nvfp4", rounding="sr8", seed=21)
    assert np.array_equal(q.codes, block.quantize_blocks(x, "nvfp4", rounding="sr8", seed=21,
                                                         rng="philox").codes)
    draws = srn_draws(8, 21, 40)
    assert draws.tolist() == [draw63(21, i) >> 55 for i in range(40)]
    # the earlier stream, by name: NumPy's PCG64 integers below 2**8
    old = srn_draws(8, 21, 40, rng="pcg64")
    assert old.tolist() == np.random.Generator(np.random.PCG64(21)).integers(
        0, 256, size=40, dtype=np.uint64).tolist()
    p = block.quantize_blocks(x, "nvfp4", rounding="sr8", seed=21, rng="pcg64")
    assert not np.array_equal(p.codes, q.codes)
    assert np.array_equal(p.scales, q.scales)        # the scales do not depend on the draws


@pytest.mark.parametrize("path", ["numba", "torch-code"])
def test_srn_on_the_device_makes_the_hosts_bits(path, monkeypatch):
    torch = pytest.importorskip("torch")
    import fpemu.torch
    from fpemu.torch import _quantize
    monkeypatch.setattr(_quantize, "CPU_KERNELS", path == "numba")
    x = np.random.default_rng(6).standard_normal((32, 96)).astype(np.float32)
    for preset, rounding in (("nvfp4", "sr8"), ("mxfp8", "sr12"), ("mxfp4", "sr3")):
        for rng in (None, "pcg64"):
            seed = [4, 2] if rng is None else 4
            want = block.quantize_blocks(x, preset, rounding=rounding, seed=seed, rng=rng)
            got = fpemu.torch.quantize_blocks(torch.from_numpy(x), preset, rounding=rounding,
                                              seed=seed, rng=rng)
            np.testing.assert_array_equal(got.codes.numpy(), want.codes)
            np.testing.assert_array_equal(got.scales.numpy(), want.scales)


def test_a_wrong_generator_is_named():
    with pytest.raises(FpemuValueError, match="rng='philox'.*'pcg64'"):
        block.quantize_blocks(np.ones(32, np.float32), "mxfp8", rounding="sr8", seed=1,
                              rng="mt19937")
    with pytest.raises(FpemuValueError, match=r"srn_draws\(\): rng is one of"):
        srn_draws(8, 1, 4, rng="splitmix64")
    with pytest.raises(FpemuValueError, match="expected 'splitmix64' or 'philox'"):
        fpemu.quantize(1.5, "bf16", rounding="sr", seed=1, rng="pcg64")
