#!/usr/bin/env python3
"""Import circles between the modules of a Rust crate.

Usage: hack/module-circles.py CRATE_DIR...   (e.g. api analysis driver)

Follows `mod x;` declarations from the crate root (src/lib.rs, else
src/main.rs; `#[path]` is not supported), and reads every path a module
names: `use` trees and paths in code that start with `crate::`, `super::`,
`self::` or the name of a child module. Each path is resolved to the deepest
module it names. A module using its own ancestor (`super::Item`, `use
super::*` in tests) or its own descendant is not an edge: a parent is the
namespace of its children. Any other use is lifted to the two children of
the modules' closest common ancestor that contain them, so `a::x` using
`b::y` is an edge `a -> b` among the children of the root. A circle is a
strongly connected set of such siblings; each is printed with one line per
edge that closes it (file:line of the first use).

Exit status: 0 without circles, 1 with. A heuristic, not a compiler: macros,
re-exports through a parent and glob imports of siblings are not followed.
"""

import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
RAW_STRING = re.compile(r'r(#*)"')
CHAR = re.compile(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'")


def is_ident(c):
    return c.isalnum() or c == "_"


def strip(text):
    """Text with comments, strings and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
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
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif (raw := RAW_STRING.match(text, i)) and not (i and is_ident(text[i - 1])):
            hashes = raw.group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and (char := CHAR.match(text, i)):
            out.append("' '")
            i = char.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def use_paths(tree):
    """The paths of a `use` tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)

    def expand(prefix, t):
        t = t.strip()
        if not t:
            return []
        if "{" in t and (t.index("{") < t.index(",") if "," in t else True):
            head, _, rest = t.partition("{")
            body = rest[: rest.rfind("}")]
            parts, depth, cur = [], 0, ""
            for ch in body:
                if ch == "," and depth == 0:
                    parts.append(cur)
                    cur = ""
                    continue
                depth += ch == "{"
                depth -= ch == "}"
                cur += ch
            parts.append(cur)
            out = []
            for p in parts:
                out += expand(prefix + head, p)
            return out
        return [prefix + t]

    paths = []
    for p in expand("", tree):
        p = re.sub(r"::(self|\*)$", "", p)
        paths.append(p.split("::"))
    return paths


class Crate:
    def __init__(self, root_dir):
        src = os.path.join(root_dir, "src")
        roots = [os.path.join(src, f) for f in ("lib.rs", "main.rs")]
        root = next((r for r in roots if os.path.exists(r)), None)
        if root is None:
            raise SystemExit(f"{root_dir}: no src/lib.rs or src/main.rs")
        self.files = {}  # module tuple -> file
        self.children = defaultdict(set)
        self._walk((), root, os.path.dirname(root))

    def _walk(self, module, path, child_dir):
        self.files[module] = path
        text = strip(open(path, encoding="utf-8").read())
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*([;{])", text):
            name, kind = m.group(1), m.group(2)
            child = module + (name,)
            self.children[module].add(name)
            if kind == "{":  # inline: part of this file
                continue
            files = (os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs"))
            for cand in files:
                if os.path.exists(cand):
                    sub = os.path.join(child_dir, name)
                    self._walk(child, cand, sub)
                    break

    def resolve(self, module, segments):
        """The module a path used in `module` names (None: outside the crate)."""
        first = segments[0]
        if first == "crate":
            base, rest = (), segments[1:]
        elif first in ("super", "self"):
            base, rest = module, list(segments)
            while rest and rest[0] in ("super", "self"):
                if rest.pop(0) == "super":
                    base = base[:-1]
        elif first in self.children[module]:
            base, rest = module, list(segments)
        else:
            return None
        for seg in rest:
            if seg in self.children[base]:
                base = base + (seg,)
            else:
                break
        return base

    def edges(self):
        """(from, to) -> first (file, line)."""
        found = {}
        for module, path in self.files.items():
            text = strip(open(path, encoding="utf-8").read())
            # Inline `mod x { ... }` blocks shift `super`/`self` by one level.
            spans = []
            for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
                depth, j = 1, m.end()
                while j < len(text) and depth:
                    depth += text[j] == "{"
                    depth -= text[j] == "}"
                    j += 1
                spans.append((m.end(), j, m.group(1)))

            def scope(pos):
                inner = [s for s in spans if s[0] <= pos < s[1]]
                return module + tuple(s[2] for s in sorted(inner))

            def add(pos, segments):
                here = scope(pos)
                target = self.resolve(here, segments)
                if target is None:
                    return
                # From the file's module: inline modules are part of it.
                src = module
                if target[: len(src)] == src or src[: len(target)] == target:
                    return
                line = text.count("\n", 0, pos) + 1
                found.setdefault((src, target), (path, line))

            used = []
            for m in re.finditer(r"\buse\s+([^;]+);", text):
                used.append((m.start(), m.end()))
                for segments in use_paths(m.group(1)):
                    add(m.start(), segments)
            for m in re.finditer(r"(?<![\w:])(" + IDENT + r")((?:::" + IDENT + r")+)", text):
                if any(a <= m.start() < b for a, b in used):
                    continue
                segments = [m.group(1)] + m.group(2).split("::")[1:]
                add(m.start(), segments)
        return found


def lca(a, b):
    common = []
    for x, y in zip(a, b):
        if x != y:
            break
        common.append(x)
    return tuple(common)


def sccs(nodes, graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def name(module):
    return "::".join(module) or "crate"


def report(crate_dir):
    crate = Crate(crate_dir)
    lifted = defaultdict(dict)  # parent -> (child, child) -> [witness]
    for (src, dst), where in sorted(crate.edges().items()):
        parent = lca(src, dst)
        a, b = src[len(parent)], dst[len(parent)]
        lifted[parent].setdefault((a, b), []).append((src, dst, where))
    circles = 0
    lines = []
    for parent in sorted(lifted):
        graph = defaultdict(set)
        for a, b in lifted[parent]:
            graph[a].add(b)
        nodes = set(graph) | {b for bs in graph.values() for b in bs}
        for comp in sccs(nodes, graph):
            circles += 1
            members = " <-> ".join(name(parent + (c,)) for c in comp)
            lines.append(f"  circle: {members}")
            for (a, b), witnesses in sorted(lifted[parent].items()):
                if a in comp and b in comp:
                    src, dst, (path, line) = witnesses[0]
                    more = f" (+{len(witnesses) - 1} more)" if len(witnesses) > 1 else ""
                    lines.append(f"    {name(src)} -> {name(dst)}  {path}:{line}{more}")
    modules = len(crate.files)
    print(f"{crate_dir}: {modules} modules, {circles} circle(s)")
    for line in lines:
        print(line)
    return circles


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    total = sum(report(d.rstrip("/")) for d in sys.argv[1:])
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
