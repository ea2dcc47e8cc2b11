"""Running a training script as ``__main__`` with its first optimizer
hooked: how ``fpemu monitor`` and ``fpemu emulate`` find the model of a
script that does not name it (the module that owns the optimizer's
parameters)."""

from __future__ import annotations

import gc
import os
import runpy
import sys
import warnings

from ..errors import FpemuValueError
from ._import import torch_module


def _find_root_module(optimizer):
    """The module that owns the optimizer's parameters: of the live modules holding
    its first parameter, the one with the most parameters."""
    torch = torch_module()
    first = next((p for g in optimizer.param_groups for p in g["params"]), None)
    if first is None:
        return None
    best, size = None, -1
    with warnings.catch_warnings():   # isinstance on lazy modules can warn (deprecations)
        warnings.simplefilter("ignore")
        modules = []
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.nn.Module):
                    modules.append(obj)
            except ReferenceError:    # pragma: no cover - a dead weak proxy
                continue
    for obj in modules:
        params = list(obj.parameters())
        if any(p is first for p in params) and len(params) > size:
            best, size = obj, len(params)
    return best


def _check_script(path, command):
    if not os.path.isfile(path):
        raise FpemuValueError(f"fpemu {command}: no script {path!r}; pass the path of a "
                              "Python training script")


#: The globals of the last script ``run_hooked`` ran, kept until the next one
#: or the end of the process, as ``python script.py`` keeps a script's objects
#: until the interpreter exits. Freeing them as soon as the script returns
#: deadlocks torch (2.13) at times: a DDP model's ``Reducer`` destroys its gloo
#: process group holding the GIL and joins the group's worker threads, while
#: one of them waits for the GIL to free the last all-reduce's work (its
#: thread-local state holds a Python object since torch stashes a context
#: there in every backward). At interpreter exit a thread waiting for the GIL
#: ends instead, so the same objects are freed there without a hang.
_SCRIPT_GLOBALS: list = []


def run_hooked(path, argv, attach, attached):
    """Run the script ``path`` as ``__main__`` with ``sys.argv = [path,
    *argv]``; while ``attached()`` is false, the first optimizer the script
    creates gives the module that owns its parameters to ``attach(model,
    optimizer)`` (``fpemu monitor`` and ``fpemu emulate``). Returns ``(the
    script's exception or None, its sys.exit code or None)``; ``sys.argv``
    and ``torch.optim.Optimizer.__init__`` are restored whatever happens."""
    torch = torch_module()
    real_init = torch.optim.Optimizer.__init__

    def init(opt, *a, **k):
        real_init(opt, *a, **k)
        if not attached() and not getattr(init, "busy", False):
            init.busy = True
            try:
                model = _find_root_module(opt)
                if model is not None:
                    attach(model, opt)
            finally:
                init.busy = False

    torch.optim.Optimizer.__init__ = init
    old_argv = sys.argv
    sys.argv = [path, *argv]
    error = exit_code = None
    _SCRIPT_GLOBALS.clear()         # the previous script's objects go now, not with this one's
    try:
        _SCRIPT_GLOBALS.append(runpy.run_path(path, run_name="__main__"))
    except SystemExit as ex:
        exit_code = ex.code
        _keep_script_globals(ex.__traceback__, path)
    except Exception as err:
        error = err
        _keep_script_globals(err.__traceback__, path)
    finally:
        sys.argv = old_argv
        torch.optim.Optimizer.__init__ = real_init
    return error, exit_code


def _keep_script_globals(tb, path):
    """Keep the globals of the script's module frame in a traceback (a script
    that ended by ``sys.exit`` or an exception), as ``_SCRIPT_GLOBALS``."""
    want = os.path.abspath(path)
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "<module>" and os.path.abspath(code.co_filename) == want:
            _SCRIPT_GLOBALS.append(tb.tb_frame.f_globals)
            return
        tb = tb.tb_next
