"""fpemu.torch under torch.compile: the quantizers are custom operators
(``fpemu::quantize``, ``fpemu::encode``, ``fpemu::decode``), one opaque call
each in the graph, so a compiled program keeps its graph whole
(``fullgraph=True`` holds) and gets the eager bits: fpemu's Numba kernels' on
this CPU (their own oracles: test_quantize.py, test_fast_paths.py).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu  # noqa: E402
import fpemu.torch  # noqa: E402
from fpemu.errors import FpemuValueError  # noqa: E402
from test_fast_paths import _sample  # noqa: E402
from test_torch_quantize import ALL, _bits, _inputs  # noqa: E402


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_under_torch_compile_the_same_bits():
    """A compiled function that calls the quantizers among its own operations
    gives fpemu's bits, for every format in nearest-even, to-odd and
    stochastic rounding, the same function compiled again for each format
    (where Dynamo turns constants that change into symbols: the case that
    gave wrong bits, and once a crash, when the quantizers were compiled into
    the graph's own code on the CPU). They are custom operators now, opaque
    to Inductor: ``fullgraph=True`` holds (no graph break). A NaN into e2m1
    is refused there too."""
    x0 = np.concatenate([_sample()[::60], np.float32([-np.inf, np.inf, 0.0, -0.0])])
    modes = ("rne", "rto", "sr")
    for fmt in ALL:
        x = torch.from_numpy(_inputs(fmt, x0))

        def f(x):
            y = x * 1.0                                  # an operation of the graph's own
            return [(fpemu.torch.quantize(y, fmt, rounding=mode, seed=5),
                     fpemu.torch.decode(fpemu.torch.encode(y, fmt, rounding=mode, seed=5), fmt))
                    for mode in modes]

        torch._dynamo.reset()            # (one code object compiled for 20 formats)
        for mode, pair in zip(modes, torch.compile(f, fullgraph=True)(x)):
            want = _bits(fpemu.quantize(x.numpy(), fmt, rounding=mode, seed=5))
            for got in pair:
                bad = np.flatnonzero(_bits(got.numpy()) != want)
                assert bad.size == 0, (fmt.name, mode, bad.size)
    with pytest.raises(FpemuValueError, match="holds NaN and e2m1 has no NaN"):
        torch.compile(lambda x: fpemu.torch.quantize(x * 1.0, "e2m1"), fullgraph=True)(
            torch.tensor([1.0, float("nan")]))


class _FakeQuant(torch.nn.Module):
    """Rounds what passes through it to a format (forward only), as a lecture's
    fake-quantized layer would."""

    def __init__(self, fmt, **kw):
        super().__init__()
        self.fmt, self.kw = fmt, kw

    def forward(self, x):
        return fpemu.torch.quantize(x, self.fmt, **self.kw)


def test_a_compiled_model_gives_the_eager_models_bits():
    """A small MLP whose activations and weights pass through the quantizers
    (e4m3fn to nearest, bf16 stochastically with Philox, codes and back):
    compiled with Inductor in one graph, its outputs equal eager mode's bit
    for bit, over several calls (the stochastic seed fixed)."""
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 10)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = lin1, lin2
            self.q1 = _FakeQuant("e4m3fn")
            self.q2 = _FakeQuant("bf16", rounding="sr", seed=(3, 7), rng="philox")

        def forward(self, x):
            w = fpemu.torch.decode(fpemu.torch.encode(self.lin1.weight, "e4m3fn"), "e4m3fn")
            h = torch.relu(torch.nn.functional.linear(self.q1(x), w, self.lin1.bias))
            return self.lin2(self.q2(h))

    net = Net()
    compiled = torch.compile(net, fullgraph=True)
    with torch.no_grad():
        for i in range(3):
            x = torch.randn(32, 64, generator=torch.Generator().manual_seed(i))
            np.testing.assert_array_equal(_bits(compiled(x).numpy()), _bits(net(x).numpy()))
    explained = torch._dynamo.explain(net.forward)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_the_operator_reads_its_configuration_from_its_text_alone():
    """The string a graph carries describes the rounding completely (a custom
    format's fields too), so a graph cached on disk means the same rounding
    in a new process: parsed from the text without the process's cache."""
    from fpemu.formats import Format
    from fpemu.torch import _quantize
    fmt = Format.custom(4, 2, bias=140, nan_encoding="fn")
    text = _quantize._describe(fmt, "sr", False, "saturate", (4, 9), "philox")
    _quantize._CONFIGS.clear()
    x = torch.from_numpy(np.random.default_rng(1).standard_normal(500).astype(np.float32))
    got = torch.ops.fpemu.quantize(x, text)
    want = fpemu.quantize(x.numpy(), fmt, rounding="sr", subnormals=False, overflow="saturate",
                          seed=(4, 9), rng="philox")
    np.testing.assert_array_equal(_bits(got.numpy()), _bits(want))
    with pytest.raises(FpemuValueError, match="unknown rounding"):
        torch.compile(lambda x: fpemu.torch.quantize(x, "bf16", rounding="sideways"),
                      fullgraph=True)(x)
