#!/usr/bin/env python3
"""cubin_compare.py — does a change keep the device code of the CUDA objects byte for byte?

A fold (a kernel or helper moved into a header, two copies made one) is accepted without a GPU
bit check only when the machine code of every kernel stays what it was. This script reads the
sm_XX cubins out of the fat binaries of two builds' object files (the host .o's `.nv_fatbin`
section; no CUDA tools needed) and compares, per kernel (by mangled name):
  - `.text.<kernel>`: the machine code, byte for byte (the verdict);
  - the kernel's other sections (`.nv.info.<kernel>`: registers, parameters, barriers;
    `.nv.shared.<kernel>`: static shared memory; `.nv.constant0.<kernel>`; `.rela.text.<kernel>`)
    and its `.text` section's header flags (register count), reported when they differ in more
    than the numbering of the symbols they name.

usage:
  cubin_compare.py BASE.o NEW.o [--map OLD=NEW ...]
  cubin_compare.py BASE_DIR NEW_DIR            (every *.o present in both folders)
--map names a kernel renamed by the change (mangled names); --quiet prints only differences.
Exit status: 0 when every kernel's code is the same, 1 when one differs or is missing.

Typical use (docs in kernels/cuda/dev/NOTES.md): copy build/kernels/CMakeFiles/
hyla_kernels_cuda.dir/cuda/*.o to a folder before the change, rebuild, and compare the folder
with the build's objects.
"""
import os
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"


def elf_sections(data):
    """Sections of a 64-bit little-endian ELF: {name: (header dict, bytes)}."""
    if data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = []
    for i in range(shnum):
        (name, typ, flags, addr, off, size, link, info, align,
         entsize) = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        hdrs.append(dict(name=name, type=typ, flags=flags, off=off, size=size, link=link, info=info,
                         align=align, entsize=entsize))
    strtab = hdrs[shstrndx]
    names = data[strtab["off"]:strtab["off"] + strtab["size"]]
    out = {}
    for h in hdrs:
        end = names.index(b"\0", h["name"])
        nm = names[h["name"]:end].decode()
        body = b"" if h["type"] == 8 else data[h["off"]:h["off"] + h["size"]]  # 8: NOBITS
        out[nm] = (h, body)
    return out


def decompress(payload, entry_hdr):
    if payload[:4] == ELF_MAGIC:
        return payload
    if payload[:4] == b"\x28\xb5\x2f\xfd":  # zstd frame
        try:
            return subprocess.run(["zstd", "-dc"], input=payload, stdout=subprocess.PIPE,
                                  check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise ValueError("a compressed cubin needs the zstd program: %s" % e)
    raise ValueError("a cubin in an unknown compression (build with -Xfatbin=-compress-all off)")


def cubins(obj_path):
    """{arch: cubin bytes} of the fat binary in a host object file."""
    with open(obj_path, "rb") as f:
        data = f.read()
    secs = elf_sections(data)
    if ".nv_fatbin" not in secs:
        raise ValueError("%s: no .nv_fatbin section (not a CUDA object?)" % obj_path)
    fb = secs[".nv_fatbin"][1]
    out = {}
    off = 0
    while off + 16 <= len(fb):
        magic, _ver, hsz, fsz = struct.unpack_from("<IHHQ", fb, off)
        if magic != FATBIN_MAGIC:
            off += 8  # padding between fat binaries
            continue
        p, end = off + hsz, off + hsz + fsz
        while p < end:
            kind, _ev, ehs, psz = struct.unpack_from("<HHIQ", fb, p)
            arch, = struct.unpack_from("<I", fb, p + 28)
            if kind == 2:  # ELF (a cubin); kind 1 is PTX
                body = decompress(fb[p + ehs:p + ehs + psz], fb[p:p + ehs])
                out["sm_%d" % arch] = body
            p += ehs + psz
        off = end
    return out


def symbol_names(cubin):
    """[name of symbol i] of a cubin's .symtab (a section symbol by its section's name)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(tab, off):
        base = hdrs[tab][4]
        end = cubin.index(b"\0", base + off)
        return cubin[base + off:end].decode()

    names = []
    for i, h in enumerate(hdrs):
        if h[1] != 2:  # SHT_SYMTAB
            continue
        strtab = h[6]
        for j in range(h[5] // 24):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", cubin, h[4] + 24 * j)
            if st_name:
                names.append(cstr(strtab, st_name))
            elif (st_info & 15) == 3 and st_shndx < shnum:  # STT_SECTION
                names.append(cstr(shstrndx, hdrs[st_shndx][0]))
            else:
                names.append("")
    return names


def same_but_symbol_numbers(a, b, syms_a, syms_b):
    """True when two sections differ only in 4-byte words that are symbol indices naming the
    same symbol in each cubin (the numbering moves when kernels are emitted in another order)."""
    if len(a) != len(b) or len(a) % 4:
        return False
    for i in range(0, len(a), 4):
        x, = struct.unpack_from("<I", a, i)
        y, = struct.unpack_from("<I", b, i)
        if x == y:
            continue
        if not (x < len(syms_a) and y < len(syms_b) and syms_a[x] and syms_a[x] == syms_b[y]):
            return False
    return True


def kernels(cubin):
    """{mangled kernel name: {section kind: (header, bytes)}} plus the text section headers."""
    secs = elf_sections(cubin)
    out = {}
    for nm, (h, body) in secs.items():
        if not nm.startswith(".text."):
            continue
        k = nm[len(".text."):]
        parts = {}
        for kind in (".text.", ".nv.info.", ".nv.shared.", ".nv.constant0.", ".rela.text."):
            if kind + k in secs:
                parts[kind[:-1]] = secs[kind + k]
        out[k] = parts
    return out


def compare_cubins(base, new, renames, label, quiet):
    kb, kn = kernels(base), kernels(new)
    syms_b, syms_n = symbol_names(base), symbol_names(new)
    bad = 0
    rows = []
    seen_new = set()
    for k in sorted(kb):
        kn_name = renames.get(k, k)
        seen_new.add(kn_name)
        if kn_name not in kn:
            rows.append(("MISSING", k, "only in the base"))
            bad = 1
            continue
        pb, pn = kb[k], kn[kn_name]
        tb, tn = pb[".text"], pn[".text"]
        if tb[1] != tn[1]:
            n = min(len(tb[1]), len(tn[1]))
            first = next((i for i in range(n) if tb[1][i] != tn[1][i]), n)
            ndiff = sum(1 for i in range(0, n, 16) if tb[1][i:i + 16] != tn[1][i:i + 16])
            rows.append(("DIFFERS", k, "code %d -> %d bytes, %d of %d instructions differ, first at 0x%x"
                         % (len(tb[1]), len(tn[1]), ndiff, len(tb[1]) // 16, first)))
            bad = 1
            continue
        notes = []
        if (tb[0]["flags"], tb[0]["info"] >> 24) != (tn[0]["flags"], tn[0]["info"] >> 24):
            notes.append("text header (flags %#x -> %#x)" % (tb[0]["flags"], tn[0]["flags"]))
        for part in (".nv.info", ".nv.shared", ".nv.constant0", ".rela.text"):
            a, b = pb.get(part), pn.get(part)
            if (a is None) != (b is None):
                notes.append(part + " present in one only")
            elif a is not None and (a[1] != b[1] or a[0]["size"] != b[0]["size"]):
                if not same_but_symbol_numbers(a[1], b[1], syms_b, syms_n):
                    notes.append(part)
        name = k if kn_name == k else "%s -> %s" % (k, kn_name)
        if notes:
            rows.append(("same code", name, "but " + ", ".join(notes) + " differ"))
        else:
            rows.append(("same", name, "%d bytes" % len(tb[1])))
    for k in sorted(set(kn) - seen_new):
        rows.append(("NEW", k, "only in the new build"))
        bad = 1
    for verdict, k, what in rows:
        if quiet and verdict == "same":
            continue
        print("%s %-9s %s  %s" % (label, verdict, k, what))
    nsame = sum(1 for r in rows if r[0] in ("same", "same code"))
    print("%s: %d of %d kernels with the same code%s" % (label, nsame, len(rows), "" if not bad else " (DIFFERENCES)"))
    return bad


def compare_objects(a, b, renames, quiet):
    ca, cb = cubins(a), cubins(b)
    bad = 0
    label = os.path.basename(b)
    if sorted(ca) != sorted(cb):
        print("%s: architectures differ: %s vs %s" % (label, sorted(ca), sorted(cb)))
        return 1
    for arch in sorted(ca):
        bad |= compare_cubins(ca[arch], cb[arch], renames, "%s %s" % (label, arch), quiet)
    return bad


def main(argv):
    args, renames, quiet = [], {}, False
    i = 0
    while i < len(argv):
        if argv[i] == "--map" and i + 1 < len(argv):
            old, _, new = argv[i + 1].partition("=")
            renames[old] = new
            i += 2
        elif argv[i] == "--quiet":
            quiet = True
            i += 1
        elif argv[i] in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            args.append(argv[i])
            i += 1
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = args
    if os.path.isdir(a) and os.path.isdir(b):
        names = sorted(set(f for f in os.listdir(a) if f.endswith(".o")) & set(f for f in os.listdir(b) if f.endswith(".o")))
        if not names:
            print("no object files in common", file=sys.stderr)
            return 2
        bad = 0
        for n in names:
            bad |= compare_objects(os.path.join(a, n), os.path.join(b, n), renames, quiet)
        return bad
    return compare_objects(a, b, renames, quiet)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
