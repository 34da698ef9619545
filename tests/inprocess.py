"""`python launch.py ARGS` inside the test process: the same app, entry point and exit codes as a user's
command (launch.py's `main` through currytrain.app.run_app), without paying a new interpreter, torch's import
and Hydra's start-up for every run.

What a process owns is saved and restored around each run: sys.argv, the working directory, the environment,
signal handlers, run-folder locks (currytrain.lock), logging handlers, warning filters, torch's thread count and default dtype, Hydra's global
state, and the app's record of this process's outcomes. stdout and stderr are captured as text, so a test
reads `returncode`, `stdout` and `stderr` exactly as from subprocess.run. Runs that need a process of their own
(several workers, multiruns, a changed environment) go through conftest.launch_subprocess instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from hydra.core.global_hydra import GlobalHydra

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
_apps: dict[Path, ModuleType] = {}


def launch_module(script: Path = ROOT / "launch.py") -> ModuleType:
    """A launch.py as a module (imported once: it registers the schemas, and holds the @hydra.main function)."""
    if script not in _apps:
        spec = importlib.util.spec_from_file_location(f"launch_py_{len(_apps)}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if script != ROOT / "launch.py":  # Hydra finds conf/ beside the file of a __main__ task, as for `python launch.py`
            module.main.__wrapped__.__module__ = "__main__"
        _apps[script] = module
    return _apps[script]


@contextlib.contextmanager
def project_imports(root: Path) -> Iterator[None]:
    """Inside the block, `experiments` is the package of the project at root (as for its launch.py, whose folder
    is first on sys.path); the test process's own (the checkout's) is back after it."""
    saved_path = sys.path[:]
    saved = {name: module for name, module in sys.modules.items() if name == "experiments" or name.startswith("experiments.")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in [name for name in sys.modules if name == "experiments" or name.startswith("experiments.")]:
            del sys.modules[name]
        sys.modules.update(saved)


@contextlib.contextmanager
def process_state(argv: list[str], script: Path = ROOT / "launch.py") -> Iterator[None]:
    """A fresh command's view of the process inside the block, the test's own restored after it."""
    from currytrain import app, lock

    saved_argv, saved_cwd, saved_env = sys.argv[:], os.getcwd(), dict(os.environ)
    saved_signals = {signum: signal.getsignal(signum) for signum in SIGNALS}
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_levels = {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items() if isinstance(logger, logging.Logger)}
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    sys.argv = [str(script), *argv]
    os.chdir(script.parent)
    GlobalHydra.instance().clear()
    app._task_started = False
    app._outcomes.clear()
    app._failed_runs.clear()
    quick_exit, app.quick_exit = app.quick_exit, lambda: None  # it readies a process's exit, which does not come here
    try:
        with warnings.catch_warnings():
            yield
    finally:
        app.quick_exit = quick_exit
        for held in list(lock._HELD.values()):  # the kernel drops a dead process's run-folder locks
            held.count = 1
            held.release()
        GlobalHydra.instance().clear()
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()  # the job's log file under its run folder
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv


def run_launch_py(argv: list[str], script: Path = ROOT / "launch.py") -> subprocess.CompletedProcess:
    """Run the app of `script` (curryTrain's launch.py, or a project's: it runs in the project's folder, its
    experiments importable) with `argv` here; its exit code and captured output, as subprocess.run gives them."""
    from currytrain.app import run_app

    imports = project_imports(script.parent) if script != ROOT / "launch.py" else contextlib.nullcontext()
    stdout, stderr = io.StringIO(), io.StringIO()
    with imports, process_state(argv, script), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        module = launch_module(script)
        try:
            run_app(module.main)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if not isinstance(exit_.code, int | None):
                print(exit_.code, file=sys.stderr)  # as the interpreter prints a non-integer exit status
    return subprocess.CompletedProcess(["launch.py", *argv], code, stdout.getvalue(), stderr.getvalue())
