/*
 * The waitset from C: many pending waits without a thread each.
 *
 * usage: waitset PREFIX
 *   PREFIX is a path prefix for the region files this program creates (it
 *   removes them). Prints "figure <name> <value>" lines, "FAIL ..." for
 *   every check that failed, and "failures N"; exits 0 only if none
 *   failed. ffi/tests/waitset.rs runs it and reads the figures.
 *
 * Checks: 5,000 pending acquires start quickly and are published in the
 * region; the thread count does not grow with them; they complete as
 * capacity frees; cancel leaves 0 waiters and 0 held; timeouts fire;
 * closing with pending waits leaks nothing; a consume completed but not
 * taken gives its tokens back when cancelled; a High wait in a waitset is
 * served before a Low blocking waiter in another process.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmsched.h"

static int failures;
static char prefix[256];

#define N_WAITS 5000
#define CAP 4

static void fail(const char *what, const char *why) {
  printf("FAIL %s: %s\n", what, why);
  fflush(stdout);
  failures++;
}

static void ok(const char *what, shmsched_status st) {
  if (st != SHMSCHED_STATUS_OK) {
    char msg[512], why[700];
    shmsched_last_error_message(msg, sizeof msg);
    snprintf(why, sizeof why, "%s: %s", shmsched_strerror(st), msg);
    fail(what, why);
  }
}

static void check(int cond, const char *what) {
  if (!cond) fail(what, "condition false");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int threads(void) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  struct dirent *e;
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] != '.') n++;
  }
  closedir(d);
  return n;
}

static const char *path(const char *tag) {
  static char buf[4][300];
  static int i;
  char *p = buf[i++ % 4];
  snprintf(p, 300, "%s-%s", prefix, tag);
  return p;
}

static shmsched_scheduler_stats stats(shmsched_scheduler *s) {
  shmsched_scheduler_stats st;
  st.size = sizeof st;
  ok("get_stats", shmsched_scheduler_get_stats(s, &st));
  return st;
}

static uint32_t waiters(shmsched_scheduler *s) {
  shmsched_scheduler_stats st = stats(s);
  uint32_t n = 0;
  for (int i = 0; i < 7; i++) n += st.region.waiters[i];
  return n;
}

/* Waits (at most 10 s, in 100 ms slices) until take gives something;
 * returns how many completions it wrote to c[0..cap]. */
static size_t take_some(shmsched_waitset *ws, shmsched_completion *c, size_t cap) {
  size_t n = 0;
  for (int k = 0; k < 100 && n == 0; k++) {
    size_t ready = 0;
    shmsched_waitset_wait(ws, 100000000ull, &ready);
    ok("waitset_take", shmsched_waitset_take(ws, c, cap, &n));
  }
  return n;
}

/* Takes whatever is ready, blocking in shmsched_waitset_wait at most
 * `limit_s`; releases the permits it gets (counted in *granted), counts
 * the other statuses. Returns the number of completions taken. */
static size_t drain(shmsched_waitset *ws, double limit_s, size_t want, size_t *granted,
                    size_t *by_status) {
  static shmsched_completion buf[512];
  size_t got = 0;
  double end = now_s() + limit_s;
  while (got < want && now_s() < end) {
    size_t ready = 0;
    shmsched_status st = shmsched_waitset_wait(ws, 200000000ull, &ready);
    if (st == SHMSCHED_STATUS_TIMEOUT) continue;
    ok("waitset_wait", st);
    size_t n = 0;
    ok("waitset_take", shmsched_waitset_take(ws, buf, 512, &n));
    for (size_t i = 0; i < n; i++) {
      if (buf[i].status < 32) by_status[buf[i].status]++;
      if (buf[i].status == SHMSCHED_STATUS_OK && buf[i].kind == SHMSCHED_WAIT_ACQUIRE) {
        (*granted)++;
        ok("release a granted permit", shmsched_permit_release(buf[i].permit));
      }
    }
    got += n;
  }
  return got;
}

static void many_waits(void) {
  shmsched_region *r;
  shmsched_scheduler *s;
  shmsched_waitset *ws;
  unlink(path("many"));
  ok("region_create", shmsched_region_create(path("many"), 0, 0, &r));
  ok("scheduler_shared", shmsched_scheduler_shared(r, CAP, &s));
  ok("set_lottery", shmsched_scheduler_set_lottery(s, 0, false));
  ok("waitset_create", shmsched_waitset_create(&ws));
  int fd = -1;
  ok("waitset_fd", shmsched_waitset_fd(ws, &fd));
  check(fd >= 0, "the waitset has a descriptor");

  /* Fill the budget, then start the waits. */
  shmsched_permit held[CAP];
  for (int i = 0; i < CAP; i++) ok("acquire", shmsched_scheduler_acquire(s, 0, &held[i]));
  int threads_before = threads();
  static uint64_t ids[N_WAITS];
  double t0 = now_s();
  for (int i = 0; i < N_WAITS; i++) {
    ok("acquire_start",
       shmsched_scheduler_acquire_start(s, SHMSCHED_PRIORITY_NORMAL, 1, SHMSCHED_FOREVER, ws,
                                        (uint64_t)i, &ids[i]));
  }
  double start_s = now_s() - t0;
  int threads_after = threads();
  printf("figure start_5000_ms %.2f\n", start_s * 1e3);
  printf("figure threads_before %d\nfigure threads_after %d\n", threads_before, threads_after);
  check(threads_after - threads_before <= 1,
        "5,000 pending waits add at most the library's one helper thread");
  size_t pending = 0;
  ok("waitset_pending", shmsched_waitset_pending(ws, &pending));
  check(pending == N_WAITS, "5,000 pending");
  check(waiters(s) == N_WAITS, "the region publishes 5,000 waiters");
  struct pollfd p = {fd, POLLIN, 0};
  check(poll(&p, 1, 0) == 0, "the descriptor is not readable while nothing completed");

  /* Free the capacity: every wait completes, CAP at a time. */
  double t1 = now_s();
  for (int i = 0; i < CAP; i++) ok("release", shmsched_permit_release(held[i]));
  check(poll(&p, 1, 5000) == 1, "the descriptor becomes readable when a slot frees");
  size_t granted = 0, by_status[32] = {0};
  size_t got = drain(ws, 60.0, N_WAITS, &granted, by_status);
  double drain_s = now_s() - t1;
  printf("figure drain_5000_ms %.2f\n", drain_s * 1e3);
  check(got == N_WAITS && granted == N_WAITS, "every wait was granted");
  check(waiters(s) == 0, "no waiter left");
  check(stats(s).region.running == 0, "nothing held after the drain");
  ok("waitset_pending", shmsched_waitset_pending(ws, &pending));
  check(pending == 0, "nothing pending after the drain");

  /* Cancel: 1,000 waits queued behind a full budget, all cancelled. */
  for (int i = 0; i < CAP; i++) ok("acquire", shmsched_scheduler_acquire(s, 0, &held[i]));
  for (int i = 0; i < 1000; i++) {
    ok("acquire_start", shmsched_scheduler_acquire_start(s, (i % 7) - 3, 1, SHMSCHED_FOREVER, ws,
                                                         (uint64_t)i, &ids[i]));
  }
  check(waiters(s) == 1000, "1,000 waiters published");
  for (int i = 0; i < 1000; i++) ok("waitset_cancel", shmsched_waitset_cancel(ws, ids[i]));
  check(waiters(s) == 0, "cancel leaves 0 waiters");
  memset(by_status, 0, sizeof by_status);
  granted = 0;
  got = drain(ws, 10.0, 1000, &granted, by_status);
  check(got == 1000 && by_status[SHMSCHED_STATUS_CANCELLED] == 1000,
        "every cancelled wait completes as CANCELLED");
  check(shmsched_waitset_cancel(ws, ids[0]) == SHMSCHED_STATUS_ALREADY_RELEASED,
        "a taken wait cannot be cancelled again");

  /* A grant that raced the cancel is given back: free one slot so the
   * first of two waits is granted (not yet taken), then cancel both. */
  ok("acquire_start", shmsched_scheduler_acquire_start(s, 0, 1, SHMSCHED_FOREVER, ws, 1, &ids[0]));
  ok("acquire_start", shmsched_scheduler_acquire_start(s, 0, 1, SHMSCHED_FOREVER, ws, 2, &ids[1]));
  ok("release", shmsched_permit_release(held[0]));
  check(poll(&p, 1, 5000) == 1, "the grant rang the descriptor");
  ok("waitset_cancel", shmsched_waitset_cancel(ws, ids[0]));
  ok("waitset_cancel", shmsched_waitset_cancel(ws, ids[1]));
  check(stats(s).region.running == CAP - 1, "the raced grant was given back");
  check(waiters(s) == 0, "no waiter after cancelling both");
  memset(by_status, 0, sizeof by_status);
  got = drain(ws, 10.0, 2, &granted, by_status);
  check(got == 2 && by_status[SHMSCHED_STATUS_CANCELLED] == 2, "both complete as CANCELLED");

  /* Timeouts: 100 waits of 20 ms behind the full budget. */
  ok("acquire", shmsched_scheduler_acquire(s, 0, &held[0]));
  double t2 = now_s();
  for (int i = 0; i < 100; i++) {
    ok("acquire_start", shmsched_scheduler_acquire_start(s, 0, 1, 20000000ull, ws, (uint64_t)i,
                                                         &ids[i]));
  }
  memset(by_status, 0, sizeof by_status);
  got = drain(ws, 10.0, 100, &granted, by_status);
  double timeout_s = now_s() - t2;
  printf("figure timeout_100x20ms_ms %.2f\n", timeout_s * 1e3);
  check(got == 100 && by_status[SHMSCHED_STATUS_TIMEOUT] == 100, "every wait timed out");
  check(timeout_s >= 0.019, "not before the timeout");
  check(waiters(s) == 0, "timeouts leave no waiter");

  /* Weighted: 3 units of 4 (all or none). */
  for (int i = 0; i < CAP; i++) ok("release", shmsched_permit_release(held[i]));
  ok("acquire_start 3 units",
     shmsched_scheduler_acquire_start(s, 0, 3, SHMSCHED_FOREVER, ws, 77, &ids[0]));
  shmsched_completion c[4];
  size_t n = take_some(ws, c, 4);
  check(n == 1 && c[0].status == SHMSCHED_STATUS_OK && c[0].tag == 77,
        "a 3-unit acquire completes");
  check(stats(s).region.running == 3, "it holds 3 units");
  if (n == 1) ok("release 3 units", shmsched_permit_release(c[0].permit));

  /* Close with pending waits: nothing leaks. */
  for (int i = 0; i < CAP; i++) ok("acquire", shmsched_scheduler_acquire(s, 0, &held[i]));
  for (int i = 0; i < 1000; i++) {
    ok("acquire_start", shmsched_scheduler_acquire_start(s, 1, 1, SHMSCHED_FOREVER, ws,
                                                         (uint64_t)i, &ids[i]));
  }
  ok("release", shmsched_permit_release(held[0]));  /* one granted, not taken */
  shmsched_waitset_close(ws);
  check(waiters(s) == 0, "close leaves 0 waiters");
  check(stats(s).region.running == CAP - 1, "close gives back the untaken grant");
  for (int i = 1; i < CAP; i++) ok("release", shmsched_permit_release(held[i]));
  check(stats(s).region.running == 0, "nothing held at the end");
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  unlink(path("many"));
}

static void consumes(void) {
  shmsched_region *r;
  shmsched_limiter *l;
  shmsched_waitset *ws;
  unlink(path("lim"));
  ok("region_create", shmsched_region_create(path("lim"), 0, 0, &r));
  ok("limiter_shared", shmsched_limiter_shared(r, 1000, &l));
  ok("waitset_create", shmsched_waitset_create(&ws));
  uint64_t id;
  /* A full bucket: granted at start; cancelled before it is taken, the
   * tokens go back. */
  ok("consume_start", shmsched_limiter_consume_start(l, 1000, 0, SHMSCHED_FOREVER, ws, 5, &id));
  ok("waitset_cancel", shmsched_waitset_cancel(ws, id));
  check(shmsched_limiter_try_consume(l, 900) == SHMSCHED_STATUS_OK,
        "a cancelled consume gave its tokens back");
  shmsched_completion c[4];
  size_t n = 0;
  ok("waitset_take", shmsched_waitset_take(ws, c, 4, &n));
  check(n == 1 && c[0].status == SHMSCHED_STATUS_CANCELLED && c[0].tag == 5,
        "the cancelled consume completes as CANCELLED");
  /* About 100 tokens left: 200 at 1000/s come in about 0.1 s. */
  double t0 = now_s();
  ok("consume_start", shmsched_limiter_consume_start(l, 200, 1, SHMSCHED_FOREVER, ws, 6, &id));
  n = take_some(ws, c, 4);
  double waited = now_s() - t0;
  printf("figure consume_200_at_1000_ms %.2f\n", waited * 1e3);
  check(n == 1 && c[0].status == SHMSCHED_STATUS_OK && c[0].kind == SHMSCHED_WAIT_CONSUME &&
            !c[0].grant.immediate,
        "a consume waits for the refill");
  check(waited > 0.05, "the refill took its time");
  /* A consume that times out gets its charged levels back. */
  ok("consume_start", shmsched_limiter_consume_start(l, 900, 0, 5000000ull, ws, 7, &id));
  n = take_some(ws, c, 4);
  check(n == 1 && c[0].status == SHMSCHED_STATUS_TIMEOUT, "a consume times out");
  /* Interrupt makes a wait return at once. */
  ok("waitset_interrupt", shmsched_waitset_interrupt(ws));
  size_t ready = 99;
  double t1 = now_s();
  ok("waitset_wait after interrupt", shmsched_waitset_wait(ws, SHMSCHED_FOREVER, &ready));
  check(now_s() - t1 < 1.0 && ready == 0, "an interrupted wait returns at once, nothing ready");
  check(shmsched_waitset_wait(ws, 1000000ull, &ready) == SHMSCHED_STATUS_TIMEOUT,
        "an empty waitset's wait times out");
  shmsched_waitset_close(ws);
  shmsched_limiter_close(l);
  shmsched_region_close(r);
  unlink(path("lim"));
}

/* Cross-process order: a Low blocking waiter in a forked child queues
 * first; then a High wait in this process's waitset. The freed slot goes
 * to the High one. */
static void across_processes(void) {
  shmsched_region *r;
  shmsched_scheduler *s;
  unlink(path("xp"));
  ok("region_create", shmsched_region_create(path("xp"), 0, 0, &r));
  ok("scheduler_shared", shmsched_scheduler_shared(r, 1, &s));
  ok("set_lottery", shmsched_scheduler_set_lottery(s, 0, false));
  shmsched_permit held;
  ok("acquire", shmsched_scheduler_acquire(s, 0, &held));
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    fail("pipe", "failed");
    return;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60); /* bounded, whatever happens */
    shmsched_region *cr;
    shmsched_scheduler *cs;
    shmsched_permit p;
    if (shmsched_region_open(path("xp"), &cr) != SHMSCHED_STATUS_OK) _exit(2);
    if (shmsched_scheduler_attach(cr, &cs) != SHMSCHED_STATUS_OK) _exit(3);
    if (shmsched_scheduler_acquire(cs, SHMSCHED_PRIORITY_LOW, &p) != SHMSCHED_STATUS_OK) _exit(4);
    if (write(from_child[1], "g", 1) != 1) _exit(5);
    char b;
    if (read(to_child[0], &b, 1) != 1) _exit(6);
    shmsched_permit_release(p);
    _exit(0);
  }
  double end = now_s() + 30;
  while (stats(s).region.waiters[SHMSCHED_PRIORITY_LOW + 3] != 1 && now_s() < end) usleep(1000);
  check(stats(s).region.waiters[SHMSCHED_PRIORITY_LOW + 3] == 1, "the child's Low waiter queued");
  shmsched_waitset *ws;
  ok("waitset_create", shmsched_waitset_create(&ws));
  uint64_t id;
  ok("acquire_start High",
     shmsched_scheduler_acquire_start(s, SHMSCHED_PRIORITY_HIGH, 1, SHMSCHED_FOREVER, ws, 9, &id));
  check(stats(s).region.waiters[SHMSCHED_PRIORITY_HIGH + 3] == 1, "the High wait is published");
  ok("release", shmsched_permit_release(held));
  shmsched_completion c[2];
  size_t n = take_some(ws, c, 2);
  check(n == 1 && c[0].status == SHMSCHED_STATUS_OK && c[0].tag == 9,
        "the High wait in the waitset got the slot");
  check(stats(s).region.waiters[SHMSCHED_PRIORITY_LOW + 3] == 1,
        "the Low waiter in the other process still waits");
  struct pollfd pf = {from_child[0], POLLIN, 0};
  check(poll(&pf, 1, 0) == 0, "the child has not been served");
  if (n == 1) ok("release", shmsched_permit_release(c[0].permit));
  check(poll(&pf, 1, 30000) == 1, "then the child is served");
  char b = 'x';
  if (write(to_child[1], &b, 1) != 1) fail("write", "to child");
  int st = 0;
  end = now_s() + 30;
  while (waitpid(pid, &st, WNOHANG) == 0 && now_s() < end) usleep(1000);
  if (now_s() >= end) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fail("child", "did not exit within 30 s");
  } else {
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's acquire and release succeeded");
  }
  shmsched_waitset_close(ws);
  check(stats(s).region.running == 0 && waiters(s) == 0, "nothing left");
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  unlink(path("xp"));
}

/* The per-priority token counters of shmsched_limiter_stats, exact: per
 * handle (this handle at this level) and region-wide (every handle), with
 * a refund made by cancelling a completed consume before it is taken. And
 * the size protocol: a caller built before the counters existed gets the
 * prefix it knows, nothing written past it. */
static void counters(void) {
  shmsched_region *r;
  shmsched_limiter *l, *other;
  shmsched_waitset *ws;
  unlink(path("ctr"));
  ok("region_create", shmsched_region_create(path("ctr"), 0, 0, &r));
  ok("limiter_shared", shmsched_limiter_shared(r, 1000, &l));
  ok("limiter_attach", shmsched_limiter_attach(r, &other));
  ok("waitset_create", shmsched_waitset_create(&ws));
  /* 400 of a full bucket of 1000: everything goes at once. */
  ok("consume 200 High", shmsched_limiter_consume(l, 200, SHMSCHED_PRIORITY_HIGH, NULL));
  uint64_t id;
  ok("consume_start 100 High",
     shmsched_limiter_consume_start(l, 100, SHMSCHED_PRIORITY_HIGH, SHMSCHED_FOREVER, ws, 1, &id));
  ok("waitset_cancel", shmsched_waitset_cancel(ws, id));
  shmsched_completion c[2];
  size_t n = 0;
  ok("waitset_take", shmsched_waitset_take(ws, c, 2, &n));
  check(n == 1 && c[0].status == SHMSCHED_STATUS_CANCELLED, "the cancelled consume is refunded");
  ok("try_consume 10", shmsched_limiter_try_consume(l, 10));
  /* A try at a priority counts there, not at Normal. */
  ok("try_consume_at 40 High", shmsched_limiter_try_consume_at(l, 40, SHMSCHED_PRIORITY_HIGH));
  ok("consume 50 Low", shmsched_limiter_consume(other, 50, SHMSCHED_PRIORITY_LOW, NULL));

  shmsched_limiter_stats st;
  memset(&st, 0xab, sizeof st);
  st.size = sizeof st;
  ok("limiter get_stats", shmsched_limiter_get_stats(l, &st));
  check(st.size == sizeof st, "the whole struct filled");
  const int hi = SHMSCHED_PRIORITY_HIGH + 3, lo = SHMSCHED_PRIORITY_LOW + 3,
            normal = SHMSCHED_PRIORITY_NORMAL + 3;
  for (int p = 0; p < 7; p++) {
    uint64_t want_c = p == hi ? 340 : p == normal ? 10 : 0;
    uint64_t want_r = p == hi ? 100 : 0;
    uint64_t region_c = want_c + (p == lo ? 50 : 0);
    if (st.consumed[p] != want_c || st.refunded[p] != want_r || st.region.consumed[p] != region_c ||
        st.region.refunded[p] != want_r) {
      char why[200];
      snprintf(why, sizeof why,
               "priority index %d: handle consumed %llu refunded %llu, region consumed %llu "
               "refunded %llu; want %llu %llu %llu %llu",
               p, (unsigned long long)st.consumed[p], (unsigned long long)st.refunded[p],
               (unsigned long long)st.region.consumed[p], (unsigned long long)st.region.refunded[p],
               (unsigned long long)want_c, (unsigned long long)want_r,
               (unsigned long long)region_c, (unsigned long long)want_r);
      fail("limiter counters", why);
    }
  }
  shmsched_limiter_stats o;
  o.size = sizeof o;
  ok("other get_stats", shmsched_limiter_get_stats(other, &o));
  check(o.consumed[lo] == 50 && o.consumed[hi] == 0 && o.refunded[hi] == 0 &&
            o.region.consumed[hi] == 340 && o.region.refunded[hi] == 100,
        "the other handle: its own 50 at Low, the region's 340/100 at High");

  /* The struct as it was before the counters: it ended with region.wakes. */
  const size_t old = offsetof(shmsched_limiter_stats, region) +
                     offsetof(shmsched_limiter_region_stats, consumed);
  memset(&st, 0xab, sizeof st);
  st.size = (uint32_t)old;
  ok("limiter get_stats (old size)", shmsched_limiter_get_stats(l, &st));
  check(st.size == old && st.region.processes == 1 && st.region.wakes != 0xababababababababull,
        "an old caller gets the old prefix");
  const unsigned char *tail = (const unsigned char *)&st + old;
  int untouched = 1;
  for (size_t i = 0; i < sizeof st - old; i++) untouched &= tail[i] == 0xab;
  check(untouched, "nothing written past an old caller's size");

  shmsched_waitset_close(ws);
  shmsched_limiter_close(other);
  shmsched_limiter_close(l);
  shmsched_region_close(r);
  unlink(path("ctr"));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: waitset PREFIX\n");
    return 2;
  }
  snprintf(prefix, sizeof prefix, "%s", argv[1]);
  many_waits();
  consumes();
  counters();
  across_processes();
  printf("failures %d\n", failures);
  return failures == 0 ? 0 : 1;
}
