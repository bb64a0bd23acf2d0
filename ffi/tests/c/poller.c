/*
 * ffi/tests/poller.rs: a process that only polls gets dead holders' slots
 * back through the C ABI.
 *
 *   poller hold PATH N
 *       attach to the scheduler in PATH, take N slots (blocking), print
 *       "held", then wait for a line (or EOF) on stdin (the test SIGKILLs
 *       it instead).
 *   poller poll PATH N
 *       attach, print "ready", wait for a line on stdin; then
 *       shmsched_scheduler_try_acquire every 1 ms until it holds N slots
 *       or 2 s passed; print "polled GOT MS FAILED_TRIES" (MS: from the
 *       first failed try to the last slot taken, or to giving up).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shmsched.h"

static void die(const char *what, shmsched_status st) {
  char msg[1024];
  shmsched_last_error_message(msg, sizeof msg);
  fprintf(stderr, "poller.c: %s: %s (%s)\n", what, shmsched_strerror(st), msg);
  exit(3);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static shmsched_scheduler *attach(const char *path) {
  shmsched_region *r;
  shmsched_status st = shmsched_region_open(path, &r);
  if (st != SHMSCHED_STATUS_OK) die("region_open", st);
  shmsched_scheduler *s;
  st = shmsched_scheduler_attach(r, &s);
  if (st != SHMSCHED_STATUS_OK) die("attach", st);
  return s;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: poller hold|poll PATH N\n");
    return 2;
  }
  int n = atoi(argv[3]);
  shmsched_scheduler *s = attach(argv[2]);
  shmsched_permit held[64];
  if (n < 1 || n > 64) return 2;
  char line[64];
  if (strcmp(argv[1], "hold") == 0) {
    for (int i = 0; i < n; i++) {
      shmsched_status st = shmsched_scheduler_acquire(s, 0, &held[i]);
      if (st != SHMSCHED_STATUS_OK) die("acquire", st);
    }
    printf("held\n");
    fflush(stdout);
    (void)fgets(line, sizeof line, stdin);
    return 0;
  }
  printf("ready\n");
  fflush(stdout);
  if (fgets(line, sizeof line, stdin) == NULL) return 0;
  int got = 0;
  long failed = 0;
  uint64_t first_fail = 0, last = 0, start = now_ns();
  while (got < n && now_ns() - start < 2000000000u) {
    shmsched_status st = shmsched_scheduler_try_acquire(s, 0, &held[got]);
    if (st == SHMSCHED_STATUS_OK) {
      got++;
      last = now_ns();
    } else if (st == SHMSCHED_STATUS_WOULD_BLOCK) {
      if (failed++ == 0) first_fail = now_ns();
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    } else {
      die("try_acquire", st);
    }
  }
  if (got < n) last = now_ns();
  if (first_fail == 0) first_fail = start;
  printf("polled %d %.1f %ld\n", got, (double)(last - first_fail) / 1e6, failed);
  fflush(stdout);
  for (int i = 0; i < got; i++) {
    shmsched_status st = shmsched_permit_release(held[i]);
    if (st != SHMSCHED_STATUS_OK) die("release", st);
  }
  return 0;
}
