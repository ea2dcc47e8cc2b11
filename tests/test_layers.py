"""The layers of fpemu.autograd read one way: ``_core`` (tensors, storage,
the graph) -> ``_aten`` / ``_autocast`` (kernel formulas, autocast rules) ->
``ops`` -> ``nn``, and no two modules import each other, not even inside a
function."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import fpemu

ROOT = pathlib.Path(fpemu.__file__).parent / "autograd"
PKG = "fpemu.autograd"


def _modules():
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([PKG] + parts)] = p
    return out


def _graph():
    """module -> the fpemu.autograd modules it imports, at the top or in a
    function (``from . import x`` of a submodule counts as that submodule)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                up = base[:len(base) - node.level + 1] if node.level else []
                mod = ".".join(up + [node.module] if node.module else up) if node.level \
                    else node.module
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    deps.add(sub if sub in mods else mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def _reach(graph, start):
    seen, todo = set(), [start]
    while todo:
        for d in graph[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_no_import_cycle_inside_autograd():
    graph = _graph()
    cycles = sorted(m for m in graph if m in _reach(graph, m))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_core_aten_ops_nn_read_one_way():
    graph = _graph()
    below = {"_core": ("_aten", "_autocast", "ops", "nn", "_methods"),
             "_aten": ("ops", "nn", "_methods"), "_autocast": ("ops", "nn", "_methods"),
             "ops": ("nn", "_methods", "fp8", "optim", "amp")}
    for layer, above in below.items():
        mods = [m for m in graph if m == f"{PKG}.{layer}" or m.startswith(f"{PKG}.{layer}.")]
        assert mods
        for m in mods:
            bad = sorted(d for d in _reach(graph, m)
                         if any(d == f"{PKG}.{a}" or d.startswith(f"{PKG}.{a}.") for a in above))
            assert not bad, f"{m} reaches {bad}, a layer above it"


def test_core_alone_loads_no_op():
    """Import ``_core`` in a fresh interpreter with the package's own
    ``__init__`` bypassed (which imports everything): no ops module, no
    autocast rule and no kernel formula table gets loaded, and a tensor still
    works (made, printed, cast, differentiated)."""
    code = f"""
import importlib, sys, types
sys.path.insert(0, {str(ROOT.parent.parent)!r})
import fpemu
stub = types.ModuleType("fpemu.autograd")
stub.__path__ = [{str(ROOT)!r}]
sys.modules["fpemu.autograd"] = stub
core = importlib.import_module("fpemu.autograd._core")
t = core.tensor([1.0, 2.5], dtype=core.bfloat16, requires_grad=True)
u = core.to_dtype(t, core.float32)
u.backward(core.tensor([1.0, 1.0]))
print(repr(t), t.grad._data.tolist())
loaded = sorted(m for m in sys.modules if m.startswith("fpemu.autograd."))
print(loaded)
bad = [m for m in loaded if m.startswith(("fpemu.autograd.ops", "fpemu.autograd.nn"))
       or m in ("fpemu.autograd._autocast", "fpemu.autograd._aten", "fpemu.autograd._methods")]
assert not bad, bad
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "dtype=torch.bfloat16, requires_grad=True) [1.0, 1.0]" in out.stdout


def test_no_module_reaches_into_quantize_or_the_kernels():
    """quantize's helpers are private: other modules use its public API
    (Cast, quantize, encode, ...) and fpemu.checks; fpemu.autograd calls no
    rounding, arithmetic or accumulation kernel directly (its _special.py
    and optim/_loops.py run Numba loops of their own: float64 erf for GELU,
    Adam's float32 step; neither is a rounding)."""
    import re
    root = pathlib.Path(fpemu.__file__).parent
    private = re.compile(r"from \.+quantize import [^\n]*\b_\w|quantize\._\w|"
                         r"from \.+quantize import \(\s*_")
    kernels = re.compile(r"\b_kernels\b|\b_arith_kernels\b|\b_accum_kernels\b|\brun_kernel\(")
    for path in root.rglob("*.py"):
        if path.name == "quantize.py":
            continue
        text = path.read_text()
        assert not private.search(text), f"{path.relative_to(root)} imports a private name " \
                                         "of fpemu.quantize"
        if "autograd" in path.parts and path.name not in ("_special.py", "_loops.py"):
            assert not kernels.search(text), f"{path.relative_to(root)} calls a kernel"
