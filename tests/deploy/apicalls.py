"""Which Kubernetes API calls a service makes, read from its source (Python ``ast``, no imports).

A service's code is its package under ``services/`` plus every project module it imports,
transitively (``vgpu.*``). In that code we look for:

* ``<api>.get/list/watch/create/replace/merge_patch/delete("<kind>", ...)`` on the ``KubeApi``
  port (``vgpu.kube.port``), the kind a string literal or a module-level constant;
* ``<api>.get_resource_claim(...)`` (a resource.k8s.io resourceclaims get);
* ``<api>.bind_pod(...)`` (a pods/binding create), ``<api>.evict_pod(...)`` (a pods/eviction create) and ``<api>.create_event(...)`` (an event);
* ``Informer(api, "<kind>", ...)``, which lists and watches that kind.

Calls whose kind is not a literal are collected separately; only the generic machinery in
``vgpu.kube`` (the informer, the adapters) may make those, since its callers name the kind.
"""

from __future__ import annotations

import ast
import pathlib
import typing
from dataclasses import dataclass

from vgpu.kube import port

REPO = pathlib.Path(__file__).resolve().parents[2]
ROOTS = (REPO / "libs", REPO / "services")
PROJECT_PACKAGES = ("vgpu", "vgpu_scheduler", "vgpu_device_plugin")
KINDS = set(typing.get_args(port.Kind))
# each kind's API group, from the apiVersion the adapters use ("v1": the core group "")
GROUPS = {kind: api_version.rpartition("/")[0] for kind, (_, api_version, _, _) in port.RESOURCES.items()}
VERB_OF = {
    "get": "get",
    "list": "list",
    "watch": "watch",
    "create": "create",
    "replace": "update",
    "merge_patch": "patch",
    "delete": "delete",
}
INFORMER_CLASSES = {"Informer"}
GENERIC_PACKAGE = "vgpu.kube"


@dataclass(frozen=True, order=True)
class Permission:
    group: str
    resource: str
    verb: str


@dataclass(frozen=True)
class CallSite:
    module: str
    line: int
    call: str
    permissions: tuple[Permission, ...]


def _module_file(name: str) -> pathlib.Path | None:
    parts = name.split(".")
    for root in ROOTS:
        base = root.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
    return None


def _module_name(path: pathlib.Path) -> str:
    for root in ROOTS:
        if path.is_relative_to(root):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise ValueError(path)


def _imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in PROJECT_PACKAGES}


def closure(package: str) -> dict[str, pathlib.Path]:
    """Every project module ``package`` (a service) consists of or imports, transitively."""
    root = _module_file(package)
    assert root is not None, f"no package {package}"
    todo = [_module_name(p) for p in sorted(root.parent.rglob("*.py"))]
    seen: dict[str, pathlib.Path] = {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        # importing a.b.c runs a/__init__ and a/b/__init__ too
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        tree = ast.parse(path.read_text(), filename=str(path))
        todo.extend(_imports(tree, name, path.name == "__init__.py") | set(parents))
    return seen


def _constants(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    out[target.id] = node.value.value
    return out


def _kind_arg(call: ast.Call, position: int, constants: dict[str, str]) -> str | None:
    """The kind argument as a string, or None when it is not a literal/constant."""
    arg: ast.expr | None = None
    if len(call.args) > position:
        arg = call.args[position]
    for kw in call.keywords:
        if kw.arg == "kind":
            arg = kw.value
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name) and arg.id in constants:
        return constants[arg.id]
    return None


def _receiver_is_api(func: ast.Attribute) -> bool:
    return "api" in ast.unparse(func.value).lower()


def _permission(kind: str, verb: str) -> Permission:
    return Permission(GROUPS.get(kind, ""), kind, verb)


def scan(modules: dict[str, pathlib.Path]) -> tuple[list[CallSite], list[CallSite]]:
    """(resolved calls, calls whose kind could not be read) in ``modules``."""
    resolved: list[CallSite] = []
    unresolved: list[CallSite] = []
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), filename=str(path))
        constants = _constants(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            attr = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            text = ast.unparse(node)[:120]
            if attr == "bind_pod":
                resolved.append(
                    CallSite(name, node.lineno, text, (Permission("", "pods/binding", "create"),))
                )
            elif attr == "evict_pod":
                resolved.append(
                    CallSite(name, node.lineno, text, (Permission("", "pods/eviction", "create"),))
                )
            elif attr == "get_resource_claim":  # port.ClaimReader (the DRA kubelet plugin)
                perm = Permission("resource.k8s.io", "resourceclaims", "get")
                resolved.append(CallSite(name, node.lineno, text, (perm,)))
            elif attr == "create_event":
                resolved.append(CallSite(name, node.lineno, text, (Permission("", "events", "create"),)))
            elif attr in INFORMER_CLASSES:
                kind = _kind_arg(node, 1, constants)
                if kind is not None and kind in KINDS:
                    perms = (_permission(kind, "list"), _permission(kind, "watch"))
                    resolved.append(CallSite(name, node.lineno, text, perms))
                else:
                    unresolved.append(CallSite(name, node.lineno, text, ()))
            elif isinstance(func, ast.Attribute) and attr in VERB_OF:
                kind = _kind_arg(node, 0, constants)
                if kind is not None and kind in KINDS:
                    resolved.append(CallSite(name, node.lineno, text, (_permission(kind, VERB_OF[attr]),)))
                elif kind is None and _receiver_is_api(func):
                    unresolved.append(CallSite(name, node.lineno, text, ()))
    return resolved, unresolved


def permissions(package: str) -> tuple[set[Permission], list[CallSite], list[CallSite]]:
    """The permissions ``package``'s code needs, the call sites, and the unresolved call sites."""
    resolved, unresolved = scan(closure(package))
    return {p for site in resolved for p in site.permissions}, resolved, unresolved
