"""The boundaries of the design: backends never import app; runtimes stay in their modules."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNTIME_MODULES = ("llama_cpp", "mlx", "mlx_lm")
# Modules allowed to import a runtime: their own backend module only.
RUNTIME_HOMES = {
    "llama_cpp": "llamacpp.py",
    "mlx": "mlx_lm_backend.py",
    "mlx_lm": "mlx_lm_backend.py",
}


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_the_algorithm_imports_where_no_runtime_is_installed() -> None:
    code = """
import json, sys
for name in ("llama_cpp", "mlx", "mlx_lm"):
    sys.modules[name] = None  # any import of it now raises ImportError
import backends.speculative, backends.sampling, backends.drafters, backends.base
import backends.errors
print(json.dumps(sorted(sys.modules)))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "backends.speculative" in loaded


def test_importing_backends_never_imports_app() -> None:
    code = """
import importlib, json, pkgutil, sys
for name in ("llama_cpp", "mlx", "mlx_lm"):
    sys.modules[name] = None
import backends
failed = {}
for module in pkgutil.iter_modules(backends.__path__):
    try:
        importlib.import_module(f"backends.{module.name}")
    except Exception as error:  # a runtime backend may refuse without its runtime
        failed[module.name] = repr(error)
print(json.dumps({"modules": sorted(sys.modules), "failed": failed}))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    app_modules = [name for name in report["modules"] if name == "app" or name.startswith("app.")]
    assert app_modules == []
    core = {"base", "sampling", "drafters", "speculative", "errors"}
    assert not core & set(report["failed"]), report["failed"]


def imported_names(path: Path) -> set[str]:
    """Top-level package names that a source file imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_backends_source_imports_app() -> None:
    sources = sorted((REPO / "backends").rglob("*.py"))
    assert sources
    for path in sources:
        assert "app" not in imported_names(path), f"{path.relative_to(REPO)} imports app"


def test_runtimes_are_imported_only_by_their_own_backend_module() -> None:
    for path in sorted([*(REPO / "backends").rglob("*.py"), *(REPO / "app").rglob("*.py")]):
        names = imported_names(path)
        for runtime in RUNTIME_MODULES:
            if runtime in names:
                home = REPO / "backends" / RUNTIME_HOMES[runtime]
                assert path == home, f"{path.relative_to(REPO)} imports {runtime}"
