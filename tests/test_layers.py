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


def _modules(root=ROOT, pkg=PKG):
    """module name -> path, for every module under ``root`` (package ``pkg``)."""
    out = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([pkg] + parts)] = p
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
    rounding, arithmetic or accumulation kernel directly (its _special.py,
    optim/_loops.py, _cuda_reduce.py and the _cpu_*.py models of ATen's CPU
    kernels run Numba loops of their own: float64 erf for GELU, Adam's float32
    step, ATen's CUDA and CPU reductions' float32 adds in their order, the CPU
    kernels' vectorized float32 math; none is a rounding)."""
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
        if "autograd" in path.parts and path.name not in ("_special.py", "_loops.py",
                                                          "_cuda_reduce.py") \
                and not path.name.startswith("_cpu_"):
            assert not kernels.search(text), f"{path.relative_to(root)} calls a kernel"


# ------------------------------------------------------------ all of fpemu
PKG_ROOT = pathlib.Path(fpemu.__file__).parent

#: The Numba kernel modules and the modules that may import each: the public
#: owner whose functions wrap them (the kernel modules themselves form one
#: layer, sharing device functions such as ``_kernels._round``).
KERNEL_OWNERS = {
    "fpemu._kernels": {"fpemu.quantize", "fpemu.stats"},
    "fpemu._arith_kernels": {"fpemu.arith"},
    "fpemu._accum_kernels": {"fpemu.accumulate"},
    "fpemu._coll_kernels": {"fpemu.collectives"},
    "fpemu.block._kernels": {"fpemu.block"},
}

#: Private top-level modules every layer may import: the house's utilities
#: (Numba's JIT and the kernel runner; exact conversions to float64; the
#: callable checks; the element rounding that the Numba kernels, the torch
#: code and the Triton kernels each run), whose names inside are public.
SHARED = {"fpemu._jit", "fpemu._exact", "fpemu._callable", "fpemu._elemround"}


def _all_modules():
    return _modules(PKG_ROOT, "fpemu")


def _owner(module):
    """Who may use ``module``'s private names (and the module itself, if
    private): a module of a subpackage belongs to its first-level package
    (``fpemu.autograd``, ``fpemu.torch``, ``fpemu.block``, ...); a top-level
    module of fpemu to itself alone."""
    parts = module.split(".")
    return module if len(parts) == 2 else ".".join(parts[:2])


def _inside(importer, owner):
    return importer == owner or importer.startswith(owner + ".")


def _imports(mods, name, path):
    """(imported module, names taken from it, line) of every import of an
    fpemu module in ``path``, at the top or in a function; and the local
    names bound to fpemu modules."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found, aliases = [], {}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[:len(base) - node.level + 1]
                mod = ".".join(up + [node.module] if node.module else up)
            else:
                mod = node.module
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in mods:
                    aliases[a.asname or a.name] = sub
                    found.append((sub, (), node.lineno))
                elif mod in mods:
                    found.append((mod, (a.name,), node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    found.append((a.name, (), node.lineno))
                    if a.asname:
                        aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            found.append((aliases[node.value.id], (node.attr,), node.lineno))
    return found


def _private(n):
    return n.startswith("_") and not n.startswith("__")


def test_no_module_uses_another_layers_private_names():
    """Layers meet at public names only: no fpemu module imports or uses a
    private name (``_x``) or a private module of another layer (a layer: a
    first-level package, or a top-level module), and each kernel module is
    imported only by its public owner (``KERNEL_OWNERS``)."""
    mods = _all_modules()
    bad = []
    for name, path in sorted(mods.items()):
        for target, names, line in _imports(mods, name, path):
            where = f"{path.relative_to(PKG_ROOT)}:{line}"
            if target in KERNEL_OWNERS:
                if not any(_inside(name, o) for o in KERNEL_OWNERS[target]) and \
                        name not in KERNEL_OWNERS:
                    bad.append(f"{where} imports the kernels {target}")
                continue
            owner = _owner(target)
            if _inside(name, owner) or owner.startswith(name + "."):
                continue          # its own layer, or a package re-exporting its modules
            if target not in SHARED and any(_private(p) for p in target.split(".")[1:]):
                bad.append(f"{where} imports the private module {target}")
            bad.extend(f"{where} uses {target}.{n}" for n in names if _private(n))
    assert not bad, "\n".join(bad)


def _all_graph():
    mods = _all_modules()
    return {name: {t for t, _, _ in _imports(mods, name, path) if t != name}
            for name, path in mods.items()}


def test_no_import_cycle_anywhere_in_fpemu():
    """No two fpemu modules import each other, directly or around a circle,
    at the top or inside a function; a package's ``__init__`` and the
    modules under it are not counted as a circle (the package re-exports
    what its modules define)."""
    graph = _all_graph()

    def deps(m):
        return {d for d in graph[m] if not (d != m and m.startswith(d + "."))}

    cycles = []
    for start in sorted(graph):
        seen, todo = set(), [start]
        while todo:
            for d in deps(todo.pop()):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        if start in seen:
            cycles.append(start)
    assert not cycles, f"modules on an import cycle: {cycles}"
