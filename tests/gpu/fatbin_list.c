/* Lists the GPU code of the CUDA fat binaries in a file nvcc built or linked (an object,
 * a library, moetrain): one line per fat binary, its entries in stored order, sm_NN for
 * SASS (an ELF cubin) and compute_NN for PTX. The toolkit's own lister (cuobjdump) is
 * not part of every installation; the container is simple: a 16-byte header (magic
 * 0xBA55ED50, version 1, its size, the size of the entries after it), then entries,
 * each a header (kind 1 PTX or 2 ELF at byte 0, the header's size at 4, the payload's
 * at 8, the architecture as major*10+minor at 28) and its payload, compressed or not.
 *
 *   fatbin_list FILE   exit 0 with the list, 1 when FILE holds no fat binary or a
 *                      malformed one */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t get(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fatbin_list FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    size_t cap = 1 << 20, n = 0, got;
    unsigned char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            unsigned char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "fatbin_list: out of memory\n");
        return 1;
    }
    int count = 0, bad = 0;
    /* the .nv_fatbin section aligns each fat binary to 8 bytes */
    for (size_t off = 0; off + 16 <= n; off += 8) {
        const unsigned char *h = buf + off;
        if (get(h, 4) != 0xBA55ED50u || get(h + 4, 2) != 1 || get(h + 6, 2) != 16) continue;
        const uint64_t size = get(h + 8, 8);
        if (size > n - off - 16) continue;
        printf("fatbin %d at 0x%zx:", count++, off);
        for (uint64_t e = off + 16; e < off + 16 + size;) {
            const unsigned char *eh = buf + e;
            const unsigned kind = (unsigned)get(eh, 2);
            const uint64_t hsize = get(eh + 4, 4), psize = get(eh + 8, 8);
            if (e + 32 > off + 16 + size || hsize < 32 || (kind != 1 && kind != 2) ||
                psize > off + 16 + size - e - hsize) {
                printf(" ?(malformed entry at 0x%zx)", (size_t)e);
                bad = 1;
                break;
            }
            printf(" %s_%u", kind == 2 ? "sm" : "compute", (unsigned)get(eh + 28, 4));
            e += hsize + psize;
        }
        printf("\n");
        off += (16 + size + 7) / 8 * 8 - 8;
    }
    free(buf);
    if (count == 0) fprintf(stderr, "fatbin_list: %s holds no CUDA fat binary\n", argv[1]);
    return count == 0 || bad;
}
