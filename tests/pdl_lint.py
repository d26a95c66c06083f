#!/usr/bin/env python3
"""pdl_lint.py — every kernel that the CUDA backend launches programmatically waits for the
kernel ahead before it can return or touch memory.

A kernel launched by cu_launch_pdl (directly, or through ROW_OP), or by a cudaLaunchKernelEx
with the programmatic attribute of its own (the skinny kernel's cluster form), may start while the kernel
before it in the stream still runs (hyla_cuda_impl.h, "Programmatic dependent launch"). Its
threads must execute pdl_wait() before they read anything an earlier kernel writes or write
anything; a kernel that forgot it would race its predecessor only now and then, on a GPU, and
never on the CPU machines that run most tests. This check reads the sources (no GPU, no build):
for every kernel so launched it finds the __global__ definitions and
requires, in each body, a pdl_wait() call (or a call of a __device__ helper whose body calls
it, or a macro that expands to it) before the body's first `return`. What a kernel does before its wait (the skinny linears
request weight tiles, which no kernel writes) is left to review: the check asserts the wait is
there and reached, not what precedes it. A body may say, in a comment holding EXEMPT, that its
early returns touch no memory.

usage: pdl_lint.py KERNELS_CUDA_DIR     Exit status 1 with one line per kernel that fails.
"""
import os
import re
import sys

# A comment holding this in a kernel's body says that its returns before the wait touch no memory
# (blocks with nothing to do that only keep a cluster's barriers); the wait must still be there.
EXEMPT = "pdl-lint: returns before the wait touch no memory"


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), src, flags=re.S)  # lines kept
    return re.sub(r"//[^\n]*", "", src)


def body_at(src, open_brace):
    """The text of the brace block starting at src[open_brace] == '{'."""
    depth = 0
    for i in range(open_brace, len(src)):
        if src[i] == "{":
            depth += 1
        elif src[i] == "}":
            depth -= 1
            if depth == 0:
                return src[open_brace : i + 1]
    return src[open_brace:]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "kernels/cuda"
    files = sorted(
        os.path.join(root, f) for f in os.listdir(root) if f.endswith(".cu") or f.endswith(".cuh") or f.endswith(".h")
    )
    raws = {f: open(f, encoding="utf-8").read() for f in files}
    srcs = {f: strip_comments(raws[f]) for f in files}
    raw_bodies = {}  # (file, line) -> the definition's body with its comments (for EXEMPT)
    launched = set()
    for src in srcs.values():
        for m in re.finditer(r"cu_launch_pdl\s*\(\s*[A-Za-z_]\w*\s*,\s*([A-Za-z_]\w*)", src):
            launched.add(m.group(1))
        for m in re.finditer(r"\bROW_OP\s*\(\s*[A-Za-z_]\w*\s*,\s*([A-Za-z_]\w*)", src):
            launched.add(m.group(1))
        # a launch of its own with the attribute (k_skinny2c: a cluster as well): the kernel of the
        # next cudaLaunchKernelEx after the attribute is set
        for m in re.finditer(r"cudaLaunchAttributeProgrammaticStreamSerialization", src):
            k = re.compile(r"cudaLaunchKernelEx\s*\(\s*&?\s*\w+\s*,\s*([A-Za-z_]\w*)").search(src, m.end())
            if k and k.group(1) != "kern":
                launched.add(k.group(1))
    launched.discard("kern")  # ROW_OP's and cu_launch_pdl's own parameters, in their definitions
    # what waits: pdl_wait itself, macros that expand to it (the row ops' ROW_SETUP) and __device__
    # helpers whose bodies call any of these, to a fixed point
    macros = []
    for src in srcs.values():
        for m in re.finditer(r"#define\s+([A-Za-z_]\w*)((?:[^\n]*\\\n)*[^\n]*)", src):
            macros.append((m.group(1), m.group(2)))
    helpers = []
    for src in srcs.values():
        for m in re.finditer(r"__device__[^;{]*?\b([A-Za-z_]\w*)\s*\([^;{]*\)\s*\{", src):
            helpers.append((m.group(1), body_at(src, m.end() - 1)))
    waiting = {"pdl_wait"}

    def wait_re():
        return re.compile(r"\b(" + "|".join(sorted(waiting)) + r")\s*(<[^;()]*>)?\s*\(")

    grown = True
    while grown:
        grown = False
        r = wait_re()
        for name, text in macros + helpers:
            if name not in waiting and r.search(text):
                waiting.add(name)
                grown = True
    wait_call = wait_re()
    bad, checked = [], 0
    for name in sorted(launched):
        defs = []
        for f, src in srcs.items():
            for m in re.finditer(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", src):
                brace = src.find("{", m.end())
                semi = src.find(";", m.end())
                if brace < 0 or (0 <= semi < brace and ")" in src[m.end() : semi] and src[m.end():semi].count("(") < src[m.end():semi].count(")")):
                    continue  # a declaration
                line = src[: m.start()].count("\n") + 1
                defs.append((f, line, body_at(src, brace)))
                raw_bodies[(f, line)] = body_at(raws[f], brace)  # comments keep their lengths
        if not defs:
            bad.append(f"{name}: launched by cu_launch_pdl / ROW_OP, but no __global__ definition found")
            continue
        for f, line, body in defs:
            checked += 1
            w = wait_call.search(body)
            r = re.search(r"\breturn\b", body)
            if not w:
                bad.append(f"{f}:{line}: {name} is launched programmatically but never calls pdl_wait()")
            elif r and r.start() < w.start() and EXEMPT not in raw_bodies.get((f, line), ""):
                bad.append(f"{f}:{line}: {name} may return before its pdl_wait()")
    for b in bad:
        print("FAIL " + b)
    print(f"pdl_lint: {checked} kernel definitions of {len(launched)} programmatically launched kernels: "
          + ("ok" if not bad else f"{len(bad)} failing"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
