#!/usr/bin/env python3
"""Architecture checks run by `.ci/run` (python3, standard library only).

1. No import cycle between the modules of a crate.

   Granularity: a module is a *file*. `src/lib.rs`, `src/main.rs` and `src/bin/x.rs` are crate
   roots (each its own crate); `src/a.rs` and `src/a/mod.rs` are module `a`, `src/a/b.rs` is
   `a::b`. Inline modules (`mod tests { ... }`) belong to the file they are written in: their
   `super::` is the file itself, so a test module's `use super::*` is no edge.

   An edge A -> B is a use of B by A: a `use` declaration, or a path in code (`crate::b::f()`,
   `super::T`, `self::b::X`, or `b::f()` where `b` is a child module or a name a `use`
   bound to a module). A path names an item: it is followed through the `use`
   declarations (re-exports included) of the module it goes through, to the file that
   *defines* the item, so `crate::Type` re-exported by `lib.rs` is an edge to the file defining
   `Type`, and `super::Type` is an edge to the parent only where the parent defines `Type`.
   A `use` of a whole module is no edge by itself; the paths through it are.
   A `use x::*` glob counts as an edge to `x`.

   Not edges: a module's uses of its own descendants (`mod` declarations, `pub use` re-exports
   and calls from a parent into its children: a module owns its subtree and is its facade), so
   a child -> parent edge (`super::Type`, `Type` defined in the parent file) only closes a cycle
   through a module outside the subtree, or between siblings. Comments and doc links, string
   literals and `$crate` in macros are ignored. `--strict` also counts parent -> child uses
   (parent <-> child back-and-forth), for information: CI does not run it.

   Test code is not architecture: items under `#[cfg(test)]` (test modules inline or in their
   own file, test-only functions and `use`s) are left out, so a unit test may use any module of
   its crate. `--with-tests` counts them too, for information.

   Every strongly connected component of more than one module is reported with the edges
   (file:line) that make it.

   What it cannot see: paths written inside strings (serde's `with = "..."`) and paths that
   macros build; an item a macro defines is taken as defined by the module the path names.

2. Limits (only when `node` is checked): no file under `node/src` over 1,000 lines (every `.rs`
   file counts: none is generated, `node/src/api/openapi.rs` is written by hand), no function
   over 150 lines in `node/src/net/` or `node/src/lease/` (from the `fn` line to its closing
   brace, test functions included).

3. The code map (only when every crate is checked): `docs/ARCHITECTURE.md` names every `.rs`
   file under a member's `src/`, and every path it names in backticks under a member,
   `scripts/` or `docs/` exists.

Usage: scripts/arch-check.py [--crate NAME]...   (NAME: a member directory or package name;
default: every workspace member). Exit 0 when clean, 1 with a list of findings otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field

MAX_FILE_LINES = 1000
FILE_LIMIT_ROOT = "node/src"
MAX_FN_LINES = 150
FN_LIMIT_DIRS = ("node/src/net", "node/src/lease")

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ITEM_RE = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?[ \t]+)?(?:(?:const|async|unsafe|extern(?:[ \t]+\"[^\"]*\")?|default)[ \t]+)*"
    r"(?:struct|enum|union|trait|type|fn|const|static|mod|macro_rules!)[ \t]+(" + IDENT + r")",
    re.M,
)
MOD_DECL_RE = re.compile(r"^[ \t]*(?:pub(?:\([^)]*\))?[ \t]+)?mod[ \t]+(" + IDENT + r")[ \t]*;", re.M)
USE_RE = re.compile(r"(?<![\w$])(pub(?:\([^)]*\))?\s+)?use\s+([^;{}]*(?:\{[^;]*\})?[^;{}]*);")
CODE_PATH_RE = re.compile(r"(?<![\w$:])((?:" + IDENT + r")(?:\s*::\s*" + IDENT + r")+)")
INLINE_MOD_RE = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")
CFG_TEST_RE = re.compile(r"#\[cfg\(test\)\]")
FN_RE = re.compile(r"\bfn\s+(" + IDENT + r")")


def strip_code(text: str) -> str:
    """Blanks comments, string and char literals (newlines kept, so offsets keep their line)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 300]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            m = re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'", text[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank_test_items(text: str) -> str:
    """Blanks every item under `#[cfg(test)]` (a test module, function or `use`), lines kept."""
    out = list(text)
    for m in CFG_TEST_RE.finditer(text):
        j, paren = m.end(), 0
        while j < len(text):
            ch = text[j]
            if ch in "([":
                paren += 1
            elif ch in ")]":
                paren -= 1
            elif paren == 0 and ch in ";{":
                break
            j += 1
        if j < len(text) and text[j] == "{":
            j = closing_brace(text, j)
        for k in range(m.start(), min(j + 1, len(text))):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)


def closing_brace(text: str, open_at: int) -> int:
    """The offset of the `}` that closes the `{` at `open_at` (`len(text)` if none does)."""
    depth, j = 0, open_at
    while j < len(text):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return j


def line_of(text: str, offset: int) -> int:
    """The 1-based line of `offset`."""
    return text.count("\n", 0, offset) + 1


def expand_use_tree(tree: str) -> list[tuple[list[str], str | None]]:
    """`a::{b, c::{self, D as E}}` -> [(path segments, bound name or None for globs)]."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
    results: list[tuple[list[str], str | None]] = []

    def split_top(s: str) -> list[str]:
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix: list[str], s: str) -> None:
        if not s:
            return
        brace = s.find("{")
        if brace >= 0 and s.endswith("}"):
            head = s[:brace].rstrip(":")
            segs = prefix + ([x for x in head.split("::") if x] if head else [])
            for part in split_top(s[brace + 1:-1]):
                walk(segs, part)
            return
        alias = None
        if "@" in s:
            s, alias = s.split("@", 1)
        segs = prefix + [x for x in s.split("::") if x]
        if segs and segs[-1] == "*":
            results.append((segs[:-1], None))
        elif segs and segs[-1] == "self":
            results.append((segs[:-1], alias or (segs[-2] if len(segs) > 1 else None)))
        elif segs:
            results.append((segs, alias or segs[-1]))

    walk([], tree)
    return results


@dataclass
class Use:
    """One path a file uses: absolute or relative segments, the scope it appears in."""

    scope: tuple[str, ...]  # the module (file module + inline modules) the path is written in
    segs: list[str]
    line: int
    glob: bool = False
    reexport: bool = False  # `pub use`


@dataclass
class ModFile:
    path: str  # relative to the repository
    mod: tuple[str, ...]
    children: set[str] = field(default_factory=set)
    items: set[str] = field(default_factory=set)
    # name bound by a `use` in a scope -> (absolute segments, line)
    imports: dict[tuple[tuple[str, ...], str], list[str]] = field(default_factory=dict)
    globs: dict[tuple[str, ...], list[list[str]]] = field(default_factory=dict)
    uses: list[Use] = field(default_factory=list)


class Crate:
    def __init__(self, name: str, root_file: str, with_tests: bool):
        self.name = name
        self.with_tests = with_tests
        self.root_file = root_file
        self.files: dict[tuple[str, ...], ModFile] = {}
        self.load(root_file, (), True)

    def load(self, path: str, mod: tuple[str, ...], is_dir_owner: bool) -> None:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        text = strip_code(raw)
        if not self.with_tests:
            text = blank_test_items(text)
        mf = ModFile(path=path, mod=mod)
        self.files[mod] = mf
        mf.items = set(ITEM_RE.findall(text))
        self.parse(mf, text)
        base = os.path.dirname(path) if is_dir_owner else os.path.splitext(path)[0]
        for name in MOD_DECL_RE.findall(text):
            mf.children.add(name)
            for cand, owner in ((os.path.join(base, name + ".rs"), False), (os.path.join(base, name, "mod.rs"), True)):
                if os.path.exists(cand):
                    self.load(cand, mod + (name,), owner)
                    break

    def parse(self, mf: ModFile, text: str) -> None:
        # Inline module scopes: (start, end, name path)
        scopes: list[tuple[int, int, tuple[str, ...]]] = []
        for m in INLINE_MOD_RE.finditer(text):
            j = closing_brace(text, m.end() - 1)
            scopes.append((m.start(), j, (m.group(1),)))

        def scope_at(off: int) -> tuple[str, ...]:
            inner = [s for s in scopes if s[0] <= off <= s[1]]
            inner.sort(key=lambda s: s[0])
            path = mf.mod
            for s in inner:
                path = path + s[2]
            return path

        for s in scopes:
            mf.items.add(s[2][0])
        spans = []
        for m in USE_RE.finditer(text):
            spans.append((m.start(), m.end()))
            scope = scope_at(m.start())
            line = line_of(text, m.start())
            reexport = bool(m.group(1))
            for segs, bound in expand_use_tree(m.group(2)):
                if not segs or segs[0] in ("$crate",):
                    continue
                u = Use(scope, segs, line, glob=bound is None, reexport=reexport)
                mf.uses.append(u)
                if bound is None:
                    mf.globs.setdefault(scope, []).append(segs)
                elif bound != "_":
                    mf.imports[(scope, bound)] = segs
        blanked = list(text)
        for a, b in spans:
            for k in range(a, b):
                if blanked[k] != "\n":
                    blanked[k] = " "
        code = "".join(blanked)
        for m in CODE_PATH_RE.finditer(code):
            segs = [x.strip() for x in m.group(1).split("::")]
            mf.uses.append(Use(scope_at(m.start()), segs, line_of(code, m.start())))

    # -- resolution ---------------------------------------------------------------------------

    def absolute(self, mf: ModFile, scope: tuple[str, ...], segs: list[str], depth: int = 0) -> list[str] | None:
        """The crate-absolute segments of a path, or None when it leaves the crate."""
        head = segs[0]
        if head == "crate":
            return segs[1:]
        if head in ("super", "self"):
            cur = list(scope)
            i = 0
            while i < len(segs) and segs[i] in ("super", "self"):
                if segs[i] == "super":
                    if not cur:
                        return None
                    cur.pop()
                i += 1
            return cur + segs[i:]
        # Relative: a name a `use` bound (in this scope or an enclosing one of the file), or a
        # child module; anything else (`std::...`, another crate, a local type) leaves the crate.
        file_scope = tuple(scope)
        while True:
            key = (file_scope, head)
            if key in mf.imports and depth < 8 and mf.imports[key] != [head]:
                base = self.absolute(mf, file_scope, mf.imports[key], depth + 1)
                return None if base is None else base + segs[1:]
            if len(file_scope) <= len(mf.mod):
                break
            file_scope = file_scope[:-1]
        if head in mf.children:
            return list(mf.mod) + segs
        return None

    def module_of(self, segs: list[str]) -> tuple[tuple[str, ...], list[str]]:
        """The deepest file module a path goes through, and the rest of the path."""
        for k in range(len(segs), -1, -1):
            if tuple(segs[:k]) in self.files:
                return tuple(segs[:k]), segs[k:]
        return (), segs

    def resolve(self, segs: list[str], depth: int = 0) -> tuple[str, ...] | None:
        """The file module defining what `segs` (crate-absolute) names; None: a whole module."""
        mod, rest = self.module_of(segs)
        if not rest:
            return None
        target = self.files[mod]
        name = rest[0]
        if name in target.items or depth > 8:
            return mod
        if (mod, name) in target.imports:
            inner = self.absolute(target, mod, target.imports[(mod, name)])
            if inner is None:
                return mod  # re-exported from another crate: the module is the dependency
            return self.resolve(inner + rest[1:], depth + 1)
        for g in target.globs.get(mod, []):
            inner = self.absolute(target, mod, g)
            if inner is None:
                continue
            gmod, grest = self.module_of(inner)
            if not grest and name in self.files[gmod].items | {k[1] for k in self.files[gmod].imports if k[0] == gmod}:
                found = self.resolve(inner + rest, depth + 1)
                return found if found is not None else gmod
        return mod

    def edges(self, strict: bool) -> dict[tuple[str, ...], dict[tuple[str, ...], list[int]]]:
        graph: dict[tuple[str, ...], dict[tuple[str, ...], list[int]]] = {m: {} for m in self.files}
        for mf in self.files.values():
            for u in mf.uses:
                segs = self.absolute(mf, u.scope, u.segs)
                if segs is None:
                    continue
                if u.glob:
                    target: tuple[str, ...] | None = self.module_of(segs)[0]
                else:
                    target = self.resolve(segs)
                if target is None or target == mf.mod:
                    continue
                if target[: len(mf.mod)] == mf.mod and (u.reexport or not strict):
                    continue  # a module using or re-exporting its own descendants
                graph[mf.mod].setdefault(target, []).append(u.line)
        return graph

    def label(self, mod: tuple[str, ...]) -> str:
        return "::".join(mod) if mod else "crate"


def sccs(graph: dict) -> list[list]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict = {}
    low: dict = {}
    on: set = set()
    stack: list = []
    out: list[list] = []
    counter = [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph.get(w, {}))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def workspace_members(repo: str) -> list[str]:
    with open(os.path.join(repo, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"members\s*=\s*\[([^\]]*)\]", text)
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def package_name(repo: str, member: str) -> str:
    with open(os.path.join(repo, member, "Cargo.toml"), encoding="utf-8") as f:
        m = re.search(r'^name\s*=\s*"([^"]+)"', f.read(), re.M)
    return m.group(1) if m else member


def crate_roots(repo: str, member: str) -> list[str]:
    src = os.path.join(member, "src")
    roots = [os.path.join(src, r) for r in ("lib.rs", "main.rs") if os.path.exists(os.path.join(repo, src, r))]
    bindir = os.path.join(src, "bin")
    if os.path.isdir(os.path.join(repo, bindir)):
        for entry in sorted(os.listdir(os.path.join(repo, bindir))):
            if entry.endswith(".rs"):
                roots.append(os.path.join(bindir, entry))
            elif os.path.exists(os.path.join(repo, bindir, entry, "main.rs")):
                roots.append(os.path.join(bindir, entry, "main.rs"))
    return roots


def check_cycles(repo: str, member: str, strict: bool, with_tests: bool) -> list[str]:
    findings = []
    for root in crate_roots(repo, member):
        crate = Crate(member, root, with_tests)
        graph = crate.edges(strict)
        for comp in sccs(graph):
            if len(comp) < 2:
                continue
            members = set(comp)
            names = sorted(crate.label(m) for m in comp)
            lines = [f"{member} ({root}): import cycle between modules {', '.join(names)}:"]
            for a in sorted(comp):
                for b in sorted(graph[a]):
                    if b in members:
                        at = ", ".join(f"{crate.files[a].path}:{n}" for n in sorted(set(graph[a][b])))
                        lines.append(f"    {crate.label(a)} -> {crate.label(b)}   ({at})")
            findings.append("\n".join(lines))
    return findings


def function_spans(text: str):
    """(name, first line, line count) of every function with a body."""
    for m in FN_RE.finditer(text):
        j, paren, angle = m.end(), 0, 0
        while j < len(text):
            ch = text[j]
            if ch in "([":
                paren += 1
            elif ch in ")]":
                paren -= 1
            elif ch == ";" and paren == 0:
                break
            elif ch == "{" and paren == 0:
                break
            j += 1
        if j >= len(text) or text[j] != "{":
            continue
        k = closing_brace(text, j)
        first, last = line_of(text, m.start()), line_of(text, k)
        yield m.group(1), first, last - first + 1


def check_sizes(repo: str) -> list[str]:
    findings = []
    for dirpath, _, files in sorted(os.walk(os.path.join(repo, FILE_LIMIT_ROOT))):
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, repo)
            with open(path, encoding="utf-8") as f:
                raw = f.read()
            n = raw.count("\n") + (0 if raw.endswith("\n") or not raw else 1)
            if n > MAX_FILE_LINES:
                findings.append(f"{rel}: {n} lines (limit {MAX_FILE_LINES} for files under {FILE_LIMIT_ROOT}/)")
            if rel.startswith(tuple(d + "/" for d in FN_LIMIT_DIRS)):
                for fn, first, count in function_spans(strip_code(raw)):
                    if count > MAX_FN_LINES:
                        findings.append(f"{rel}:{first}: fn {fn} is {count} lines (limit {MAX_FN_LINES} in {', '.join(FN_LIMIT_DIRS)})")
    return findings


ARCH_DOC = "docs/ARCHITECTURE.md"
DOC_PATH_RE = re.compile(r"`((?:[\w.-]+/)+[\w.-]*)`")


def check_docs_map(repo: str, members: list[str]) -> list[str]:
    """docs/ARCHITECTURE.md maps the code: every path it names in backticks (`a/b.rs`, `a/b/`)
    under a workspace member or `scripts/`/`docs/` exists, and every `.rs` file under a member's
    `src/` is named in it (its code map has one line per module)."""
    path = os.path.join(repo, ARCH_DOC)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        return [f"{ARCH_DOC}: cannot read it ({e})"]
    findings = []
    roots = tuple(m + "/" for m in members) + ("scripts/", "docs/")
    named = set()
    for m in DOC_PATH_RE.finditer(text):
        p = m.group(1)
        if not p.startswith(roots) or "<" in p:
            continue
        named.add(p.rstrip("/"))
        if not os.path.exists(os.path.join(repo, p)):
            findings.append(f"{ARCH_DOC}:{line_of(text, m.start())}: names `{p}`, which does not exist")
    for member in members:
        src = os.path.join(repo, member, "src")
        for dirpath, _, files in os.walk(src):
            for f in sorted(files):
                if f.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(dirpath, f), repo)
                    if rel not in named:
                        findings.append(f"{ARCH_DOC}: the code map has no line for `{rel}`")
    return findings


def main() -> int:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crate", action="append", default=[], help="a member directory or package name (repeatable; default all)")
    ap.add_argument("--strict", action="store_true", help="also count a module's uses of its own descendants (report only)")
    ap.add_argument("--with-tests", action="store_true", help="also count `#[cfg(test)]` code (report only)")
    args = ap.parse_args()
    members = workspace_members(repo)
    by_name = {m: m for m in members} | {package_name(repo, m): m for m in members}
    unknown = [c for c in args.crate if c not in by_name]
    if unknown:
        print(f"arch-check: unknown crate {', '.join(unknown)} (members: {', '.join(members)})", file=sys.stderr)
        return 2
    selected = [by_name[c] for c in args.crate] if args.crate else members
    findings: list[str] = []
    for member in selected:
        findings += check_cycles(repo, member, args.strict, args.with_tests)
    if "node" in selected:
        findings += check_sizes(repo)
    if not args.crate:
        findings += check_docs_map(repo, members)
    if findings:
        print(f"arch-check: {len(findings)} finding(s) in {', '.join(selected)}:\n", file=sys.stderr)
        for f in findings:
            print(f, file=sys.stderr)
        print("\nBreak each cycle (move the shared item to the module that owns it, or to a small module"
              " both use); split long files and functions. See scripts/arch-check.py's header.", file=sys.stderr)
        return 1
    print(f"arch-check: no module cycles in {', '.join(selected)}" + ("; node file and function sizes within limits" if "node" in selected else "") + ("; docs/ARCHITECTURE.md maps every module" if not args.crate else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
