"""fpemu.reference: fidelity to real PyTorch, recorded and replayed.

* :mod:`.scenarios`: the scenarios, each written once against the API that
  ``torch`` and ``fpemu.autograd`` share, each array with its tier;
* :mod:`.record`: ``fpemu record`` runs them with PyTorch (CPU or CUDA) and
  writes ``tests/reference/<device>-torch<version>/`` (needs no Numba);
* :mod:`.parity`: ``fpemu parity`` replays a trace folder in fpemu under the
  recorded version's profile and compares every array bit for bit;
* :mod:`.compare`: the comparison in the storage dtype's codes and ulps.

See ``docs/fidelity.md``.
"""

from .scenarios import SCENARIOS, Scenario, Trace  # noqa: F401

__all__ = ["SCENARIOS", "Scenario", "Trace"]
