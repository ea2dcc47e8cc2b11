"""The ops of fpemu.autograd, by kind: ``elementwise``, ``reduce``,
``shape`` (views and indexing), ``scatter`` (writes at indices), ``search``
(searching and counting), ``linalg`` (matrix products), ``einsum``,
``distance`` (cdist), ``composite`` (ops torch composes from others),
``creation`` (factories) and ``inplace`` (writes into storage).

Each family module names its ops in its ``__all__``; this package gathers
them (a new op is one function and its name there)."""

from .creation import *  # noqa: F401,F403
from .composite import *  # noqa: F401,F403
from .distance import *  # noqa: F401,F403
from .einsum import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .scatter import *  # noqa: F401,F403
from .search import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
