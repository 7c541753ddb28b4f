"""Shared setup: find the flashcute package and library; keep JAX from taking the whole GPU."""

import os
import pathlib
import random
import sys

import pytest

# JAX preallocates most of the GPU by default, which would starve torch and CuPy in this process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Fresh random data each run; the header prints the seed so a failure can be replayed.
os.environ.setdefault("FLASHCUTE_TEST_SEED", str(random.randrange(2 ** 31)))

REPO = pathlib.Path(__file__).resolve().parents[2]

try:
    import flashcute  # noqa: F401  (an installed wheel, carrying its library)
except ImportError:
    # The source tree; the library then comes from FLASHCUTE_LIB.
    sys.path.insert(0, str(REPO / "python"))


@pytest.fixture(scope="session")
def library():
    """The loaded libflashcute.

    A skip when none is found, a failure when FLASHCUTE_REQUIRE_LIB=1.
    """
    from flashcute import _library

    try:
        return _library.load()
    except OSError as error:
        if os.environ.get("FLASHCUTE_REQUIRE_LIB") == "1":
            pytest.fail(str(error))
        pytest.skip(str(error))


def pytest_report_header(config):
    return f"flashcute test data seed: FLASHCUTE_TEST_SEED={os.environ['FLASHCUTE_TEST_SEED']}"
