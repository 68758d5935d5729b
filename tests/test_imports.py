"""The package's import graph: vLLM behind one door, no import cycles.

Read from the source with ``ast`` (nothing is imported), over every module of
``inferscale_memory`` and of the framework adapters' packages (``adapters/*/<package>``).

- The door: only ``inferscale_memory.driver`` (every use of vLLM beyond the connector base
  API) and ``inferscale_memory.connector`` (the class vLLM instantiates) may import
  ``vllm``. Every import counts here, a function's lazy one included, and so does
  ``importlib.import_module("vllm...")``.
- The door is shut for reads too: the private or version-specific names of vLLM that
  ``tests/test_vllm_contract.py`` checks (:data:`PRIVATE_VLLM_NAMES`, each in one of its
  ``TOUCHES``) are read only inside the door: an attribute, a name, an imported name or a
  string that is exactly one of them (``getattr(llm, "errored")``) counts elsewhere.
- Inside the door, the connector's scheduler side and the plain data it keeps
  (:data:`PLAIN_CONNECTOR`) neither import vLLM or torch nor read those names: they see
  vLLM's requests and steps as the plain views the driver builds (``connector/step.py``).
- Cycles: module A imports module B when A's module-level code does: its body and the
  bodies of ``if``/``try``/``with`` blocks and classes in it, ``if TYPE_CHECKING:`` blocks
  included (a cycle of types is a cycle of design: ``memory.py`` once type-hinted the
  ``MemoryEngine`` that imported it, and reached into it). ``import a.b`` and
  ``from a import b`` import the module ``a.b``; ``from a import name`` of a name that is
  no module imports ``a``. Importing ``a.b`` also runs the package ``a``'s ``__init__``
  first; that edge is not counted: a package's ``__init__`` that imports its own
  submodules is how packages are built.
- Lazy cycles: a function's import is how an optional dependency is loaded on demand
  (``store.backends`` picks the Qdrant backend that way), but between our own modules a
  cycle through one is still a cycle of design (``store.index`` once picked the backend
  that imported it), so the second graph counts every import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOORS = ("inferscale_memory.connector", "inferscale_memory.driver")
# vLLM's private or version-specific names that only the door reads. Each is named by a
# touch of tests/test_vllm_contract.py; names that our own code also uses for its own
# things (``ChatCompletionRequest``, ``extract_tool_calls``, ``max_model_len``) are left out.
PRIVATE_VLLM_NAMES = (
    "_ROPE_DICT", "_compute_cos_sin_cache", "_C_cache_ops", "_k_scale", "_v_scale",
    "_k_scale_float", "_v_scale_float",
    "do_kv_cache_update", "static_forward_context", "_dynamo", "finalize_loading",
    "vllm_config", "output_handler", "errored", "num_gpu_blocks", "EngineDeadError",
    "EngineGenerateError",
    "VLLMValidationError", "ToolParserManager", "get_tool_parser", "tools_called",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_RPC_BASE_PATH", "CachedRequestData", "resumed_req_ids",
    "scheduled_cached_reqs", "scheduled_new_reqs", "num_scheduled_tokens", "get_block_ids",
    "invalid_block_ids", "_get_connector_metadata",
)
# The connector's modules that read vLLM's records only as plain views built by the driver
# (driver/scheduling.py): the scheduler side, the fact registry, the plans and reports.
PLAIN_CONNECTOR = tuple(f"inferscale_memory.connector.{name}" for name in (
    "params", "plan", "registry", "report", "scheduler", "step", "tracking"))


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the packages under ``root`` and of the adapters, by dotted name."""
    roots = [root / "inferscale_memory"]
    roots += [p.parent for p in sorted((root / "adapters").glob("*/*/__init__.py"))
              if p.parent.name != "tests"]
    modules = {}
    for package in roots:
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name of a ``from ... import`` (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(module: str, path: Path,
                   nodes: list[ast.stmt] | ast.AST) -> Iterator[tuple[str, str]]:
    """What ``nodes`` import: (the name if it is a module, else the module it is in)
    pairs; ``from a import b`` gives ``("a.b", "a")``, ``import a.b`` ``("a.b", "a.b")``."""
    walk = (n for node in nodes for n in ast.walk(node)) if isinstance(nodes, list) \
        else ast.walk(nodes)
    for node in walk:
        if isinstance(node, ast.Import):
            yield from ((alias.name, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            yield from ((f"{base}.{alias.name}", base) for alias in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                             "__import__")):
            yield node.args[0].value, node.args[0].value


def module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements at module level (see the module docstring): all but functions."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If | ast.For | ast.While | ast.With | ast.Try | ast.ClassDef):
            for field in ("body", "orelse", "finalbody"):
                yield from module_level(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                yield from module_level(handler.body)
        else:
            yield node


def imports_of(name: str, path: Path, packages: tuple[str, ...] = ("vllm",)) -> list[str]:
    """The modules of ``packages`` that module ``name`` imports (lazy imports included)."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted({base for _, base in imported_names(name, path, tree)
                   if any(base == p or base.startswith(p + ".") for p in packages)})


def private_names_read(path: Path) -> list[str]:
    """The names of :data:`PRIVATE_VLLM_NAMES` that a module reads."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.alias):
            used.add(node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.add(node.value)
    return sorted(used & set(PRIVATE_VLLM_NAMES))


def vllm_imports(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Modules outside the door that import vLLM, with what they import."""
    return {name: hits for name, path in modules.items()
            if not inside_the_door(name) and (hits := imports_of(name, path))}


def inside_the_door(module: str) -> bool:
    return any(module == door or module.startswith(door + ".") for door in DOORS)


def private_vllm_reads(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Modules outside the door that read a name of :data:`PRIVATE_VLLM_NAMES`, with the
    names they read."""
    return {name: hits for name, path in modules.items()
            if not inside_the_door(name) and (hits := private_names_read(path))}


def touched_names(contract: Path) -> str:
    """What every touch of ``TOUCHES`` in ``contract`` reads, joined (read with ``ast``:
    the contract test imports vLLM)."""
    tree = ast.parse(contract.read_text(), str(contract))
    return " ".join(node.args[0].value for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and ast.unparse(node.func) == "Touch"
                    and node.args and isinstance(node.args[0], ast.Constant))


def import_graph(modules: dict[str, Path], lazy: bool = False) -> dict[str, set[str]]:
    """Module-level imports between the given modules (every import with ``lazy``)."""
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        nodes = [tree] if lazy else list(module_level(tree.body))
        pairs = imported_names(name, path, nodes)
        targets = {full if full in modules else base for full, base in pairs}
        graph[name] = {n for n in targets if n in modules and n != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(cycle: list[str], graph: dict[str, set[str]]) -> str:
    members = set(cycle)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in cycle)


def test_only_the_driver_and_the_connector_import_vllm() -> None:
    modules = package_modules(ROOT)
    assert "inferscale_memory.runtime" in modules and "inferscale_memory.server.app" in modules
    assert any(name.startswith("langchain_inferscale") for name in modules)
    assert vllm_imports(modules) == {}, f"vLLM imported outside {DOORS}"


def test_only_the_driver_and_the_connector_read_vllms_private_names() -> None:
    assert private_vllm_reads(package_modules(ROOT)) == {}, \
        f"vLLM's private names read outside {DOORS}: move the read into inferscale_memory/driver"


def test_the_scheduler_side_sees_plain_views_only() -> None:
    modules = package_modules(ROOT)
    found = {name: imports_of(name, modules[name], ("vllm", "torch"))
             + private_names_read(modules[name]) for name in PLAIN_CONNECTOR}
    assert {name: hits for name, hits in found.items() if hits} == {}, \
        "move the read of vLLM's records into inferscale_memory/driver/scheduling.py"
    shim = modules["inferscale_memory.connector.connector"]
    assert imports_of("inferscale_memory.connector.connector", shim) != []  # imports are seen
    assert "get_block_ids" in private_names_read(modules["inferscale_memory.driver.scheduling"])


def test_each_private_name_is_checked_by_the_vllm_contract() -> None:
    touched = touched_names(ROOT / "tests" / "test_vllm_contract.py")
    assert "AsyncLLM.output_handler" in touched  # the touches are read
    unchecked = [name for name in PRIVATE_VLLM_NAMES if name not in touched]
    assert not unchecked, f"no touch of tests/test_vllm_contract.py checks {unchecked}"


def test_no_import_cycle_between_the_package_modules() -> None:
    graph = import_graph(package_modules(ROOT))
    assert "inferscale_memory.runtime" in graph["inferscale_memory.engine"]  # edges are seen
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(describe(c, graph) for c in found)


def test_no_import_cycle_through_a_lazy_import() -> None:
    graph = import_graph(package_modules(ROOT), lazy=True)
    assert "inferscale_memory.store.qdrant" in graph["inferscale_memory.store.backends"]
    found = cycles(graph)
    assert not found, "import cycles (lazy imports counted): " + " | ".join(
        describe(c, graph) for c in found)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """A made-up package with a vLLM import outside the door, a lazy one, cycles of module
    level imports (one through a package, one under TYPE_CHECKING) and an import that is
    no edge (in a function)."""
    package = tmp_path / "inferscale_memory"
    (package / "connector").mkdir(parents=True)
    files = {
        "__init__.py": "from inferscale_memory.a import A\nfrom inferscale_memory.g import G\n",
        "a.py": "from . import b\nA = 1\n",
        "b.py": "import inferscale_memory.c\n",
        "c.py": "try:\n    from inferscale_memory.a import A\nexcept ImportError:\n    pass\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from inferscale_memory.e import f\nimport inferscale_memory.h\n",
        "e.py": "def f():\n    from inferscale_memory import d\n    import vllm.config\n",
        "h.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from inferscale_memory.d import D\n",
        "f.py": "import importlib\nX = importlib.import_module('vllm.v1')\n",
        "g.py": "from inferscale_memory import A\nG = A\n",
        "connector/__init__.py": "import vllm\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    (tmp_path / "adapters").mkdir()
    modules = package_modules(tmp_path)
    assert vllm_imports(modules) == {"inferscale_memory.e": ["vllm.config"],
                                     "inferscale_memory.f": ["vllm.v1"]}
    graph = import_graph(modules)
    assert cycles(graph) == [["inferscale_memory", "inferscale_memory.g"],
                             ["inferscale_memory.a", "inferscale_memory.b", "inferscale_memory.c"],
                             ["inferscale_memory.d", "inferscale_memory.h"]]
    assert graph["inferscale_memory.e"] == set()  # its imports are in a function
    lazy = import_graph(modules, lazy=True)
    assert lazy["inferscale_memory.e"] == {"inferscale_memory.d"}
    assert ["inferscale_memory.d", "inferscale_memory.e", "inferscale_memory.h"] in cycles(lazy)


def test_the_private_names_check_finds_reads_outside_the_door(tmp_path: Path) -> None:
    """Reads through an attribute, ``getattr``, a call and an import are found outside the
    door; a docstring that names one, and any read inside the door, are not."""
    package = tmp_path / "inferscale_memory"
    (package / "driver").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "x.py": '"""Stops the output_handler."""\n\n\ndef f(llm, rope):\n'
                '    return getattr(llm, "errored"), llm.vllm_config, '
                'rope._compute_cos_sin_cache()\n',
        "y.py": "from vllm.v1.core.sched.output import CachedRequestData\n",
        "z.py": '"""Nothing of vLLM: EngineDeadError is named in prose only."""\n',
        "driver/__init__.py": "",
        "driver/engine.py": "from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT\n"
                            "def f(llm):\n    return llm.output_handler\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    (tmp_path / "adapters").mkdir()
    assert private_vllm_reads(package_modules(tmp_path)) == {
        "inferscale_memory.x": ["_compute_cos_sin_cache", "errored", "vllm_config"],
        "inferscale_memory.y": ["CachedRequestData"]}
