/* CRC-32, reflected polynomial 0xEDB88320, slicing by 8 (about 1 byte per cycle). */
#include "util/crc32.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t mt_crc32(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&once, make_table);
    const unsigned char *b = p;
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, b, 4);
        memcpy(&hi, b + 4, 4);
        lo ^= crc; /* little-endian hosts, as every target of moetrain */
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
              table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        b += 8;
        n -= 8;
    }
    while (n--) crc = table[0][(crc ^ *b++) & 0xff] ^ (crc >> 8);
    return ~crc;
}
