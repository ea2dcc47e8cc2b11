"""The process that draws the demo report's figures (:class:`fpemu.report.FigureWriter`).

Started as ``python -m fpemu._figure_worker``. Each line on stdin names a
pickle file holding ``(function name in fpemu.report, arguments)``; the
worker reads and removes it, calls the function and writes back, on the
stdout it was started with, a length-prefixed pickle of ``("ok", value)`` or
``("error", traceback text)``, one per line read, in order. It ends at the
end of stdin. Anything the drawing prints goes to stderr, so that it cannot
mix with the answers.

It runs at the lowest priority (``nice`` 19): it draws on the cores the
experiments leave idle, and yields them as soon as an experiment's thread
pools (PyTorch's, Numba's) want them, whose parallel loops wait for their
slowest thread.
"""

import os
import pickle
import struct
import sys
import traceback


def main():
    try:
        os.nice(19)
    except (AttributeError, OSError):   # no nice (Windows), or not allowed: draw as is
        pass
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                       # a print while drawing goes to stderr
    sys.stdout = sys.stderr
    from fpemu import report
    for line in sys.stdin:
        path = line.strip()
        if not path:
            continue
        try:
            with open(path, "rb") as fh:
                name, args = pickle.load(fh)
            os.remove(path)
            answer = ("ok", getattr(report, name)(*args))
        except Exception:              # the parent raises it with this text
            answer = ("error", traceback.format_exc())
        data = pickle.dumps(answer)
        answers.write(struct.pack("<Q", len(data)) + data)
        answers.flush()


if __name__ == "__main__":
    main()
