"""Unpack cutlass_library/source/include from an nvidia-cutlass wheel into a target folder."""
import pathlib
import sys
import zipfile

wheel_dir, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheels = sorted(wheel_dir.glob("nvidia_cutlass-*.whl"))
if not wheels:
    sys.exit(f"no nvidia_cutlass wheel in {wheel_dir}")
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheels[-1]) as archive:
    for name in archive.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = target / name[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(archive.read(name))
