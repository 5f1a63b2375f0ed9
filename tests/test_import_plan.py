"""The import plan (issue 38): the measuring lab is a sibling no mechanism
imports, chapter 5's model imports no later chapter, and no module of the
package imports another of its modules inside a function."""

import ast
import pathlib

import attn_np

ROOT = pathlib.Path(attn_np.__file__).parent
LAB = ("bench", "instruments")
# files still being reworked elsewhere (issue 38's parts half): their
# function-local imports are theirs to remove
PENDING = {"long_context.py", "multihead.py", "rope.py"}


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        yield rel, ast.parse(path.read_text(), str(path))


def imported(rel, node):
    """The dotted ``attn_np`` modules an import statement names."""
    pkg = ["attn_np", *rel.parts[:-1]]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("attn_np")]
    if node.level == 0:
        base = node.module or ""
        return [base] if base.startswith("attn_np") else []
    base = pkg[: len(pkg) - (node.level - 1)]
    head = ".".join(base + ([node.module] if node.module else []))
    return [head] + [f"{head}.{a.name}" for a in node.names]


def test_no_mechanism_imports_the_lab():
    bad = []
    for rel, tree in modules():
        if rel.parts[0] in LAB or str(rel) == "__init__.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in imported(rel, node):
                    parts = name.split(".")
                    if len(parts) > 1 and parts[1] in LAB:
                        bad.append(f"{rel}: {name}")
    assert bad == []


def test_chapter_5_imports_no_later_chapter():
    later = ("linear", "linear_attention", "sparse", "long_context", "hf")
    for rel, tree in modules():
        if rel.parts[0] != "training":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in imported(rel, node):
                    assert not any(
                        name.startswith(f"attn_np.{m}") for m in later
                    ), f"{rel}: {name}"


def test_no_function_local_imports_of_the_package():
    bad = []
    for rel, tree in modules():
        if str(rel) in PENDING:
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").startswith("attn_np")
                ):
                    bad.append(f"{rel}:{node.lineno}")
    assert bad == []
