#!/usr/bin/env python3
"""Writes a Fortran program that READs every group of a moetrain --print-config
file and WRITEs it back with gfortran's own namelist output.

usage: fortran_roundtrip.py PRINTED.nml PROGRAM.f90

Types are inferred from the printed values (quoted -> character, .true./.false.
-> logical, '.' or exponent -> real(8), else integer); arrays from the number of
values. Each group is read in its own subroutine, so keys may repeat across
groups. The program takes the input and output file names as arguments."""
import re
import sys

TOKEN = re.compile(r"\s*('(?:[^']|'')*'|[^,\s]+)\s*,?")


def parse(path):
    groups, cur, key = [], None, None
    for line in open(path):
        s = line.rstrip("\n")
        if s.startswith("&"):
            cur = (s[1:].strip(), [])
            groups.append(cur)
        elif s.strip() == "/":
            cur = None
        elif cur is not None and re.match(r"^  [a-z_0-9]+ = ", s):
            key, rest = s.strip().split(" = ", 1)
            cur[1].append([key, TOKEN.findall(rest)])
        elif cur is not None and s.startswith("    "):
            cur[1][-1][1].extend(TOKEN.findall(s))
    return groups


def ftype(vals):
    v = vals[0]
    if v.startswith("'"):
        return "character(len=1024)"
    if v.lower() in (".true.", ".false."):
        return "logical"
    if re.search(r"[.eEdD]", v):
        return "real(8)"
    return "integer"


def main():
    groups = parse(sys.argv[1])
    out = ["program roundtrip", "  implicit none", "  character(len=4096) :: fin, fout",
           "  integer :: u, w", "  call get_command_argument(1, fin)",
           "  call get_command_argument(2, fout)",
           "  open(newunit=u, file=trim(fin), status='old', action='read')",
           "  open(newunit=w, file=trim(fout), status='replace', delim='apostrophe')"]
    for g, _ in groups:
        out.append(f"  call read_{g}(u, w)")
    out += ["  close(u)", "  close(w)", "contains"]
    for g, keys in groups:
        out.append(f"  subroutine read_{g}(u, w)")
        out.append("    integer, intent(in) :: u, w")
        names = []
        for key, vals in keys:
            vals = vals or ["''"]
            dim = f", dimension({len(vals)})" if len(vals) > 1 else ""
            out.append(f"    {ftype(vals)}{dim} :: {key}")
            names.append(key)
        out.append(f"    namelist /{g}/ " + ", ".join(names))
        out.append(f"    read(u, nml={g})")
        out.append(f"    write(w, nml={g})")
        out.append(f"  end subroutine read_{g}")
    out.append("end program roundtrip")
    with open(sys.argv[2], "w") as f:
        for line in out:
            # free-form lines must stay under 132 characters
            while len(line) > 120:
                cut = line.rfind(",", 0, 118) + 1
                f.write(line[:cut] + " &\n")
                line = "      " + line[cut:].lstrip()
            f.write(line + "\n")


if __name__ == "__main__":
    main()
