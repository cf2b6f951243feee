"""Write requirements.txt from pyproject.toml, so versions live in one place.

requirements.txt stays the README's install path (`pip install -r requirements.txt` then
`python app.py`, no package install): it is the base dependencies plus every extra.
`--check` exits 1 when the file is stale (tests/test_packaging.py runs it).
"""
from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
HEADER = """\
# Generated from pyproject.toml by `python scripts/sync_requirements.py`: change versions there.
# Everything (linter, engine, app), the same as `pip install ".[all]"` without installing the package.
# torch is a range so your own CUDA build satisfies it; on a CPU-only Linux machine, install the CPU
# wheel first (`pip install torch --index-url https://download.pytorch.org/whl/cpu`): PyPI's Linux
# torch is the CUDA build, several GB with its libraries.
"""


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Base dependencies, then each extra's, in file order, without the package's own name."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    out: list[str] = []
    for req in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]:
        if not req.startswith(project["name"]) and req not in out:
            out.append(req)
    return out


def render(pyproject: Path = ROOT / "pyproject.toml") -> str:
    return HEADER + "".join(r + "\n" for r in requirements(pyproject))


def main(argv: list[str]) -> int:
    target = ROOT / "requirements.txt"
    text = render()
    if "--check" in argv:
        if target.read_text(encoding="utf-8") != text:
            print("requirements.txt is stale: run python scripts/sync_requirements.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target.name}: {len(text.splitlines()) - HEADER.count(chr(10))} requirements")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
