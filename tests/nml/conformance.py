#!/usr/bin/env python3
"""moetrain: gfortran as the oracle for the namelist parser (run by conformance.sh).

For every fixture it writes Fortran that declares the fixture's variables, READs
its groups with gfortran's namelist input, and prints each element in the form
of flatten.h; all fixtures go in one program, compiled once.

  ok/NAME.nml   gfortran must read the same values as moetrain's nml_dump.
                Variables, types and sizes come from NAME.expect: its element
                lines, plus '#decl group.key type size' for keys given no
                value and '#group name' for groups with no keys.
  bad/NAME.nml  gfortran must reject it too (iostat /= 0, or the group not
                found), with the variables of the '#decl' lines of NAME.err.

A null value leaves an element unchanged, so each group is read twice, from
two different initial values (sentinels): an element that differs between
the two reads was never set, and is not printed.  moetrain's 'null' lines are
dropped to match.  Reals compare to a relative 1e-15, strings without their
trailing blanks (Fortran pads them to character(len=64)).
"""

import argparse
import os
import re
import subprocess
import sys

FTYPE = {
    "int": "integer(8)",
    "real": "real(8)",
    "logical": "logical",
    "str": "character(len=64)",
    "complex": "complex(8)",
}
SENTINEL = {
    "int": ("-123456789_8", "123456789_8"),
    "real": ("-1.25d300", "1.25d300"),
    "logical": (".false.", ".true."),
    "str": ("'zz sentinel 1'", "'zz sentinel 2'"),
    "complex": ("(-1.25d300, 0d0)", "(1.25d300, 0d0)"),
}
FORMAT = {
    "int": "(A,I0,A,I0)",
    "real": "(A,I0,A,ES26.17E3)",
    "logical": "(A,I0,A,L1)",
    "str": "(A,I0,A,A)",
    "complex": "(A,I0,A,2ES26.17E3)",
}
LINE = re.compile(r"^([a-z0-9_]+)\.([a-z0-9_%]+)\((-?\d+)\) = (\S+)(?: (.*))?$")


class Fixture:
    def __init__(self, kind, name):
        self.kind, self.name = kind, name
        self.groups = {}  # group -> {key: [types, size]}

    def declare(self, group, key, typ, size):
        keys = self.groups.setdefault(group, {})
        entry = keys.setdefault(key, [set(), 0])
        if typ != "null":
            entry[0].add(typ)
        entry[1] = max(entry[1], size)


def read_spec(fx, path):
    """Reads the declarations of fx from a .expect or .err file."""
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line.startswith("#decl "):
                var, typ, size = line.split()[1:4]
                group, key = var.split(".", 1)
                fx.declare(group, key, typ, int(size))
            elif line.startswith("#group "):
                fx.groups.setdefault(line.split()[1], {})
            elif fx.kind == "ok" and line:
                m = LINE.match(line)
                if not m:
                    sys.exit(f"{path}: cannot read line: {line}")
                fx.declare(m.group(1), m.group(2), m.group(4), int(m.group(3)))
    if not fx.groups:
        fx.groups["g"] = {}


def key_type(fx, key, types):
    """One Fortran type for a key whose elements have the given types."""
    if not types:
        return "int"
    if len(types) == 1:
        return next(iter(types))
    if types <= {"int", "real"}:
        return "real"
    sys.exit(f"{fx.kind}/{fx.name}: key {key} mixes {sorted(types)}; give it one type")


def fortran_for_group(fx, idx, group, keys):
    """A subroutine that reads every occurrence of the group and prints it."""
    sub = f"zz{idx}_{group}"
    leaves = []  # (path, type, size)
    for key in sorted(keys):
        types, size = keys[key]
        leaves.append((key, key_type(fx, key, types), max(size, 1)))
    if not leaves:
        leaves.append(("zz_dummy", "int", 1))

    # Derived types: a%b%c makes type for a with component b of a type with c.
    tree = {}
    for path, typ, size in leaves:
        node = tree
        parts = path.split("%")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = (typ, size)

    out = [f"  subroutine {sub}(dir)", "    character(len=*), intent(in) :: dir"]

    def decl_line(indent, prefix, name, child):
        if isinstance(child, dict):
            out.append(f"{indent}type(t{prefix}_{name}) :: {name}")
        else:
            out.append(f"{indent}{FTYPE[child[0]]} :: {name}({child[1]})")

    def emit_types(node, prefix):
        for name, child in node.items():
            if isinstance(child, dict):
                emit_types(child, prefix + "_" + name)
                out.append(f"    type t{prefix}_{name}")
                for cname, cchild in child.items():
                    decl_line("      ", f"{prefix}_{name}", cname, cchild)
                out.append("    end type")

    emit_types(tree, f"{idx}")
    for name, child in tree.items():
        decl_line("    ", f"{idx}", name, child)
    for k, (path, typ, size) in enumerate(leaves):
        out.append(f"    {FTYPE[typ]} :: zzs{k}({size})")
    out += [
        "    integer :: zzu, zzios, zzi, zzpass, zzreads",
        "    character(len=512) :: zzmsg",
        f"    namelist /{group}/ " + ", ".join(tree.keys()),
        "    do zzpass = 1, 2",
    ]
    for p in (0, 1):
        out.append("      if (zzpass == 1) then" if p == 0 else "      else")
        for path, typ, size in leaves:
            out.append(f"        {path} = {SENTINEL[typ][p]}")
    out += [
        "      end if",
        f"      open(newunit=zzu, file=dir//'/{fx.kind}/{fx.name}.nml', status='old', action='read')",
        "      zzreads = 0",
        "      do",
        f"        read(zzu, nml={group}, iostat=zzios, iomsg=zzmsg)",
        "        if (zzios /= 0) exit",
        "        zzreads = zzreads + 1",
        "      end do",
        "      close(zzu)",
    ]
    tag = f"{fx.kind}/{fx.name}"
    if fx.kind == "bad":
        out += [
            "      if (zzios > 0 .or. zzreads == 0) then",
            f"        print '(A)', '{tag}: rejected &{group}: ' // trim(zzmsg)",
            "      else",
            f"        print '(A)', '{tag}: accepted &{group}'",
            "      end if",
            "      return",
        ]
    else:
        out += [
            "      if (zzios > 0) then",
            f"        print '(A)', '{tag}: ERROR reading &{group}: ' // trim(zzmsg)",
            "        return",
            "      end if",
            "      if (zzpass == 1) then",
        ]
        for k, (path, typ, size) in enumerate(leaves):
            out.append(f"        zzs{k} = {path}")
        out.append("      end if")
    out.append("    end do")
    if fx.kind == "ok":
        for k, (path, typ, size) in enumerate(leaves):
            if path == "zz_dummy":
                continue
            same = {"logical": ".eqv.", "complex": "=="}.get(typ, "==")
            value = f"trim({path}(zzi))" if typ == "str" else f"{path}(zzi)"
            out += [
                f"    do zzi = 1, {size}",
                f"      if ({path}(zzi) {same} zzs{k}(zzi)) print '{FORMAT[typ]}', &",
                f"        '{tag}: {group}.{path}(', zzi, ') = {typ} ', {value}",
                "    end do",
            ]
    out.append(f"  end subroutine {sub}")
    return sub, out


def fortran_program(fixtures):
    subs, body = [], []
    for idx, fx in enumerate(fixtures):
        for group, keys in fx.groups.items():
            sub, lines = fortran_for_group(fx, idx, group, keys)
            subs.append(sub)
            body += lines
    head = [
        "! Generated by tests/nml/conformance.py: reads the namelist fixtures.",
        "program nml_conformance",
        "  implicit none",
        "  character(len=4096) :: dir",
        "  call get_command_argument(1, dir)",
    ]
    head += [f"  call {s}(trim(dir))" for s in subs]
    return "\n".join(head + ["contains"] + body + ["end program nml_conformance", ""])


def parse_flat(lines, types=None):
    """{element: (type, value)} from flatten.h lines, without nulls."""
    got = {}
    for line in lines:
        m = LINE.match(line)
        if not m:
            raise ValueError(f"cannot read line: {line!r}")
        group, key, index, typ, value = m.groups()
        if typ == "null":
            continue
        value = value or ""
        if typ == "str" and value.startswith("'"):
            value = value[1:-1].replace("''", "'")
        got[f"{group}.{key}({index})"] = (typ, value)
    return got


def same(declared, a, b):
    (ta, va), (tb, vb) = a, b
    if declared == "real":
        x, y = float(va), float(vb)
        return x == y or abs(x - y) <= 1e-15 * max(abs(x), abs(y))
    if declared == "str":
        return ta == tb and va.rstrip(" ") == vb.rstrip(" ")
    return ta == tb and va.strip() == vb.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--gfortran", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--ok-skip", default="")
    ap.add_argument("--stricter", default="")
    args = ap.parse_args()
    ok_skip, stricter = set(args.ok_skip.split()), set(args.stricter.split())

    fixtures = []
    for kind, ext in (("ok", ".expect"), ("bad", ".err")):
        for entry in sorted(os.listdir(os.path.join(args.fixtures, kind))):
            if entry.endswith(".nml"):
                fx = Fixture(kind, entry[:-4])
                read_spec(fx, os.path.join(args.fixtures, kind, fx.name + ext))
                fixtures.append(fx)
    for name in ok_skip | stricter:
        if not any(fx.name == name for fx in fixtures):
            sys.exit(f"conformance: listed fixture {name} does not exist")

    src = os.path.join(args.tmp, "conformance.f90")
    exe = os.path.join(args.tmp, "conformance")
    with open(src, "w", encoding="utf-8") as f:
        f.write(fortran_program(fixtures))
    subprocess.run([args.gfortran, "-O0", "-ffree-line-length-none", "-o", exe, src], check=True)
    run = subprocess.run([exe, args.fixtures], check=True, capture_output=True)
    fortran = {}
    for line in run.stdout.decode("utf-8", "replace").splitlines():
        tag, _, rest = line.partition(": ")
        fortran.setdefault(tag, []).append(rest)

    failures = 0
    for fx in fixtures:
        tag = f"{fx.kind}/{fx.name}"
        lines = fortran.get(tag, [])
        if fx.kind == "bad":
            verdicts = [l.split()[0] for l in lines]
            rejected = "rejected" in verdicts
            if fx.name in stricter:
                print(f"skip {tag}: moetrain is stricter; gfortran {'rejects it too' if rejected else 'accepts it'}")
            elif rejected:
                print(f"pass {tag}: gfortran rejects it too")
            else:
                print(f"FAIL {tag}: gfortran accepts it: {lines}")
                failures += 1
            continue
        dump = subprocess.run([args.dump, os.path.join(args.fixtures, "ok", fx.name + ".nml")],
                              capture_output=True)
        problems = [l for l in lines if l.startswith("ERROR reading")]
        if dump.returncode != 0:
            problems.append("nml_dump: " + dump.stderr.decode("utf-8", "replace"))
        ours = parse_flat(dump.stdout.decode("utf-8").splitlines())
        theirs = parse_flat([l for l in lines if not l.startswith("ERROR reading")])
        for elem in sorted(set(ours) | set(theirs)):
            group, key = elem.split("(")[0].split(".", 1)
            declared = key_type(fx, key, fx.groups[group][key][0])
            if elem not in ours:
                problems.append(f"{elem}: gfortran {theirs[elem]}, moetrain unset")
            elif elem not in theirs:
                problems.append(f"{elem}: moetrain {ours[elem]}, gfortran unset")
            elif not same(declared, ours[elem], theirs[elem]):
                problems.append(f"{elem}: moetrain {ours[elem]}, gfortran {theirs[elem]}")
        if fx.name in ok_skip:
            state = "differs" if problems else "now agrees: remove it from OK_SKIP"
            print(f"skip {tag}: gfortran reads it differently ({state})")
        elif problems:
            print(f"FAIL {tag}:\n  " + "\n  ".join(problems))
            failures += 1
        else:
            print(f"pass {tag}: {len(ours)} elements agree")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
