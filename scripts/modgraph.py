#!/usr/bin/env python3
"""Print a Rust crate's file-level module import graph and its circles.

    python3 scripts/modgraph.py crates/lbd/src [--skip-tests] [--edges]

Reads every `.rs` file under the given `src` directory (except `src/bin`,
whose files are crates of their own), maps each file to its module
(`lib.rs`/`main.rs` is the crate root, `a.rs` and `a/mod.rs` are `a`,
`a/b.rs` is `a::b`), and collects which other files each one refers to:

- `use` declarations, grouped ones included (`use crate::{a, b::{c, d}}`),
  starting with `crate::`, `super::`, `self::` or the name of a child module;
- paths written anywhere in the code (`crate::a::f()`, `super::x::T`), and
  paths through a name a `use` bound to a module (`use crate::tasks;` then
  `tasks::bgp::spawn()` refers to `tasks/bgp.rs`).

A reference goes to the file of the longest module prefix of its path
(`crate::a::b::T` is `a/b.rs` if it exists, otherwise `a.rs`), except that
a name a module only re-exports is followed to where it comes from: with
`pub use a::T;` in lib.rs, `crate::T` is `a.rs`, not lib.rs (a `use` at
the top of a module, `pub` or not, binds the name there; chains of them
are followed, glob re-exports are not). Comments
(doc comments and their intra-doc links included) and string literals are
not read. `mod x;` declarations are not references: a parent declaring a
child does not depend on it. Inline `mod x { ... }` blocks (tests) count as
part of their file, with `super::` resolved from inside them; with
`--skip-tests`, blocks under `#[cfg(test)]` are left out.

It prints each strongly connected component of more than one file (a
circle of imports) and exits 1 if there is any, 0 if there is none; with
`--edges` it also prints every file's references first.

Only the standard library is used; it parses tokens, not Rust's grammar, so
a macro that builds paths out of fragments is not seen.
"""

import argparse
import os
import sys


def strip(src):
    """The source with comments, strings and char literals blanked out.

    Newlines are kept so that nothing else moves; lifetimes (`'a`) are kept
    as they are, since they are not char literals.
    """
    out = []
    i = 0
    n = len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            # Block comments nest in Rust.
            depth = 0
            while i < n:
                if src.startswith("/*", i):
                    depth += 1
                    i += 2
                elif src.startswith("*/", i):
                    depth -= 1
                    i += 2
                    if depth == 0:
                        break
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
            continue
        # Raw strings: r"..", r#".."#, br#".."#.
        if c in "rb" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            j = i + 1 if c == "r" else (i + 2 if src.startswith("br", i) else -1)
            if j > 0 and (c == "r" or src[i + 1] == "r"):
                k = j
                while k < n and src[k] == "#":
                    k += 1
                if k < n and src[k] == '"':
                    end = '"' + "#" * (k - j)
                    e = src.find(end, k + 1)
                    e = n if e < 0 else e + len(end)
                    out.append('""' + "\n" * src.count("\n", i, e))
                    i = e
                    continue
        if c == '"':
            k = i + 1
            while k < n and src[k] != '"':
                k += 2 if src[k] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, k))
            i = k + 1
            continue
        if c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if i + 2 < n and src[i + 1] == "\\":
                e = src.find("'", i + 2)
                if e > 0:
                    out.append("' '")
                    i = e + 1
                    continue
            if i + 2 < n and src[i + 2] == "'":
                out.append("' '")
                i += 3
                continue
        out.append(c)
        i += 1
    return "".join(out)


def tokens(text):
    """Identifiers, `::` and single punctuation characters, in order."""
    toks = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            # Raw identifiers (r#type) are the identifier.
            if word == "r" and text.startswith("#", j) and j + 1 < n and (
                text[j + 1].isalpha() or text[j + 1] == "_"
            ):
                k = j + 1
                while k < n and (text[k].isalnum() or text[k] == "_"):
                    k += 1
                word = text[j + 1 : k]
                j = k
            toks.append(word)
            i = j
        elif text.startswith("::", i):
            toks.append("::")
            i += 2
        elif c.isspace():
            i += 1
        elif c.isdigit():
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "_."):
                j += 1
            i = j
        else:
            toks.append(c)
            i += 1
    return toks


def module_of(rel):
    """The module path of a file, relative to `src`: ("a", "b") for a/b.rs."""
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main") and (parts[-1] == "mod" or len(parts) == 1):
        parts = parts[:-1]
    return tuple(parts)


class Crate:
    """The files of one crate and the modules they hold."""

    def __init__(self, src):
        self.src = src
        self.files = {}  # module path -> file name relative to src
        for root, dirs, names in os.walk(src):
            rel_root = os.path.relpath(root, src)
            if rel_root == "bin" or rel_root.startswith("bin" + os.sep):
                dirs[:] = []
                continue
            dirs.sort()
            for name in sorted(names):
                if not name.endswith(".rs"):
                    continue
                rel = os.path.normpath(os.path.join(rel_root, name))
                mod = module_of(rel)
                # lib.rs wins over main.rs as the root both claim.
                if mod in self.files and rel.endswith("main.rs"):
                    continue
                self.files[mod] = rel
        # module path -> {name: absolute path} its top-level `use`s bind.
        self.uses = {}
        for mod, rel in self.files.items():
            self.uses[mod] = module_uses(self, rel)

    def canonical(self, path):
        """`path` with names modules only re-export followed to their source.

        `crate::T` with `pub use a::T;` in lib.rs is `a::T`; a chain of
        such re-exports is followed (at most a few steps, so that a cycle
        of them cannot hang the script).
        """
        path = list(path)
        for _ in range(16):
            k = len(path)
            while k > 0 and tuple(path[:k]) not in self.files:
                k -= 1
            if k == len(path):
                break
            uses = self.uses.get(tuple(path[:k]), {})
            target = uses.get(path[k])
            if target is None or target == path[: k + 1]:
                break
            path = list(target) + path[k + 1 :]
        return path

    def file_of(self, path):
        """The file of the longest module prefix of an absolute path."""
        for k in range(len(path), -1, -1):
            if tuple(path[:k]) in self.files:
                return self.files[tuple(path[:k])]
        return None

    def is_module(self, path):
        return tuple(path) in self.files


def use_trees(toks, i):
    """The paths of the `use` tree starting at toks[i], and where it ends.

    `a::{b, c::{d, e}}` gives [a,b], [a,c,d], [a,c,e]; `self` inside braces
    names the prefix itself; `as x` aliases are returned with each path.
    """
    paths = []

    def tree(i, prefix):
        segs = list(prefix)
        while i < len(toks):
            t = toks[i]
            if t == "{":
                i += 1
                while i < len(toks) and toks[i] != "}":
                    i = tree(i, segs)
                    if i < len(toks) and toks[i] == ",":
                        i += 1
                return i + 1
            if t == "*":
                paths.append((segs, None, True))
                return i + 1
            if t == "::":
                if not segs:
                    # A leading `::` (`use ::ring::x;`) names another
                    # crate, even where a child module has the same name.
                    segs = ["::"]
                i += 1
                continue
            if t in (",", "}", ";"):
                paths.append((segs, None, False))
                return i
            if t == "as":
                paths.append((segs, toks[i + 1] if i + 1 < len(toks) else None, False))
                return i + 2
            if t == "self" and segs and toks[i - 1] != "::":
                # `{self, ..}`: the prefix itself.
                segs = segs + []
                i += 1
                continue
            segs = segs + [t]
            i += 1
        paths.append((segs, None, False))
        return i

    while i < len(toks) and toks[i] != ";":
        i = tree(i, [])
        if i < len(toks) and toks[i] == ",":
            i += 1
    return paths, i


def module_uses(crate, rel):
    """The names a file's top-level `use` declarations bind in its module.

    Returns {name: absolute path} for the non-glob items (`pub use a::T;`,
    `use super::x::U as V;`) of `use` declarations outside any braces, so
    that a path through the module to such a name can be followed to the
    item itself. Paths into other crates are left out.
    """
    with open(os.path.join(crate.src, rel), encoding="utf-8") as f:
        toks = tokens(strip(f.read()))
    here = module_of(rel)
    names = {}
    depth = 0
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
        elif t == "use" and depth == 0 and (i == 0 or toks[i - 1] != "::"):
            paths, i = use_trees(toks, i + 1)
            for segs, alias, glob in paths:
                if glob or not segs:
                    continue
                head = segs[0]
                if head == "crate":
                    absolute = list(segs[1:])
                elif head in ("self", "super"):
                    base = list(here)
                    k = 0
                    ok = True
                    while k < len(segs) and segs[k] in ("self", "super"):
                        if segs[k] == "super":
                            if not base:
                                ok = False
                                break
                            base.pop()
                        k += 1
                    if not ok:
                        continue
                    absolute = base + list(segs[k:])
                elif crate.is_module(list(here) + [head]):
                    absolute = list(here) + list(segs)
                else:
                    continue
                name = alias or segs[-1]
                if absolute and name not in ("self", "super", "crate", "_"):
                    names[name] = absolute
            continue
        i += 1
    return names


def references(crate, rel, skip_tests):
    """The files the file `rel` refers to, and one example path for each."""
    with open(os.path.join(crate.src, rel), encoding="utf-8") as f:
        toks = tokens(strip(f.read()))
    file_mod = module_of(rel)
    refs = {}

    # Inline modules: a stack of (module path, brace depth at its opening).
    scopes = [(file_mod, 0)]
    depth = 0
    aliases = [{}]  # per scope: name -> absolute module path
    cfg_test = False

    def resolve(segs, here):
        """An absolute path for `segs` seen in module `here`, or None."""
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return list(segs[1:])
        if head in ("self", "super"):
            base = list(here)
            k = 0
            while k < len(segs) and segs[k] in ("self", "super"):
                if segs[k] == "super":
                    if not base:
                        return None
                    base.pop()
                k += 1
            return base + list(segs[k:])
        for scope in reversed(aliases):
            if head in scope:
                return list(scope[head]) + list(segs[1:])
        if crate.is_module(list(here) + [head]):
            return list(here) + list(segs)
        return None

    def add(path, shown):
        if path is None:
            return
        target = crate.file_of(crate.canonical(path))
        if target is not None and target != rel:
            refs.setdefault(target, shown)

    i = 0
    skipping_from = None  # brace depth a skipped #[cfg(test)] block opened at
    while i < len(toks):
        t = toks[i]
        here = scopes[-1][0]
        if t == "#" and toks[i + 1 : i + 6] == ["[", "cfg", "(", "test", ")"]:
            cfg_test = True
            i += 6
            continue
        if t == "{":
            depth += 1
            i += 1
            continue
        if t == "}":
            if skipping_from is not None and depth == skipping_from:
                skipping_from = None
            if len(scopes) > 1 and scopes[-1][1] == depth:
                scopes.pop()
                aliases.pop()
            depth -= 1
            i += 1
            continue
        if t == "mod" and i + 2 < len(toks) and toks[i + 2] in ("{", ";"):
            name = toks[i + 1]
            if toks[i + 2] == "{":
                if skip_tests and cfg_test and skipping_from is None:
                    skipping_from = depth + 1
                scopes.append((here + (name,), depth + 1))
                aliases.append({})
            cfg_test = False
            i += 2
            continue
        if t == ";":
            cfg_test = False
        if skipping_from is not None:
            i += 1
            continue
        if t == "use" and (i == 0 or toks[i - 1] != "::"):
            paths, i = use_trees(toks, i + 1)
            for segs, alias, glob in paths:
                absolute = resolve(segs, here)
                if absolute is None:
                    continue
                add(absolute, "::".join(segs))
                absolute = crate.canonical(absolute)
                if not glob and crate.is_module(absolute):
                    name = alias or (segs[-1] if segs else None)
                    if name and name not in ("self", "super", "crate"):
                        aliases[-1][name] = absolute
            continue
        # A path written in the code: a run of `ident :: ident ...`.
        if (t.isidentifier() and i + 1 < len(toks) and toks[i + 1] == "::"
                and (i == 0 or toks[i - 1] != "::")):
            segs = [t]
            j = i + 1
            while j + 1 < len(toks) and toks[j] == "::" and toks[j + 1].isidentifier():
                segs.append(toks[j + 1])
                j += 2
            add(resolve(segs, here), "::".join(segs))
            i = j
            continue
        i += 1
    return refs


def circles(graph):
    """Tarjan's strongly connected components of more than one node."""
    index = {}
    low = {}
    stack = []
    on = set()
    found = []
    counter = [0]

    def visit(v):
        # Iterative, so that a deep graph does not hit the recursion limit.
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="the crate's src directory, e.g. crates/lbd/src")
    p.add_argument("--skip-tests", action="store_true",
                   help="leave out #[cfg(test)] modules")
    p.add_argument("--edges", action="store_true",
                   help="print every file's references too")
    a = p.parse_args()
    if not os.path.isdir(a.src):
        print(f"{a.src}: not a directory", file=sys.stderr)
        return 2
    crate = Crate(a.src)
    graph = {}
    examples = {}
    for rel in sorted(crate.files.values()):
        refs = references(crate, rel, a.skip_tests)
        graph[rel] = set(refs)
        examples[rel] = refs
    if a.edges:
        for rel in sorted(graph):
            print(rel)
            for target in sorted(graph[rel]):
                print(f"    -> {target}  ({examples[rel][target]})")
    found = circles(graph)
    for comp in found:
        members = set(comp)
        print(f"circle of {len(comp)} files:")
        for rel in comp:
            inside = sorted(t for t in graph[rel] if t in members)
            print(f"    {rel} -> {', '.join(inside)}")
    if not found:
        print(f"{a.src}: {len(graph)} files, no circle")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
