"""Builds the flashcute wheel: the Python package plus libflashcute.so in flashcute/lib/.

The library comes from FLASHCUTE_PREBUILT_LIB (a libflashcute.so built elsewhere, so CI and the
device flow compile once) or else from a CMake build of this repository (target flashcute only).
CMake options come from the environment:
  FLASHCUTE_CUDA_ARCHS      e.g. "90a" or "80;90a"     FLASHCUTE_TILE_SET        full | minimal
  FLASHCUTE_SM80_HEAD_DIMS  e.g. "64;128"              FLASHCUTE_SM80_DTYPES     e.g. "bf16"
  CUTLASS_DIR               a CUTLASS checkout          FLASHCUTE_CMAKE_ARGS      extra arguments
  FLASHCUTE_BUILD_DIR       default <repo>/build-python  FLASHCUTE_BUILD_JOBS    default: all cores
  FLASHCUTE_SOURCE_DIR      the repository root, default the parent of this folder
The library is reached through ctypes, with no Python extension, so the wheel is tagged
py3-none-<platform>: one wheel for every Python 3.
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 keeps it in the wheel package
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
CMAKE_CACHE_VARS = (
    "FLASHCUTE_CUDA_ARCHS",
    "FLASHCUTE_TILE_SET",
    "FLASHCUTE_SM80_HEAD_DIMS",
    "FLASHCUTE_SM80_DTYPES",
    "CUTLASS_DIR",
)


def _cmake_env():
    # pip's isolated build hides the interpreter's site-packages through PYTHONPATH and
    # PYTHONNOUSERSITE; CMake's CUTLASS step runs `python -m pip download`, which needs them back.
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME"):
        env.pop(name, None)
    return env


def build_library():
    source = pathlib.Path(os.environ.get("FLASHCUTE_SOURCE_DIR", HERE.parent)).resolve()
    if not (source / "CMakeLists.txt").is_file():
        raise RuntimeError(
            f"no CMakeLists.txt in {source}: build from the repository (pip install ./python), "
            "set FLASHCUTE_SOURCE_DIR, or pass FLASHCUTE_PREBUILT_LIB=/path/libflashcute.so")
    build = pathlib.Path(os.environ.get("FLASHCUTE_BUILD_DIR", source / "build-python")).resolve()
    configure = [
        "cmake", "-S", str(source), "-B", str(build),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DFLASHCUTE_BUILD_TESTS=OFF",
        "-DFLASHCUTE_BUILD_TOOLS=OFF",
    ]
    configure += [f"-D{name}={os.environ[name]}"
                  for name in CMAKE_CACHE_VARS if os.environ.get(name)]
    configure += shlex.split(os.environ.get("FLASHCUTE_CMAKE_ARGS", ""))
    jobs = os.environ.get("FLASHCUTE_BUILD_JOBS", str(os.cpu_count() or 1))
    env = _cmake_env()
    subprocess.run(configure, check=True, env=env)
    subprocess.run(["cmake", "--build", str(build), "--target", "flashcute", "-j", jobs],
                   check=True, env=env)
    built = build / "lib" / "libflashcute.so"
    if not built.is_file():
        raise RuntimeError(f"the CMake build did not produce {built}")
    return built


class BuildPyWithLibrary(build_py):
    """build_py, then puts libflashcute.so into the package's lib/ folder."""

    def run(self):
        super().run()
        prebuilt = os.environ.get("FLASHCUTE_PREBUILT_LIB")
        library = pathlib.Path(prebuilt).resolve() if prebuilt else build_library()
        if not library.is_file():
            raise RuntimeError(f"FLASHCUTE_PREBUILT_LIB={prebuilt} is not a file")
        target = pathlib.Path(self.build_lib) / "flashcute" / "lib" / "libflashcute.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, target)
        os.chmod(target, 0o755)


class NativeDistribution(Distribution):
    """Installs into platlib, as a package with a native library must."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the wheel carries a native library but no Python extension."""

    def get_tag(self):
        return "py3", "none", sysconfig.get_platform().replace("-", "_").replace(".", "_")


setup(distclass=NativeDistribution,
      cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
