/* bf16_round: round to nearest even on known bit patterns, NaN and Inf. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels.h"

static uint32_t round_bits(uint32_t in)
{
    float x, y;
    memcpy(&x, &in, 4);
    mt_kernels_cpu()->op.bf16_round(NULL, &y, &x, 1);
    uint32_t out;
    memcpy(&out, &y, 4);
    return out;
}

static void test_exact_and_ties(void **state)
{
    (void)state;
    static const uint32_t cases[][2] = {
        {0x3f800000u, 0x3f800000u}, /* 1.0 is exact */
        {0x00000000u, 0x00000000u}, /* +0 */
        {0x80000000u, 0x80000000u}, /* -0 */
        {0x3f808000u, 0x3f800000u}, /* tie, even (lsb 0): down */
        {0x3f818000u, 0x3f820000u}, /* tie, odd (lsb 1): up */
        {0x3f807fffu, 0x3f800000u}, /* below half: down */
        {0x3f808001u, 0x3f810000u}, /* above half: up */
        {0xbf818000u, 0xbf820000u}, /* negative tie, odd: away from zero */
        {0xbf808000u, 0xbf800000u}, /* negative tie, even */
        {0x3fffffffu, 0x40000000u}, /* carry into the exponent */
        {0x00018000u, 0x00020000u}, /* subnormal tie, odd: up */
        {0x00008000u, 0x00000000u}, /* smallest subnormal tie, even: to zero */
        {0x7f7fffffu, 0x7f800000u}, /* FLT_MAX rounds past the largest bf16: +Inf */
        {0x7f7f7fffu, 0x7f7f0000u}, /* just under: stays finite */
        {0x7f800000u, 0x7f800000u}, /* +Inf */
        {0xff800000u, 0xff800000u}, /* -Inf */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(round_bits(cases[i][0]), cases[i][1]);
}

static void test_nan(void **state)
{
    (void)state;
    /* quiet, signalling with a payload only in the dropped bits, negative */
    static const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xffc00001u,
                                    0xff800001u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint32_t r = round_bits(nans[i]);
        assert_true((r & 0x7f800000u) == 0x7f800000u && (r & 0x007f0000u) != 0); /* NaN */
        assert_int_equal(r & 0xffffu, 0);
        assert_int_equal(r >> 31, nans[i] >> 31); /* sign kept */
    }
}

static void test_in_place_array(void **state)
{
    (void)state;
    float x[3] = {1.00390625f /* 1 + 2^-8: tie, even */, 3.0f, -2.0f};
    mt_kernels_cpu()->op.bf16_round(NULL, x, x, 3);
    assert_true(x[0] == 1.0f && x[1] == 3.0f && x[2] == -2.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_and_ties),
        cmocka_unit_test(test_nan),
        cmocka_unit_test(test_in_place_array),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
