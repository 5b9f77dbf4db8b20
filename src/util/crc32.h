/* moetrain: CRC-32 (the polynomial of zlib, gzip and PNG: Python's zlib.crc32 gives the
 * same values), for checkpoint blocks. */
#ifndef MT_UTIL_CRC32_H
#define MT_UTIL_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* The CRC of p[0..n) continued from crc (0 to start). */
uint32_t mt_crc32(uint32_t crc, const void *p, size_t n);

#endif
