/*
 * A C worker of the mixed-language tests (ffi/tests/mixed.rs). Its twins
 * are worker.py (Python), worker.mjs (Node) and the Rust role in mixed.rs;
 * all speak the same line protocol on stdin/stdout.
 *
 *   worker sched-hold PATH PRIORITY
 *       attach to the scheduler in PATH (lottery off), print "ready",
 *       acquire at PRIORITY, print "got", wait for a line (or EOF) on
 *       stdin, release, print "released".
 *   worker sched-churn PATH SECONDS
 *       attach, print "ready", wait for "go"; then acquire at a random
 *       priority, hold up to 200 us, release, for SECONDS; print "done N".
 *   worker lim-consume PATH CHUNK
 *       attach to the limiter in PATH, print "ready", wait for
 *       "go ORIGIN_NS"; then consume CHUNK tokens at a time until "stop"
 *       (or EOF), recording each completion in 10 ms buckets since
 *       ORIGIN_NS (CLOCK_MONOTONIC); print "bucket I TOKENS" per non-empty
 *       bucket, then "consumed TOTAL".
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shmsched.h"

static void die(const char *what, shmsched_status st) {
  char msg[1024];
  shmsched_last_error_message(msg, sizeof msg);
  fprintf(stderr, "worker.c: %s: %s (%s)\n", what, shmsched_strerror(st), msg);
  exit(3);
}

static void say(const char *line) {
  printf("%s\n", line);
  fflush(stdout);
}

static int read_line(char *buf, size_t len) {
  if (fgets(buf, (int)len, stdin) == NULL) {
    return 0;
  }
  buf[strcspn(buf, "\n")] = 0;
  return 1;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int priority_of(const char *name) {
  static const char *names[] = {"lowest", "lower", "low", "normal", "high", "higher", "highest"};
  for (int i = 0; i < 7; i++) {
    if (strcmp(name, names[i]) == 0) {
      return i - 3;
    }
  }
  return atoi(name);
}

static shmsched_region *open_region(const char *path) {
  shmsched_region *r;
  shmsched_status st = shmsched_region_open(path, &r);
  if (st != SHMSCHED_STATUS_OK) {
    die("region_open", st);
  }
  return r;
}

static int sched_hold(const char *path, const char *prio) {
  shmsched_region *r = open_region(path);
  shmsched_scheduler *s;
  shmsched_status st = shmsched_scheduler_attach(r, &s);
  if (st != SHMSCHED_STATUS_OK) die("attach", st);
  st = shmsched_scheduler_set_lottery(s, 0, false);
  if (st != SHMSCHED_STATUS_OK) die("set_lottery", st);
  say("ready");
  shmsched_permit p;
  st = shmsched_scheduler_acquire(s, priority_of(prio), &p);
  if (st != SHMSCHED_STATUS_OK) die("acquire", st);
  say("got");
  char line[64];
  read_line(line, sizeof line);
  st = shmsched_permit_release(p);
  if (st != SHMSCHED_STATUS_OK) die("release", st);
  say("released");
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  return 0;
}

static int sched_churn(const char *path, double seconds) {
  shmsched_region *r = open_region(path);
  shmsched_scheduler *s;
  shmsched_status st = shmsched_scheduler_attach(r, &s);
  if (st != SHMSCHED_STATUS_OK) die("attach", st);
  say("ready");
  char line[64];
  if (!read_line(line, sizeof line)) return 0;
  uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
  unsigned rng = (unsigned)getpid() * 2654435761u;
  long n = 0;
  while (now_ns() < end) {
    rng = rng * 1103515245u + 12345u;
    shmsched_permit p;
    st = shmsched_scheduler_acquire(s, (int)((rng >> 16) % 7) - 3, &p);
    if (st != SHMSCHED_STATUS_OK) die("acquire", st);
    /* Hold for up to 200 us: load shaping, so that holds overlap. */
    uint64_t until = now_ns() + (rng >> 8) % 200000;
    while (now_ns() < until) {
    }
    st = shmsched_permit_release(p);
    if (st != SHMSCHED_STATUS_OK) die("release", st);
    n++;
  }
  printf("done %ld\n", n);
  fflush(stdout);
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  return 0;
}

static atomic_int stop_flag;

static void *watch_stdin(void *arg) {
  (void)arg;
  char line[64];
  while (read_line(line, sizeof line)) {
    if (strcmp(line, "stop") == 0) break;
  }
  atomic_store(&stop_flag, 1);
  return NULL;
}

#define BUCKETS 2000 /* 20 s of 10 ms buckets */

static int lim_consume(const char *path, uint64_t chunk) {
  shmsched_region *r = open_region(path);
  shmsched_limiter *l;
  shmsched_status st = shmsched_limiter_attach(r, &l);
  if (st != SHMSCHED_STATUS_OK) die("attach", st);
  say("ready");
  char line[64];
  if (!read_line(line, sizeof line) || strncmp(line, "go ", 3) != 0) return 0;
  uint64_t origin = strtoull(line + 3, NULL, 10);
  pthread_t t;
  pthread_create(&t, NULL, watch_stdin, NULL);
  static uint64_t bucket[BUCKETS];
  uint64_t total = 0;
  while (!atomic_load(&stop_flag)) {
    st = shmsched_limiter_consume(l, chunk, SHMSCHED_PRIORITY_NORMAL, NULL);
    if (st != SHMSCHED_STATUS_OK) die("consume", st);
    uint64_t at = now_ns();
    total += chunk;
    if (at >= origin && (at - origin) / 10000000u < BUCKETS) {
      bucket[(at - origin) / 10000000u] += chunk;
    }
  }
  pthread_join(t, NULL);
  for (int i = 0; i < BUCKETS; i++) {
    if (bucket[i] != 0) {
      printf("bucket %d %llu\n", i, (unsigned long long)bucket[i]);
    }
  }
  printf("consumed %llu\n", (unsigned long long)total);
  fflush(stdout);
  shmsched_limiter_close(l);
  shmsched_region_close(r);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "sched-hold") == 0) return sched_hold(argv[2], argv[3]);
  if (argc == 4 && strcmp(argv[1], "sched-churn") == 0) return sched_churn(argv[2], atof(argv[3]));
  if (argc == 4 && strcmp(argv[1], "lim-consume") == 0)
    return lim_consume(argv[2], strtoull(argv[3], NULL, 10));
  fprintf(stderr, "usage: worker sched-hold|sched-churn|lim-consume PATH ARG\n");
  return 2;
}
