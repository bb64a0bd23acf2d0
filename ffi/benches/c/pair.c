/*
 * One uncontended acquire + release pair through the C ABI, the way
 * benches/ffi_pair.rs times the same pair from Rust: a scheduler shared
 * through an anonymous region (max 8), `rounds` rounds of `iters` pairs,
 * the median round reported in ns per pair.
 *
 * usage: pair ITERS ROUNDS   ->  prints "ns_per_pair <median>"
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "shmsched.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void check(shmsched_status st, const char *what) {
  if (st != SHMSCHED_STATUS_OK) {
    char msg[512];
    shmsched_last_error_message(msg, sizeof msg);
    fprintf(stderr, "%s: %s (%s)\n", what, shmsched_strerror(st), msg);
    exit(1);
  }
}

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 1000000;
  int rounds = argc > 2 ? atoi(argv[2]) : 9;
  if (iters <= 0 || rounds <= 0 || rounds > 99) {
    fprintf(stderr, "usage: pair ITERS ROUNDS\n");
    return 2;
  }
  shmsched_region *region;
  shmsched_scheduler *sched;
  check(shmsched_region_anonymous(0, &region), "region");
  check(shmsched_scheduler_shared(region, 8, &sched), "scheduler");
  double per[99];
  for (int r = 0; r < rounds; r++) {
    double t0 = now_ns();
    for (long i = 0; i < iters; i++) {
      shmsched_permit p;
      if (shmsched_scheduler_acquire(sched, SHMSCHED_PRIORITY_NORMAL, &p) != SHMSCHED_STATUS_OK ||
          shmsched_permit_release(p) != SHMSCHED_STATUS_OK) {
        check(SHMSCHED_STATUS_INTERNAL, "pair");
      }
    }
    per[r] = (now_ns() - t0) / (double)iters;
  }
  qsort(per, (size_t)rounds, sizeof per[0], cmp);
  printf("ns_per_pair %.2f\n", per[rounds / 2]);
  shmsched_scheduler_close(sched);
  shmsched_region_close(region);
  return 0;
}
