/* moetrain tests: print the flattened values of namelist files (flatten.h),
 * for the gfortran conformance test.  Usage: nml_dump FILE...
 * Exit status 1 and the parser's message on stderr if a file does not parse. */
#include <stdio.h>

#include "flatten.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct mt_nml_file *f;
        struct mt_err err;
        if (mt_nml_parse_file(argv[i], &f, &err) != MT_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int rc = nml_flatten(f, stdout);
        mt_nml_free(f);
        if (rc != 0) {
            fprintf(stderr, "%s: out of memory\n", argv[0]);
            return 1;
        }
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
