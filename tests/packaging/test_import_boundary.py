"""The boundaries of the design: backends never import app; runtimes stay in their modules."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME_MODULES = ("llama_cpp", "mlx", "mlx_lm", "mlx_vlm")
# Modules allowed to import a runtime: their own runtime package only.
RUNTIME_HOMES = {
    "llama_cpp": "llamacpp/*.py",
    "mlx": "mlx/*.py",
    "mlx_lm": "mlx/*.py",
    "mlx_vlm": "mlx/*.py",
}


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_the_algorithm_imports_where_no_runtime_is_installed() -> None:
    code = """
import json, sys
for name in ("llama_cpp", "mlx", "mlx_lm", "mlx_vlm"):
    sys.modules[name] = None  # any import of it now raises ImportError
import backends.base, backends.engine, backends.errors, backends.generation_events
import backends.speculation.loop, backends.speculation.model_drafter, backends.speculation.rejection
import backends.speculation.draft_policy, backends.speculation.verification
import backends.sampling.filters, backends.sampling.sparse_distribution
import backends.sampling.row_scans, backends.sampling.nucleus, backends.sampling.top_logits
import backends.sampling.penalties, backends.output.stop_strings
import backends.caches.conversation_cache
print(json.dumps(sorted(sys.modules)))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "backends.speculation.loop" in loaded


def test_importing_backends_never_imports_app() -> None:
    code = """
import importlib, json, pkgutil, sys
for name in ("llama_cpp", "mlx", "mlx_lm", "mlx_vlm"):
    sys.modules[name] = None
import backends
failed = {}
for module in pkgutil.walk_packages(backends.__path__, "backends."):
    try:
        importlib.import_module(module.name)
    except Exception as error:  # a runtime backend may refuse without its runtime
        failed[module.name] = repr(error)
print(json.dumps({"modules": sorted(sys.modules), "failed": failed}))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    app_modules = [name for name in report["modules"] if name == "app" or name.startswith("app.")]
    assert app_modules == []
    # Only the runtimes may refuse to import where their runtime is missing.
    refused_rooms = {room_of(name) for name in report["failed"]}
    assert refused_rooms <= {"llamacpp", "mlx"}, report["failed"]
    assert "backends.speculation.loop" in report["modules"]


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
                homes = set((REPO / "backends").glob(RUNTIME_HOMES[runtime]))
                assert path in homes, f"{path.relative_to(REPO)} imports {runtime}"


# -- the house inside app/: front ends on top, shared packages below --------------------

FRONT_ENDS = ("tui", "cli", "engine", "bench")
LOWER_PACKAGES = ("models", "chats")
ENTRY_POINT = "app.main"


def app_modules(package: str = "app") -> dict[str, Path]:
    """Every module under app/ (or ``package``), by dotted name (packages by their own name)."""
    modules = {}
    for path in sorted((REPO / package).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def app_imports(path: Path, known: set[str], package: str = "app") -> set[str]:
    """The app (or ``package``) modules a file imports, anywhere in it (TYPE_CHECKING
    blocks and function bodies too): ``from app.cli import doctor`` counts as
    ``app.cli.doctor``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(package))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not (node.module == package or node.module.startswith(package + ".")):
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found & known


def import_graph(package: str = "app") -> dict[str, set[str]]:
    modules = app_modules(package)
    known = set(modules)
    return {name: app_imports(path, known, package) - {name} for name, path in modules.items()}


def part_of(module: str) -> str:
    """``app.models.store`` -> ``models``; a module directly in app/ is its own part."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "app"


def test_front_ends_never_import_each_other() -> None:
    graph = import_graph()
    crossings = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if part_of(module) in FRONT_ENDS
        for target in targets
        if part_of(target) in FRONT_ENDS and part_of(target) != part_of(module)
    ]
    assert crossings == []


def test_lower_packages_never_import_a_front_end_or_the_entry_point() -> None:
    graph = import_graph()
    upward = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module != ENTRY_POINT and part_of(module) not in FRONT_ENDS
        for target in targets
        if part_of(target) in FRONT_ENDS or target == ENTRY_POINT
    ]
    assert upward == []
    assert graph[ENTRY_POINT], "the entry point should hand commands to the front ends"


def test_models_and_chats_stand_apart() -> None:
    graph = import_graph()
    sideways = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if part_of(module) in LOWER_PACKAGES
        for target in targets
        if part_of(target) in LOWER_PACKAGES and part_of(target) != part_of(module)
    ]
    assert sideways == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that import each other in a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def test_app_has_no_import_circles() -> None:
    assert strongly_connected(import_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    # The negative control: a loop of three and a self-contained chain.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


# -- the house inside backends/: the floor's doors at the top, rooms by purpose below ------

# The doors every room may stand on (runtime_exchange: how a generation's thread hands
# a runtime's work to the one thread that runs it; token_prefix: how much of a cache a
# new context keeps; target_rows: the target's rows a runtime's draft head has yet to read;
# sequence_head: a parallel target's sequence drafting with the head on the runtime thread).
GROUND = {
    "base",
    "errors",
    "generation_events",
    "runtime_exchange",
    "token_prefix",
    "target_rows",
    "sequence_head",
}
# The rooms each room may import besides itself: sampling imports nothing above it, the
# loop never a runtime, a runtime never the loop. The doors engine, select and pair_check
# sit on top and may import any room.
BACKENDS_MAY_IMPORT = {
    "sampling": {"base", "errors"},
    "output": GROUND | {"sampling"},
    "speculation": GROUND | {"sampling", "output"},
    # The caches keep model state by tokens; they need nothing of speculation.
    "caches": GROUND | {"sampling", "output"},
    # Other machines' addresses, protocol and layer shares: plain Python, no runtime.
    "workers": {"errors"},
    "llamacpp": GROUND | {"sampling", "output", "workers"},
    "mlx": GROUND | {"sampling", "output"},
}


def room_of(module: str) -> str:
    """``backends.sampling.rows`` -> ``sampling``; a door is its own room (``base``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "backends"


def rooms_imported_against_the_plan(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a room of backends/ to one its plan does not allow."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if room_of(module) in BACKENDS_MAY_IMPORT
        for target in sorted(targets)
        if room_of(target) != room_of(module)
        and room_of(target) not in BACKENDS_MAY_IMPORT[room_of(module)]
    ]


def test_backends_rooms_import_only_what_their_plan_allows() -> None:
    graph = import_graph("backends")
    assert {room_of(module) for module in graph} >= set(BACKENDS_MAY_IMPORT)
    assert rooms_imported_against_the_plan(graph) == []


def test_the_plan_check_finds_an_import_against_it() -> None:
    # The negative control: sampling reaching up to the loop, the loop to a runtime.
    graph = {
        "backends.sampling.rows": {"backends.speculation.loop", "backends.base"},
        "backends.speculation.loop": {"backends.llamacpp.model", "backends.sampling.rows"},
    }
    assert rooms_imported_against_the_plan(graph) == [
        "backends.sampling.rows imports backends.speculation.loop",
        "backends.speculation.loop imports backends.llamacpp.model",
    ]


def test_backends_has_no_import_circles() -> None:
    assert strongly_connected(import_graph("backends")) == []


# -- the engine and its clients: front ends reach the engine only over the socket ---------

CLIENT_MAY_IMPORT = {"app.settings", "app.errors"}


def test_the_client_package_imports_neither_the_engine_nor_a_front_end() -> None:
    graph = import_graph()
    client_modules = [module for module in graph if part_of(module) == "client"]
    assert "app.client.engine_client" in client_modules
    outside = [
        f"{module} imports {target}"
        for module in client_modules
        for target in graph[module]
        if part_of(target) != "client" and target not in CLIENT_MAY_IMPORT
    ]
    assert outside == []


def test_nothing_but_the_entry_point_imports_the_engine() -> None:
    graph = import_graph()
    importers = sorted(
        module
        for module, targets in graph.items()
        if part_of(module) != "engine" and any(part_of(target) == "engine" for target in targets)
    )
    assert importers == [ENTRY_POINT]


def test_the_engine_and_its_clients_share_one_definition_of_the_wire() -> None:
    graph = import_graph()
    assert "app.client.wire" in graph["app.engine.api"]
    assert "app.client.wire" in graph["app.client.engine_client"]


# The chat app and the plain REPL are clients of the engine: they never load a model.
CLIENT_FRONT_ENDS = ("app/tui", "app/cli/repl.py")
MODEL_LOADING = ("app.loading", "backends.engine", "app.engine")


def test_the_chat_front_ends_never_load_a_model_themselves() -> None:
    sources = [
        path
        for place in CLIENT_FRONT_ENDS
        for path in sorted(
            (REPO / place).rglob("*.py") if (REPO / place).is_dir() else [REPO / place]
        )
    ]
    assert len(sources) > 5
    loading = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            loading += [
                f"{path.relative_to(REPO)} imports {module}"
                for module in modules
                if any(module == bad or module.startswith(bad + ".") for bad in MODEL_LOADING)
            ]
    assert loading == []
