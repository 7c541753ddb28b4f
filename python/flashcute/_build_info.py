"""flashcute.build_info(): what the loaded libflashcute.so was built from and for.

The library answers itself (fc_build_info, a JSON object), so the report holds for whichever
library is loaded: the wheel's copy or FLASHCUTE_LIB.
"""

import ctypes
import json
import threading

from . import _library

_info = None
_lock = threading.Lock()


def _read():
    lib = _library.load()
    try:
        function = lib.fc_build_info
    except AttributeError:
        raise OSError(f"{_library.library_path()} has no fc_build_info: it was built from older "
                      "sources than this package; rebuild it") from None
    function.argtypes = []
    function.restype = ctypes.c_char_p
    return json.loads(function().decode("utf-8"))


def build_info():
    """A dict: version, cuda_version (the toolkit it was compiled with), cuda_archs (the machine
    code targets, e.g. ["80", "90a"]; "80" also carries compute_80 PTX), tile_set ("minimal" or
    "full"), git_commit (the source commit, or "unknown") and library (the file loaded).
    """
    global _info
    with _lock:
        if _info is None:
            _info = _read()
            _info["library"] = str(_library.library_path().resolve())
    return dict(_info, cuda_archs=list(_info["cuda_archs"]))
