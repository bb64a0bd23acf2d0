/*
 * ffi/tests/cell_token.rs: one-slot permits of a shared handle are cell
 * tokens (serial bit 63), released once, checked by the slot's own
 * give-back CAS. Prints "FAIL ..." lines for what went wrong and "done"
 * at the end; exits 0 only if nothing failed.
 *
 *   - a double release: ALREADY_RELEASED, and the slot is not freed again
 *     for the next holder;
 *   - garbage tokens (random serials with bit 63 set, this process's tag):
 *     ALREADY_RELEASED, never a crash, never a free;
 *   - a weighted permit and a child's permit are table tokens (bit 63 clear);
 *   - a permit released after its handle was closed frees its slot;
 *   - max 1 and max 65536: the slot numbered 65535 round-trips;
 *   - a forked child cannot release its parent's token (FOREIGN_PERMIT) and
 *     the parent's slot stays held; the parent releases it afterwards;
 *   - the lean path (acquire, try_acquire: the cell's own next tag) and the
 *     general one (acquire_timeout: the thread's tag) give tokens of the
 *     same slot and cell, each released once, a stale one of either kind
 *     never freeing the other's slot; what the lean path declines (NULL
 *     arguments, a bad priority, a disposed handle, an inherited handle in
 *     a forked child) answers with the general path's status and message;
 *   - a permit released on another thread (whose first release goes the
 *     general way, registering its hazard record) is released once.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shmsched.h"

static int failures;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      printf("FAIL line %d: ", __LINE__); \
      printf(__VA_ARGS__);                \
      printf("\n");                       \
      failures++;                         \
    }                                     \
  } while (0)

static void must(shmsched_status st, const char *what) {
  if (st != SHMSCHED_STATUS_OK) {
    char msg[512];
    shmsched_last_error_message(msg, sizeof msg);
    printf("FAIL %s: %s (%s)\n", what, shmsched_strerror(st), msg);
    fflush(stdout);
    exit(1);
  }
}

static uint32_t running(shmsched_scheduler *s) {
  uint32_t n = 0;
  must(shmsched_scheduler_global_running(s, &n), "global_running");
  return n;
}

static shmsched_scheduler *shared(shmsched_region **r, uint32_t max) {
  shmsched_scheduler *s;
  must(shmsched_region_anonymous(0, r), "region_anonymous");
  must(shmsched_scheduler_shared(*r, max, &s), "scheduler_shared");
  return s;
}

static const uint64_t CELL_TOKEN = (uint64_t)1 << 63;

/* This thread's last error message. */
static const char *message(void) {
  static char msg[512];
  shmsched_last_error_message(msg, sizeof msg);
  return msg;
}

/* Releases a token on a thread of its own: the first release, then a
 * second one, which must find it released. */
static void *release_twice(void *arg) {
  shmsched_permit *p = arg;
  static shmsched_status st[2];
  st[0] = shmsched_permit_release(*p);
  st[1] = shmsched_permit_release(*p);
  return st;
}

/* Lean and general paths: see the header comment. */
static void lean_and_general(void) {
  shmsched_region *r;
  shmsched_scheduler *s = shared(&r, 1);
  shmsched_permit l, g, t;
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l), "lean acquire");
  CHECK(shmsched_permit_release(l) == SHMSCHED_STATUS_OK, "release l");
  must(shmsched_scheduler_acquire_timeout(s, SHMSCHED_PRIORITY_NORMAL, 1000000000ull, &g),
       "general acquire");
  CHECK((g.serial & CELL_TOKEN) && g.serial >> 32 == l.serial >> 32,
        "same slot and cell: %#llx %#llx", (unsigned long long)l.serial,
        (unsigned long long)g.serial);
  CHECK((uint32_t)g.serial != (uint32_t)l.serial, "another tag");
  CHECK(shmsched_permit_release(l) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale lean token");
  CHECK(running(s) == 1, "the general token's slot is held: running %u", running(s));
  CHECK(shmsched_permit_release(g) == SHMSCHED_STATUS_OK, "release g");
  CHECK(shmsched_permit_release(g) == SHMSCHED_STATUS_ALREADY_RELEASED, "release g again");
  must(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_HIGH, &t), "lean try_acquire");
  CHECK(t.serial >> 32 == l.serial >> 32, "the same slot again");
  CHECK(shmsched_permit_release(g) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale general token");
  CHECK(shmsched_permit_release(l) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale lean token");
  CHECK(running(s) == 1, "t's slot is held: running %u", running(s));
  CHECK(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) ==
            SHMSCHED_STATUS_WOULD_BLOCK,
        "full: %s", message());

  /* Released on another thread, once. */
  pthread_t th;
  void *res = NULL;
  CHECK(pthread_create(&th, NULL, release_twice, &t) == 0, "pthread_create");
  CHECK(pthread_join(th, &res) == 0, "pthread_join");
  if (res) {
    shmsched_status *st = res;
    CHECK(st[0] == SHMSCHED_STATUS_OK, "released on another thread: %d", (int)st[0]);
    CHECK(st[1] == SHMSCHED_STATUS_ALREADY_RELEASED, "and only once: %d", (int)st[1]);
  }
  CHECK(running(s) == 0, "freed: running %u", running(s));

  /* What the lean path declines. */
  CHECK(shmsched_scheduler_acquire(NULL, SHMSCHED_PRIORITY_NORMAL, &l) ==
            SHMSCHED_STATUS_NULL_ARGUMENT,
        "NULL sched");
  CHECK(strcmp(message(), "argument `sched` is NULL") == 0, "message: %s", message());
  CHECK(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, NULL) ==
            SHMSCHED_STATUS_NULL_ARGUMENT,
        "NULL out");
  CHECK(strcmp(message(), "argument `out` is NULL") == 0, "message: %s", message());
  CHECK(shmsched_scheduler_try_acquire(s, 4, &l) == SHMSCHED_STATUS_INVALID_PRIORITY,
        "priority 4");
  CHECK(strstr(message(), "4") != NULL, "message: %s", message());

  /* An inherited handle in a forked child: FORKED, nothing taken; a new
   * handle there takes the lean path. */
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    if (shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) != SHMSCHED_STATUS_FORKED ||
        strstr(message(), "fork") == NULL)
      code = 7;
    if (shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) != SHMSCHED_STATUS_FORKED)
      code = 8;
    shmsched_scheduler *mine;
    if (shmsched_scheduler_attach(r, &mine) != SHMSCHED_STATUS_OK) _exit(9);
    if (shmsched_scheduler_acquire(mine, SHMSCHED_PRIORITY_NORMAL, &l) != SHMSCHED_STATUS_OK ||
        !(l.serial & CELL_TOKEN))
      code = 10;
    if (shmsched_permit_release(l) != SHMSCHED_STATUS_OK ||
        shmsched_permit_release(l) != SHMSCHED_STATUS_ALREADY_RELEASED)
      code = 11;
    _exit(code);
  }
  int wst = 0;
  waitpid(pid, &wst, 0);
  CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "the forked child's checks (status %d)", wst);
  CHECK(running(s) == 0, "nothing taken in the child: running %u", running(s));

  must(shmsched_scheduler_dispose(s), "dispose");
  CHECK(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) == SHMSCHED_STATUS_DISPOSED,
        "disposed");
  CHECK(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) ==
            SHMSCHED_STATUS_DISPOSED,
        "disposed (try)");
  CHECK(running(s) == 0, "nothing taken: running %u", running(s));
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
}

int main(void) {
  shmsched_region *r;
  shmsched_scheduler *s = shared(&r, 2);
  shmsched_permit a, b;

  /* Double release. */
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire");
  CHECK(a.serial & CELL_TOKEN, "a one-slot permit is a cell token: %#llx",
        (unsigned long long)a.serial);
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "first release");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "second release");
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &b), "acquire b");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale release");
  CHECK(running(s) == 1, "b still held: running %u", running(s));

  /* Garbage. */
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 100000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    shmsched_permit g = {b.process, x | CELL_TOKEN};
    if (g.serial == b.serial) continue;
    shmsched_status st = shmsched_permit_release(g);
    if (st != SHMSCHED_STATUS_ALREADY_RELEASED) {
      CHECK(0, "garbage serial %#llx: %s", (unsigned long long)g.serial, shmsched_strerror(st));
      break;
    }
  }
  CHECK(running(s) == 1, "garbage freed nothing: running %u", running(s));
  CHECK(shmsched_permit_release(b) == SHMSCHED_STATUS_OK, "release b");

  /* Weighted and child permits are table tokens. */
  shmsched_permit m, c;
  must(shmsched_scheduler_acquire_many(s, SHMSCHED_PRIORITY_NORMAL, 2, &m), "acquire_many");
  CHECK(!(m.serial & CELL_TOKEN), "a weighted permit is a table token");
  CHECK(shmsched_permit_release(m) == SHMSCHED_STATUS_OK, "release m");
  shmsched_scheduler *child;
  must(shmsched_scheduler_child(s, 1, &child), "child");
  must(shmsched_scheduler_acquire(child, SHMSCHED_PRIORITY_NORMAL, &c), "acquire child");
  CHECK(!(c.serial & CELL_TOKEN), "a child's permit is a table token");
  CHECK(shmsched_permit_release(c) == SHMSCHED_STATUS_OK, "release c");
  CHECK(shmsched_permit_release(c) == SHMSCHED_STATUS_ALREADY_RELEASED, "release c again");
  shmsched_scheduler_close(child);

  /* Released after close: frees its slot (counted through a second handle). */
  shmsched_scheduler *other;
  must(shmsched_scheduler_attach(r, &other), "attach");
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire a");
  shmsched_scheduler_close(s);
  CHECK(running(other) == 1, "held across the close");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "release after close");
  CHECK(running(other) == 0, "freed after close: running %u", running(other));
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "again after close");

  /* Fork: the child cannot release the parent's token. */
  must(shmsched_scheduler_acquire(other, SHMSCHED_PRIORITY_NORMAL, &a), "acquire for fork");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int code = shmsched_permit_release(a) == SHMSCHED_STATUS_FOREIGN_PERMIT ? 0 : 7;
    _exit(code);
  }
  int wst = 0;
  waitpid(pid, &wst, 0);
  CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "the child got FOREIGN_PERMIT (status %d)", wst);
  CHECK(running(other) == 1, "the parent's slot stays held: running %u", running(other));
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "the parent releases it");
  shmsched_scheduler_close(other);
  shmsched_region_close(r);

  lean_and_general();

  /* Max 1 and max 65536. */
  s = shared(&r, 1);
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire max 1");
  CHECK(((a.serial >> 32) & 0xffff) == 0, "max 1: slot 0");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "release max 1");
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  s = shared(&r, 65536);
  shmsched_permit *all = malloc(65536 * sizeof *all);
  int found = -1;
  for (int i = 0; i < 65536; i++) {
    must(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &all[i]), "try_acquire");
    if (((all[i].serial >> 32) & 0xffff) == 65535) found = i;
  }
  CHECK(found >= 0, "slot 65535 named by a token");
  CHECK(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a) ==
            SHMSCHED_STATUS_WOULD_BLOCK,
        "full");
  for (int i = 0; i < 65536; i++) {
    CHECK(shmsched_permit_release(all[i]) == SHMSCHED_STATUS_OK, "release %d", i);
  }
  if (found >= 0) {
    CHECK(shmsched_permit_release(all[found]) == SHMSCHED_STATUS_ALREADY_RELEASED, "65535 again");
  }
  CHECK(running(s) == 0, "all free: running %u", running(s));
  free(all);
  shmsched_scheduler_close(s);
  shmsched_region_close(r);

  printf("done\n");
  return failures ? 1 : 0;
}
