"""ATen's CUDA reduction order (fpemu.autograd._cuda_reduce).

Oracles: launch configurations worked by hand from ``setReduceConfig``
(aten/src/ATen/native/cuda/Reduce.cuh, torch 2.11); sums worked by hand; and
``_oracle_sum``, a straightforward simulation written here of the documented
kernel (every thread of the grid, its accumulators, the shared-memory trees and
the warp's shuffles lane by lane), fed the hand-worked configurations. It shares
no code with the module. FPRev (Xie et al., arXiv 2411.00442): with ``M`` at
position i, ``-M`` at j and ones elsewhere (M large enough to absorb every group
of ones), the sum counts the ones added after i and j met, so it reveals the
tree.
"""

import numpy as np
import pytest

import fpemu.autograd as fa
from fpemu.autograd import _cuda_reduce as cr
from fpemu.autograd._profile import Profile, use_profile


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


# ---------------------------------------------------------------- the oracle
def _oracle_sum(row, block, ctas, vectorize, im, step, shift=0):
    """One output of Reduce.cuh's kernel, simulated thread by thread. ``row``:
    the output's inputs in reduction order (float32); ``block`` = (bx, by);
    ``im``: input_mult (x, y, cta); ``step``: step_input. Only the threads
    whose input index differs matter: x when im[0], y when im[1]."""
    f = np.float32
    n = len(row)
    bx, by = block
    nx = bx if im[0] else 1
    ny = by if im[1] else 1

    def thread(x, y, c):
        accs = [f(0)] * 4
        idx = x * im[0] + y * im[1] + c * im[2]
        if not vectorize:
            k = 0
            while idx < n:
                accs[k % 4] = f(accs[k % 4] + row[idx])
                idx += step
                k += 1
        else:
            # data -= shift; the head; data += 4: vector element j is row[base + j]
            end, base = n, 0
            if shift:
                end = n + shift
                if y == 0 and c == 0 and shift <= x < 4:
                    accs[0] = f(accs[0] + row[x - shift])
                end -= 4
                base = 4 - shift
            while idx * 4 + 3 < end:
                for i in range(4):
                    accs[i] = f(accs[i] + row[base + idx * 4 + i])
                idx += step
            t = end - end % 4 + x
            if y == 0 and c == 0 and t < end:
                accs[0] = f(accs[0] + row[base + t])
        return f(f(f(accs[0] + accs[1]) + accs[2]) + accs[3])

    def ytree(vals):                 # block_y_reduce on a list indexed by y
        vals = list(vals)
        off = len(vals) // 2
        while off:
            for y in range(off):
                vals[y] = f(vals[y] + vals[y + off])
            off //= 2
        return vals[0]

    def xtree(vals):                 # block_x_reduce: shared memory, then shuffles
        vals = list(vals)
        dim_x = len(vals)
        if dim_x > 32:
            off = dim_x // 2
            while off >= 32:
                for x in range(off):
                    vals[x] = f(vals[x] + vals[x + off])
                off //= 2
            dim_x = 32
        lanes = vals[:dim_x] + [f(0)] * (32 - dim_x)
        off = 1
        while off < dim_x:           # __shfl_down_sync: lanes past 31 read their own
            lanes = [f(lanes[k] + lanes[k + off if k + off < 32 else k]) for k in range(32)]
            off *= 2
        return lanes[0]

    staged = []
    for c in range(ctas):
        grid = [[thread(x, y, c) for x in range(nx)] for y in range(ny)]
        cols = [ytree([grid[y][x] for y in range(ny)]) if im[1] else grid[0][x]
                for x in range(nx)]
        staged.append(xtree(cols) if im[0] else cols[0])
    if ctas == 1:
        return staged[0]
    T = bx * by if im[0] else by
    part = []
    for t in range(T):
        acc = f(0)
        for c in range(t, ctas, T):
            acc = f(acc + staged[c])
        part.append(acc)
    if im[0]:
        cols = [ytree([part[y * bx + x] for y in range(by)]) for x in range(bx)]
        return xtree(cols)
    return ytree(part)


def _fprev(n, i, j, M=np.float32(2.0 ** 40)):
    x = np.ones(n, np.float32)
    x[i], x[j] = M, -M
    return x


# --------------------------------------------------------- launch configs
# (shape, axes, sm_count) -> block, grid, vectorize, output_vec_size,
# input_mult, output_mult, step_input; worked by hand from setReduceConfig
CONFIGS = [
    # 8 contiguous: dim0 = 8 -> 8 lanes, values_per_thread 1 < 16: warps split outputs
    (((8,), (0,), 132), ((8, 1), (1, 1), False, 1, (1, 0, 0), (0, 1), 8)),
    # 5: last_pow2(5) = 4 lanes
    (((5,), (0,), 132), ((4, 1), (1, 1), False, 1, (1, 0, 0), (0, 1), 4)),
    # 1000: vectorized (dim0 1000 > 128 -> 250 -> 128 lanes), 1000/128 = 8 < 16
    (((1000,), (0,), 132), ((128, 1), (1, 1), True, 1, (1, 0, 0), (0, 1), 128)),
    # 100000: 25000 -> 512 lanes; 196 values >= 16 -> input split over (1) warp
    (((100000,), (0,), 132), ((512, 1), (1, 1), True, 1, (1, 512, 0), (0, 0), 512)),
    # rows of 1000: 32 x 16 block, 32 values < 256 -> warps take rows; 64/16 = 4 blocks
    (((64, 1000), (1,), 132), ((32, 16), (4, 1), True, 1, (1, 0, 0), (0, 1), 32)),
    # columns of (64, 1000): output vectorized by 4 (250 -> 128 -> 32 x 4 block)
    (((64, 1000), (0,), 132), ((32, 4), (8, 1), False, 4, (0, 1, 0), (1, 0), 4)),
    # columns of (4096, 512): 4096 / 4 = 1024 values >= 256, grid 4 <= 132 * 16:
    # ctas = max(min(528, 64), 4) = 64
    (((4096, 512), (0,), 132), ((32, 4), (4, 64), False, 4, (0, 1, 4), (1, 0), 256)),
    # (8, 3, 5) over dims 0 and 2: reduced dims (5, stride 1), (8, stride 15)
    (((8, 3, 5), (0, 2), 132), ((32, 2), (2, 1), False, 1, (1, 0, 0), (0, 1), 32)),
    # 2**23: 16384 values per thread; ctas = max(min(SMs * 4, 1024), 64)
    (((2 ** 23,), (0,), 132),
     ((512, 1), (1, 528), True, 1, (1, 512, 512), (0, 0), 512 * 528)),
    (((2 ** 23,), (0,), 108),
     ((512, 1), (1, 432), True, 1, (1, 512, 512), (0, 0), 512 * 432)),
]


@pytest.mark.parametrize("args,want", CONFIGS)
def test_launch_configuration(args, want):
    shape, axes, sms = args
    strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
    cfg, _ = cr.reduce_config(shape, strides, axes, sms)
    got = (cfg.block, cfg.grid, cfg.vectorize_input, cfg.output_vec_size, cfg.input_mult,
           cfg.output_mult, cfg.step_input)
    assert got == want


def test_iterator_puts_smallest_reduced_stride_first():
    # a transposed (3, 4) view over both dims: the reduced dims follow the
    # input's strides, then merge into one contiguous dim
    geo = cr.geometry((4, 3), (1, 4), (0, 1))
    assert geo.shape == (12,) and geo.in_strides == (1,) and geo.red_axes == (0, 1)
    geo = cr.geometry((8, 3, 5), (15, 5, 1), (0, 2))
    assert geo.shape == (5, 8, 3) and geo.in_strides == (1, 15, 5)
    assert geo.num_reduce_dims == 2


# ----------------------------------------------------------- hand-worked sums
def test_eight_elements_warp_tree_by_hand():
    # 8 lanes, one value each, shuffles down by 1, 2, 4:
    # ((e0 + e1) + (e2 + e3)) + ((e4 + e5) + (e6 + e7))
    x = np.ones(8, np.float32)
    x[0] = 2.0 ** 24
    got = cr.cuda_sum(x)
    assert bits(got) == bits(2.0 ** 24 + 6)          # 2^24 + 1 ties down to 2^24
    assert bits(np.float32(x.astype(np.float64).sum())) == bits(2.0 ** 24 + 8)  # old: once
    # FPRev: M, -M meet in the subtree of size 2, 4 or 8; the ones outside it survive
    for (i, j), ones_after in {(0, 1): 6, (2, 3): 6, (0, 2): 4, (5, 7): 4, (0, 4): 0,
                               (3, 4): 0, (1, 6): 0}.items():
        assert float(cr.cuda_sum(_fprev(8, i, j))) == ones_after, (i, j)


def test_accumulators_round_robin_by_hand():
    # 40 elements -> 32 lanes; lane 0 holds elements 0 and 32 in accumulator
    # 0 and 1: M at 0 and -M at 32 meet only when lane 0 combines a0 + a1,
    # after which the other ones in its accumulators (none) are added; the
    # 31 other lanes' ones are added in the warp tree: 38 ones survive
    assert float(cr.cuda_sum(_fprev(40, 0, 32))) == 38.0
    # element 1 sits in lane 1: M (lane 0) and -M (lane 1) meet at the first
    # shuffle; lane 0 also holds element 32 (a one) in a1, absorbed before:
    # survivors are the ones outside lanes 0..1 -> 40 - 2 - 2 = 36
    assert float(cr.cuda_sum(_fprev(40, 0, 1))) == 36.0


def test_norm_two_fuses_the_square():
    # 1000 elements -> 128 lanes of 4-element vectors; lane 0's accumulator 0
    # takes element 0, then element 512 (its next vector, 128 vectors on):
    # fma(x512, x512, x0 * x0) = 2^-24 + (1 + 2^-12)^2 = 1 + 2^-11 + 2^-23
    # exactly; unfused the square rounds to 1 + 2^-11 and 2^-24 is lost at the tie
    x = np.zeros(1000, np.float32)
    x[0], x[512] = 2.0 ** -12, 1 + 2.0 ** -12
    acc = cr.reduce_acc(x, op=cr.OP_SQUARES)
    assert bits(acc) == bits(1 + 2.0 ** -11 + 2.0 ** -23)
    unfused = np.float32(np.float32(x[512] * x[512]) + np.float32(x[0] * x[0]))
    assert bits(unfused) != bits(acc)
    assert bits(cr.cuda_norm(x, 2)) == bits(np.sqrt(np.float32(1 + 2.0 ** -11 + 2.0 ** -23)))


def test_mean_multiplies_by_the_float_factor():
    # 3 elements -> 2 lanes: lane 0 holds (1 + (1 + 2^-21)), lane 1 holds 1:
    # the sum 3 + 2^-21 is exact; MeanOps multiplies by float(1) / 3
    x = np.array([1.0, 1.0, 1.0 + 2.0 ** -21], np.float32)
    acc = np.float32(3 + 2.0 ** -21)
    assert bits(cr.cuda_sum(x)) == bits(acc)
    want = np.float32(acc * np.float32(np.float32(1) / np.float32(3)))
    assert bits(cr.cuda_mean(x)) == bits(want)
    assert bits(want) != bits(np.float32(np.float64(acc) / 3))   # not a division


# ------------------------------------------------------- against the oracle
ORACLE_CASES = [
    # (n, config from CONFIGS)
    (8, ((8, 1), 1, False, (1, 0, 0), 8)),
    (40, ((32, 1), 1, False, (1, 0, 0), 32)),
    (1000, ((128, 1), 1, True, (1, 0, 0), 128)),
    (1003, ((128, 1), 1, True, (1, 0, 0), 128)),
    (20000, ((512, 1), 1, True, (1, 512, 0), 512)),
    (140000, ((512, 1), 18, True, (1, 512, 512), 512 * 18)),
]


@pytest.mark.parametrize("n,cfg", ORACLE_CASES)
def test_matches_the_oracle(n, cfg):
    block, ctas, vec, im, step = cfg
    got_cfg, _ = cr.reduce_config((n,), (1,), (0,), 132)
    assert (got_cfg.block, got_cfg.ctas_per_output, got_cfg.vectorize_input,
            got_cfg.input_mult, got_cfg.step_input) == cfg
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))).astype(np.float32)
    assert bits(cr.cuda_sum(x)) == bits(_oracle_sum(x, block, ctas, vec, im, step))
    # FPRev pairs: every pair result equals the oracle's
    for i, j in [(0, 1), (0, n - 1), (3, n // 2), (n // 3, n // 3 + 4), (n - 5, n - 1)]:
        xs = _fprev(n, i, j)
        assert bits(cr.cuda_sum(xs)) == bits(_oracle_sum(xs, block, ctas, vec, im, step)), (i, j)


def test_unaligned_rows_take_the_head_path():
    # rows of 1001: row r starts at element 1001 r, 1001 r mod 4 = r mod 4
    n, rows = 1001, 4
    rng = np.random.default_rng(5)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    cfg, _ = cr.reduce_config(x.shape, (n, 1), (1,), 132)
    # 1001 / 4 = 250 -> 128 lanes, 4 rows -> 4 warps; 8 values per lane < 64
    assert cfg.vectorize_input and cfg.block == (128, 4) and cfg.input_mult == (1, 0, 0)
    got = cr.cuda_sum(x, 1)
    for r in range(rows):
        want = _oracle_sum(x[r], (128, 4), 1, True, (1, 0, 0), 128, shift=r % 4)
        assert bits(got[r]) == bits(want), r
    # the head matters: shift 0 for every row would give other bits somewhere
    shifted = [_oracle_sum(x[r], (128, 4), 1, True, (1, 0, 0), 128, shift=0)
               for r in range(rows)]
    assert bits(got).tolist() != bits(shifted).tolist()


def test_columns_match_the_oracle():
    # (16384, 16) over dim 0: output vectorized by 4 (16 / 4 = 4 lanes, 512 / 4
    # threads -> 32 warps), 16384 / 32 = 512 values per thread >= 256 and one
    # block column: ctas = max(min(132 * 16, 512 / 16), 512 / 256) = 32
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16384, 16)).astype(np.float32)
    cfg, _ = cr.reduce_config(x.shape, (16, 1), (0,), 132)
    assert (cfg.block, cfg.grid, cfg.output_vec_size, cfg.input_mult, cfg.step_input) == \
        ((4, 32), (1, 32), 4, (0, 1, 32), 1024)
    got = cr.cuda_sum(x, 0)
    for col in range(16):
        assert bits(got[col]) == bits(_oracle_sum(x[:, col], (4, 32), 32, False, (0, 1, 32),
                                                  1024)), col


def test_float64_rounded_once_differs():
    # the old model (float64 sum, rounded once) misses the kernel's order on
    # many rows of mixed magnitudes; the oracle agrees with the model on them
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((256, 1000)) * np.exp2(rng.integers(-12, 12, (256, 1000)))
         ).astype(np.float32)
    once = x.astype(np.float64).sum(1).astype(np.float32)
    got = cr.cuda_sum(x, 1)
    differ = np.flatnonzero(bits(got) != bits(once))
    assert len(differ) > 50
    # 250 vectors -> 128 lanes, 256 rows -> 16 warps: block (32, 16), 32 lanes
    cfg, _ = cr.reduce_config(x.shape, (1000, 1), (1,), 132)
    assert (cfg.block, cfg.step_input) == ((32, 16), 32)
    for r in differ[:5]:
        assert bits(got[r]) == bits(_oracle_sum(x[r], (32, 16), 1, True, (1, 0, 0), 32))


# ------------------------------------------------------------- wired in
def test_autograd_sum_mean_under_each_profile():
    x = np.ones(8, np.float32)
    x[0] = 2.0 ** 24
    with use_profile(Profile("cuda")):
        assert fa.tensor(x).sum().item() == 2.0 ** 24 + 6
        assert fa.tensor(x).mean().item() == np.float32(np.float32(2.0 ** 24 + 6) *
                                                        np.float32(0.125))
    with use_profile(Profile("cpu")):
        # torch CPU's cascade_sum: one vector of 8 lanes, added in order from
        # 0 (each + 1 to 2^24 a tie, to even: 2^24), as torch 2.13 CPU prints
        assert fa.tensor(x).sum().item() == 2.0 ** 24


def test_bf16_sum_rounds_the_float32_accumulator_once():
    x = np.ones(8, np.float32)
    x[0] = 2.0 ** 24
    t = fa.tensor(x).to(fa.bfloat16)
    with use_profile(Profile("cuda")):
        s = t.sum()
    assert s.dtype is fa.bfloat16
    # bf16(2^24 + 6): 8 significant bits -> 2^24 (round to nearest)
    assert s.item() == float(fa.tensor([2.0 ** 24 + 6]).to(fa.bfloat16).item())


def test_broadcast_gradient_uses_the_order():
    a = fa.tensor(np.zeros((8, 1), np.float32), requires_grad=True)
    g = np.ones((8, 1), np.float32)
    g[0] = 2.0 ** 24
    with use_profile(Profile("cuda")):
        b = fa.zeros((1, 1)).requires_grad_()
        (a + b).backward(fa.tensor(g))
    assert b.grad.item() == 2.0 ** 24 + 6


def test_bad_input_says_what_to_pass():
    with pytest.raises(Exception, match="float32 or float64"):
        cr.cuda_sum(np.arange(4))
    with pytest.raises(Exception, match="axes"):
        cr.cuda_sum(np.ones(4, np.float32), axes=(3,))


# ------------------------------------------------------------------ softmax
def _oracle_softmax(row, log):
    """PersistentSoftmax.cuh softmax_warp_forward for one row, written out:
    lane l holds l, l + W, ...; lane sums from 0; XOR butterfly W/2 .. 1."""
    f = np.float32
    n = len(row)
    p2 = 1
    while p2 < n:
        p2 *= 2
    W = min(p2, 32)
    m = max(row)
    lanes = []
    for lane in range(W):
        s = f(0)
        for j in range(lane, p2, W):
            if j < n:
                s = f(s + f(np.exp(np.float64(f(row[j] - m)))))
        lanes.append(s)
    off = W // 2
    while off:
        lanes = [f(lanes[k] + lanes[k ^ off]) for k in range(W)]
        off //= 2
    total = lanes[0]
    if log:
        return np.array([f(f(v - m) - f(np.log(np.float64(total)))) for v in row], np.float32)
    return np.array([f(np.float64(f(np.exp(np.float64(f(v - m))))) / np.float64(total))
                     for v in row], np.float32)


def test_softmax_backward_sum_order_by_hand():
    # log_softmax backward with output 0 (exp 1): grad - sum(grad); FPRev on
    # 64 elements: lanes hold j and j + 32; butterfly pairs lanes 16 apart first
    for (i, j), total in {(0, 32): 62, (0, 16): 60, (0, 8): 56, (0, 1): 0}.items():
        T = _fprev(64, i, j)[None, :]
        gi = cr.cuda_softmax_backward(T, np.zeros_like(T), True)
        assert gi[0, 2] == np.float32(1 - total), (i, j)


@pytest.mark.parametrize("n", [3, 17, 100, 1000, 1024])
def test_softmax_forward_matches_the_oracle(n):
    rng = np.random.default_rng(n)
    X = (rng.standard_normal((3, n)) * 4).astype(np.float32)
    for log in (False, True):
        got = cr.cuda_softmax_forward(X, log)
        for r in range(3):
            assert bits(got[r]).tolist() == bits(_oracle_softmax(X[r], log)).tolist()


def test_softmax_wired_under_cuda_only():
    rng = np.random.default_rng(3)
    X = (rng.standard_normal((4, 300)) * 4).astype(np.float32)
    t = fa.tensor(X)
    with use_profile(Profile("cuda")):
        y = fa.nn.functional.softmax(t, -1).numpy()
        ly = fa.nn.functional.log_softmax(t, -1).numpy()
    want = np.stack([_oracle_softmax(X[r], False) for r in range(4)])
    lwant = np.stack([_oracle_softmax(X[r], True) for r in range(4)])
    assert bits(y).tolist() == bits(want).tolist()
    assert bits(ly).tolist() == bits(lwant).tolist()
    # the float64 path rounded once differs on some element
    e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    once = (e / e.sum(1, keepdims=True)).astype(np.float32)
    assert bits(once).tolist() != bits(y).tolist()


# ----------------------------------------------------------------- nll_loss
def test_nll_loss_thread_count():
    # Loss.cu nll_loss_threads: clamp(1 << round(log2(nframe / 16)), 32, 1024)
    assert [cr.nll_loss_threads(n) for n in (1, 64, 735, 736, 1000, 3000, 100000)] == \
        [32, 32, 32, 64, 64, 256, 1024]


def test_nll_loss_sum_order_by_hand():
    # 64 frames -> 32 threads: thread t subtracts frames t and t + 32, then the
    # shared-memory tree adds threads 16 apart first, then 8, 4, 2, 1
    # (Loss.cu nll_loss_forward_reduce_cuda_kernel_2d); FPRev: M at i, -M at j
    cases = {(0, 32): -62.0, (0, 16): -60.0, (0, 8): -56.0, (0, 1): 0.0}
    for (i, j), want in cases.items():
        v = _fprev(64, i, j)
        logp = np.zeros((64, 2), np.float32)
        logp[:, 1] = v
        target = fa.tensor(np.ones(64, np.int64))
        with use_profile(Profile("cuda")):
            loss = fa.nn.functional.nll_loss(fa.tensor(logp), target, reduction="sum")
            mean = fa.nn.functional.nll_loss(fa.tensor(logp), target)
        assert loss.item() == want, (i, j)
        assert bits(mean.numpy()) == bits(np.float32(np.float32(want) / np.float32(64)))
    # the float64 sum rounded once (the old model) gives -62 for (0, 1)
    assert np.float32(-_fprev(64, 0, 1).astype(np.float64).sum()) == -62.0


# --------------------------------------------------------------- layer_norm
def _fma32(a, b, c):
    """float32 fma from exact rationals, rounded to nearest even (test-only)."""
    from fractions import Fraction
    v = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if v == 0:
        return np.float32(0)
    e = abs(v.numerator).bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > abs(v):
        e -= 1
    scale = Fraction(2) ** (23 - max(e, -126))
    q = v * scale
    n, rem = divmod(q.numerator, q.denominator)
    twice = 2 * rem
    if twice > q.denominator or (twice == q.denominator and n % 2):
        n += 1
    return np.float32(float(Fraction(n) / scale))


def _oracle_layer_norm(row, gamma, beta, eps):
    """layer_norm_kernel.cu vectorized_layer_norm_kernel for one row: 256
    threads, cuWelfordOnlineSum per element, shuffles down 16..1, warps 4, 2, 1."""
    f = np.float32
    N = len(row)

    def online(v, s):
        m, s2, c = s
        d = f(v - m)
        c1 = f(c + 1)
        nm = _fma32(d, f(1 / np.float64(c1)), m)
        return nm, _fma32(d, f(v - nm), s2), c1

    def combine(B, A):
        d = f(B[0] - A[0])
        cnt = f(A[2] + B[2])
        if not cnt > 0:
            return f(0), f(0), cnt
        coef = f(1 / np.float64(cnt))
        na, nb = f(A[2] * coef), f(B[2] * coef)
        return (_fma32(na, A[0], f(nb * B[0])),
                _fma32(f(f(d * d) * A[2]), nb, f(A[1] + B[1])), cnt)

    threads = []
    for t in range(256):
        s = (f(0), f(0), f(0))
        for i in range(t, N // 4, 256):
            for ii in range(4):
                s = online(row[4 * i + ii], s)
        threads.append(s)
    warps = []
    for y in range(8):
        lanes = threads[32 * y: 32 * y + 32]
        for off in (16, 8, 4, 2, 1):
            lanes = [combine(lanes[k], lanes[k + off]) if k < off else lanes[k]
                     for k in range(32)]
        warps.append(lanes[0])
    for off in (4, 2, 1):
        warps = [combine(warps[y], warps[y + off]) if y < off else warps[y] for y in range(8)]
    mean = warps[0][0]
    var = f(np.float64(warps[0][1]) / N)
    rstd = f(1 / np.sqrt(np.float64(f(var + f(eps)))))
    return np.array([_fma32(g, f(rstd * f(v - mean)), b) for v, g, b in zip(row, gamma, beta)],
                    np.float32)


@pytest.mark.parametrize("N", [64, 1032])
def test_layer_norm_matches_the_oracle(N):
    rng = np.random.default_rng(N)
    X = (rng.standard_normal((2, N)) * 3 + 5).astype(np.float32)
    g = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    y, _, _ = cr.cuda_layer_norm(X, g, b, 1e-5)
    for r in range(2):
        assert bits(y[r]).tolist() == bits(_oracle_layer_norm(X[r], g, b, 1e-5)).tolist()


def test_layer_norm_wired_under_cuda_only():
    rng = np.random.default_rng(2)
    X = (rng.standard_normal((16, 256)) * 3 + 5).astype(np.float32)
    g = rng.standard_normal(256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    args = (fa.tensor(X), (256,), fa.tensor(g), fa.tensor(b))
    with use_profile(Profile("cuda")):
        y = fa.nn.functional.layer_norm(*args).numpy()
    with use_profile(Profile("cpu")):
        y64 = fa.nn.functional.layer_norm(*args).numpy()
    want = np.stack([_oracle_layer_norm(X[r], g, b, 1e-5) for r in range(16)])
    assert bits(y).tolist() == bits(want).tolist()
    assert bits(y64).tolist() != bits(y).tolist()        # float64 rounded once differs


def test_mean_backward_multiplies_by_the_reciprocal_on_cuda_and_divides_on_the_cpu():
    """torch's mean_backward divides the gradient by the count, a number:
    CUDA's div_true multiplies by its reciprocal (taken in double, rounded
    to float32), the CPU divides. 7 / 3 tells them apart by one ulp; torch's
    CPU is the oracle of the CPU side."""
    import torch
    f = np.float32
    want = {"cuda": f(f(7) * f(1 / 3)), "cpu": f(7 / 3)}
    assert want["cuda"] != want["cpu"]
    for dev in ("cuda", "cpu"):
        with use_profile(Profile(dev)):
            x = fa.ones(3, requires_grad=True)
            x.mean().backward(fa.tensor(7.0))
        assert (x.grad.numpy().view(np.uint32) == want[dev].view(np.uint32)).all(), dev
    t = torch.ones(3, requires_grad=True)
    t.mean().backward(torch.tensor(7.0))
    assert (t.grad.numpy().view(np.uint32) == want["cpu"].view(np.uint32)).all()
