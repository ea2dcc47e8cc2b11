"""``torch.nn.modules.rnn``: :class:`RNN`, :class:`LSTM`, :class:`GRU` and
their single-step cells :class:`RNNCell`, :class:`LSTMCell`, :class:`GRUCell`.

Weights are named, shaped and initialised as torch's (uniform in
+-1/sqrt(hidden_size), drawn in parameter order), gates in cuDNN's order
(LSTM: i, f, g, o; GRU: r, z, n). A layer composes torch's CPU cells
(``aten/src/ATen/native/RNN.cpp``): the input projection of the whole
(packed) sequence first, then per step the hidden projection ``linear(h,
w_hh, b_hh)`` added to it and the gate math. A
:class:`~fpemu.autograd.nn.utils.rnn.PackedSequence` runs as ATen's packed
layers do: the batch shrinks as sequences end (their final hidden state is
kept), and the reverse direction starts from the shortest batch and grows.
Under autocast the projections run in the autocast dtype and the gate math
in float32, as cuDNN's kernels do (tier 2, ``docs/autograd.md``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..._core import Tensor, float64, tensor
from ..._state import State
from .. import functional as F
from .. import init
from .module import Module
from .utils import _empty_param
from ...ops.shape import cat, index_select, stack
from ..utils.rnn import PackedSequence


def _lstm_cell(pre, hh, h, c):
    """torch's CPU cell: ``c' = f*c + i*g``, ``h' = o*tanh(c')``."""
    i, f, g, o = (hh + pre).chunk(4, 1)
    i, f, g, o = F.sigmoid(i), F.sigmoid(f), F.tanh(g), F.sigmoid(o)
    c_new = f * c.to(i.dtype) + i * g
    h_new = o * F.tanh(c_new)
    return h_new.to(h.dtype), c_new.to(c.dtype)


def _gru_cell(pre, hh, h, c):
    """torch's CPU cell: r, z = sigmoid(hh + pre), n = tanh(pre_n + r*hh_n),
    ``h' = (h - n)*z + n``."""
    pr, pz, pn = pre.chunk(3, 1)
    hr, hz, hn = hh.chunk(3, 1)
    r, z = F.sigmoid(hr + pr), F.sigmoid(hz + pz)
    n = F.tanh(pn + hn * r)
    return ((h.to(n.dtype) - n) * z + n).to(h.dtype), None


def _simple_cell(act):
    def cell(pre, hh, h, c):
        return act(hh + pre).to(h.dtype), None
    return cell


def _slice(state, lo, hi):
    return None if state is None else state[lo:hi]


def _cat(parts):
    parts = [p for p in parts if p is not None]
    return parts[0] if len(parts) == 1 else cat(parts, 0)


def _run_direction(cell, pre, sizes, h0, c0, w_hh, b_hh, auto, reverse):
    """One direction of one layer over packed rows ``pre`` (the input
    projection, ``sum(sizes)`` rows): returns (outputs in packed order,
    final h, final c), the finals in the batch order of ``h0``."""
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    T = len(sizes)
    outs = [None] * T
    if not reverse:
        h, c = h0, c0
        done_h, done_c = [], []
        last = sizes[0]
        for t in range(T):
            b = sizes[t]
            if b < last:                    # sequences that ended keep their state
                done_h.append(_slice(h, b, last))
                done_c.append(_slice(c, b, last))
                h, c = _slice(h, 0, b), _slice(c, 0, b)
            last = b
            h, c = _step(cell, pre[int(offsets[t]):int(offsets[t + 1])], h, c, w_hh, b_hh,
                         auto)
            outs[t] = h
        h_n = _cat([h] + done_h[::-1])
        c_n = _cat([c] + done_c[::-1]) if c0 is not None else None
        return outs, h_n, c_n
    last = sizes[-1]
    h, c = _slice(h0, 0, last), _slice(c0, 0, last)
    for t in range(T - 1, -1, -1):
        b = sizes[t]
        if b > last:                        # sequences that start here join
            h = _cat([h, _slice(h0, last, b)])
            c = _cat([c, _slice(c0, last, b)]) if c0 is not None else None
        last = b
        h, c = _step(cell, pre[int(offsets[t]):int(offsets[t + 1])], h, c, w_hh, b_hh, auto)
        outs[t] = h
    return outs, h, c


def _step(cell, pre_t, h, c, w_hh, b_hh, auto):
    hh = F.linear(h, w_hh, b_hh)
    if auto:                                # fp32 gate math
        pre_t, hh = pre_t.float(), hh.float()
    return cell(pre_t, hh, h, c)


class RNNBase(Module):
    """What RNN, LSTM and GRU share: the parameters, their initialisation,
    the argument checks and the layer loop over plain or packed input."""

    _GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None):
        super().__init__()
        if mode not in self._GATES:
            raise ValueError(f"Unrecognized RNN mode: {mode}")
        self.mode = mode
        if proj_size:
            raise NotImplementedError(
                f"{mode}(proj_size={proj_size}): the projected LSTM (weight_hr) is not "
                f"emulated; use proj_size=0, or apply an nn.Linear(hidden_size, proj_size) to "
                f"the output (which, unlike torch's, does not feed the projection back)")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or \
                not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, so "
                          f"non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool):
            raise TypeError(f"hidden_size should be of type int, got: "
                            f"{type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        dirs = 2 if bidirectional else 1
        G = self._gates * hidden_size
        self._flat_weights_names = []
        for layer in range(num_layers):
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                inp = input_size if layer == 0 else hidden_size * dirs
                names = [("weight_ih" + sfx, (G, inp)), ("weight_hh" + sfx, (G, hidden_size))]
                if bias:
                    names += [("bias_ih" + sfx, (G,)), ("bias_hh" + sfx, (G,))]
                for name, shape in names:
                    setattr(self, name, _empty_param(*shape))
                    self._flat_weights_names.append(name)
        self.reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        std = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -std, std)

    def flatten_parameters(self):
        return None

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        per = 4 if self.bias else 2
        w = self._flat_weights
        return [w[i:i + per] for i in range(0, len(w), per)]

    @property
    def _gates(self):
        return self._GATES[self.mode]

    def _cell_fn(self):
        """The cell of the mode (RNNBase("LSTM", ...) works as torch's does)."""
        if self.mode == "LSTM":
            return _lstm_cell
        if self.mode == "GRU":
            return _gru_cell
        return _simple_cell(F.tanh if self.mode == "RNN_TANH" else F.relu)

    def forward(self, input, hx=None):
        packed = isinstance(input, PackedSequence)
        lstm = self._gates == 4
        dirs = 2 if self.bidirectional else 1
        if packed:
            data, sizes = input.data, [int(s) for s in input.batch_sizes.tolist()]
            B = sizes[0]
            batched = True
            if hx is not None and input.sorted_indices is not None:
                hx = _permute_hidden(hx, input.sorted_indices, lstm)
        else:
            x = input
            if x.ndim not in (2, 3):
                raise ValueError(f"{self.mode}: Expected input to be 2D or 3D, got {x.ndim}D "
                                 f"tensor instead")
            batched = x.ndim == 3
            if not batched:
                x = x.unsqueeze(1)
            elif self.batch_first:
                x = x.transpose(0, 1)
            T, B = x.shape[0], x.shape[1]
            if x.shape[2] != self.input_size:
                raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                                   f"{self.input_size}, got {x.shape[2]}")
            if T == 0:
                raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
            data, sizes = x.reshape(T * B, x.shape[2]), [B] * T
            if hx is not None and not batched:
                hx = tuple(h.unsqueeze(1) for h in hx) if lstm else hx.unsqueeze(1)
        want = (self.num_layers * dirs, B, self.hidden_size)
        if hx is None:
            zeros = tensor(np.zeros(want, np.float32)).to(data.dtype)
            h0, c0 = zeros, (zeros if lstm else None)
        else:
            h0, c0 = hx if lstm else (hx, None)
            for name, t in (("hidden", h0), ("cell", c0)):
                if t is not None and tuple(t.shape) != want:
                    raise RuntimeError(f"Expected {name} size {want}, got {list(t.shape)}")
        auto = bool(State.autocast) and State.autocast[-1].enabled
        if auto and data.dtype is not float64:      # _cudnn_rnn: lower-precision list
            low = State.autocast[-1].dtype
            data, h0 = data.to(low), h0.to(low)
            c0 = c0.to(low) if c0 is not None else None
        cell = self._cell_fn()
        hs, cs = [], []
        layer_in = data
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                w_ih, w_hh = getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx)
                b_ih = getattr(self, "bias_ih" + sfx) if self.bias else None
                b_hh = getattr(self, "bias_hh" + sfx) if self.bias else None
                k = layer * dirs + d
                pre = F.linear(layer_in, w_ih, b_ih)           # the whole sequence at once
                steps, h, c = _run_direction(cell, pre, sizes, h0[k],
                                             c0[k] if c0 is not None else None, w_hh, b_hh,
                                             auto, reverse=bool(d))
                outs.append(_cat(steps))
                hs.append(h)
                cs.append(c)
            layer_in = outs[0] if dirs == 1 else cat(outs, 1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, True)
        h_n = stack(hs, 0)
        c_n = stack(cs, 0) if lstm else None
        if packed:
            out = PackedSequence(layer_in, input.batch_sizes, input.sorted_indices,
                                 input.unsorted_indices)
            hidden = (h_n, c_n) if lstm else h_n
            if input.unsorted_indices is not None:
                hidden = _permute_hidden(hidden, input.unsorted_indices, lstm)
            return out, hidden
        out = layer_in.reshape(T, B, layer_in.shape[-1])
        if not batched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if lstm else None
        elif self.batch_first:
            out = out.transpose(0, 1)
        return (out, (h_n, c_n)) if lstm else (out, h_n)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


def _permute_hidden(hx, permutation, lstm):
    """The hidden state's batch (dim 1) reordered (``index_select``)."""
    if lstm:
        return tuple(index_select(h, 1, permutation) for h in hx)
    return index_select(hx, 1, permutation)


class RNN(RNNBase):
    """Elman RNN: ``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or relu)."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             f"'relu'.")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


class GRU(RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype)


class RNNCellBase(Module):
    """One step of a recurrent layer: ``weight_ih`` (G, input_size),
    ``weight_hh`` (G, hidden_size) and the biases, torch's initialisation."""

    _gates = 1

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        G = self._gates * hidden_size
        self.weight_ih = _empty_param(G, input_size)
        self.weight_hh = _empty_param(G, hidden_size)
        if bias:
            self.bias_ih = _empty_param(G)
            self.bias_hh = _empty_param(G)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()
        if dtype is not None:
            self.to(dtype)

    reset_parameters = RNNBase.reset_parameters

    def _prepare(self, input, hx, what):
        if input.ndim not in (1, 2):
            raise ValueError(f"{what}: Expected input to be 1D or 2D, got {input.ndim}D "
                             f"instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.shape[-1]} "
                               f"expected {self.input_size}")
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        return x, batched

    def _zeros(self, x):
        return tensor(np.zeros((x.shape[0], self.hidden_size), np.float32)).to(x.dtype)

    def _project(self, x, h):
        pre = F.linear(x, self.weight_ih, self.bias_ih)
        hh = F.linear(h, self.weight_hh, self.bias_hh)
        auto = bool(State.autocast) and State.autocast[-1].enabled
        if auto:
            pre, hh = pre.float(), hh.float()
        return pre, hh

    def _cast_low(self, *ts):
        auto = bool(State.autocast) and State.autocast[-1].enabled
        if not auto:
            return ts
        low = State.autocast[-1].dtype
        return tuple(t.to(low) if isinstance(t, Tensor) and t.dtype is not float64 else t
                     for t in ts)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s


class RNNCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None,
                 dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {nonlinearity}")
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        x, batched = self._prepare(input, hx, "RNNCell")
        h = self._zeros(x) if hx is None else (hx if batched else hx.unsqueeze(0))
        x, h = self._cast_low(x, h)
        pre, hh = self._project(x, h)
        act = F.tanh if self.nonlinearity == "tanh" else F.relu
        out, _ = _simple_cell(act)(pre, hh, h, None)
        return out if batched else out.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step: ``(h', c') = cell(input, (h, c))``."""

    _gates = 4

    def forward(self, input, hx=None):
        x, batched = self._prepare(input, hx, "LSTMCell")
        if hx is None:
            h = c = self._zeros(x)
        else:
            h, c = hx if batched else (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        x, h, c = self._cast_low(x, h, c)
        pre, hh = self._project(x, h)
        h_new, c_new = _lstm_cell(pre, hh, h, c)
        if not batched:
            return h_new.squeeze(0), c_new.squeeze(0)
        return h_new, c_new


class GRUCell(RNNCellBase):
    _gates = 3

    def forward(self, input, hx=None):
        x, batched = self._prepare(input, hx, "GRUCell")
        h = self._zeros(x) if hx is None else (hx if batched else hx.unsqueeze(0))
        x, h = self._cast_low(x, h)
        pre, hh = self._project(x, h)
        out, _ = _gru_cell(pre, hh, h, None)
        return out if batched else out.squeeze(0)
