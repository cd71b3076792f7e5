#!/usr/bin/env python3
"""Every module note that claims an invariant names the test that holds it.

For each `.rs` file of the product's folders (not a test, bench, example or
fuzz target), the leading `//!` block is cut into bullets (a line starting
`//! - ` or `//! 1. `, with the lines after it up to the next bullet or
blank line) and paragraphs. A bullet or paragraph whose text (outside
backticks) says `only`, `never` or `without touching`, as whole words
(`read-only` included), must name at least one test in backticks, in one of
these forms:

    `path/to/file.rs::test_name`    (also `path/to/file.rs::tests::test_name`)
    `module::tests::test_name`      (a unit test in that module's `mod tests`)
    `tests::test_name`              (a unit test of the file the note heads)
    `module::tests`                 (a whole unit-test module)
    `test_name`                     (a test function anywhere)
    `scripts/check-NAME.py`         (a check `scripts/test.sh` runs)

and every test so named must exist: a `fn` under `#[test]` or
`#[tokio::test]`, inside `proptest! { }`, or named in a test-generating
macro's invocation (the store contract suite's `contract!(...)`), in a `.rs`
file of the workspace (a path names the file that must hold it; `crate::`
is the note's own crate).

Run by scripts/test.sh; prints `file:line: <the bullet's start>` and what is
missing for each breach, and exits 1 if there is any."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ["orchestrator", "dashboard", "deferred-queue", "policies", "sandbox-image"]
SKIP_PARTS = {"tests", "benches", "examples", "fuzz", "target"}

CLAIM = re.compile(r"\b(only|never|without\s+touching)\b", re.I)
CODE_SPAN = re.compile(r"`([^`]*)`")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PATH_REF = re.compile(r"^([\w./-]+\.rs)::(" + IDENT + r"(?:::" + IDENT + r")*)$")
SELF_REF = re.compile(r"^tests::(" + IDENT + r")$")
MOD_REF = re.compile(r"^(" + IDENT + r"(?:::" + IDENT + r")*)::tests(?:::(" + IDENT + r"))?$")
BARE_REF = re.compile(r"^" + IDENT + r"$")
SCRIPT_REF = re.compile(r"^scripts/check-[\w-]+\.py$")

TEST_ATTR = re.compile(r"^\s*#\[(test|tokio::test)\b")
ATTR_OR_COMMENT = re.compile(r"^\s*(#\[|//|$)")
FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?fn\s+(" + IDENT + r")")
FN_ANY = re.compile(r"\bfn\s+(" + IDENT + r")\s*[(<]")
MOD_TESTS = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+tests\b")
MACRO_DEF = re.compile(r"macro_rules!\s+(" + IDENT + r")\s*\{")


def all_rust_files():
    for base, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(base, ROOT)
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (rel == "." and d == "target")]
        for f in files:
            if f.endswith(".rs"):
                yield os.path.relpath(os.path.join(base, f), ROOT)


def block(text, start):
    """The text from `start` (an opening brace or parenthesis) to its match."""
    opening = text[start]
    closing = {"{": "}", "(": ")", "[": "]"}[opening]
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return text[start:]


def tests_in(text):
    """The names of the test functions a file's text defines."""
    names = set()
    pending = False
    for line in text.splitlines():
        if TEST_ATTR.match(line):
            pending = True
            continue
        if pending:
            m = FN.match(line)
            if m:
                names.add(m.group(1))
                pending = False
            elif not ATTR_OR_COMMENT.match(line):
                pending = False
    for m in re.finditer(r"\bproptest!\s*[{(]", text):
        names.update(FN_ANY.findall(block(text, m.end() - 1)))
    # Test-generating macros: `macro_rules! m` whose body has `#[test]`; the
    # identifiers passed to `m!(...)` are tests.
    for m in MACRO_DEF.finditer(text):
        body = block(text, m.end() - 1)
        if "#[test]" not in body:
            continue
        for call in re.finditer(r"(?<![\w!])" + re.escape(m.group(1)) + r"!\s*[({\[]", text):
            if text[call.start() - len("macro_rules! ") : call.start()] == "macro_rules! ":
                continue
            names.update(re.findall(IDENT, block(text, call.end() - 1)[1:-1]))
    return names


class Workspace:
    def __init__(self):
        self.files = sorted(all_rust_files())
        self.text = {}
        self.tests = {}
        self.test_files = {}  # test name -> files
        for f in self.files:
            try:
                with open(os.path.join(ROOT, f), encoding="utf-8") as h:
                    t = h.read()
            except (OSError, UnicodeDecodeError):
                continue
            self.text[f] = t
            names = tests_in(t)
            self.tests[f] = names
            for n in names:
                self.test_files.setdefault(n, set()).add(f)
        try:
            with open(os.path.join(ROOT, "scripts", "test.sh"), encoding="utf-8") as h:
                self.test_sh = h.read()
        except OSError:
            self.test_sh = ""
        self.crates = {}
        for base, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "target"]
            if "Cargo.toml" in files:
                with open(os.path.join(base, "Cargo.toml"), encoding="utf-8") as h:
                    m = re.search(r'^\[package\][^\[]*?^name\s*=\s*"([^"]+)"', h.read(), re.M | re.S)
                if m:
                    self.crates[m.group(1).replace("-", "_")] = os.path.relpath(base, ROOT)

    def files_ending(self, suffix):
        return [f for f in self.files if f == suffix or f.endswith("/" + suffix)]

    def module_files(self, module, here):
        """The files that may hold module `a::b::c`, named in a note of
        file `here` (`crate::` is its crate)."""
        parts = module.split("::")
        if parts[0] == "crate":
            src = here[: here.rfind("/src/") + len("/src/")] if "/src/" in here else ""
            rest = "/".join(parts[1:])
            names = [rest + ".rs", rest + "/mod.rs"] if rest else ["lib.rs", "main.rs"]
            return [src + n for n in names if src + n in self.text]
        found = []
        if parts and parts[0] in self.crates:
            src = self.crates[parts[0]] + "/src/"
            rest = "/".join(parts[1:])
            if rest:
                found = [src + rest + ".rs", src + rest + "/mod.rs"]
            else:
                found = [src + "lib.rs", src + "main.rs"]
            found = [f for f in found if f in self.text]
            if found:
                return found
        rest = "/".join(parts)
        return self.files_ending(rest + ".rs") + self.files_ending(rest + "/mod.rs")

    def has_tests_module(self, f):
        t = self.text.get(f, "")
        return any(MOD_TESTS.match(line) for line in t.splitlines())

    def tests_of_module_file(self, f):
        """Tests in a module file and in its `tests.rs` beside or below it."""
        names = set(self.tests.get(f, ()))
        stem = f[: -len("/mod.rs")] if f.endswith("/mod.rs") else f[: -len(".rs")]
        names |= self.tests.get(stem + "/tests.rs", set())
        return names

    def check_ref(self, span, here):
        """(is a test reference, error or None) for one backticked span in
        the note of file `here`."""
        if SCRIPT_REF.match(span):
            if "python3 " + span in self.test_sh:
                return True, None
            return True, f"`{span}`: scripts/test.sh does not run it"
        m = SELF_REF.match(span)
        if m:
            if m.group(1) in self.tests_of_module_file(here):
                return True, None
            return True, f"`{span}`: no test {m.group(1)} in this file's tests"
        m = PATH_REF.match(span)
        if m:
            path, rest = m.group(1), m.group(2)
            name = rest.split("::")[-1]
            files = self.files_ending(path.lstrip("./"))
            if not files:
                return True, f"`{span}`: no file {path}"
            if any(name in self.tests.get(f, ()) for f in files):
                return True, None
            return True, f"`{span}`: no test {name} in {path}"
        m = MOD_REF.match(span)
        if m:
            module, name = m.group(1), m.group(2)
            files = self.module_files(module, here)
            if not files:
                return True, f"`{span}`: no module {module}"
            if name is None:
                if any(self.has_tests_module(f) for f in files):
                    return True, None
                return True, f"`{span}`: {module} has no mod tests"
            if any(name in self.tests_of_module_file(f) for f in files):
                return True, None
            return True, f"`{span}`: no test {name} in {module}::tests"
        if BARE_REF.match(span) and span in self.test_files:
            return True, None
        return False, None


def leading_doc(lines):
    """(line number, text) of the leading `//!` block."""
    out = []
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("//!"):
            out.append((i, s[3:]))
        elif out:
            break
        elif s == "" or (s.startswith("//") and not s.startswith("///")) or s.startswith("#!["):
            continue
        else:
            break
    return out


def units(doc):
    """Bullets and paragraphs: (first line number, joined text)."""
    result = []
    cur = None
    in_code = False
    for n, text in doc:
        body = text[1:] if text.startswith(" ") else text
        if body.lstrip().startswith("```"):
            in_code = not in_code
        if not in_code and body.strip() == "":
            cur = None
            continue
        if not in_code and re.match(r"^\s*([-*]|\d+\.) |^#+ ", body):
            cur = [n, body.strip()]
            result.append(cur)
            continue
        if cur is None:
            cur = [n, body.strip()]
            result.append(cur)
        else:
            cur[1] += " " + body.strip()
    return [(n, t) for n, t in result]


def checked_files(ws):
    for f in ws.files:
        parts = f.split("/")
        if parts[0] not in FOLDERS or SKIP_PARTS & set(parts[:-1]):
            continue
        yield f


def main():
    ws = Workspace()
    breaches = 0
    for f in checked_files(ws):
        for n, text in units(leading_doc(ws.text.get(f, "").splitlines())):
            if not CLAIM.search(CODE_SPAN.sub("", text)):
                continue
            named, errors = 0, []
            for span in CODE_SPAN.findall(text):
                is_ref, err = ws.check_ref(span.strip(), f)
                if is_ref:
                    named += 1
                if err:
                    errors.append(err)
            if named and not errors:
                continue
            what = "; ".join(errors) if errors else "names no test"
            print(f"{f}:{n}: {text[:100]}\n    {what}")
            breaches += 1
    if breaches:
        print(f"{breaches} module note(s) claim only/never/without touching without a test that holds it")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
