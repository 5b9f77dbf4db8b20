dnl moetrain's dependency probe, one macro for every library.
dnl
dnl MT_PROBE(ID, DESCRIPTION, PKG-CONFIG-MODULES, HEADER, FUNCTION, LIBS, DEFAULT)
dnl   --with-ID[=yes|no|DIR] / --without-ID.  DEFAULT is "check" (use if found) or a
dnl   directory tried first.  Order: pkg-config (unless a DIR is given), then the
dnl   header + function check with DIR/include and DIR/lib[64].  If the user asked
dnl   for ID explicitly (yes or a DIR) and it is missing, configure stops.
dnl   Sets ID_CFLAGS, ID_LIBS (AC_SUBST), mt_have_ID=yes|no, HAVE_ID (config.h).
AC_DEFUN([MT_PROBE], [
AC_ARG_WITH([$1],
  [AS_HELP_STRING([--with-$1@<:@=DIR@:>@], [$2 (default: use if found)])],
  [], [with_$1=check])
mt_have_$1=no
mt_where_$1=""
AS_IF([test "x$with_$1" != xno], [
  dnl 1. pkg-config, when no directory was named
  AS_IF([test "x$with_$1" = xcheck || test "x$with_$1" = xyes], [
    AS_IF([test "x$3" != x], [
      PKG_CHECK_MODULES([$1], [$3], [mt_have_$1=yes; mt_where_$1="pkg-config $3"], [:])
    ])
  ])
  dnl 2. header + function, in DIR (given or default) or the system paths
  AS_IF([test $mt_have_$1 = no], [
    mt_dirs_$1=""
    AS_CASE([$with_$1],
      [check|yes], [mt_dirs_$1="$7 system"],
      [mt_dirs_$1="$with_$1"])
    for mt_d in $mt_dirs_$1; do
      mt_save_CPPFLAGS=$CPPFLAGS; mt_save_LIBS=$LIBS
      AS_IF([test "x$mt_d" = xsystem], [mt_c=""; mt_l="$6"],
            [mt_c="-I$mt_d/include"; mt_l="-L$mt_d/lib64 -L$mt_d/lib -Wl,-rpath,$mt_d/lib64 -Wl,-rpath,$mt_d/lib $6"])
      CPPFLAGS="$CPPFLAGS $mt_c"; LIBS="$mt_l $LIBS"
      AC_MSG_CHECKING([for $4 and $5 in ${mt_d}])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <$4>]], [[(void)&$5;]])],
        [mt_have_$1=yes; $1_CFLAGS=$mt_c; $1_LIBS=$mt_l; mt_where_$1=$mt_d],
        [])
      AC_MSG_RESULT([$mt_have_$1])
      AS_UNSET([ac_cv_header_]m4_translit([$4], [./-], [___]))
      CPPFLAGS=$mt_save_CPPFLAGS; LIBS=$mt_save_LIBS
      AS_IF([test $mt_have_$1 = yes], [break])
    done
  ])
  AS_IF([test $mt_have_$1 = no && test "x$with_$1" != xcheck],
    [AC_MSG_ERROR([--with-$1 was given but $2 was not found ($4 / $5). Install it (Debian: see README) or pass --with-$1=DIR, or --without-$1.])])
])
AS_IF([test $mt_have_$1 = yes],
  [AC_DEFINE_UNQUOTED(m4_toupper([HAVE_$1]), [1], [Define if $2 is available])])
AC_SUBST([$1_CFLAGS])
AC_SUBST([$1_LIBS])
])
