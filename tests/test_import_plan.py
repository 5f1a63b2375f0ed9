"""The import plan: the measuring lab is a sibling no mechanism imports, no
module imports a later chapter's module (beside the parts the one layer
takes by keyword, listed below with why), the import graph has no cycle,
and no module of the package imports another of its modules inside a
function."""

import ast
import pathlib

import attn_np

ROOT = pathlib.Path(attn_np.__file__).parent
LAB = ("bench", "instruments")
# every mechanism module by the chapter that introduces it; a supporting
# subpackage (costs, hf, training) is placed where the book uses it first
CHAPTER = {
    "_checks": 0,
    "_workers": 0,
    "_blas": 0,
    "softmax": 1,
    "masks": 1,
    "attention": 1,
    "heads": 2,
    "grouped": 2,
    "multihead": 2,
    "convert": 3,
    "kv_cache": 4,
    "norms": 5,
    "training": 5,
    "costs": 2,
    "rope": 6,
    "latent": 7,
    "windows": 8,
    "streaming": 8,
    "flash": 9,
    "refinements": 10,
    "_refined_settings": 10,
    "shared_kv": 10,
    "hf": 10,
    "rope_scaling": 11,
    "long_context": 11,
    "linear": 12,
    "sparse": 13,
    "ffn": 14,
    "pretrained": 14,
    "serving": 15,
    "cross": 16,
    "speculative": 16,
    "memory": 17,  # appendix A1's command line: reads the costs
}
# The one layer (chapters 2-3) takes the parts of later chapters by keyword
# (a cache, rotary=, flash=): its module names their types, and those
# parts import nothing of the layer. Chapter 10's recipe takes Hugging
# Face's rope_scaling by keyword, a position part of chapter 11. The cost
# formulas read a config.json through the one reader, hf.config, which is
# plain parsing (it imports no mechanism: checked below). The HF builder
# builds every chapter's layer from a config, so it reads chapters 11-13.
PARTS_OF_THE_LAYER = {
    ("multihead", "kv_cache"),
    ("multihead", "rope"),
    ("grouped", "flash"),
    ("refinements", "rope_scaling"),
    ("costs", "hf"),
    ("hf", "rope_scaling"),
    ("hf", "long_context"),
    ("hf", "linear"),
    ("hf", "sparse"),
}


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
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").startswith("attn_np")
                ):
                    bad.append(f"{rel}:{node.lineno}")
    assert bad == []


def _top(name):
    """``attn_np.hf.build`` -> ``hf``: the module or subpackage a dotted
    name belongs to (None for the package itself)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph():
    """Module-level imports between the package's modules (as dotted
    module names that exist), for the cycle check."""
    names = {
        ".".join(["attn_np", *rel.with_suffix("").parts]).removesuffix(
            ".__init__"
        )
        for rel, _ in modules()
    }
    edges = {}
    for rel, tree in modules():
        me = ".".join(["attn_np", *rel.with_suffix("").parts])
        me = me.removesuffix(".__init__")
        for node in tree.body:  # module level only
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in imported(rel, node):
                    while name and name not in names:
                        name = name.rpartition(".")[0]
                    if name and name != me and name != "attn_np":
                        edges.setdefault(me, set()).add(name)
    return edges


def test_the_import_graph_has_no_cycle():
    edges = _graph()
    state = {}

    def visit(n, path):
        state[n] = "open"
        for m in sorted(edges.get(n, ())):
            if state.get(m) == "open":
                raise AssertionError(" -> ".join(path + [n, m]))
            if m not in state:
                visit(m, path + [n])
        state[n] = "done"

    for n in sorted(edges):
        if n not in state:
            visit(n, [])


def test_no_module_imports_a_later_chapter():
    """A module's imports come from its own or earlier chapters, beside the
    parts the one layer takes by keyword (PARTS_OF_THE_LAYER)."""
    bad = []
    for rel, tree in modules():
        me = rel.parts[0].removesuffix(".py")
        if me in LAB or me == "__init__":
            continue
        assert me in CHAPTER, f"{rel}: give it a chapter in CHAPTER"
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in imported(rel, node):
                    other = _top(name)
                    if other is None or other == me or other not in CHAPTER:
                        continue
                    if CHAPTER[other] > CHAPTER[me] and (
                        (me, other) not in PARTS_OF_THE_LAYER
                    ):
                        bad.append(f"{rel} imports {name}")
    assert bad == []


def test_the_plan_can_fail():
    """The checks above see an upward import and a cycle when one is
    there (a made-up graph through the same functions)."""
    assert CHAPTER["rope"] > CHAPTER["multihead"]
    assert ("rope", "long_context") not in PARTS_OF_THE_LAYER
    edges = {"a": {"b"}, "b": {"a"}}
    state = {}

    def visit(n):
        state[n] = "open"
        for m in edges[n]:
            if state.get(m) == "open":
                return True
            if m not in state and visit(m):
                return True
        state[n] = "done"
        return False

    assert visit("a")


def test_the_config_reader_imports_no_mechanism():
    """hf.config, which the cost formulas read through, is parsing only."""
    path = ROOT / "hf" / "config.py"
    tree = ast.parse(path.read_text())
    rel = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in imported(rel, node):
                assert _top(name) in (None, "_checks", "hf"), name


def test_mechanisms_are_short():
    """No mechanism module over 900 lines, no function in one over 80 (the
    lab's benchmarks and the book's figure code aside)."""
    long = []
    for rel, tree in modules():
        if rel.parts[0] in LAB:
            continue
        n = len((ROOT / rel).read_text().splitlines())
        if n > 900:
            long.append(f"{rel}: {n} lines")
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = fn.end_lineno - fn.lineno + 1
                if size > 80:
                    long.append(f"{rel}:{fn.name}: {size} lines")
    assert long == []
