"""A random generator that draws PyTorch's CPU numbers.

PyTorch's CPU generator is a 32-bit Mersenne Twister (mt19937) seeded by
``manual_seed(s)`` with the reference initialisation of Matsumoto and
Nishimura, which is also NumPy's legacy ``RandomState`` seeding. Each
distribution turns the 32-bit draws into numbers in a fixed way
(``docs/pytorch-numerics.md`` §10):

* ``randint(low, high)``: ``low + draw % (high - low)``, one 32-bit draw per
  element, a 64-bit draw (two 32-bit ones, the first the high word) when the
  range is 2**32 or more;
* ``rand`` / ``uniform_(a, b)``: 24 random bits (53 for float64) times
  2**-24, then ``x * (b - a) + a`` in double with a and b rounded to float32,
  rounded to the dtype (bit for bit torch's for float32, float64 and float16;
  bfloat16 within one ulp, equal on 99.8 % of draws);
* ``randperm(n)``: a Fisher-Yates pass, ``swap(r[i], r[i + draw % (n - i)])``;
* ``randn`` / ``normal_`` with fewer than 16 elements (or not float32 /
  float64): Box-Muller in double from two 53-bit uniforms, the second value
  kept for the next call; with 16 or more float32 (float64) elements: 24-bit
  (53-bit) uniforms for every element, then Box-Muller on blocks of 16 (the
  last block redrawn when the size is not a multiple of 16).

Integers, uniforms and permutations are bit for bit torch's; normals follow
the same draws, so the stream stays aligned, but torch computes the
logarithm, sine and cosine of large blocks with its own vector library, so a
value may differ from torch's in the last bits. Dropout and multinomial
sampling follow their own formulas here (torch's CPU dropout draws through
MKL); their numbers are not torch's.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FpemuTypeError, FpemuValueError

_U24 = 2.0 ** -24
_U53 = 2.0 ** -53


class Generator:
    """``torch.Generator``: an mt19937 stream, seeded as PyTorch's CPU one."""

    def __init__(self, device="cpu"):
        self.device = device
        self.manual_seed(67280421310721)        # torch's default seed

    def manual_seed(self, seed):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise FpemuTypeError(f"manual_seed expects an int, got {type(seed).__name__} "
                                 f"({seed!r})")
        seed = int(seed)
        if seed < 0:                              # torch takes the two's complement
            seed += 1 << 64
        self._seed = seed
        self._mt = np.random.MT19937(0)
        self._mt._legacy_seeding(seed & 0xFFFFFFFF)
        self._normal_cache = None
        return self

    def initial_seed(self):
        return self._seed

    def seed(self):
        """Seed from the operating system, as ``torch.seed()``; returns it."""
        s = int.from_bytes(np.random.SeedSequence().generate_state(2, np.uint32).tobytes(),
                           "little")
        self.manual_seed(s)
        return s

    def get_state(self):
        return (self._seed, self._mt.state, self._normal_cache)

    def set_state(self, state):
        self._seed, mt_state, self._normal_cache = state
        self._mt.state = mt_state
        return self

    # -- raw draws
    def draws32(self, n):
        """``n`` 32-bit draws as uint64."""
        return self._mt.random_raw(int(n)).astype(np.uint64)

    def draws64(self, n):
        r = self.draws32(2 * n).reshape(-1, 2)
        return (r[:, 0] << np.uint64(32)) | r[:, 1]

    # -- distributions
    def randint(self, low, high, n):
        """``n`` integers in [low, high) as int64, torch's formula."""
        span = int(high) - int(low)
        if span <= 0:
            raise FpemuValueError(f"random_ expects 'from' to be less than 'to', but got "
                                  f"from={low} >= to={high}")
        raw = self.draws32(n) if span < (1 << 32) else self.draws64(n)
        return (raw % np.uint64(span)).astype(np.int64) + np.int64(low)

    def uniform(self, n, low=0.0, high=1.0, double=False):
        """``n`` uniforms in [low, high): float64 values (already rounded to
        float32 unless ``double``)."""
        if double:
            x = (self.draws64(n) & np.uint64((1 << 53) - 1)).astype(np.float64) * _U53
            return x * (float(high) - float(low)) + float(low)
        lo, hi = float(np.float32(low)), float(np.float32(high))
        x = (self.draws32(n) & np.uint64(0xFFFFFF)).astype(np.float64) * _U24
        return (x * (hi - lo) + lo).astype(np.float32).astype(np.float64)

    def randperm(self, n):
        r = np.arange(n, dtype=np.int64)
        if n > 1:
            raw = self.draws32(n - 1)
            for i in range(n - 1):
                z = i + int(raw[i] % np.uint64(n - i))
                r[i], r[z] = r[z], r[i]
        return r

    def normal(self, n, mean=0.0, std=1.0, fill32=False, fill64=False):
        """``n`` normal values as float64. ``fill32`` / ``fill64``: the tensor
        is float32 / float64, and torch fills blocks of 16 when there are 16
        or more (``normal_fill``: float32 from 24-bit uniforms, float64 from
        53-bit ones); every other case takes the one-at-a-time double path."""
        if n >= 16 and fill32:
            return self._normal_fill(n, float(np.float32(mean)), float(np.float32(std)))
        if n >= 16 and fill64:
            return self._normal_fill64(n, float(mean), float(std))
        out = np.empty(n, np.float64)
        for i in range(n):
            if self._normal_cache is not None:
                z, self._normal_cache = self._normal_cache, None
            else:
                u1, u2 = self.uniform(2, double=True)
                r = math.sqrt(-2.0 * math.log1p(-u2))
                theta = 2.0 * math.pi * u1
                self._normal_cache = r * math.sin(theta)
                z = r * math.cos(theta)
            out[i] = z * std + mean
        return out

    def _normal_fill(self, n, mean, std):
        data = self.uniform(n).astype(np.float32)
        full = n // 16 * 16
        if full:
            data[:full] = _box_muller16(data[:full], mean, std)
        if n % 16:
            data[n - 16:] = _box_muller16(self.uniform(16).astype(np.float32), mean, std)
        return data.astype(np.float64)

    def _normal_fill64(self, n, mean, std):
        data = self.uniform(n, double=True)
        full = n // 16 * 16
        if full:
            data[:full] = _box_muller16_64(data[:full], mean, std)
        if n % 16:
            data[n - 16:] = _box_muller16_64(self.uniform(16, double=True), mean, std)
        return data

    def bernoulli(self, shape, p):
        """Booleans with P(True) = p from 24-bit uniforms (not torch's numbers)."""
        n = int(np.prod(shape, dtype=np.int64))
        return (self.uniform(n) < p).reshape(shape)

    def multinomial(self, probs, num_samples, replacement):
        """Rows of category indices drawn with the inverse CDF of 53-bit uniforms
        (torch's sampling law, not its numbers)."""
        rows = probs.reshape(-1, probs.shape[-1]).astype(np.float64)
        out = np.empty((rows.shape[0], num_samples), np.int64)
        for r, w in enumerate(rows):
            w = w.copy()
            for s in range(num_samples):
                total = w.sum()
                cdf = np.cumsum(w) / total
                u = self.uniform(1, double=True)[0]
                k = int(np.searchsorted(cdf, u, side="right"))
                k = min(k, len(w) - 1)
                while w[k] == 0:              # never pick a zero-weight category
                    k -= 1
                out[r, s] = k
                if not replacement:
                    w[k] = 0.0
        return out.reshape(probs.shape[:-1] + (num_samples,))


def _box_muller16(d, mean, std):
    """torch's ``normal_fill_16`` on blocks of 16 float32 uniforms: element j
    and j + 8 from u1 = 1 - d[j], u2 = d[j + 8]."""
    d = d.reshape(-1, 16)
    u1 = (np.float32(1) - d[:, :8]).astype(np.float32)
    radius = np.sqrt(np.float32(-2) * np.log(u1.astype(np.float64)).astype(np.float32))
    theta = (np.float32(2.0 * math.pi) * d[:, 8:]).astype(np.float64)   # float32, as torch
    out = np.empty_like(d)
    out[:, :8] = radius.astype(np.float64) * np.cos(theta) * std + mean
    out[:, 8:] = radius.astype(np.float64) * np.sin(theta) * std + mean
    return out.reshape(-1)


def _box_muller16_64(d, mean, std):
    """``normal_fill_16<double>`` on blocks of 16 float64 uniforms: radius
    sqrt(-2 log(1 - d[j])), angle 2 pi d[j + 8], all in double."""
    d = d.reshape(-1, 16)
    radius = np.sqrt(-2.0 * np.log(1.0 - d[:, :8]))
    theta = 2.0 * math.pi * d[:, 8:]
    out = np.empty_like(d)
    out[:, :8] = radius * np.cos(theta) * std + mean
    out[:, 8:] = radius * np.sin(theta) * std + mean
    return out.reshape(-1)


default_generator = Generator()
