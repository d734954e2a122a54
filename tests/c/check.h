/* CHECK(condition, printf-style message): the C tests' assertion. A failed check prints where and why and is
 * counted in `failures`, and the test goes on, so that one run reports every broken check. */
#ifndef SPARROW_TESTS_C_CHECK_H
#define SPARROW_TESTS_C_CHECK_H

#include <stdio.h>

static int failures = 0;

#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                      \
      fprintf(stderr, "\n");                                             \
      ++failures;                                                        \
    }                                                                    \
  } while (0)

#endif
