"""curryTrain installed beside hydra-optuna-sweeper, for real: a new virtual environment gets hydra-optuna-sweeper
1.3.0 with its own Optuna 2.10 from the package registries, then curryTrain's wheel, built from this checkout.
The official plugin keeps its files, its `hydra/sweeper=optuna` and its behaviour; uninstalling either leaves the
other installed and working; curryTrain's sweeper (`hydra/sweeper=currytrain`) says why it cannot run on that Optuna.

curryTrain's wheel goes in with --no-deps: its metadata asks for torch, whose registry build for Linux is a CUDA one
of several GB, and neither the Hydra plugin nor the sweeper imports torch. The plugin needs only hydra-core, which
the official plugin brings; running curryTrain's sweeper adds optuna>=4 and matplotlib (numpy and scipy are there).
The environment is made once for this module (about a minute of pip on a fresh machine, seconds with pip's cache)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.slow

OFFICIAL = ["hydra-optuna-sweeper==1.3.0", "hydra-core>=1.3,<1.4", "sqlalchemy<2"]
"""hydra-optuna-sweeper asks for hydra-core>=1.1.0.dev7, a pre-release bound that lets pip take hydra-core's release
candidates: curryTrain's own range is what pip settles on with both installed. Optuna 2.10's RDB storage predates
SQLAlchemy 2."""
SWEEP_NEEDS = ["optuna>=4", "matplotlib>=3.7"]
"""What curryTrain's sweeper imports beyond what the environment already holds."""
APP = ROOT / "tests" / "sweep_app" / "main.py"
PROBE = r"""
import base64, hashlib, json
from importlib import metadata
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper


def files(name):
    "(the files the distribution's RECORD lists, those whose bytes differ from it), or None when not installed"
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    listed, changed = [], []
    for entry in dist.files or []:
        if "__pycache__" in entry.parts:  # compiled later by Python itself
            continue
        listed.append(str(entry))
        if entry.hash is None:
            continue
        path = entry.locate()
        data = path.read_bytes() if path.is_file() else b"(missing)"
        digest = base64.urlsafe_b64encode(hashlib.new(entry.hash.mode, data).digest()).rstrip(b"=").decode()
        if digest != entry.hash.value:
            changed.append(str(entry))
    return {"listed": listed, "changed": changed}


def provider(path):
    try:
        return ConfigStore.instance().load(path).provider
    except Exception:
        return None


sweepers = {f"{c.__module__}.{c.__name__}": getattr(__import__("sys").modules.get(c.__module__), "__file__", None) for c in Plugins.instance().discover(Sweeper)}
print(json.dumps({
    "official": files("hydra-optuna-sweeper"),
    "currytrain": files("currytrain"),
    "sweepers": sweepers,
    "optuna": provider("hydra/sweeper/optuna.yaml"),
    "tpe": provider("hydra/sweeper/sampler/tpe.yaml"),
    "currytrain_sweeper": provider("hydra/sweeper/currytrain.yaml"),
}))
"""
OFFICIAL_CLASS = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


@dataclass
class Env:
    python: Path
    wheel: Path
    root: Path

    def run(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """A command of this environment's Python, away from the checkout (whose hydra_plugins/ must not be seen)."""
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        return subprocess.run([str(self.python), *args], cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout)

    def pip(self, *args: str) -> None:
        result = self.run("-m", "pip", "--disable-pip-version-check", "-q", *args)
        assert result.returncode == 0, f"pip {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"

    def installed(self, name: str) -> bool:
        return self.run("-c", f"from importlib import metadata; metadata.version({name!r})").returncode == 0

    def ensure(self, *, official: bool, currytrain: bool) -> None:
        """Bring the environment to the state a test starts from (each test states its own)."""
        if currytrain and not self.installed("currytrain"):
            self.pip("install", "--no-deps", str(self.wheel))
        if not currytrain and self.installed("currytrain"):
            self.pip("uninstall", "-y", "currytrain")
        if official and not self.installed("hydra-optuna-sweeper"):
            self.pip("install", *OFFICIAL)  # also takes Optuna back to 2.10
        if not official and self.installed("hydra-optuna-sweeper"):
            self.pip("uninstall", "-y", "hydra-optuna-sweeper")

    def probe(self) -> dict:
        result = self.run("-c", PROBE)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    def sweep(self, name: str, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
        """tests/sweep_app (a plain Hydra app written for hydra-optuna-sweeper) swept here, 4 trials, y fixed."""
        sweep_dir = self.root / "sweeps" / name
        result = self.run(str(APP), "--multirun", f"hydra.sweep.dir={sweep_dir}", "hydra.sweeper.n_trials=4", "y=0", *overrides)
        return result, sweep_dir


def _source_copy(target: Path) -> Path:
    """The checkout's files a wheel is built from (not its venv, run folders or build leftovers)."""
    ignore = shutil.ignore_patterns(".venv", ".git", "runs", "outputs", "multirun", "build", "*.egg-info", "__pycache__", ".pytest_cache")
    shutil.copytree(ROOT, target, ignore=ignore)
    return target


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    root = tmp_path_factory.mktemp("coexist")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "wheel", "--no-deps", "-w", str(root / "wheels"), str(_source_copy(root / "src"))],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    environment = Env(root / "venv" / "bin" / "python", next((root / "wheels").glob("currytrain-*.whl")), root)
    environment.pip("install", *OFFICIAL)  # the official plugin first, working, as a user has it
    environment.pip("install", "--no-deps", str(environment.wheel))
    return environment


def _official_ran(result: subprocess.CompletedProcess, sweep_dir: Path) -> None:
    """The official plugin ran the sweep: its results file has its three keys only, its study was in memory."""
    assert result.returncode == 0, result.stderr[-3000:]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert set(results) == {"name", "best_params", "best_value"} and "y" not in results["best_params"]
    assert not (sweep_dir / "optuna.db").exists() and not (sweep_dir / "report.md").exists()
    for job in sorted(d for d in sweep_dir.iterdir() if d.name.isdigit()):
        assert yaml.safe_load((job / ".hydra" / "config.yaml").read_text())["y"] == 0


def _official_intact(state: dict) -> None:
    assert state["official"] is not None and state["official"]["changed"] == []
    assert state["optuna"] == "optuna_sweeper" and state["tpe"] == "optuna_sweeper"  # its own config entries
    assert state["sweepers"][OFFICIAL_CLASS].endswith("hydra_optuna_sweeper/optuna_sweeper.py")


def test_installed_beside_it_curry_train_leaves_the_official_plugin_untouched(env: Env):
    env.ensure(official=True, currytrain=True)
    state = env.probe()
    _official_intact(state)
    assert state["currytrain"]["changed"] == [] and state["currytrain_sweeper"] == "currytrain"
    assert not set(state["official"]["listed"]) & set(state["currytrain"]["listed"])  # no file owned twice
    assert "hydra_plugins.currytrain_sweeper.sweeper.CurryTrainSweeper" in state["sweepers"]
    _official_ran(*env.sweep("both"))
    check = env.run("-m", "pip", "check")  # what curryTrain's --no-deps install leaves out is its own business
    assert not [line for line in check.stdout.splitlines() if not line.startswith("currytrain ")], check.stdout
    # curryTrain's own sweeper is there too, and says why it cannot run on Optuna 2.10 (exit 2, with the way out).
    result, _ = env.sweep("currytrain", "hydra/sweeper=currytrain")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "curryTrain's sweeper needs optuna>=4, but Optuna 2.10" in result.stderr and "use hydra/sweeper=optuna for that plugin" in result.stderr


def test_uninstalling_curry_train_leaves_the_official_plugin_working(env: Env):
    env.ensure(official=True, currytrain=True)
    env.pip("uninstall", "-y", "currytrain")
    state = env.probe()
    _official_intact(state)
    assert state["currytrain"] is None and state["currytrain_sweeper"] is None
    _official_ran(*env.sweep("after_currytrain_left"))


def test_uninstalling_the_official_plugin_leaves_curry_train_working(env: Env):
    env.ensure(official=True, currytrain=True)
    env.pip("uninstall", "-y", "hydra-optuna-sweeper")
    state = env.probe()
    assert state["official"] is None and state["currytrain"]["changed"] == []
    assert state["optuna"] == "currytrain" and state["tpe"] == "currytrain"  # the name is free: curryTrain offers it
    assert OFFICIAL_CLASS in state["sweepers"] and state["sweepers"][OFFICIAL_CLASS] is None  # no file behind it
    env.pip("install", *SWEEP_NEEDS)
    result, sweep_dir = env.sweep("after_official_left")  # the app's `hydra/sweeper: optuna`, now curryTrain's
    assert result.returncode == 0, result.stderr[-3000:]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["trials"] == {"COMPLETE": 4} and "y" not in results["best_params"]
    assert (sweep_dir / "optuna.db").is_file() and (sweep_dir / "report.md").is_file()


def test_the_official_plugin_installed_after_curry_train_is_untouched_too(env: Env):
    env.ensure(official=False, currytrain=True)
    env.pip("install", *OFFICIAL)
    state = env.probe()
    _official_intact(state)
    assert state["currytrain"]["changed"] == [] and not set(state["official"]["listed"]) & set(state["currytrain"]["listed"])
    _official_ran(*env.sweep("official_after"))
