"""``torch.nn.modules.conv``: :class:`Conv1d`, :class:`Conv2d`, :class:`Conv3d`
and :class:`ConvTranspose2d`, with torch's parameter shapes and
initialisation."""

from __future__ import annotations

from .. import functional as F
from .linear import _reset_fan_in
from .module import Module
from .utils import _empty_param, _pair, _single, _triple


class _ConvNd(Module):
    """The arguments and parameters the convolutions share, checked and
    printed as torch does."""

    _tuple = staticmethod(_pair)
    _transposed = False
    #: the functional form (F.conv1d, F.conv2d, F.conv3d)
    _fn = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", device=None,
                 dtype=None, output_padding=0):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise ValueError(f"{type(self).__name__}: padding_mode={padding_mode!r} is not "
                             f"emulated; pad the input with F.pad(x, ..., mode="
                             f"{padding_mode!r}) and use padding_mode='zeros'")
        nt = self._tuple
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = nt(kernel_size), nt(stride)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 f"{{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = nt(padding)
        self.dilation, self.groups = nt(dilation), groups
        self.output_padding = nt(output_padding)
        self.padding_mode = padding_mode
        if self._transposed:
            shape = (in_channels, out_channels // groups) + self.kernel_size
        else:
            shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = _empty_param(*shape)
        self.bias = _empty_param(out_channels) if bias else None
        self.reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        """torch's: kaiming_uniform_(a=sqrt(5)), bias uniform in +-1/sqrt(fan_in)."""
        _reset_fan_in(self.weight, self.bias)

    def extra_repr(self):
        nt = self._tuple
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != nt(0):
            s += f", padding={self.padding}"
        if self.dilation != nt(1):
            s += f", dilation={self.dilation}"
        if self.output_padding != nt(0):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s

    def forward(self, input):
        return type(self)._fn(input, self.weight, self.bias, self.stride, self.padding,
                              self.dilation, self.groups)


class Conv1d(_ConvNd):
    """1-D convolution over (N, C, L) or (C, L)."""

    _tuple = staticmethod(_single)
    _fn = staticmethod(F.conv1d)


class Conv2d(_ConvNd):
    """2-D convolution (im2col + the emulated matmul), torch's init."""

    _fn = staticmethod(F.conv2d)


class Conv3d(_ConvNd):
    """3-D convolution over (N, C, D, H, W) or (C, D, H, W)."""

    _tuple = staticmethod(_triple)
    _fn = staticmethod(F.conv3d)


class ConvTranspose2d(_ConvNd):
    """The transposed 2-D convolution (``F.conv_transpose2d``); ``weight`` is
    ``(in_channels, out_channels / groups, kh, kw)`` as torch's."""

    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 device=None, dtype=None):
        if isinstance(padding, str):
            raise ValueError(f"padding={padding!r} is not supported for ConvTranspose2d; "
                             f"pass the padding as ints")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype, output_padding)

    def _output_padding(self, input, output_size):
        """The output padding that gives ``output_size`` (torch's rule)."""
        if output_size is None:
            return self.output_padding
        size = list(output_size)[-2:]
        if len(size) != 2:
            raise ValueError(f"ConvTranspose2d: output_size must have 2 or more elements "
                             f"(got {len(list(output_size))})")
        pads = []
        for d in range(2):
            n = input.shape[input.ndim - 2 + d]
            smallest = ((n - 1) * self.stride[d] - 2 * self.padding[d]
                        + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            largest = smallest + self.stride[d] - 1
            if not smallest <= size[d] <= largest:
                raise ValueError(f"requested an output size of {size}, but valid sizes range "
                                 f"from {smallest} to {largest} (for an input of "
                                 f"{list(input.shape[-2:])})")
            pads.append(size[d] - smallest)
        return tuple(pads)

    def forward(self, input, output_size=None):
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                  self._output_padding(input, output_size), self.groups,
                                  self.dilation)
