#!/usr/bin/env python3
"""The layers hold: only the adapter crates depend on (and name) the
container engine's client, the database drivers and the HTTP framework, and
no crate's modules import each other in a cycle.

Run by scripts/test.sh; exits non-zero naming each breach."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each adapter may name: the crate -> the packages allowed to depend on it.
ADAPTERS = {
    "bollard": {"nightshift-engine-docker"},
    "rusqlite": {"nightshift-store-sqlite"},
    "postgres": {"nightshift-store-postgres"},
    "tokio-postgres": {"nightshift-store-postgres"},
    "sqlx": {"nightshift-store-postgres"},
    "axum": {"nightshift-dashboard"},
    "kube": {"nightshift-engine-kubernetes"},
}
# The end-to-end tests' crate (never shipped) tampers with the SQLite file
# as an attacker on the host would: rows deleted, rewritten; so does the
# store contract suite (orchestrator/store-postgres/tests/contract.rs, a
# dev-dependency), which runs on the SQLite store too.
TEST_ALLOWED = {("tests", "rusqlite"), ("nightshift-store-postgres", "rusqlite")}

# Inside an adapter crate, the one module that may name its adapter (the
# others reach it through that module): crate directory -> (adapter, file).
ADAPTER_MODULE = {
    "orchestrator/engine-docker/src": ("bollard", "engine.rs"),
    "orchestrator/store-sqlite/src": ("rusqlite", "store.rs"),
    "orchestrator/engine-kubernetes/src": ("kube", "cluster.rs"),
}

# The product's crates whose modules must not import each other in a cycle.
PRODUCT = [
    "orchestrator/core/src",
    "orchestrator/store-sqlite/src",
    "orchestrator/engine-docker/src",
    "orchestrator/engine-kubernetes/src",
    "orchestrator/gateway/src",
    "orchestrator/supervisor/src",
    "dashboard/src",
    "orchestrator/src",
]


def rust_files(d):
    for base, _, files in os.walk(d):
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(base, f)


def main():
    breaches = []
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            cwd=ROOT,
        )
    )
    for pkg in meta["packages"]:
        name = pkg["name"]
        src = os.path.dirname(pkg["manifest_path"])
        for dep in pkg["dependencies"]:
            allowed = ADAPTERS.get(dep["name"])
            if allowed is None or name in allowed:
                continue
            if (name, dep["name"]) in TEST_ALLOWED:
                continue
            breaches.append(
                f"{name} ({os.path.relpath(src, ROOT)}) depends on {dep['name']}: only {', '.join(sorted(allowed))} may"
            )
        # A name could also arrive re-exported: no source outside the
        # adapter names the crate's paths either.
        for adapter, allowed in ADAPTERS.items():
            if name in allowed or (name, adapter) in TEST_ALLOWED:
                continue
            ident = adapter.replace("-", "_")
            pat = re.compile(r"(?<![A-Za-z0-9_])" + ident + r"::")
            for f in rust_files(os.path.join(src, "src")):
                for i, line in enumerate(open(f, encoding="utf-8"), 1):
                    code = line.split("//")[0]
                    if pat.search(code):
                        breaches.append(f"{os.path.relpath(f, ROOT)}:{i} names {ident}")

    for d, (adapter, module) in ADAPTER_MODULE.items():
        pat = re.compile(r"(?<![A-Za-z0-9_])" + adapter + r"\b")
        for f in rust_files(os.path.join(ROOT, d)):
            if os.path.basename(f) == module:
                continue
            code = open(f, encoding="utf-8").read().split("#[cfg(test)]")[0]
            for i, line in enumerate(code.splitlines(), 1):
                if pat.search(line.split("//")[0]):
                    breaches.append(f"{os.path.relpath(f, ROOT)}:{i} names {adapter}: only {module} in its crate may")

    for d in PRODUCT:
        path = os.path.join(ROOT, d)
        mods = {}
        for f in rust_files(path):
            rel = os.path.relpath(f, path)
            top = rel.split(os.sep)[0]
            top = top[:-3] if top.endswith(".rs") else top
            if top in ("lib", "main"):
                continue
            text = open(f, encoding="utf-8").read()
            # Only the product's code: tests may reach anywhere.
            text = text.split("#[cfg(test)]")[0]
            code = "\n".join(line.split("//")[0] for line in text.splitlines())
            refs = set(re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", code))
            mods.setdefault(top, set()).update(refs)
        graph = {m: {r for r in refs if r in mods and r != m} for m, refs in mods.items()}
        for cycle in cycles(graph):
            breaches.append(f"{d}: modules import each other in a cycle: {' -> '.join(cycle + [cycle[0]])}")

    for b in breaches:
        print(f"check-layers: {b}", file=sys.stderr)
    if breaches:
        sys.exit(1)
    print("check-layers: the adapters are named only by their crates; no module cycle")


def cycles(graph):
    """One cycle per strongly connected component of more than one module."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
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
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


if __name__ == "__main__":
    main()
