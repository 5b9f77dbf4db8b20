dnl The CBLAS of the CPU backend's GEMMs (kernels/cpu/cpu_dense.c, cpu_layers.c).
dnl
dnl MT_PROBE_BLAS: --with-blas=openblas|blis|mkl|DIR (default openblas; DIR: an OpenBLAS
dnl installed in DIR). blas_CFLAGS and blas_LIBS on the configure line replace the
dnl search; otherwise pkg-config (openblas, blis, mkl-dynamic-lp64-seq), then the header
dnl and a function of that library with its usual -l flags, in DIR or $MKLROOT, the
dnl system paths, and for BLIS Debian's blis-{openmp,pthread,serial} directories.
dnl The library must also link cblas_sgemm. Stops when the chosen library is missing.
dnl Sets blas_CFLAGS, blas_LIBS (AC_SUBST), mt_where_blas, mt_blas_name, and one of
dnl MT_BLAS_OPENBLAS, MT_BLAS_BLIS, MT_BLAS_MKL (config.h).
AC_DEFUN([MT_PROBE_BLAS], [
AC_ARG_WITH([blas],
  [AS_HELP_STRING([--with-blas=openblas|blis|mkl|DIR], [the BLAS of the CPU backend: OpenBLAS (default), BLIS, Intel oneMKL (sequential), or the OpenBLAS installed in DIR; blas_CFLAGS=... blas_LIBS=... name its flags directly])],
  [], [with_blas=openblas])
AC_ARG_VAR([blas_CFLAGS], [C compiler flags for the BLAS (--with-blas), instead of searching])
AC_ARG_VAR([blas_LIBS], [linker flags for the BLAS (--with-blas), instead of searching])
mt_blas_dir=""
AS_CASE([$with_blas],
  [yes|openblas], [mt_blas=openblas],
  [blis], [mt_blas=blis],
  [mkl], [mt_blas=mkl; mt_blas_dir=${MKLROOT:-}],
  [/*], [mt_blas=openblas; mt_blas_dir=$with_blas],
  [no], [AC_MSG_ERROR([the CPU backend needs a BLAS: --with-blas=openblas|blis|mkl|DIR])],
  [AC_MSG_ERROR([--with-blas=$with_blas: give openblas, blis, mkl or the absolute directory of an OpenBLAS])])
AS_CASE([$mt_blas],
  [openblas], [mt_blas_name=OpenBLAS; mt_blas_pc=openblas; mt_blas_h=cblas.h
               mt_blas_fn=openblas_get_config; mt_blas_l=-lopenblas; mt_blas_sub=""
               mt_blas_includes="@%:@include <cblas.h>"],
  [blis], [mt_blas_name=BLIS; mt_blas_pc=blis; mt_blas_h=blis.h
           mt_blas_fn=bli_info_get_version_str; mt_blas_l=-lblis
           mt_blas_sub="blis blis-openmp blis-pthread blis-serial"
           mt_blas_includes="@%:@include <blis.h>
@%:@include <cblas.h>"],
  [mkl], [mt_blas_name="Intel oneMKL"; mt_blas_pc=mkl-dynamic-lp64-seq; mt_blas_h=mkl.h
          mt_blas_fn=mkl_get_version_string
          mt_blas_l="-lmkl_intel_lp64 -lmkl_sequential -lmkl_core -lpthread -lm -ldl"; mt_blas_sub=""
          mt_blas_includes="@%:@include <mkl.h>"])
mt_have_blas=no
mt_where_blas=""
dnl mt_blas_try CFLAGS LIBS WHERE: the headers, the library's own function and cblas_sgemm link
mt_blas_try() {
  mt_save_CPPFLAGS=$CPPFLAGS; mt_save_LIBS=$LIBS
  CPPFLAGS="$CPPFLAGS $[]1"; LIBS="$[]2 $LIBS"
  AC_MSG_CHECKING([for $mt_blas_name ($mt_blas_h, $mt_blas_fn, cblas_sgemm) in $[]3])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[$mt_blas_includes]], [[(void)&$mt_blas_fn; (void)&cblas_sgemm;]])],
    [mt_have_blas=yes; blas_CFLAGS=$[]1; blas_LIBS=$[]2; mt_where_blas=$[]3])
  AC_MSG_RESULT([$mt_have_blas])
  CPPFLAGS=$mt_save_CPPFLAGS; LIBS=$mt_save_LIBS
}
AS_IF([test "x${blas_CFLAGS+set}${blas_LIBS+set}" != x], [
  mt_blas_try "${blas_CFLAGS:-}" "${blas_LIBS:-$mt_blas_l}" "blas_CFLAGS/blas_LIBS"
], [test "x$mt_blas_dir" != x], [
  mt_blas_try "-I$mt_blas_dir/include" "-L$mt_blas_dir/lib64 -L$mt_blas_dir/lib -L$mt_blas_dir/lib/intel64 -Wl,-rpath,$mt_blas_dir/lib64 -Wl,-rpath,$mt_blas_dir/lib -Wl,-rpath,$mt_blas_dir/lib/intel64 $mt_blas_l" "$mt_blas_dir"
], [
  PKG_CHECK_MODULES([blas], [$mt_blas_pc],
    [mt_blas_try "$blas_CFLAGS" "$blas_LIBS" "pkg-config $mt_blas_pc"], [:])
  AS_IF([test $mt_have_blas = no], [mt_blas_try "" "$mt_blas_l" "the system paths"])
  mt_multiarch=`$CC -print-multiarch 2>/dev/null`
  for mt_sub in $mt_blas_sub; do
    AS_IF([test $mt_have_blas = no && test -d "/usr/include/$mt_multiarch/$mt_sub"],
      [mt_blas_try "-I/usr/include/$mt_multiarch/$mt_sub" "-L/usr/lib/$mt_multiarch/$mt_sub -Wl,-rpath,/usr/lib/$mt_multiarch/$mt_sub $mt_blas_l" "/usr/include/$mt_multiarch/$mt_sub"])
  done
])
AS_IF([test $mt_have_blas = no],
  [AC_MSG_ERROR([--with-blas=$with_blas: $mt_blas_name was not found (its header $mt_blas_h, $mt_blas_fn and cblas_sgemm). Debian: apt-get install libopenblas-dev (OpenBLAS) or libblis-dev (BLIS); or --with-blas=DIR for an OpenBLAS in DIR; or name the flags: blas_CFLAGS=-I... blas_LIBS="-L... -l..."])])
AS_CASE([$mt_blas],
  [openblas], [AC_DEFINE([MT_BLAS_OPENBLAS], [1], [Define if the CPU backend's BLAS is OpenBLAS])],
  [blis], [AC_DEFINE([MT_BLAS_BLIS], [1], [Define if the CPU backend's BLAS is BLIS])],
  [mkl], [AC_DEFINE([MT_BLAS_MKL], [1], [Define if the CPU backend's BLAS is Intel oneMKL])])
AC_SUBST([blas_CFLAGS])
AC_SUBST([blas_LIBS])
])
