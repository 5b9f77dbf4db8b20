/* moetrain --version: what this build is and what it finds where it runs. */
#ifndef MT_VERSION_H
#define MT_VERSION_H

#include <stdio.h>

/* The release and source revision, the compilers and configure arguments, the
 * backends and runtimes built in, and each library's version at build time beside the
 * one this process loads (or why it cannot load it). */
void mt_print_version(FILE *out);

#endif
