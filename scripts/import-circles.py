#!/usr/bin/env python3
"""Import circles between the modules of each Rust crate of the workspace.

A module here is a source file (`src/a/b.rs` or `src/a/b/mod.rs` is
`a::b`; an inline `mod x { }` belongs to its file). An edge `A -> B` is a
path in A's code (a `use`, or a `crate::`/`super::`/`self::` path in an
expression) that names B or an item defined in B; a name that a module
re-exports (`pub use inner::Name;`) is followed to where it is defined.
Comments, string literals and `#[cfg(test)]` modules (inline or in their
own file) are left out: tests may reach anywhere. Paths into other crates
are not edges.

    scripts/import-circles.py [CRATE_DIR ...]

Prints each circle (its files, and the names each takes from the next) and
exits 1 when there is any; with no argument it checks every workspace
member. A crate whose root doc comment states a module order (a line
`//! ... Module order ... : `a`, `b`, ...`, the names up to the next
period) is held to it too: each top-level module may use only those
before it. tests/py/test_import_circles.py runs it under `make test`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ---- lexing: code without comments, strings and test modules ----------------

def strip(src: str) -> str:
    """`src` with comments and string/char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif (m := re.match(r'b?r(#*)"', src[i:])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", src[i:])):
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(code: str, open_at: int) -> int:
    """The index just past the brace that closes the one at `open_at`."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*([{;])")


def without_tests(code: str) -> tuple[str, set[str]]:
    """`code` without its inline `#[cfg(test)]` modules, and the names of
    the test modules it declares in their own files."""
    files: set[str] = set()
    while m := TEST_MOD.search(code):
        if m.group(2) == ";":
            files.add(m.group(1))
            code = code[: m.start()] + code[m.end():]
        else:
            end = matching(code, m.end() - 1)
            code = code[: m.start()] + "\n" * code.count("\n", m.start(), end) + code[end:]
    return code, files


# ---- the module tree ----------------------------------------------------------

class Module:
    def __init__(self, path: tuple[str, ...], file: Path, code: str):
        self.path, self.file, self.code = path, file, code
        self.children: dict[str, Module] = {}
        self.parent: Module | None = None
        # name -> path (as written) of what `pub use` re-exports under it
        self.reexports: dict[str, tuple[list[str], Module]] = {}
        self.globs: list[tuple[list[str], Module]] = []

    def __repr__(self):
        return "::".join(self.path) or "crate"


MOD_DECL = re.compile(r"(?:#\[path\s*=\s*\"[^\"]*\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")


def load_crate(src_root: Path) -> Module | None:
    root_file = next((src_root / f for f in ("lib.rs", "main.rs") if (src_root / f).exists()), None)
    if root_file is None:
        return None

    def load(path: tuple[str, ...], file: Path, is_dir_owner: bool) -> Module:
        code, test_files = without_tests(strip(file.read_text()))
        m = Module(path, file, code)
        base = file.parent if is_dir_owner else file.parent / file.stem
        for decl in MOD_DECL.finditer(code):
            name = decl.group(1)
            if name in test_files:
                continue
            for cand, owner in ((base / f"{name}.rs", False), (base / name / "mod.rs", True)):
                if cand.exists():
                    child = load(path + (name,), cand, owner)
                    child.parent = m
                    m.children[name] = child
                    break
        return m

    return load((), root_file, True)


def use_trees(code: str) -> list[list[str]]:
    """Every path a `use` item brings in, its groups expanded."""
    paths: list[list[str]] = []
    for m in re.finditer(r"(?<!pub )(?<!\) )\buse\s+([^;]*);", code):
        paths.extend(segs for segs, _ in expand(re.sub(r"\s+", " ", m.group(1))))
    return paths


PATH_EXPR = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)")


def expr_paths(code: str) -> list[list[str]]:
    code = re.sub(r"\buse\s+[^;]*;", "", code)
    return [p.split("::") for p in PATH_EXPR.findall(code)]


def index_reexports(m: Module):
    for um in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", m.code):
        tree = re.sub(r"\s+", " ", um.group(1)).strip()
        for part in expand(tree):
            segs, alias = part
            if not segs:
                continue
            if segs[-1] == "*":
                m.globs.append((segs[:-1], m))
            else:
                m.reexports[alias or segs[-1]] = (segs, m)
    for c in m.children.values():
        index_reexports(c)


def expand(tree: str, prefix: list[str] | None = None) -> list[tuple[list[str], str | None]]:
    """A use tree's paths, its groups expanded, each with its `as` alias."""
    prefix = prefix or []
    tree = tree.strip().lstrip(":")
    if "{" not in tree:
        alias = None
        m = re.match(r"(.*?)\s+as\s+(\w+)$", tree)
        if m:
            tree, alias = m.group(1), m.group(2)
        segs = [s.strip() for s in tree.split("::") if s.strip()]
        if segs == ["self"]:
            segs = []
        return [(prefix + segs, alias)] if prefix or segs else []
    head, rest = tree.split("{", 1)
    inner = rest[: rest.rfind("}")]
    segs = prefix + [s.strip() for s in head.split("::") if s.strip()]
    out = []
    depth, start = 0, 0
    for j, c in enumerate(inner + ","):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            part = inner[start:j].strip()
            if part:
                out.extend(expand(part, segs))
            start = j + 1
    return out


def resolve(segs: list[str], here: Module, root: Module, seen: int = 0) -> Module | None:
    """The module that defines what `segs`, written in `here`, names;
    `None` for another crate's."""
    if seen > 20 or not segs:
        return None
    if segs[0] == "crate":
        cur, rest = root, segs[1:]
    elif segs[0] == "self":
        cur, rest = here, segs[1:]
    elif segs[0] == "super":
        cur, rest = here, segs
        while rest and rest[0] == "super":
            cur = cur.parent or cur
            rest = rest[1:]
    elif segs[0] in here.children:
        cur, rest = here, segs
    else:
        return None  # another crate, std, or a name in scope
    while rest:
        name = rest[0]
        if name in cur.children:
            cur, rest = cur.children[name], rest[1:]
            continue
        if name in cur.reexports:
            target, owner = cur.reexports[name]
            return resolve(target + rest[1:], owner, root, seen + 1) if _local(target, owner) else None
        for target, owner in cur.globs:
            if _local(target, owner):
                got = resolve(target + rest, owner, root, seen + 1)
                if got is not None and got is not cur:
                    return got
        return cur
    return cur


def _local(segs: list[str], owner: Module) -> bool:
    return bool(segs) and (segs[0] in ("crate", "self", "super") or segs[0] in owner.children)


def related(a: Module, b: Module) -> bool:
    """Whether one of `a`, `b` is the other or holds it: a module and its
    own submodules are one unit seen from outside (a folder's `mod.rs`
    names its parts; a part uses what its folder defines)."""
    return a.path[: len(b.path)] == b.path or b.path[: len(a.path)] == a.path


def modules(m: Module):
    yield m
    for c in m.children.values():
        yield from modules(c)


def edges(root: Module) -> dict[Path, dict[Path, set[str]]]:
    """file -> file -> the names the first takes from the second."""
    index_reexports(root)
    out: dict[Path, dict[Path, set[str]]] = {}
    for m in modules(root):
        for segs in use_trees(m.code) + expr_paths(m.code):
            if segs and segs[-1] == "*":
                segs = segs[:-1]
            # `use a::b;` brings `b` itself; a module path names the module.
            target = resolve(segs, m, root)
            if target is None or related(m, target):
                continue
            out.setdefault(m.file, {}).setdefault(target.file, set()).add(segs[-1])
    return out


def circles(graph: dict[Path, dict[Path, set[str]]]) -> list[list[Path]]:
    """The strongly connected groups of more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    found: list[list[Path]] = []
    counter = [0]
    nodes = set(graph) | {t for ts in graph.values() for t in ts}

    def visit(v: Path):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def crate_circles(crate_dir: Path) -> tuple[list[list[Path]], dict]:
    root = load_crate(crate_dir / "src")
    if root is None:
        return [], {}
    g = edges(root)
    return circles(g), g


def top_edges(crate_dir: Path) -> dict[str, dict[str, set[str]]]:
    """Top-level module -> top-level module -> names, from the file edges."""
    root = load_crate(crate_dir / "src")
    if root is None:
        return {}
    g = edges(root)
    src = (crate_dir / "src").resolve()

    def top(f: Path) -> str:
        parts = f.resolve().relative_to(src).parts
        return parts[0].removesuffix(".rs") if len(parts) > 1 or parts[0] not in ("lib.rs", "main.rs") else ""

    out: dict[str, dict[str, set[str]]] = {}
    for a, ts in g.items():
        for b, names in ts.items():
            ta, tb = top(a), top(b)
            if ta and tb and ta != tb:
                out.setdefault(ta, {}).setdefault(tb, set()).update(names)
    return out


def stated_order(crate_dir: Path) -> list[str] | None:
    """The module order the crate root's doc comment states, if any."""
    root = next((crate_dir / "src" / f for f in ("lib.rs", "main.rs") if (crate_dir / "src" / f).exists()), None)
    if root is None:
        return None
    doc = " ".join(l[3:].strip() for l in root.read_text().splitlines() if l.startswith("//!"))
    m = re.search(r"Module order[^:]*:\s*(.*?)\.(?:\s|$)", doc)
    return re.findall(r"`(\w+)`", m.group(1)) if m else None


def order_violations(crate_dir: Path) -> list[str]:
    """Each import of a top-level module against the stated order, and
    each module the order leaves out (or names that do not exist)."""
    order = stated_order(crate_dir)
    if order is None:
        return []
    root = load_crate(crate_dir / "src")
    have = set(root.children) if root else set()
    bad = [f"the order names {m}, which is no module" for m in order if m not in have]
    bad += [f"the order leaves out {m}" for m in sorted(have - set(order))]
    at = {m: i for i, m in enumerate(order)}
    for a, ts in sorted(top_edges(crate_dir).items()):
        for b, names in sorted(ts.items()):
            if a in at and b in at and at[b] > at[a]:
                bad.append(f"{a} uses {b} ({', '.join(sorted(names))}), which comes after it")
    return bad


def members() -> list[Path]:
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r"members\s*=\s*\[([^\]]*)\]", text)
    return [ROOT / s for s in re.findall(r'"([^"]+)"', m.group(1))] if m else []


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or members()
    bad = 0
    for d in dirs:
        found, g = crate_circles(d)
        for group in found:
            bad += 1
            print(f"circle in {d}: " + ", ".join(str(f.relative_to(d)) for f in group))
            for a in group:
                for b in group:
                    if b in g.get(a, {}):
                        print(f"  {a.relative_to(d)} -> {b.relative_to(d)}: {', '.join(sorted(g[a][b]))}")
        for v in order_violations(d):
            bad += 1
            print(f"module order of {d}: {v}")
    if not bad:
        print(f"no import circles in {len(dirs)} crates; the stated module orders hold")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
