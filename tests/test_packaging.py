"""The project installs like a linter: a wheel with its data, a console command that works from any
folder, and a lint-only install that needs neither torch nor gradio.

The wheel test builds from a copy of the working tree and installs it offline into a fresh venv
(`--no-deps --no-index`; the venv sees the system site-packages for pyyaml and hides torch and
gradio with an import blocker), so it runs without network in about 10 s.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import troubleshooter

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "lint"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Imported first in the child: makes the heavy libraries look uninstalled.
BLOCKER = '''
import sys
class _NoHeavyLibraries:
    BLOCKED = {"torch", "gradio", "gradio_client", "matplotlib", "pydantic", "numpy", "pygls", "lsprotocol"}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoHeavyLibraries())
'''


def test_requirements_txt_is_generated_from_pyproject():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import sync_requirements
    finally:
        sys.path.pop(0)
    assert (ROOT / "requirements.txt").read_text() == sync_requirements.render(), \
        "requirements.txt is stale: run python scripts/sync_requirements.py"
    reqs = sync_requirements.requirements()
    assert any(r.startswith("torch") for r in reqs) and any(r.startswith("gradio") for r in reqs)


def test_base_install_leaves_torch_and_gradio_to_extras():
    project = PYPROJECT["project"]
    assert not any(r.split(">")[0].split("<")[0].strip() in {"torch", "gradio"} for r in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(r.startswith("torch") for r in extras["engine"])
    assert any(r.startswith("gradio") for r in extras["app"]) and "amp-troubleshooter[engine]" in extras["app"]
    assert project["scripts"]["amp-troubleshooter"] == "troubleshooter.cli:entry"
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "troubleshooter.__version__"}


def test_pre_commit_hook_runs_the_console_command_on_python_and_notebooks():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "amp-troubleshooter")
    assert hook["entry"].split()[0] in PYPROJECT["project"]["scripts"] and hook["entry"].split()[1] == "lint"
    assert hook["language"] == "python" and set(hook["types_or"]) == {"python", "jupyter"}


def run_blocked(tmp_path: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`python -m troubleshooter ARGV` from the checkout with torch, gradio, ... unimportable."""
    blocker_dir = tmp_path / "blocker"
    blocker_dir.mkdir(exist_ok=True)
    (blocker_dir / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker_dir), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "troubleshooter", *argv], cwd=tmp_path, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_lint_rules_explain_recipe_ask_work_without_torch_or_gradio(tmp_path):
    shutil.copy(FIXTURES / "bad_AMP101.py", tmp_path / "train.py")
    proc = run_blocked(tmp_path, "lint", "train.py", "--format", "sarif")
    assert proc.returncode == 1, proc.stderr
    assert {r["ruleId"] for r in json.loads(proc.stdout)["runs"][0]["results"]} == {"AMP101"}
    assert run_blocked(tmp_path, "rules", "AMP101").returncode == 0
    proc = run_blocked(tmp_path, "explain", "-", stdin="RuntimeError: \"LayerNormKernelImpl\" not implemented for 'Half'\n")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr
    proc = run_blocked(tmp_path, "recipe", "--precision", "bf16", "-o", "loop.py")
    assert proc.returncode == 0, proc.stderr
    compile((tmp_path / "loop.py").read_text(), "loop.py", "exec")
    (tmp_path / "answers.yaml").write_text("gpu: A100\n")
    proc = run_blocked(tmp_path, "ask", "--answers", "answers.yaml", "--format", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("argv, needs", [(["capability"], "torch"), (["check", "--preset", "mlp"], "torch"),
                                         (["trace", "train.py"], "torch"),  # its parent looks torch up, never imports it
                                         (["app", "--port", "7999"], "gradio"), (["server"], "pygls")])
def test_engine_and_app_commands_name_the_extra_to_install(tmp_path, argv, needs):
    proc = run_blocked(tmp_path, *argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    extra = {"gradio": "app", "pygls": "lsp"}.get(needs, "engine")
    assert proc.stderr.startswith("error: ") and needs in proc.stderr and f"amp-troubleshooter[{extra}]" in proc.stderr


def _working_tree_copy(dest: Path) -> Path:
    """The files a clean clone would have (tracked, plus new files git does not ignore)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot tell which files a clean clone holds")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _can_build_wheels_offline() -> bool:
    """setuptools builds wheels itself from 70.1; older ones need the `wheel` package."""
    try:
        import setuptools
    except ModuleNotFoundError:
        return False
    major_minor = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    return major_minor >= (70, 1) or importlib.util.find_spec("wheel") is not None


def test_wheel_installs_offline_and_the_console_command_works_from_another_folder(tmp_path):
    if not _can_build_wheels_offline():
        pytest.skip("building the wheel offline needs setuptools>=70.1 (or the wheel package) installed here")
    clone = _working_tree_copy(tmp_path / "clone")
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(dist), str(clone)], capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(dist.glob("amp_troubleshooter-*.whl"))
    assert wheel.name.startswith(f"amp_troubleshooter-{troubleshooter.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("troubleshooter/recipes_data/train_amp.py", "troubleshooter/recipes_data/options.yaml",
                 "troubleshooter/recipes_data/train_gan_amp.py", "troubleshooter/data/gpu_products.yaml",
                 "troubleshooter/lint/analysis/data/vocabulary.json",
                 "troubleshooter/data/questions.yaml", "troubleshooter/data/log_patterns.yaml"):
        assert data in names
    # every data file the package reads ships with it (a missing one breaks the installed tool only)
    data_files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "troubleshooter").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data_files <= names, sorted(data_files - names)
    assert not any(n.startswith(("tests/", "app.py", "bench/")) for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / ("python.exe" if os.name == "nt" else "python")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                              "-q", str(wheel)], capture_output=True, text=True, timeout=240)
    assert install.returncode == 0, install.stderr[-2000:]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "_amp_no_heavy.py").write_text(BLOCKER)
    (Path(site) / "_amp_no_heavy.pth").write_text("import _amp_no_heavy\n")

    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(FIXTURES / "bad_AMP101.py", work / "train.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    cmd = str(bindir / "amp-troubleshooter")

    def run(*argv):
        return subprocess.run([cmd, *argv], cwd=work, env=env, capture_output=True, text=True, timeout=120)

    version = run("--version")
    assert version.returncode == 0 and troubleshooter.__version__ in version.stdout
    assert version.stdout.startswith("amp-troubleshooter ")
    where = subprocess.run([str(py), "-c", "import troubleshooter; print(troubleshooter.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True).stdout
    assert where.startswith(site), where  # the installed copy, not the checkout
    recipe = run("recipe", "--precision", "fp16", "--clip", "1.0", "-o", "train_amp.py")
    assert recipe.returncode == 0, recipe.stderr
    assert "GradScaler" in (work / "train_amp.py").read_text()
    sarif = run("lint", "train.py", "--format", "sarif")
    assert sarif.returncode == 1, sarif.stderr
    results = json.loads(sarif.stdout)["runs"][0]["results"]
    assert {(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]) for r in results} \
        == {("AMP101", "train.py")}
    assert run("rules", "AMP101").returncode == 0
    check = run("check", "--preset", "mlp")
    assert check.returncode == 2 and "amp-troubleshooter[engine]" in check.stderr and "Traceback" not in check.stderr
