"""Environment variables that third-party libraries read, set only for the block that needs them.

>>> import os
>>> with scoped_env({"DOCTEST_SCOPED_VAR": "1"}):
...     os.environ["DOCTEST_SCOPED_VAR"]
'1'
>>> "DOCTEST_SCOPED_VAR" in os.environ
False
"""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def scoped_env(values: dict[str, str]):
    """Set each variable the user has not set for the block; remove exactly those afterwards."""
    added = [n for n in values if n not in os.environ]
    for n in added:
        os.environ[n] = values[n]
    try:
        yield
    finally:
        for n in added:
            os.environ.pop(n, None)
