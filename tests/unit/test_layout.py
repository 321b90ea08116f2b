"""Layouts: the instance's shared-memory objects (reply rings are sized from the request
rings), and the package's modules (each has a role, imports run downhill)."""

from __future__ import annotations

import ast
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from queen_mp.ipc import layout
from queen_mp.ipc.ring import Ring
from queen_mp.runtime import Runtime


def test_reply_rings_are_an_eighth_of_the_request_rings_and_at_least_64_kib(tmp_path) -> None:
    assert layout.reply_ring_bytes(4096 * 1024) == 512 * 1024
    assert layout.reply_ring_bytes(64 * 1024) == 64 * 1024
    rt = Runtime(f"/qmpt{os.getpid():x}", 2, 1, 1 << 20, 0.0, str(tmp_path))
    layout.create_all(rt)
    try:
        request, reply = Ring.attach(rt.request_ring(1, 0)), Ring.attach(rt.reply_ring(1, 0))
        try:
            # an eighth, give or take the ring's own header
            assert request.capacity // 8 - 4096 <= reply.capacity <= request.capacity // 8
        finally:
            request.close()
            reply.close()
    finally:
        layout.unlink_all(rt)


# ------------------------------------------------------------------ the package's own layout
# A house organised by role (README "Layout"): each module's folder names its role, and imports
# run downhill only. The walk reads the source (every ``import`` and ``from ... import``, at
# module level, in functions and under TYPE_CHECKING alike), so it also checks another checkout
# (``package_violations(Path("/elsewhere/queen_mp"))``).

ROOT_LEAVES = frozenset({"config", "runtime", "metrics", "heap", "crypto", "keyring",
                         "auth", "logs"})
#: what each layer may import (its own layer included); "root" is the leaf modules above
#: and the package itself (``__version__``)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "processes": frozenset({"processes", "http", "front", "shards", "models", "ipc", "db",
                            "spool", "wire", "root"}),
    "http": frozenset({"http", "front", "models", "ipc", "db", "spool", "wire", "root"}),
    "front": frozenset({"front", "models", "ipc", "db", "spool", "wire", "root"}),
    "models": frozenset({"models", "ipc", "db", "spool", "wire", "root"}),
    "shards": frozenset({"shards", "models", "ipc", "db", "spool", "wire", "root"}),
    "ipc": frozenset({"ipc", "db", "spool", "wire", "root"}),
    "db": frozenset({"ipc", "db", "spool", "wire", "root"}),
    "spool": frozenset({"ipc", "db", "spool", "wire", "root"}),
    "wire": frozenset({"wire"}),
    "root": frozenset({"root"}),
}
#: third-party packages that belong to one role only
ONLY_IN: dict[str, frozenset[str]] = {
    "falcon": frozenset({"http"}),   # the HTTP edge; models raise domain errors instead
    "click": frozenset({"processes"}),  # command lines; shards and migrations log via logs.py
}
PACKAGE = Path(__file__).resolve().parents[2] / "queen_mp"


@dataclass(frozen=True)
class Import:
    module: str   # the importing module
    line: int
    target: str   # the imported module (``from a import b``: a.b when b is a module)


def _module_name(package: Path, path: Path) -> str:
    parts = (package.name, *path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(package: Path, dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (package / rel).with_suffix(".py").is_file() or (package / rel / "__init__.py").is_file()


def package_imports(package: Path = PACKAGE) -> list[Import]:
    out: list[Import] = []
    for path in sorted(package.rglob("*.py")):
        name = _module_name(package, path)
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.extend(Import(name, node.lineno, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    is_sub = base.startswith(package.name) and _is_module(package, sub)
                    out.append(Import(name, node.lineno, sub if is_sub else base))
    return list(dict.fromkeys(out))  # one per (module, line, target)


def layer_of(dotted: str, package: str = "queen_mp") -> str | None:
    """The role of a module of the package, None if it has no place in the layout."""
    parts = dotted.split(".")
    if parts[0] != package:
        return None
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in ROOT_LEAVES):
        return "root"
    if parts[1] in MAY_IMPORT and parts[1] != "root":
        return parts[1]
    return None


def package_violations(package: Path = PACKAGE) -> list[str]:
    """Every import that breaks the layout, one readable line each."""
    bad: list[str] = []
    for path in sorted(package.rglob("*.py")):
        name = _module_name(package, path)
        if layer_of(name, package.name) is None:
            bad.append(f"{name}: no place in the layout (the root holds only "
                       f"{', '.join(sorted(ROOT_LEAVES))}; roles: "
                       f"{', '.join(sorted(set(MAY_IMPORT) - {'root'}))})")
    for imp in package_imports(package):
        mine = layer_of(imp.module, package.name)
        if mine is None:
            continue  # reported above
        top = imp.target.split(".")[0]
        if top in ONLY_IN and mine not in ONLY_IN[top]:
            bad.append(f"{imp.module} (line {imp.line}) imports {imp.target}: only "
                       f"{'/'.join(sorted(ONLY_IN[top]))} may import {top}")
            continue
        if top != package.name:
            continue
        theirs = layer_of(imp.target, package.name)
        if theirs is None or theirs not in MAY_IMPORT[mine]:
            where = "a module with no place in the layout" if theirs is None else theirs
            bad.append(f"{imp.module} (line {imp.line}) imports {imp.target} ({where}): "
                       f"{mine} may import only {', '.join(sorted(MAY_IMPORT[mine]))}")
    return bad


def test_every_module_has_a_role_and_imports_run_downhill() -> None:
    bad = package_violations()
    assert not bad, "layout broken:\n  " + "\n  ".join(bad)


def test_the_import_walk_sees_lazy_and_type_checking_imports() -> None:
    seen = {(i.module, i.target) for i in package_imports()}
    # a function-level import (the arbiter loads the app in each worker) and a TYPE_CHECKING one
    assert ("queen_mp.processes.arbiter", "queen_mp.http.app") in seen
    assert ("queen_mp.http.admission", "queen_mp.front.worker") in seen
    # ``from package import module`` names the module
    assert ("queen_mp.http.timers", "queen_mp.models.timers") in seen


def test_the_rules_refuse_what_they_should() -> None:
    assert layer_of("queen_mp") == layer_of("queen_mp.logs") == "root"
    assert layer_of("queen_mp.worker") is None  # a role-less module at the root
    assert "front" not in MAY_IMPORT["shards"] and "shards" not in MAY_IMPORT["front"]
    assert "processes" not in set().union(*(v for k, v in MAY_IMPORT.items()
                                             if k != "processes"))
    assert {k for k, v in MAY_IMPORT.items() if "http" in v} == {"processes", "http"}
    assert {k for k, v in MAY_IMPORT.items() if "front" in v} == {"processes", "http", "front"}
    for low in ("db", "wire", "ipc", "spool"):
        assert not MAY_IMPORT[low] & {"front", "http", "shards", "models", "processes"}


_MODULE_FLAGS = ("-m", "--worker-class")


def _module_strings(path: Path) -> list[tuple[int, str]]:
    """Module paths in strings: what follows ``"-m"`` or ``"--worker-class"`` in a list or
    tuple (``python -m queen_mp...``, gunicorn's worker class), ``import_module("...")``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List | ast.Tuple):
            for flag, value in itertools.pairwise(node.elts):
                if (isinstance(flag, ast.Constant) and flag.value in _MODULE_FLAGS
                        and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                    out.append((value.lineno, value.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            out.append((node.lineno, str(node.args[0].value)))
    return out


def test_module_paths_in_strings_name_modules_that_exist() -> None:
    repo = PACKAGE.parent
    bad = []
    for tree in ("queen_mp", "tests", "bench"):
        for path in sorted((repo / tree).rglob("*.py")):
            for line, text in _module_strings(path):
                dotted = text.split(":")[0]
                if not dotted.startswith("queen_mp"):
                    continue
                module, _, attr = dotted.rpartition(".")
                if _is_module(PACKAGE, dotted):
                    continue
                if module and _is_module(PACKAGE, module) and attr:  # package.module.Class
                    source = Path(PACKAGE, *module.split(".")[1:]).with_suffix(".py")
                    if source.is_file() and f"class {attr}" in source.read_text():
                        continue
                bad.append(f"{path.relative_to(repo)}:{line}: {text!r}")
    assert not bad, "module paths that do not exist:\n  " + "\n  ".join(bad)
