"""Builds batchtune._core with the project's CMake (BATCHTUNE_BUILD_PYTHON=ON).

The metadata is in pyproject.toml. The extension is built against the torch of
the interpreter running the build, so use `pip install --no-build-isolation .`.
The CMake build tree stays in build-python/ (so that a second install is an
incremental build); BATCHTUNE_CMAKE_ARGS adds CMake flags.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch  # noqa: F401
        except ImportError:
            sys.exit("batchtune: torch must be installed first, and the build must see it: "
                     "pip install --no-build-isolation .")
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        shared = "BATCHTUNE_BUILD_DIR" in os.environ
        build_dir = Path(os.environ.get("BATCHTUNE_BUILD_DIR", ROOT / "build-python"))
        args = [
            f"-DBATCHTUNE_PYTHON={sys.executable}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DBATCHTUNE_BUILD_PYTHON=ON",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DBATCHTUNE_PYTHON_OUTPUT_DIR={out_dir}",
        ]
        if not shared:
            # Its own build tree: only what the extension needs (no GoogleTest).
            args += ["-DBATCHTUNE_BUILD_TESTS=OFF", "-DBATCHTUNE_BUILD_BENCH=OFF",
                     "-DBATCHTUNE_BUILD_EXAMPLES=OFF"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        args += shlex.split(os.environ.get("BATCHTUNE_CMAKE_ARGS", ""))
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir)] + args)
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "batchtune_core"])


setup(ext_modules=[CMakeExtension("batchtune._core")], cmdclass={"build_ext": CMakeBuild})
