"""Builds the flashcute wheel: the Python package plus libflashcute.so in flashcute/lib/.

The library comes from FLASHCUTE_PREBUILT_LIB (a libflashcute.so built elsewhere, so CI and the
device flow compile once) or else from a CMake build of this repository (target flashcute only).

What the CMake build compiles, from the environment:
  FLASHCUTE_CUDA_ARCHS      e.g. "90a" or "80;90a" (commas work too). Unset: the GPUs nvidia-smi
                            lists (8.0 -> 80, 8.6 -> 86, 8.9 -> 89, 9.0 -> 90a), or "80;90a" when
                            it lists none
  FLASHCUTE_TILE_SET        minimal (default: the automatic tile per dtype and head_dim) | full
  FLASHCUTE_SM80_HEAD_DIMS, FLASHCUTE_SM80_DTYPES, FLASHCUTE_SM90_HEAD_DIMS,
  FLASHCUTE_SM90_DTYPES     prune the instantiations, e.g. "64;128" and "bf16"
  FLASHCUTE_BUILD_SM90, FLASHCUTE_STATIC_LIBSTDCXX   ON | OFF
  CUTLASS_DIR               a CUTLASS checkout          FLASHCUTE_CMAKE_ARGS      extra arguments
How it builds:
  FLASHCUTE_BUILD_DIR       default <repo>/build-python/<a folder named by the options>
  FLASHCUTE_BUILD_JOBS      default: all cores          FLASHCUTE_SOURCE_DIR      the repository
  FLASHCUTE_BUILD_VERBOSE   1: stream CMake's output, 0: progress lines only (default: stream
                            under `pip -v` and outside pip)
Progress: pip shows a build backend's output only with -v, so without it the one-line steps go to
the terminal (/dev/tty) as well; CMake's whole output goes to flashcute-build.log in the build
folder either way.

The library is reached through ctypes, with no Python extension, so the wheel is tagged
py3-none-<platform>: one wheel for every Python 3.
"""

import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 keeps it in the wheel package
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_ARCHS = "80;90a"
# Cache variables read from the environment of the same name; the list-valued ones accept commas.
LIST_VARS = ("FLASHCUTE_SM80_HEAD_DIMS", "FLASHCUTE_SM80_DTYPES", "FLASHCUTE_SM90_HEAD_DIMS",
             "FLASHCUTE_SM90_DTYPES")
PLAIN_VARS = ("FLASHCUTE_BUILD_SM90", "FLASHCUTE_STATIC_LIBSTDCXX", "CUTLASS_DIR")
# (major, minor) -> the target built for it. 90a is the arch-specific target the Hopper family
# needs; its machine code runs on compute capability 9.0 only.
ARCH_FOR_CAPABILITY = {(8, 0): "80", (8, 6): "86", (8, 9): "89", (9, 0): "90a"}
MIN_CUDA = (12, 4)
MIN_CMAKE = (3, 25)
# The environment CMake reads its compilers and default targets from.
COMPILER_VARS = ("CUDACXX", "CUDAHOSTCXX", "CXX", "CC", "CUDAARCHS", "CUDA_PATH")


class BuildError(SystemExit):
    """A build that cannot go on: pip prints the one-line message, with no traceback."""

    def __init__(self, message):
        super().__init__(f"flashcute: {message}")


# ---------------------------------------------------------------------------------------------
# Progress output.

def _has_flag(args, long_name, letter):
    """Whether a pip-style command line sets --<long_name> or -<letter> (alone or in a cluster)."""
    return any(a == f"--{long_name}" or re.fullmatch(rf"-[a-zA-Z]*{letter}[a-zA-Z]*", a)
               for a in args)


def _frontend():
    """(shows output, quiet) for what runs this build.

    pip and uv capture a build backend's output and show it only with -v (or when the build
    fails); no variable tells the backend, so the ancestors' command lines are read (Linux /proc).
    Anything else (python -m build, setup.py itself) is taken to show it.
    """
    forced = os.environ.get("FLASHCUTE_BUILD_VERBOSE")
    if forced:
        return forced not in ("0", "false", "no", "off"), False
    if os.environ.get("PIP_VERBOSE", "0") not in ("0", "false", "no", "off", ""):
        return True, False
    pid = os.getppid()
    for _ in range(8):
        try:
            args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        args = [a for a in args.split("\0") if a]
        names = [os.path.basename(a) for a in args[:3]]
        if (any(re.fullmatch(r"pip[0-9.]*", n) for n in names) or "pip" in args[1:3]
                or names[:1] == ["uv"]):
            return _has_flag(args, "verbose", "v"), _has_flag(args, "quiet", "q")
        # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            break
    return True, False


class Progress:
    """One line per step: on stdout (pip's captured stream) and, when pip hides that, the tty."""

    def __init__(self):
        self.verbose, quiet = _frontend()
        self.tty = None
        if not self.verbose and not quiet and not sys.stdout.isatty():
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None
        self.started = time.monotonic()
        self.lines = 0

    def elapsed(self):
        seconds = int(time.monotonic() - self.started)
        return f"{seconds // 60}:{seconds % 60:02d}"

    def say(self, message):
        line = f"flashcute: {message}"
        print(line, flush=True)
        if self.tty is not None:
            # The first line leaves pip's "Building wheel ..." line; each line ends on a fresh one,
            # where pip's spinner turns in the first column until the next line overwrites it.
            start = "\r" if self.lines else "\n"
            self.tty.write(f"{start}  {line}\n")
            self.tty.flush()
            self.lines += 1

    def close(self):
        if self.tty is not None:
            self.tty.close()
            self.tty = None


# ---------------------------------------------------------------------------------------------
# What to build.

def _split_list(value):
    return [item for item in re.split(r"[;,\s]+", value) if item]


def _gpu_capabilities():
    """(capabilities, why none): compute capabilities nvidia-smi lists, as (major, minor)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found"
    try:
        result = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return [], f"nvidia-smi failed: {error}"
    found = [tuple(int(x) for x in line.strip().split("."))
             for line in result.stdout.splitlines()
             if re.fullmatch(r"\d+\.\d+", line.strip())]
    if result.returncode != 0 or not found:
        detail = (result.stdout + result.stderr).strip().splitlines()
        return [], f"nvidia-smi: {detail[0] if detail else 'it lists no GPU'}"
    return found, ""


def _arch_for(capability):
    """(target, note) for a compute capability; target None when flashcute cannot run there."""
    cc = "%d.%d" % capability
    if capability in ARCH_FOR_CAPABILITY:
        return ARCH_FOR_CAPABILITY[capability], None
    if capability < (8, 0):
        return None, f"compute capability {cc} is below 8.0, which flashcute needs"
    # Machine code runs on later minor versions of its major version, except arch-specific
    # targets (90a): the nearest lower plain target of the same major version, if any.
    same_major = [cap for cap, arch in ARCH_FOR_CAPABILITY.items()
                  if cap[0] == capability[0] and cap < capability and not arch.endswith("a")]
    if same_major:
        arch = ARCH_FOR_CAPABILITY[max(same_major)]
        return arch, f"compute capability {cc} has no target of its own: building {arch}, " \
                     "whose machine code runs on it"
    return "80", f"compute capability {cc} has no target of its own: building 80, whose " \
                 "compute_80 PTX the driver compiles for it when the library first loads"


def resolve_archs(progress):
    """FLASHCUTE_CUDA_ARCHS, else the targets of the GPUs present, else DEFAULT_ARCHS."""
    named = os.environ.get("FLASHCUTE_CUDA_ARCHS", "").strip()
    if named:
        archs = _split_list(named)
        bad = [a for a in archs if not re.fullmatch(r"\d{2,3}[af]?", a)]
        if bad:
            raise BuildError(f"FLASHCUTE_CUDA_ARCHS={named!r}: {', '.join(bad)} is no CUDA "
                             "architecture (write e.g. 80;90a)")
        progress.say(f"archs {';'.join(archs)} (FLASHCUTE_CUDA_ARCHS)")
        return ";".join(archs)
    capabilities, why = _gpu_capabilities()
    if not capabilities:
        progress.say(f"no GPU visible ({why}): building for {DEFAULT_ARCHS}, the A100 and H100 "
                     "class targets; set FLASHCUTE_CUDA_ARCHS to choose")
        return DEFAULT_ARCHS
    archs = set()
    for capability in sorted(set(capabilities)):
        arch, note = _arch_for(capability)
        if note:
            progress.say(f"note: {note}")
        if arch:
            archs.add(arch)
    if not archs:
        progress.say(f"no GPU here can run flashcute: building for {DEFAULT_ARCHS}; set "
                     "FLASHCUTE_CUDA_ARCHS to choose")
        return DEFAULT_ARCHS
    ordered = ";".join(sorted(archs, key=lambda a: int(a.rstrip("af"))))
    listed = ", ".join("%d.%d" % c for c in sorted(set(capabilities)))
    progress.say(f"archs {ordered} for the GPUs present (compute capability {listed}); "
                 "FLASHCUTE_CUDA_ARCHS overrides")
    return ordered


# ---------------------------------------------------------------------------------------------
# Tools.

def _version_of(command, pattern):
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(pattern, out)
    return tuple(int(x) for x in match.groups()) if match else None


PREBUILT_HINT = "or set FLASHCUTE_PREBUILT_LIB=/path/to/libflashcute.so to pack a built library"


def find_cmake():
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("CMake not found: pip install 'cmake>=3.25' (pip install ./python gets "
                         f"it unless --no-build-isolation is given), {PREBUILT_HINT}")
    version = _version_of([cmake, "--version"], r"cmake version (\d+)\.(\d+)")
    if version is None or version < MIN_CMAKE:
        found = ".".join(map(str, version)) if version else "unknown"
        raise BuildError(f"{cmake} is version {found}, 3.25 or newer is needed: "
                         f"pip install 'cmake>=3.25', {PREBUILT_HINT}")
    return cmake, version


def find_nvcc(extra_args):
    """The CUDA compiler CMake will take: -DCMAKE_CUDA_COMPILER, CUDACXX, PATH, CUDA_PATH."""
    for arg in extra_args:
        match = re.fullmatch(r"-DCMAKE_CUDA_COMPILER(?::\w+)?=(.+)", arg)
        if match:
            return match.group(1)
    cudacxx = os.environ.get("CUDACXX", "").strip()
    if cudacxx:
        # CMake takes the program and any arguments after it from CUDACXX.
        nvcc = shutil.which(shlex.split(cudacxx)[0])
        if nvcc is None:
            raise BuildError(f"CUDACXX={cudacxx} is not an executable: point it at the CUDA "
                             f"toolkit's bin/nvcc, {PREBUILT_HINT}")
        return nvcc
    nvcc = shutil.which("nvcc")
    if nvcc is None and os.environ.get("CUDA_PATH"):
        nvcc = shutil.which("nvcc", path=os.path.join(os.environ["CUDA_PATH"], "bin"))
    if nvcc is None:
        installed = shutil.which("nvcc", path="/usr/local/cuda/bin")
        way = (f"set CUDACXX={installed} or put {os.path.dirname(installed)} on PATH" if installed
               else "install the CUDA toolkit (12.4 or newer) and put its bin/ on PATH or set "
                    "CUDACXX=/path/to/nvcc")
        raise BuildError(f"nvcc (the CUDA compiler) not found: CUDACXX is unset and PATH has no "
                         f"nvcc; {way}, {PREBUILT_HINT}")
    return nvcc


def check_nvcc(nvcc):
    version = _version_of([nvcc, "--version"], r"release (\d+)\.(\d+)")
    if version is not None and version < MIN_CUDA:
        raise BuildError(f"{nvcc} is CUDA {version[0]}.{version[1]}, 12.4 or newer is needed: "
                         f"install a newer CUDA toolkit (set CUDACXX to its nvcc), {PREBUILT_HINT}")
    return version


# ---------------------------------------------------------------------------------------------
# Configure and build.

def cmake_options(archs):
    """The cache variables this build sets, from the environment (see the module docstring)."""
    options = {
        "CMAKE_BUILD_TYPE": "Release",
        "FLASHCUTE_BUILD_TESTS": "OFF",
        "FLASHCUTE_BUILD_TOOLS": "OFF",
        "FLASHCUTE_CUDA_ARCHS": archs,
        "FLASHCUTE_TILE_SET": os.environ.get("FLASHCUTE_TILE_SET") or "minimal",
    }
    for name in LIST_VARS:
        if os.environ.get(name):
            options[name] = ";".join(_split_list(os.environ[name]))
    for name in PLAIN_VARS:
        if os.environ.get(name):
            options[name] = os.environ[name]
    if options["FLASHCUTE_TILE_SET"] not in ("minimal", "full"):
        raise BuildError(f"FLASHCUTE_TILE_SET={options['FLASHCUTE_TILE_SET']!r}: use minimal or "
                         "full")
    return options


def _build_dir(source, options, extra_args):
    """FLASHCUTE_BUILD_DIR, else one folder per set of options, so none is reused for others."""
    if os.environ.get("FLASHCUTE_BUILD_DIR"):
        return pathlib.Path(os.environ["FLASHCUTE_BUILD_DIR"]).resolve()
    key = json.dumps([sorted(options.items()), extra_args])
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    name = f"{options['FLASHCUTE_CUDA_ARCHS'].replace(';', '_')}-{options['FLASHCUTE_TILE_SET']}"
    return source / "build-python" / f"{name}-{digest}"


def _run_logged(command, log, progress, on_line=None):
    """Runs command with its output appended to log (and streamed when the frontend shows it)."""
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", bufsize=1)
    for line in process.stdout:
        log.write(line)
        if progress.verbose:
            sys.stdout.write(line)
            sys.stdout.flush()
        elif on_line is not None:
            on_line(line)
    log.flush()
    return process.wait()


def _fail(step, rc, log_path, progress):
    if not progress.verbose:
        # pip prints a failed build's captured output: the end of the log says what went wrong.
        lines = log_path.read_text(errors="replace").splitlines()[-60:]
        print("\n".join(["", f"---- the last {len(lines)} lines of {log_path} ----", *lines]),
              flush=True)
    raise BuildError(f"{step} failed (exit {rc}); the whole output: {log_path}")


def build_library(progress):
    source = pathlib.Path(os.environ.get("FLASHCUTE_SOURCE_DIR", HERE.parent)).resolve()
    if not (source / "CMakeLists.txt").is_file():
        raise BuildError(
            f"no CMakeLists.txt in {source}: build from the repository (pip install ./python), "
            f"set FLASHCUTE_SOURCE_DIR, {PREBUILT_HINT}")
    extra_args = shlex.split(os.environ.get("FLASHCUTE_CMAKE_ARGS", ""))
    cmake, cmake_version = find_cmake()
    nvcc = find_nvcc(extra_args)
    cuda_version = check_nvcc(nvcc)
    archs = resolve_archs(progress)
    options = cmake_options(archs)
    build = _build_dir(source, options, extra_args)
    build.mkdir(parents=True, exist_ok=True)

    generator = []
    ninja = shutil.which("ninja")
    names_generator = os.environ.get("CMAKE_GENERATOR") or any(
        a.startswith("-G") for a in extra_args)
    if ninja and not names_generator:
        generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    configure = [cmake, "-S", str(source), "-B", str(build), *generator]
    configure += [f"-D{name}={value}" for name, value in options.items()]
    configure += extra_args

    # A cache written by other options or tools (pip's build environment, and so its cmake and
    # ninja, is new each time) is configured afresh; compiled objects whose commands did not
    # change are kept.
    stamp = build / "flashcute-configure.json"
    compilers = {name: os.environ.get(name, "") for name in COMPILER_VARS}
    stamp_text = json.dumps({"configure": configure, "nvcc": nvcc, "environment": compilers},
                            indent=1)
    cache = build / "CMakeCache.txt"
    fresh = cache.is_file() and (not stamp.is_file() or stamp.read_text() != stamp_text)
    if fresh:
        configure.insert(1, "--fresh")

    jobs = os.environ.get("FLASHCUTE_BUILD_JOBS", str(os.cpu_count() or 1))
    log_path = build / "flashcute-build.log"
    cuda = ".".join(map(str, cuda_version)) if cuda_version else "unknown"
    progress.say(f"configure: CMake {'.'.join(map(str, cmake_version))}, "
                 f"{'Ninja' if generator else 'the default generator'}, CUDA {cuda}, tile set "
                 f"{options['FLASHCUTE_TILE_SET']}{', afresh' if fresh else ''}; build folder "
                 f"{build}; log {log_path}")
    with open(log_path, "w") as log:
        rc = _run_logged(configure, log, progress)
        if rc != 0:
            _fail("CMake configure", rc, log_path, progress)
        stamp.write_text(stamp_text)

        ninja_step = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)")
        make_step = re.compile(r"^\[\s*(\d+)%\]\s+(.*)")

        def on_build_line(line):
            match = ninja_step.match(line) or make_step.match(line)
            if not match:
                return
            what = os.path.basename(match.group(match.lastindex).split()[-1])
            what = what[:-2] if what.endswith(".o") else what
            step = (f"{match.group(1)}/{match.group(2)}" if match.lastindex == 3
                    else f"{match.group(1)}%")
            progress.say(f"build {step} {what} ({progress.elapsed()})")

        progress.say(f"build: target flashcute, {jobs} jobs")
        build_command = [cmake, "--build", str(build), "--target", "flashcute", "-j", jobs]
        rc = _run_logged(build_command, log, progress, on_build_line)
        if rc != 0:
            _fail("the build", rc, log_path, progress)
    built = build / "lib" / "libflashcute.so"
    if not built.is_file():
        raise BuildError(f"the CMake build did not produce {built}")
    progress.say(f"built {built} in {progress.elapsed()}")
    return built


class BuildPyWithLibrary(build_py):
    """build_py, then puts libflashcute.so into the package's lib/ folder."""

    def run(self):
        super().run()
        prebuilt = os.environ.get("FLASHCUTE_PREBUILT_LIB")
        progress = None
        if prebuilt:
            library = pathlib.Path(prebuilt).resolve()
        else:
            progress = Progress()
            library = build_library(progress)
        if not library.is_file():
            raise RuntimeError(f"FLASHCUTE_PREBUILT_LIB={prebuilt} is not a file")
        target = pathlib.Path(self.build_lib) / "flashcute" / "lib" / "libflashcute.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, target)
        os.chmod(target, 0o755)
        if progress is not None:
            progress.say("package: the library goes into the wheel as flashcute/lib/"
                         "libflashcute.so")
            progress.close()


class NativeDistribution(Distribution):
    """Installs into platlib, as a package with a native library must."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the wheel carries a native library but no Python extension."""

    def get_tag(self):
        return "py3", "none", sysconfig.get_platform().replace("-", "_").replace(".", "_")


# A missing tool stops a wheel build before setuptools prints anything, so that pip's report of
# the failure is the one line that says what is missing.
BUILD_COMMANDS = ("bdist_wheel", "build", "build_py", "install", "editable_wheel", "develop")
if not os.environ.get("FLASHCUTE_PREBUILT_LIB") and set(sys.argv[1:]) & set(BUILD_COMMANDS):
    find_cmake()
    check_nvcc(find_nvcc(shlex.split(os.environ.get("FLASHCUTE_CMAKE_ARGS", ""))))

setup(distclass=NativeDistribution,
      cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
