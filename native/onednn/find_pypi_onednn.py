"""Print the folder of oneDNN's CMake package (``dnnl-config.cmake``) that PyPI's oneDNN
development package installed into this Python environment; print nothing when it is absent.

CMakeLists.txt runs this with the Python that builds the wheel: under pip's build isolation
the build requirements (``onednn-devel-cpu-gomp``, see pyproject.toml) are installed in a
temporary prefix that only that Python knows about, and the package's data files (headers,
``lib/cmake/dnnl``) land under that prefix, outside CMake's default search.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

#: PyPI distributions carrying oneDNN's CMake package, in order of preference.
DISTRIBUTIONS = ("onednn-devel-cpu-gomp",)


def dnnl_cmake_dir(names: tuple[str, ...] = DISTRIBUTIONS) -> Path | None:
    """The folder holding ``dnnl-config.cmake`` of the first installed distribution of
    ``names``, or ``None``."""
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for file in dist.files or ():
            if file.name == "dnnl-config.cmake":
                path = Path(str(dist.locate_file(file))).resolve()
                if path.is_file():
                    return path.parent
    return None


def main() -> int:
    """Print the folder (or nothing)."""
    found = dnnl_cmake_dir()
    if found is not None:
        print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
